// rope: the rotate-half rotary embedding on x [B, S, H, D], D even; positions int64 [S] on x's
// device, or undefined for 0..S-1. The rotation is orthogonal, so the backward is the same
// rotation by -angle (inverse = true) applied to the upstream gradient; the node saves only the
// positions.
#include <cmath>

#include "core/error.h"
#include "ops/dispatch.h"
#include "tape/node.h"

namespace xt {
namespace ops {

Tensor rope_forward(const Tensor& x, const Tensor& positions, double theta, bool inverse) {
  check_floating(x, "rope", "x");
  XT_CHECK(x.dim() == 4, ValueError, "rope: x must be [B, S, H, D] (4 dimensions), got ", x.describe());
  const int64_t B = x.size(0), S = x.size(1), H = x.size(2), D = x.size(3);
  XT_CHECK(D % 2 == 0, ValueError, "rope: the head dimension D must be even (rotate-half pairs i with i + D/2), got ",
           x.describe());
  XT_CHECK(std::isfinite(theta) && theta > 0, ValueError, "rope: theta must be finite and > 0, got ", theta);
  Tensor pos = positions;
  if (pos.defined()) {
    XT_CHECK(pos.dtype() == DType::Int64, TypeError, "rope: positions must be int64, got ", pos.describe());
    XT_CHECK(pos.dim() == 1 && pos.numel() == S, ValueError, "rope: positions must have shape [", S,
             "] (the S of x), got positions ", pos.describe(), " for x ", x.describe());
    check_same_device(x, pos, "rope", "x", "positions");
  } else {
    pos = arange(0.0, static_cast<double>(S), 1.0, DType::Int64, x.device());
  }
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (x.numel())
    XT_KERNEL(x.device(), rope, x.dtype(), x.data_ptr(), out.data_ptr(), pos.data<int64_t>(), B, S, H, D,
              static_cast<float>(theta), inverse, stream_for(x.device()));
  return out;
}

namespace {

class RopeBackward : public NodeWithSaved<1> {
 public:
  RopeBackward(const Tensor& positions, double theta)
      : NodeWithSaved({SavedTensor("positions", positions)}), theta_(theta) {}
  const char* name() const override { return "RopeBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!grads[0].defined()) return {Tensor()};
    const auto [positions] = unpack();  // undefined: 0..S-1
    return {rope_forward(grads[0], positions, theta_, /*inverse=*/true)};
  }

 private:
  double theta_;
};

}  // namespace

Tensor rope(const Tensor& x, const Tensor& positions, double theta) {
  Tensor out = rope_forward(x, positions, theta, /*inverse=*/false);
  if (needs_grad({&x})) set_history(out, make_node<RopeBackward>({x}, positions, theta));
  return out;
}

}  // namespace ops
}  // namespace xt
