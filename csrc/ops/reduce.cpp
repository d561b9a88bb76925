// Reductions: sum over everything or over the last dimension (deterministic kernels).
#include "core/error.h"
#include "ops/dispatch.h"

namespace xt {
namespace ops {

Tensor sum_all(const Tensor& x) {
  check_floating(x, "sum", "x");
  Tensor out = Tensor::empty({}, x.dtype(), x.device());
  XT_KERNEL(x.device(), sum_all, x.dtype(), x.data_ptr(), out.data_ptr(), x.numel(), stream_for(x.device()));
  return out;
}

Tensor sum_lastdim(const Tensor& x, bool keepdim) {
  check_floating(x, "sum", "x");
  XT_CHECK(x.dim() >= 1, ValueError, "sum: cannot reduce the last dimension of a 0-dimensional tensor ",
           x.describe());
  const int64_t cols = x.shape().back();
  Shape shape = x.shape();
  if (keepdim) shape.back() = 1;
  else shape.pop_back();
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  const int64_t rows = out.numel();
  if (rows)
    XT_KERNEL(x.device(), sum_lastdim, x.dtype(), x.data_ptr(), out.data_ptr(), rows, cols, stream_for(x.device()));
  return out;
}

}  // namespace ops
}  // namespace xt
