// Reductions: sum and mean over everything or over the last dimension (deterministic kernels).
//
// Backward broadcasts the (scaled, for mean) upstream gradient back over the reduced
// dimensions: zeros of the input's shape + g, one broadcasting add. The Node saves no tensor.
#include "core/error.h"
#include "ops/dispatch.h"
#include "tape/node.h"

namespace xt {
namespace ops {

Tensor sum_all(const Tensor& x) {
  check_floating(x, "sum", "x");
  Tensor out = Tensor::empty({}, x.dtype(), x.device());
  XT_KERNEL(x.device(), sum_all, x.dtype(), x.data_ptr(), out.data_ptr(), x.numel(), stream_for(x.device()));
  return out;
}

Tensor sum_lastdim(const Tensor& x, bool keepdim) {
  check_floating(x, "sum", "x");
  XT_CHECK(x.dim() >= 1, ValueError, "sum: cannot reduce the last dimension of a 0-dimensional tensor ",
           x.describe());
  const int64_t cols = x.shape().back();
  Shape shape = x.shape();
  if (keepdim) shape.back() = 1;
  else shape.pop_back();
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  const int64_t rows = out.numel();
  if (rows)
    XT_KERNEL(x.device(), sum_lastdim, x.dtype(), x.data_ptr(), out.data_ptr(), rows, cols, stream_for(x.device()));
  return out;
}

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
    if (divisor_ != 1.0) g = scalar_op(kernels::ScalarOp::Div, g, divisor_);
    Shape gshape;  // g's shape with the reduced dims kept as 1: broadcasts against in_shape_
    if (!all_) {
      gshape = in_shape_;
      gshape.back() = 1;
    }
    Tensor z = full(in_shape_, 0.0, g.dtype(), g.device());
    return {binary(kernels::BinaryOp::Add, z, g.view_as_shape(gshape))};
  }

 private:
  Shape in_shape_;
  bool all_;
  double divisor_;
  const char* name_;
};

Tensor reduce(const Tensor& x, bool all, bool keepdim, bool mean) {
  check_floating(x, mean ? "mean" : "sum", "x");
  Tensor out;
  double divisor = 1.0;
  if (all) {
    out = sum_all(x);
    if (keepdim) out = out.view_as_shape(Shape(x.dim(), 1));
    divisor = static_cast<double>(x.numel());
  } else {
    out = sum_lastdim(x, keepdim);
    divisor = static_cast<double>(x.shape().back());
  }
  if (mean) out = scalar_op(kernels::ScalarOp::Div, out, divisor);
  if (!needs_grad({&x})) return out;
  set_history(out, make_node<ReduceBackward>({x}, x.shape(), all, mean ? divisor : 1.0,
                                             mean ? "MeanBackward" : "SumBackward"));
  return out;
}

}  // namespace

Tensor sum(const Tensor& x, bool all, bool keepdim) { return reduce(x, all, keepdim, false); }
Tensor mean(const Tensor& x, bool all, bool keepdim) { return reduce(x, all, keepdim, true); }

}  // namespace ops
}  // namespace xt
