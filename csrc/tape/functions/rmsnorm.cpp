// rms_norm as a tape Function: y = x * rstd * w over the last dim (ops::rms_norm).
// Saves x and w (detached) and the float32 rstd; the backward returns dx in x's dtype and dw in
// w's dtype, both freshly written (the engine accumulates them into their leaves).
#include "ops/ops.h"
#include "tape/functions.h"
#include "tape/node.h"

namespace xt {
namespace tape {

namespace {

class RmsNormBackward : public Node {
 public:
  RmsNormBackward(Tensor x, Tensor w, Tensor rstd) : x_(std::move(x)), w_(std::move(w)), rstd_(std::move(rstd)) {}
  const char* name() const override { return "RmsNormBackward"; }

  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!grads[0].defined()) return {Tensor(), Tensor()};
    auto [dx, dw] = ops::rms_norm_backward(x_, w_, rstd_, grads[0]);
    return {dx, dw};
  }

  void release_saved() override {
    x_ = Tensor();
    w_ = Tensor();
    rstd_ = Tensor();
  }

 private:
  Tensor x_, w_, rstd_;
};

}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& w, double eps) {
  auto [y, rstd] = ops::rms_norm(x, w, eps);
  if (needs_grad({&x, &w})) set_history(y, make_node<RmsNormBackward>({x, w}, x.detach(), w.detach(), rstd));
  return y;
}

}  // namespace tape
}  // namespace xt
