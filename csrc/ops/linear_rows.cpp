// linear_rows: the decode step's matrix-vector products (python/xtrain/models/transformer.py,
// DECODE_GEMV_MAX_ROWS), argument checks and dispatch to kernels/{cpu,cuda}/linear_rows.
// Inference only: it records no history, and it refuses an input that requires grad while grad
// mode is on rather than return a result whose gradient would silently be missing.
//
//  - linear_rows(x, [w0, w1, ...]) = linear_multi(x, [w0, w1, ...]) for x [M, K], 1 <= M <= 8:
//    the outputs are views of one buffer, block after block (y0 [M, N0], then y1, ...), so the
//    decode step swaps one for the other. One kernel launch reads each weight row once (Note
//    [Matrix-vector products of the decode step], kernels/cuda/linear_rows.cuh).
//  - rms_norm_linear_rows(x, ws, norm_weight, eps, residual, swiglu) = (h, linear_rows(y, ws)) with
//    h, y = add_rms_norm(x, residual, norm_weight, eps) (no residual: h = x, y = rms_norm(x)), and
//    with swiglu [swiglu(y @ ws[0]^T, y @ ws[1]^T)]: bitwise that composition, in one kernel that
//    recomputes the norm in every block (Note [The decode step's norm fused into its
//    matrix-vector product], kernels/cuda/linear_rows.cuh); on CUDA, rows too long for its shared
//    memory run the composition.
//  - Numerics: float32 accumulation (float64 for float64) in a fixed order, rounded once:
//    deterministic, but not bitwise cuBLAS's or OpenBLAS's GEMM (another summation order).
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "ops/dispatch.h"
#include "tape/node.h"

