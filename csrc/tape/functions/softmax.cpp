// softmax and log_softmax over the last dim as tape Functions (ops::softmax).
// Both save only their output y (detached): softmax' = y * (dy - sum(dy * y)),
// log_softmax' = dy - exp(y) * sum(dy).
#include "ops/ops.h"
#include "tape/functions.h"
#include "tape/node.h"

namespace xt {
namespace tape {

namespace {

class SoftmaxBackward : public Node {
 public:
  SoftmaxBackward(Tensor y, bool log) : y_(std::move(y)), log_(log) {}
  const char* name() const override { return log_ ? "LogSoftmaxBackward" : "SoftmaxBackward"; }

  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!grads[0].defined()) return {Tensor()};
    return {ops::softmax_backward(y_, grads[0], log_)};
  }

  void release_saved() override { y_ = Tensor(); }

 private:
  Tensor y_;
  bool log_;
};

Tensor softmax_impl(const Tensor& x, bool log) {
  Tensor y = ops::softmax(x, log);
  if (needs_grad({&x})) set_history(y, make_node<SoftmaxBackward>({x}, y.detach(), log));
  return y;
}

}  // namespace

Tensor softmax(const Tensor& x) { return softmax_impl(x, false); }
Tensor log_softmax(const Tensor& x) { return softmax_impl(x, true); }

}  // namespace tape
}  // namespace xt
