// Argument checks shared by every op family: each names the op, the argument and what it saw.
#include "core/cuda_api.h"
#include "core/error.h"
#include "ops/ops.h"

namespace xt {
namespace ops {

void check_defined(const Tensor& t, const char* name) {
  XT_CHECK(t.defined(), ValueError, name, " must be a tensor, got an undefined tensor");
}

void check_floating(const Tensor& t, const char* op, const char* name) {
  check_defined(t, name);
  XT_CHECK(is_floating(t.dtype()), TypeError, op, ": ", name, " must be floating point (float32, bfloat16 or float64), got ",
           t.describe());
}

void check_same_device(const Tensor& a, const Tensor& b, const char* op, const char* an, const char* bn) {
  XT_CHECK(a.device() == b.device(), ValueError, op, ": ", an, " and ", bn, " must be on the same device, got ",
           a.describe(), " and ", b.describe());
}

void check_same_dtype(const Tensor& a, const Tensor& b, const char* op, const char* an, const char* bn) {
  XT_CHECK(a.dtype() == b.dtype(), TypeError, op, ": ", an, " and ", bn, " must have the same dtype, got ",
           a.describe(), " and ", b.describe());
}

void check_dim(const Tensor& t, int64_t dim, const char* op, const char* name) {
  XT_CHECK(t.dim() == dim, ValueError, op, ": ", name, " must have ", dim, " dimensions, got ", t.describe());
}

void check_head_norm_weight(const Tensor& w, const Tensor& q, int64_t D, const char* op, const char* name) {
  check_floating(w, op, name);
  check_same_device(q, w, op, "q", name);
  XT_CHECK(w.dim() == 1 && w.numel() == D, ValueError, op, ": ", name, " must have shape [", D,
           "] (the head dimension of q), got ", name, " ", w.describe(), " for q ", q.describe());
  XT_CHECK(w.dtype() == q.dtype() || w.dtype() == DType::Float32, TypeError, op, ": ", name,
           " must be float32 or q's dtype, got ", name, " ", w.describe(), " for q ", q.describe());
}

void check_linear_weights(const Tensor& x, const std::vector<Tensor>& ws, const char* op) {
  XT_CHECK(!ws.empty(), ValueError, op, ": weights must hold at least one weight");
  for (size_t i = 0; i < ws.size(); ++i) {
    const Tensor& w = ws[i];
    XT_CHECK(w.defined(), ValueError, op, ": weights[", i, "] must be a tensor, got an undefined tensor");
    XT_CHECK(w.dim() == 2, ValueError, op, ": weights[", i, "] must be [out, in], got ", w.describe());
    XT_CHECK(w.dtype() == x.dtype(), TypeError, op, ": weights[", i, "] ", w.describe(), " must have x's dtype (x ",
             x.describe(), ")");
    XT_CHECK(w.device() == x.device(), ValueError, op, ": weights[", i, "] is on ", w.device().str(), " but x on ",
             x.device().str());
    XT_CHECK(w.size(1) == x.shape().back(), ValueError, op, ": x ", x.describe(), " must end in weights[", i,
             "]'s in_features ", w.size(1), " (weights[", i, "] ", w.describe(), " is [out, in])");
  }
}

void* stream_for(Device d) { return d.is_cuda() ? cuda::current_stream(d.index) : nullptr; }

}  // namespace ops
}  // namespace xt
