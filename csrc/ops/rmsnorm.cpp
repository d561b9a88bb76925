// rms_norm over the last dim: y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps). y has x's dtype
// and shape; w is [D], in x's dtype or float32. The node saves x, w and the float32 rstd [rows];
// the backward returns dx in x's dtype and dw in w's dtype, both freshly written (the engine
// accumulates them into their leaves); dw goes straight into w's gradient slot when the leaf has
// one free (claim_grad_buffer: the parameter store's flat gradients), which saves the copy.
// add_rms_norm(x, r, w) -> (h = x + r, y = rms_norm(h, w)) in one kernel each way (the residual add
// before a block's norm). Bitwise add followed by rms_norm, forward and backward: h is rounded
// before the norm reads it, and the backward rounds the norm's dx before adding h's own gradient
// (the add the engine would make), so recompute may run either form. The node saves h, w, rstd.
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

std::pair<Tensor, Tensor> add_rms_norm_forward(const Tensor& x, const Tensor& r, const Tensor& w, double eps,
                                               Tensor* rstd_out) {
  check_weight(x, w, "add_rms_norm");
  check_floating(r, "add_rms_norm", "residual");
  XT_CHECK(r.shape() == x.shape() && r.dtype() == x.dtype() && r.device() == x.device(), ValueError,
           "add_rms_norm: residual must match x (shape, dtype, device), got residual ", r.describe(), " for x ",
           x.describe());
  XT_CHECK(std::isfinite(eps) && eps >= 0, ValueError, "add_rms_norm: eps must be finite and >= 0, got ", eps);
  const int64_t D = x.shape().back();
  const int64_t rows = x.numel() / D;
  Tensor h = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor rstd = Tensor::empty({rows}, DType::Float32, x.device());
  if (rows)
    XT_KERNEL(x.device(), add_rmsnorm_forward, x.dtype(), w.dtype(), x.data_ptr(), r.data_ptr(), w.data_ptr(),
              h.data_ptr(), y.data_ptr(), rstd.data<float>(), rows, D, static_cast<float>(eps), stream_for(x.device()));
  if (rstd_out) *rstd_out = rstd;
  return {h, y};
}

namespace {

// rms_norm_backward writing dw into `dw` when it is defined (a claimed gradient slot).
std::pair<Tensor, Tensor> rms_norm_backward_into(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                                                 const Tensor& dres, Tensor dw) {
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
  XT_CHECK(!dres.defined() || (dres.shape() == x.shape() && dres.dtype() == x.dtype() && dres.device() == x.device()),
           ValueError, "rms_norm_backward: dres must match x, got dres ", dres.describe(), " for x ", x.describe());
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (rows == 0) return {dx, zeros(w.shape(), w.dtype(), w.device())};  // dw: a sum over no rows
  if (!dw.defined()) dw = Tensor::empty(w.shape(), w.dtype(), w.device());
  if (dres.defined())
    XT_KERNEL(x.device(), add_rmsnorm_backward, x.dtype(), w.dtype(), x.data_ptr(), w.data_ptr(), rstd.data<float>(),
              dy.data_ptr(), dres.data_ptr(), dx.data_ptr(), dw.data_ptr(), rows, D, stream_for(x.device()));
  else
    XT_KERNEL(x.device(), rmsnorm_backward, x.dtype(), w.dtype(), x.data_ptr(), w.data_ptr(), rstd.data<float>(),
              dy.data_ptr(), dx.data_ptr(), dw.data_ptr(), rows, D, stream_for(x.device()));
  return {dx, dw};
}

}  // namespace

std::pair<Tensor, Tensor> rms_norm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                                            const Tensor& dres, const Tensor& dw_into) {
  return rms_norm_backward_into(x, w, rstd, dy, dres, dw_into);
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
    auto [dx, dw] = rms_norm_backward_into(x, w, rstd, grads[0], Tensor(),
                                           claim_grad_buffer(next_edges[1], w.shape(), w.dtype(), w.device()));
    return {dx, dw};
  }
};

// Outputs: 0 = h (x + r), 1 = y (the norm). Inputs: x, r, w.
class AddRmsNormBackward : public NodeWithSaved<3> {
 public:
  AddRmsNormBackward(const Tensor& h, const Tensor& w, const Tensor& rstd)
      : NodeWithSaved({SavedTensor("h", h), SavedTensor("weight", w), SavedTensor("rstd", rstd)}) {}
  const char* name() const override { return "AddRmsNormBackward"; }
  uint32_t num_outputs() const override { return 2; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& dh = grads[0];
    const Tensor& dy = grads[1];
    if (!dy.defined()) return {dh, dh, Tensor()};  // only h was used: the add's backward
    const auto [h, w, rstd] = unpack();
    auto [dsum, dw] = rms_norm_backward_into(h, w, rstd, dy, dh,
                                             claim_grad_buffer(next_edges[2], w.shape(), w.dtype(), w.device()));
    return {dsum, dsum, dw};  // gradients are never written in place, so x and r may share one
  }
};

}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& w, double eps) {
  auto [y, rstd] = rms_norm_forward(x, w, eps);
  if (needs_grad({&x, &w})) set_history(y, make_node<RmsNormBackward>({x, w}, x, w, rstd));
  return y;
}

std::pair<Tensor, Tensor> add_rms_norm(const Tensor& x, const Tensor& r, const Tensor& w, double eps) {
  Tensor rstd;
  auto [h, y] = add_rms_norm_forward(x, r, w, eps, &rstd);
  if (needs_grad({&x, &r, &w})) {
    auto node = make_node<AddRmsNormBackward>({x, r, w}, h, w, rstd);
    set_history(h, node, 0);
    set_history(y, node, 1);
  }
  return {h, y};
}

}  // namespace ops
}  // namespace xt
