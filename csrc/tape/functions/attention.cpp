// sdpa as a tape Function: scaled dot-product attention on q, k, v [B, H, S, D] (ops::sdpa).
// Saves q, k, v (detached) and the attention probabilities P [B, H, S, S]; the backward is five
// deterministic GEMMs around attn_softmax_backward (ops::sdpa_backward) and returns dq, dk, dv.
#include "ops/ops.h"
#include "tape/functions.h"
#include "tape/node.h"

namespace xt {
namespace tape {

namespace {

class SdpaBackward : public Node {
 public:
  SdpaBackward(Tensor q, Tensor k, Tensor v, Tensor probs, double scale)
      : q_(std::move(q)), k_(std::move(k)), v_(std::move(v)), probs_(std::move(probs)), scale_(scale) {}
  const char* name() const override { return "SdpaBackward"; }

  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!grads[0].defined()) return {Tensor(), Tensor(), Tensor()};
    return ops::sdpa_backward(q_, k_, v_, probs_, grads[0], scale_);
  }

  void release_saved() override {
    q_ = Tensor();
    k_ = Tensor();
    v_ = Tensor();
    probs_ = Tensor();
  }

 private:
  Tensor q_, k_, v_, probs_;
  double scale_;  // as given: <= 0 selects 1/sqrt(D) in ops, forward and backward alike
};

}  // namespace

Tensor sdpa(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale) {
  auto [out, probs] = ops::sdpa(q, k, v, causal, scale);
  if (needs_grad({&q, &k, &v}))
    set_history(out, make_node<SdpaBackward>({q, k, v}, q.detach(), k.detach(), v.detach(), probs, scale));
  return out;
}

}  // namespace tape
}  // namespace xt
