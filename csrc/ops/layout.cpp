// Layout ops: reshape (shares storage with its input, like view), permute and transpose (copies:
// storage stays contiguous row-major; the identity permutation is a plain clone). Backward is the
// inverse reshape/permutation; no Node saves a tensor.
#include "core/error.h"
#include "ops/dispatch.h"
#include "tape/node.h"

namespace xt {
namespace ops {

Tensor permute_forward(const Tensor& x, const std::vector<int64_t>& dims) {
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

namespace {

// Resolve one -1 in `want` against x's element count.
Shape resolve_shape(const Tensor& x, const Shape& want) {
  Shape out = want;
  int64_t infer = -1, known = 1;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] == -1) {
      XT_CHECK(infer < 0, ValueError, "reshape: only one dimension can be -1, got shape ", shape_str(want));
      infer = static_cast<int64_t>(i);
    } else {
      XT_CHECK(want[i] >= 0, ValueError, "reshape: invalid size ", want[i], " in shape ", shape_str(want));
      known *= want[i];
    }
  }
  if (infer >= 0) {
    XT_CHECK(known != 0 && x.numel() % known == 0, ValueError, "reshape: cannot reshape a tensor of shape ",
             shape_str(x.shape()), " (", x.numel(), " elements) into shape ", shape_str(want));
    out[infer] = x.numel() / known;
  }
  XT_CHECK(shape_numel(out) == x.numel(), ValueError, "reshape: cannot reshape a tensor of shape ",
           shape_str(x.shape()), " (", x.numel(), " elements) into shape ", shape_str(want), " (",
           shape_numel(out), " elements)");
  return out;
}

class ReshapeBackward : public Node {
 public:
  explicit ReshapeBackward(Shape in_shape) : in_shape_(std::move(in_shape)) {}
  const char* name() const override { return "ReshapeBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!grads[0].defined()) return {Tensor()};
    return {grads[0].view_as_shape(in_shape_)};
  }

 private:
  Shape in_shape_;
};

class PermuteBackward : public Node {
 public:
  explicit PermuteBackward(std::vector<int64_t> inverse) : inverse_(std::move(inverse)) {}
  const char* name() const override { return "PermuteBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!grads[0].defined()) return {Tensor()};
    return {permute_forward(grads[0], inverse_)};
  }

 private:
  std::vector<int64_t> inverse_;
};

}  // namespace

Tensor reshape(const Tensor& x, const Shape& shape) {
  check_defined(x, "x");
  Tensor out = x.view_as_shape(resolve_shape(x, shape));
  if (!needs_grad({&x})) return out;
  auto node = make_node<ReshapeBackward>({x}, x.shape());
  set_history(out, node);
  return out;
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  Tensor out = permute_forward(x, dims);  // validates dims
  if (!needs_grad({&x})) return out;
  const int64_t n = x.dim();
  std::vector<int64_t> inverse(n);
  for (int64_t i = 0; i < n; ++i) inverse[dims[i] < 0 ? dims[i] + n : dims[i]] = i;
  auto node = make_node<PermuteBackward>({x}, inverse);
  set_history(out, node);
  return out;
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) { return permute(x, transpose_dims(x, d0, d1)); }

}  // namespace ops
}  // namespace xt
