// rms_norm over the last dim: y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps). y has x's dtype
// and shape; w is [D], in x's dtype or float32. The node saves x, w and the float32 rstd [rows];
// the backward returns dx in x's dtype and dw in w's dtype, both freshly written (the engine
// accumulates them into their leaves).
#include <cmath>

#include "core/error.h"
#include "ops/dispatch.h"
#include "tape/node.h"

namespace xt {
namespace ops {

namespace {

void check_weight(const Tensor& x, const Tensor& w, const char* op) {
  check_floating(x, op, "x");
  check_floating(w, op, "weight");
  check_same_device(x, w, op, "x", "weight");
  XT_CHECK(x.dim() >= 1, ValueError, op, ": x must have at least 1 dimension, got ", x.describe());
  const int64_t D = x.shape().back();
  XT_CHECK(D >= 1, ValueError, op, ": the last dimension of x must be non-empty, got ", x.describe());
  XT_CHECK(w.dim() == 1 && w.numel() == D, ValueError, op, ": weight must have shape [", D,
           "] (the last dimension of x), got weight ", w.describe(), " for x ", x.describe());
  XT_CHECK(w.dtype() == x.dtype() || w.dtype() == DType::Float32, TypeError, op,
           ": weight must be float32 or x's dtype, got weight ", w.describe(), " for x ", x.describe());
}

}  // namespace

std::pair<Tensor, Tensor> rms_norm_forward(const Tensor& x, const Tensor& w, double eps) {
  check_weight(x, w, "rms_norm");
  XT_CHECK(std::isfinite(eps) && eps >= 0, ValueError, "rms_norm: eps must be finite and >= 0, got ", eps);
  const int64_t D = x.shape().back();
  const int64_t rows = x.numel() / D;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor rstd = Tensor::empty({rows}, DType::Float32, x.device());
  if (rows)
    XT_KERNEL(x.device(), rmsnorm_forward, x.dtype(), w.dtype(), x.data_ptr(), w.data_ptr(), y.data_ptr(),
              rstd.data<float>(), rows, D, static_cast<float>(eps), stream_for(x.device()));
  return {y, rstd};
}

std::pair<Tensor, Tensor> rms_norm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy) {
  check_weight(x, w, "rms_norm_backward");
  const int64_t D = x.shape().back();
  const int64_t rows = x.numel() / D;
  check_defined(dy, "dy");
  check_defined(rstd, "rstd");
  XT_CHECK(dy.shape() == x.shape() && dy.dtype() == x.dtype() && dy.device() == x.device(), ValueError,
           "rms_norm_backward: dy must match x, got dy ", dy.describe(), " for x ", x.describe());
  XT_CHECK(rstd.dtype() == DType::Float32 && rstd.numel() == rows && rstd.device() == x.device(), ValueError,
           "rms_norm_backward: rstd must be float32 with ", rows, " elements on ", x.device().str(), ", got ",
           rstd.describe());
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (rows == 0) return {dx, zeros(w.shape(), w.dtype(), w.device())};  // dw: a sum over no rows
  Tensor dw = Tensor::empty(w.shape(), w.dtype(), w.device());
  XT_KERNEL(x.device(), rmsnorm_backward, x.dtype(), w.dtype(), x.data_ptr(), w.data_ptr(), rstd.data<float>(),
            dy.data_ptr(), dx.data_ptr(), dw.data_ptr(), rows, D, stream_for(x.device()));
  return {dx, dw};
}

namespace {

class RmsNormBackward : public NodeWithSaved<3> {
 public:
  RmsNormBackward(const Tensor& x, const Tensor& w, const Tensor& rstd)
      : NodeWithSaved({SavedTensor("x", x), SavedTensor("weight", w), SavedTensor("rstd", rstd)}) {}
  const char* name() const override { return "RmsNormBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!grads[0].defined()) return {Tensor(), Tensor()};
    const auto [x, w, rstd] = unpack();
    auto [dx, dw] = rms_norm_backward(x, w, rstd, grads[0]);
    return {dx, dw};
  }
};

}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& w, double eps) {
  auto [y, rstd] = rms_norm_forward(x, w, eps);
  if (needs_grad({&x, &w})) set_history(y, make_node<RmsNormBackward>({x, w}, x, w, rstd));
  return y;
}

}  // namespace ops
}  // namespace xt
