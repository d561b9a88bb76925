// cross_entropy as a tape Function: mean cross-entropy of logits [N, V] against int targets [N],
// ignoring rows whose target is ignore_index (ops::cross_entropy). The loss is a float32 scalar
// (shape []) whatever the logits' dtype. Saves logits (detached), targets, the per-row lse and
// the count of non-ignored rows; the backward recomputes the softmax and returns dlogits in the
// logits' dtype.
#include "ops/ops.h"
#include "tape/functions.h"
#include "tape/node.h"

namespace xt {
namespace tape {

namespace {

class CrossEntropyBackward : public Node {
 public:
  CrossEntropyBackward(Tensor logits, Tensor targets, Tensor lse, Tensor count, int64_t ignore_index)
      : logits_(std::move(logits)), targets_(std::move(targets)), lse_(std::move(lse)), count_(std::move(count)),
        ignore_index_(ignore_index) {}
  const char* name() const override { return "CrossEntropyBackward"; }

  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!grads[0].defined()) return {Tensor()};
    return {ops::cross_entropy_backward(logits_, lse_, targets_, grads[0], count_, ignore_index_)};
  }

  void release_saved() override {
    logits_ = Tensor();
    targets_ = Tensor();
    lse_ = Tensor();
    count_ = Tensor();
  }

 private:
  Tensor logits_, targets_, lse_, count_;
  int64_t ignore_index_;
};

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  std::vector<Tensor> r = ops::cross_entropy(logits, targets, ignore_index);  // loss, lse, count
  Tensor loss = r[0];
  if (needs_grad({&logits}))
    set_history(loss, make_node<CrossEntropyBackward>({logits}, logits.detach(), targets.detach(), r[1], r[2],
                                                      ignore_index));
  return loss;
}

}  // namespace tape
}  // namespace xt
