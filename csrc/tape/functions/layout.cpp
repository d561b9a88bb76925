// Differentiable shape ops: reshape (shares storage with its input, like view), transpose and
// permute (copies). Backward is the inverse reshape/permutation; no Node saves a tensor.
#include "core/error.h"
#include "ops/ops.h"
#include "tape/functions.h"
#include "tape/node.h"

namespace xt {
namespace tape {

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
    return {ops::permute(grads[0], inverse_)};
  }

 private:
  std::vector<int64_t> inverse_;
};

}  // namespace

Tensor reshape(const Tensor& x, const Shape& shape) {
  ops::check_defined(x, "x");
  Tensor out = x.view_as_shape(resolve_shape(x, shape));
  if (!needs_grad({&x})) return out;
  auto node = make_node<ReshapeBackward>({x}, x.shape());
  set_history(out, node);
  return out;
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  Tensor out = ops::permute(x, dims);  // validates dims
  if (!needs_grad({&x})) return out;
  const int64_t n = x.dim();
  std::vector<int64_t> inverse(n);
  for (int64_t i = 0; i < n; ++i) inverse[dims[i] < 0 ? dims[i] + n : dims[i]] = i;
  auto node = make_node<PermuteBackward>({x}, inverse);
  set_history(out, node);
  return out;
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) { return permute(x, ops::transpose_dims(x, d0, d1)); }

}  // namespace tape
}  // namespace xt
