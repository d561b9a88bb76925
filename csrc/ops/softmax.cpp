// softmax / log_softmax over the last dim. Both nodes save only the output y (both backwards
// are cheapest from it): softmax' = y * (dy - sum(dy * y)), log_softmax' = dy - exp(y) * sum(dy).
#include "core/error.h"
#include "ops/dispatch.h"
#include "tape/node.h"

namespace xt {
namespace ops {

namespace {
const char* op_name(bool log) { return log ? "log_softmax" : "softmax"; }
}  // namespace

Tensor softmax_forward(const Tensor& x, bool log) {
  check_floating(x, op_name(log), "x");
  XT_CHECK(x.dim() >= 1, ValueError, op_name(log), ": x must have at least 1 dimension, got ", x.describe());
  const int64_t cols = x.shape().back();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (x.numel())
    XT_KERNEL(x.device(), softmax_forward, x.dtype(), x.data_ptr(), y.data_ptr(), x.numel() / cols, cols, log,
              stream_for(x.device()));
  return y;
}

Tensor softmax_backward(const Tensor& y, const Tensor& dy, bool log) {
  check_floating(y, op_name(log), "y");
  check_defined(dy, "dy");
  XT_CHECK(y.dim() >= 1, ValueError, op_name(log), " backward: y must have at least 1 dimension, got ",
           y.describe());
  XT_CHECK(dy.shape() == y.shape() && dy.dtype() == y.dtype() && dy.device() == y.device(), ValueError,
           op_name(log), " backward: dy must match y, got dy ", dy.describe(), " for y ", y.describe());
  const int64_t cols = y.shape().back();
  Tensor dx = Tensor::empty(y.shape(), y.dtype(), y.device());
  if (y.numel())
    XT_KERNEL(y.device(), softmax_backward, y.dtype(), y.data_ptr(), dy.data_ptr(), dx.data_ptr(), y.numel() / cols,
              cols, log, stream_for(y.device()));
  return dx;
}

namespace {

class SoftmaxBackward : public NodeWithSaved<1> {
 public:
  SoftmaxBackward(const Tensor& y, bool log) : NodeWithSaved({SavedTensor("result", y)}), log_(log) {}
  const char* name() const override { return log_ ? "LogSoftmaxBackward" : "SoftmaxBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!grads[0].defined()) return {Tensor()};
    const auto [y] = unpack();
    return {softmax_backward(y, grads[0], log_)};
  }

 private:
  bool log_;
};

Tensor softmax_fn(const Tensor& x, bool log) {
  Tensor y = softmax_forward(x, log);
  if (needs_grad({&x})) set_history(y, make_node<SoftmaxBackward>({x}, y, log));
  return y;
}

}  // namespace

Tensor softmax(const Tensor& x) { return softmax_fn(x, false); }
Tensor log_softmax(const Tensor& x) { return softmax_fn(x, true); }

}  // namespace ops
}  // namespace xt