namespace xt {
namespace ops {

namespace {

// x [M, K] with 1 <= M <= kLinearRowsMaxRows and weights [N_i, K] of x's dtype and device.
void check_rows(const Tensor& x, const std::vector<Tensor>& ws, const char* op) {
  check_defined(x, "x");
  check_floating(x, op, "x");
  XT_CHECK(x.dim() == 2, ValueError, op, ": x must be [M, K] (2 dimensions), got ", x.describe());
  const int64_t M = x.size(0);
  XT_CHECK(M >= 1 && M <= kernels::kLinearRowsMaxRows, ValueError, op, ": x must have 1 to ",
           kernels::kLinearRowsMaxRows, " rows (use linear or linear_multi for more), got ", x.describe());
  check_linear_weights(x, ws, op);
}

// The kernels' view of the weights: their data pointers, their rows (out features) and the sum.
struct WeightList {
  std::vector<const void*> ptrs;
  std::vector<int64_t> sizes;
  int64_t total = 0;
  explicit WeightList(const std::vector<Tensor>& ws) {
    for (const Tensor& w : ws) {
      ptrs.push_back(w.data_ptr());
      sizes.push_back(w.size(0));
      total += w.size(0);
    }
  }
};

}  // namespace

std::vector<Tensor> linear_rows(const Tensor& x, const std::vector<Tensor>& ws) {
  const char* op = "linear_rows";
  check_rows(x, ws, op);
  const int64_t M = x.size(0), K = x.size(1);
  XT_CHECK(!needs_grad({&x}) && !needs_grad(ws), RuntimeError, op,
           ": not differentiable (inference only): an input requires grad while grad mode is on; call it under "
           "xtrain.no_grad() or on detached tensors, or use linear_multi");

  const WeightList wl(ws);
  const int64_t total = wl.total;
  Tensor buf = Tensor::empty({M * total}, x.dtype(), x.device());
  std::vector<Tensor> out;
  out.reserve(ws.size());
  int64_t off = 0;
  for (const Tensor& w : ws) {
    out.push_back(buf.storage_view(off, {M, w.size(0)}));
    off += M * w.size(0);
  }
  if (total == 0) return out;
  XT_KERNEL(x.device(), linear_rows, x.dtype(), x.data_ptr(), M, K, static_cast<int>(ws.size()), wl.ptrs.data(),
            wl.sizes.data(), buf.data_ptr(), stream_for(x.device()));
  return out;
}

std::pair<Tensor, std::vector<Tensor>> rms_norm_linear_rows(const Tensor& x, const std::vector<Tensor>& ws,
                                                          const Tensor& norm_weight, double eps, const Tensor& residual,
                                                          bool swiglu) {
  const char* op = "rms_norm_linear_rows";
  check_rows(x, ws, op);
  const int64_t M = x.size(0), K = x.size(1);
  XT_CHECK(norm_weight.defined(), ValueError, op, ": norm_weight must be a tensor");
  check_floating(norm_weight, op, "norm_weight");
  check_same_device(x, norm_weight, op, "x", "norm_weight");
  XT_CHECK(norm_weight.dim() == 1 && norm_weight.size(0) == K, ValueError, op, ": norm_weight must have shape [", K,
           "] (x's last dimension), got ", norm_weight.describe(), " for x ", x.describe());
  XT_CHECK(norm_weight.dtype() == x.dtype() || norm_weight.dtype() == DType::Float32, TypeError, op,
           ": norm_weight must be float32 or x's dtype, got ", norm_weight.describe(), " for x ", x.describe());
  XT_CHECK(std::isfinite(eps) && eps >= 0, ValueError, op, ": eps must be finite and >= 0, got ", eps);
  XT_CHECK(!residual.defined() || (residual.shape() == x.shape() && residual.dtype() == x.dtype() &&
                                   residual.device() == x.device()),
           ValueError, op, ": residual must match x (shape, dtype, device), got residual ", residual.describe(),
           " for x ", x.describe());
  XT_CHECK(!swiglu || (ws.size() == 2 && ws[0].shape() == ws[1].shape()), ValueError, op,
           ": swiglu=True takes two weights of one shape (gate, up), got ", ws.size(), " weight(s)",
           ws.size() == 2 ? std::string(": ") + ws[0].describe() + " and " + ws[1].describe() : std::string());
  XT_CHECK(!needs_grad({&x, &residual, &norm_weight}) && !needs_grad(ws), RuntimeError, op,
           ": not differentiable (inference only): an input requires grad while grad mode is on; call it under "
           "xtrain.no_grad() or on detached tensors, or use add_rms_norm and linear_multi");

  // Too many rows for the CUDA kernel's shared memory: the composition it reproduces.
  const size_t compute = x.dtype() == DType::Float64 ? 8 : 4;
  if (x.device().is_cuda() &&
      kernels::norm_rows_smem_bytes(dtype_size(x.dtype()), compute, M, K) > kernels::kNormRowsSmemMax) {
    Tensor h = x, y;
    if (residual.defined()) std::tie(h, y) = add_rms_norm_forward(x, residual, norm_weight, eps, nullptr);
    else y = rms_norm_forward(x, norm_weight, eps).first;
    std::vector<Tensor> out = linear_rows(y, ws);
    if (swiglu) out = {swiglu_forward(out[0], out[1])};
    return {h, out};
  }

  Tensor h = residual.defined() ? Tensor::empty(x.shape(), x.dtype(), x.device()) : x;
  const WeightList wl(ws);
  const int64_t total = wl.total;
  std::vector<Tensor> out;
  Tensor buf;
  if (swiglu) {
    buf = Tensor::empty({M, ws[0].size(0)}, x.dtype(), x.device());
    out.push_back(buf);
  } else {
    buf = Tensor::empty({M * total}, x.dtype(), x.device());
    int64_t off = 0;
    for (const Tensor& w : ws) {
      out.push_back(buf.storage_view(off, {M, w.size(0)}));
      off += M * w.size(0);
    }
  }
  XT_KERNEL(x.device(), rms_norm_linear_rows, x.dtype(), norm_weight.dtype(), x.data_ptr(),
            residual.defined() ? residual.data_ptr() : nullptr, norm_weight.data_ptr(),
            residual.defined() ? h.data_ptr() : nullptr, static_cast<float>(eps), M, K, static_cast<int>(ws.size()),
            wl.ptrs.data(), wl.sizes.data(), swiglu, buf.data_ptr(), stream_for(x.device()));
  return {h, out};
}

}  // namespace ops
}  // namespace xt
