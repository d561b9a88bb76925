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

void* stream_for(Device d) { return d.is_cuda() ? cuda::current_stream(d.index) : nullptr; }

}  // namespace ops
}  // namespace xt
