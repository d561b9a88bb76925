// Layout ops: permute and transpose. Both copy (storage stays contiguous row-major); the
// identity permutation is a plain clone.
#include "core/error.h"
#include "ops/dispatch.h"

namespace xt {
namespace ops {

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  check_defined(x, "x");
  const int64_t n = x.dim();
  XT_CHECK(static_cast<int64_t>(dims.size()) == n, ValueError, "permute: dims has ", dims.size(),
           " entries but x is ", x.describe());
  XT_CHECK(n <= kernels::kMaxDims, ValueError, "permute: at most ", kernels::kMaxDims, " dimensions, got ",
           x.describe());
  int perm[kernels::kMaxDims] = {};
  bool seen[kernels::kMaxDims] = {};
  bool identity = true;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t d = dims[i];
    XT_CHECK(d >= -n && d < n, IndexError, "permute: dimension ", d, " out of range for ", x.describe());
    const int64_t dd = d < 0 ? d + n : d;
    XT_CHECK(!seen[dd], ValueError, "permute: dimension ", dd, " repeated in dims for ", x.describe());
    seen[dd] = true;
    perm[i] = static_cast<int>(dd);
    identity = identity && dd == i;
  }
  if (identity) return clone(x);
  Shape shape(n);
  for (int64_t i = 0; i < n; ++i) shape[i] = x.shape()[perm[i]];
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  if (out.numel())
    XT_KERNEL(x.device(), permute, x.dtype(), x.data_ptr(), out.data_ptr(), static_cast<int>(n), x.shape().data(),
              perm, stream_for(x.device()));
  return out;
}

std::vector<int64_t> transpose_dims(const Tensor& x, int64_t d0, int64_t d1) {
  check_defined(x, "x");
  const int64_t n = x.dim();
  XT_CHECK(d0 >= -n && d0 < n && d1 >= -n && d1 < n, IndexError, "transpose: dimensions (", d0, ", ", d1,
           ") out of range for ", x.describe());
  std::vector<int64_t> dims(n);
  for (int64_t i = 0; i < n; ++i) dims[i] = i;
  std::swap(dims[d0 < 0 ? d0 + n : d0], dims[d1 < 0 ? d1 + n : d1]);
  return dims;
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) { return permute(x, transpose_dims(x, d0, d1)); }

}  // namespace ops
}  // namespace xt
