// Differentiable embedding: out = table[ids]. Backward scatters dout rows into a fresh dtable
// (deterministic order, see kernels embedding_backward); the Node saves the ids only.
#include "ops/ops.h"
#include "tape/functions.h"
#include "tape/node.h"

namespace xt {
namespace tape {

namespace {

class EmbeddingBackward : public Node {
 public:
  EmbeddingBackward(Tensor ids, int64_t vocab, DType dtype) : ids_(std::move(ids)), vocab_(vocab), dtype_(dtype) {}
  const char* name() const override { return "EmbeddingBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!grads[0].defined()) return {Tensor()};
    return {ops::embedding_backward(ids_, grads[0], vocab_, dtype_)};
  }
  void release_saved() override { ids_ = Tensor(); }

 private:
  Tensor ids_;
  int64_t vocab_;
  DType dtype_;
};

}  // namespace

Tensor embedding(const Tensor& table, const Tensor& ids) {
  Tensor out = ops::embedding(table, ids);
  if (!needs_grad({&table})) return out;
  auto node = make_node<EmbeddingBackward>({table}, ids.detach(), table.size(0), table.dtype());
  set_history(out, node);
  return out;
}

}  // namespace tape
}  // namespace xt
