// cross_entropy as a tape Function: mean cross-entropy of logits [N, V] against int targets [N],
// ignoring rows whose target is ignore_index (ops::cross_entropy). The loss is a float32 scalar
// (shape []) whatever the logits' dtype. Saves logits (detached), targets, the per-row lse and
// the count of non-ignored rows; the backward recomputes the softmax and returns dlogits in the
// logits' dtype.
//
// linear_cross_entropy fuses the head: loss = cross_entropy(x @ w^T, targets) without a [N, V]
// logits tensor of its own (ops::linear_cross_entropy keeps them in a buffer with a padded row
// stride). It saves that buffer, x (when w needs grad), w (when x needs grad), targets, lse and
// count; its backward overwrites the buffer with dlogits in place (the Node runs once: the engine
// refuses a second backward through a released graph) and returns dx, dw in x's/w's dtype.
#include "ops/ops.h"
#include "tape/functions.h"
#include "tape/node.h"

namespace xt {
namespace tape {

namespace {

bool wants(const Node& n, size_t i) { return i < n.next_edges.size() && n.next_edges[i].valid(); }

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

class LinearCrossEntropyBackward : public Node {
 public:
  LinearCrossEntropyBackward(Tensor buf, int64_t vocab, Tensor x, Tensor w, Tensor targets, Tensor lse, Tensor count,
                             int64_t ignore_index)
      : buf_(std::move(buf)), x_(std::move(x)), w_(std::move(w)), targets_(std::move(targets)), lse_(std::move(lse)),
        count_(std::move(count)), vocab_(vocab), ignore_index_(ignore_index) {}
  const char* name() const override { return "LinearCrossEntropyBackward"; }

  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    std::vector<Tensor> out(2);
    if (!grads[0].defined()) return out;
    // dlogits overwrite the saved logits buffer (in place), then dx and dw.
    auto [dx, dw] = ops::linear_cross_entropy_backward(buf_, vocab_, wants(*this, 1) ? x_ : Tensor(),
                                                       wants(*this, 0) ? w_ : Tensor(), lse_, targets_, grads[0],
                                                       count_, ignore_index_);
    out[0] = std::move(dx);
    out[1] = std::move(dw);
    return out;
  }

  void release_saved() override {
    buf_ = Tensor();
    x_ = Tensor();
    w_ = Tensor();
    targets_ = Tensor();
    lse_ = Tensor();
    count_ = Tensor();
  }

 private:
  Tensor buf_, x_, w_, targets_, lse_, count_;  // x kept only when w needs grad, w only when x does
  int64_t vocab_, ignore_index_;
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

std::pair<Tensor, Tensor> linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& targets,
                                               int64_t ignore_index, bool return_logits) {
  // loss, lse, count, logits buffer, the weight the GEMMs used (w, or w with zero rows to ld on CUDA)
  std::vector<Tensor> r = ops::linear_cross_entropy(x, w, targets, ignore_index);
  Tensor loss = r[0];
  const int64_t vocab = w.size(0);
  // The copy is made before backward can overwrite the buffer with dlogits.
  Tensor logits = return_logits ? ops::logits_from_buffer(r[3], vocab) : Tensor();
  if (needs_grad({&x, &w}))
    set_history(loss, make_node<LinearCrossEntropyBackward>({x, w}, r[3], vocab,
                                                            w.requires_grad() ? x.detach() : Tensor(),
                                                            x.requires_grad() ? r[4].detach() : Tensor(),
                                                            targets.detach(), r[1], r[2], ignore_index));
  return {loss, logits};
}

}  // namespace tape
}  // namespace xt
