// Differentiable reductions: sum and mean, over all elements or over the last dimension.
//
// Backward broadcasts the (scaled, for mean) upstream gradient back over the reduced
// dimensions: zeros of the input's shape + g, one broadcasting add. The Node saves no tensor.
#include "core/error.h"
#include "ops/ops.h"
#include "tape/functions.h"
#include "tape/node.h"

namespace xt {
namespace tape {

namespace {

class ReduceBackward : public Node {
 public:
  // divisor: 1 for sum, the number of elements reduced per output for mean.
  ReduceBackward(Shape in_shape, bool all, double divisor, const char* name)
      : in_shape_(std::move(in_shape)), all_(all), divisor_(divisor), name_(name) {}
  const char* name() const override { return name_; }

  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    Tensor g = grads[0];
    if (!g.defined()) return {Tensor()};
    if (divisor_ != 1.0) g = ops::scalar_op(kernels::ScalarOp::Div, g, divisor_);
    Shape gshape;  // g's shape with the reduced dims kept as 1: broadcasts against in_shape_
    if (!all_) {
      gshape = in_shape_;
      gshape.back() = 1;
    }
    Tensor zeros = ops::full(in_shape_, 0.0, g.dtype(), g.device());
    return {ops::binary(kernels::BinaryOp::Add, zeros, g.view_as_shape(gshape))};
  }

 private:
  Shape in_shape_;
  bool all_;
  double divisor_;
  const char* name_;
};

Tensor reduce(const Tensor& x, bool all, bool keepdim, bool mean) {
  ops::check_floating(x, mean ? "mean" : "sum", "x");
  Tensor out;
  double divisor = 1.0;
  if (all) {
    out = ops::sum_all(x);
    if (keepdim) out = out.view_as_shape(Shape(x.dim(), 1));
    divisor = static_cast<double>(x.numel());
  } else {
    out = ops::sum_lastdim(x, keepdim);
    divisor = static_cast<double>(x.shape().back());
  }
  if (mean) out = ops::scalar_op(kernels::ScalarOp::Div, out, divisor);
  if (!needs_grad({&x})) return out;
  auto node = make_node<ReduceBackward>({x}, x.shape(), all, mean ? divisor : 1.0,
                                        mean ? "MeanBackward" : "SumBackward");
  set_history(out, node);
  return out;
}

}  // namespace

Tensor sum(const Tensor& x, bool all, bool keepdim) { return reduce(x, all, keepdim, false); }
Tensor mean(const Tensor& x, bool all, bool keepdim) { return reduce(x, all, keepdim, true); }

}  // namespace tape
}  // namespace xt
