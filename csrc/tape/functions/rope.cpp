// rope as a tape Function: rotate-half rotary embedding on x [B, S, H, D] (ops::rope).
// The rotation is orthogonal, so the backward is the same rotation by -angle (inverse = true)
// applied to the upstream gradient; only the positions are saved.
#include "ops/ops.h"
#include "tape/functions.h"
#include "tape/node.h"

namespace xt {
namespace tape {

namespace {

class RopeBackward : public Node {
 public:
  RopeBackward(Tensor positions, double theta) : positions_(std::move(positions)), theta_(theta) {}
  const char* name() const override { return "RopeBackward"; }

  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!grads[0].defined()) return {Tensor()};
    return {ops::rope(grads[0], positions_, theta_, /*inverse=*/true)};
  }

  void release_saved() override { positions_ = Tensor(); }

 private:
  Tensor positions_;  // undefined: 0..S-1
  double theta_;
};

}  // namespace

Tensor rope(const Tensor& x, const Tensor& positions, double theta) {
  Tensor out = ops::rope(x, positions, theta, /*inverse=*/false);
  if (needs_grad({&x}))
    set_history(out, make_node<RopeBackward>({x}, positions.defined() ? positions.detach() : Tensor(), theta));
  return out;
}

}  // namespace tape
}  // namespace xt
