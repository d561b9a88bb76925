// linear_rows: the decode step's matrix-vector products (python/xtrain/models/transformer.py,
// DECODE_GEMV_MAX_ROWS), argument checks and dispatch to kernels/{cpu,cuda}/linear_rows.
// Inference only: it records no history, and it refuses an input that requires grad while grad
// mode is on rather than return a result whose gradient would silently be missing.
//
//  - linear_rows(x, [w0, w1, ...]) = linear_multi(x, [w0, w1, ...]) for x [M, K], 1 <= M <= 8:
//    the outputs are views of one buffer, block after block (y0 [M, N0], then y1, ...), so the
//    decode step swaps one for the other. One kernel launch reads each weight row once (Note
//    [Matrix-vector products of the decode step], kernels/cuda/linear_rows.cuh).
//  - Numerics: float32 accumulation (float64 for float64) in a fixed order, rounded once:
//    deterministic, but not bitwise cuBLAS's or OpenBLAS's GEMM (another summation order).
#include <vector>

#include "core/error.h"
#include "ops/dispatch.h"
#include "tape/node.h"

namespace xt {
namespace ops {

std::vector<Tensor> linear_rows(const Tensor& x, const std::vector<Tensor>& ws) {
  const char* op = "linear_rows";
  check_defined(x, "x");
  check_floating(x, op, "x");
  XT_CHECK(x.dim() == 2, ValueError, op, ": x must be [M, K] (2 dimensions), got ", x.describe());
  const int64_t M = x.size(0), K = x.size(1);
  XT_CHECK(M >= 1 && M <= kernels::kLinearRowsMaxRows, ValueError, op, ": x must have 1 to ",
           kernels::kLinearRowsMaxRows, " rows (use linear or linear_multi for more), got ", x.describe());
  XT_CHECK(!ws.empty(), ValueError, op, ": weights must hold at least one weight");
  for (size_t i = 0; i < ws.size(); ++i) {
    const Tensor& w = ws[i];
    XT_CHECK(w.defined(), ValueError, op, ": weights[", i, "] must be a tensor, got an undefined tensor");
    XT_CHECK(w.dim() == 2, ValueError, op, ": weights[", i, "] must be [out, in], got ", w.describe());
    XT_CHECK(w.dtype() == x.dtype(), TypeError, op, ": weights[", i, "] ", w.describe(), " must have x's dtype (x ",
             x.describe(), ")");
    XT_CHECK(w.device() == x.device(), ValueError, op, ": weights[", i, "] is on ", w.device().str(), " but x on ",
             x.device().str());
    XT_CHECK(w.size(1) == K, ValueError, op, ": x ", x.describe(), " must end in weights[", i, "]'s in_features ",
             w.size(1), " (weights[", i, "] ", w.describe(), " is [out, in])");
  }
  XT_CHECK(!needs_grad({&x}) && !needs_grad(ws), RuntimeError, op,
           ": not differentiable (inference only): an input requires grad while grad mode is on; call it under "
           "xtrain.no_grad() or on detached tensors, or use linear_multi");

  int64_t total = 0;
  std::vector<const void*> ptrs;
  std::vector<int64_t> sizes;
  for (const Tensor& w : ws) {
    total += w.size(0);
    ptrs.push_back(w.data_ptr());
    sizes.push_back(w.size(0));
  }
  Tensor buf = Tensor::empty({M * total}, x.dtype(), x.device());
  std::vector<Tensor> out;
  out.reserve(ws.size());
  int64_t off = 0;
  for (const Tensor& w : ws) {
    out.push_back(buf.storage_view(off, {M, w.size(0)}));
    off += M * w.size(0);
  }
  if (total == 0) return out;
  XT_KERNEL(x.device(), linear_rows, x.dtype(), x.data_ptr(), M, K, static_cast<int>(ws.size()), ptrs.data(),
            sizes.data(), buf.data_ptr(), stream_for(x.device()));
  return out;
}

}  // namespace ops
}  // namespace xt
