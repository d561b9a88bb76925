// layer_norm over the last dim: y = (x - mean) * rstd * w + b, rstd = 1/sqrt(var + eps) (biased
// variance, as torch.nn.LayerNorm). y has x's dtype and shape; w and b are [D], both in x's dtype
// or both float32. The node saves x, w and the row statistics mean, rstd [rows] (float32; float64
// for float64 x); the backward returns dx in x's dtype and dw, db in w's dtype, freshly written
// (dw, db straight into the leaves' gradient slots when free: claim_grad_buffer).
// add_layer_norm(x, r, w, b) -> (h = x + r, y = layer_norm(h, w, b)) in one kernel each way (the
// residual add before a GPT-2 block's norm). Bitwise add followed by layer_norm, forward and
// backward: h is rounded before the norm reads it, and the backward rounds the norm's dx before
// adding h's own gradient (the add the engine would make). The node saves h, w, mean, rstd.
#include <cmath>

#include "core/error.h"
#include "ops/dispatch.h"
#include "tape/node.h"

namespace xt {
namespace ops {

namespace {

void check_affine(const Tensor& x, const Tensor& w, const Tensor& b, const char* op) {
  check_defined(x, "x");
  check_defined(w, "weight");
  check_defined(b, "bias");
  check_floating(x, op, "x");
  check_floating(w, op, "weight");
  check_floating(b, op, "bias");
  check_same_device(x, w, op, "x", "weight");
  check_same_device(x, b, op, "x", "bias");
  XT_CHECK(x.dim() >= 1, ValueError, op, ": x must have at least 1 dimension, got ", x.describe());
  const int64_t D = x.shape().back();
  XT_CHECK(D >= 1, ValueError, op, ": the last dimension of x must be non-empty, got ", x.describe());
  XT_CHECK(w.dim() == 1 && w.numel() == D, ValueError, op, ": weight must have shape [", D,
           "] (the last dimension of x), got weight ", w.describe(), " for x ", x.describe());
  XT_CHECK(b.dim() == 1 && b.numel() == D, ValueError, op, ": bias must have shape [", D,
           "] (the last dimension of x), got bias ", b.describe(), " for x ", x.describe());
  XT_CHECK(w.dtype() == x.dtype() || w.dtype() == DType::Float32, TypeError, op,
           ": weight must be float32 or x's dtype, got weight ", w.describe(), " for x ", x.describe());
  XT_CHECK(b.dtype() == w.dtype(), TypeError, op, ": bias must have weight's dtype, got bias ", b.describe(),
           " and weight ", w.describe());
}

void check_eps(double eps, const char* op) {
  XT_CHECK(std::isfinite(eps) && eps >= 0, ValueError, op, ": eps must be finite and >= 0, got ", eps);
}

DType stat_dtype(DType dt) { return dt == DType::Float64 ? DType::Float64 : DType::Float32; }

// The forward of both ops: r undefined for layer_norm (h is then x, not written).
std::vector<Tensor> forward_any(const Tensor& x, const Tensor& r, const Tensor& w, const Tensor& b, double eps,
                                const char* op) {
  check_affine(x, w, b, op);
  check_eps(eps, op);
  if (r.defined())
    XT_CHECK(r.shape() == x.shape() && r.dtype() == x.dtype() && r.device() == x.device(), ValueError, op,
             ": residual must match x (shape, dtype, device), got residual ", r.describe(), " for x ", x.describe());
  const int64_t D = x.shape().back();
  const int64_t rows = x.numel() / D;
  Tensor h = r.defined() ? Tensor::empty(x.shape(), x.dtype(), x.device()) : x;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor mean = Tensor::empty({rows}, stat_dtype(x.dtype()), x.device());
  Tensor rstd = Tensor::empty({rows}, stat_dtype(x.dtype()), x.device());
  if (rows)
    XT_KERNEL(x.device(), layernorm_forward, x.dtype(), w.dtype(), x.data_ptr(), r.defined() ? r.data_ptr() : nullptr,
              w.data_ptr(), b.data_ptr(), r.defined() ? h.data_ptr() : nullptr, y.data_ptr(), mean.data_ptr(),
              rstd.data_ptr(), rows, D, static_cast<float>(eps), stream_for(x.device()));
  return {h, y, mean, rstd};
}

// layer_norm_backward writing dw and db into the given tensors when defined (claimed slots).
std::vector<Tensor> backward_into(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                                  const Tensor& dy, const Tensor& dres, Tensor dw, Tensor db) {
  const char* op = "layer_norm_backward";
  check_defined(x, "x");
  check_defined(w, "weight");
  check_floating(x, op, "x");
  check_floating(w, op, "weight");
  XT_CHECK(x.dim() >= 1 && x.shape().back() >= 1 && w.dim() == 1 && w.numel() == x.shape().back(), ValueError, op,
           ": weight ", w.describe(), " must be [D] for x ", x.describe());
  XT_CHECK(w.dtype() == x.dtype() || w.dtype() == DType::Float32, TypeError, op,
           ": weight must be float32 or x's dtype, got weight ", w.describe(), " for x ", x.describe());
  check_same_device(x, w, op, "x", "weight");
  const int64_t D = x.shape().back();
  const int64_t rows = x.numel() / D;
  check_defined(dy, "dy");
  check_defined(mean, "mean");
  check_defined(rstd, "rstd");
  XT_CHECK(dy.shape() == x.shape() && dy.dtype() == x.dtype() && dy.device() == x.device(), ValueError, op,
           ": dy must match x, got dy ", dy.describe(), " for x ", x.describe());
  for (const Tensor* s : {&mean, &rstd})
    XT_CHECK(s->dtype() == stat_dtype(x.dtype()) && s->numel() == rows && s->device() == x.device(), ValueError, op,
             ": mean and rstd must be ", dtype_name(stat_dtype(x.dtype())), " with ", rows, " elements on ",
             x.device().str(), ", got ", s->describe());
  XT_CHECK(!dres.defined() || (dres.shape() == x.shape() && dres.dtype() == x.dtype() && dres.device() == x.device()),
           ValueError, op, ": dres must match x, got dres ", dres.describe(), " for x ", x.describe());
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (rows == 0)  // dw, db: sums over no rows
    return {dx, zeros(w.shape(), w.dtype(), w.device()), zeros(w.shape(), w.dtype(), w.device())};
  if (!dw.defined()) dw = Tensor::empty(w.shape(), w.dtype(), w.device());
  if (!db.defined()) db = Tensor::empty(w.shape(), w.dtype(), w.device());
  XT_KERNEL(x.device(), layernorm_backward, x.dtype(), w.dtype(), x.data_ptr(), w.data_ptr(), mean.data_ptr(),
            rstd.data_ptr(), dy.data_ptr(), dres.defined() ? dres.data_ptr() : nullptr, dx.data_ptr(), dw.data_ptr(),
            db.data_ptr(), rows, D, stream_for(x.device()));
  return {dx, dw, db};
}

}  // namespace

std::vector<Tensor> layer_norm_forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  std::vector<Tensor> out = forward_any(x, Tensor(), w, b, eps, "layer_norm");
  return {out[1], out[2], out[3]};
}

std::vector<Tensor> add_layer_norm_forward(const Tensor& x, const Tensor& r, const Tensor& w, const Tensor& b,
                                           double eps) {
  check_defined(r, "residual");
  check_floating(r, "add_layer_norm", "residual");
  return forward_any(x, r, w, b, eps, "add_layer_norm");
}

std::vector<Tensor> layer_norm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                                        const Tensor& dy, const Tensor& dres) {
  return backward_into(x, w, mean, rstd, dy, dres, Tensor(), Tensor());
}

namespace {

class LayerNormBackward : public NodeWithSaved<4> {
 public:
  LayerNormBackward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd)
      : NodeWithSaved({SavedTensor("x", x), SavedTensor("weight", w), SavedTensor("mean", mean),
                       SavedTensor("rstd", rstd)}) {}
  const char* name() const override { return "LayerNormBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!grads[0].defined()) return {Tensor(), Tensor(), Tensor()};
    const auto [x, w, mean, rstd] = unpack();
    return backward_into(x, w, mean, rstd, grads[0], Tensor(),
                         claim_grad_buffer(next_edges[1], w.shape(), w.dtype(), w.device()),
                         claim_grad_buffer(next_edges[2], w.shape(), w.dtype(), w.device()));
  }
};

// Outputs: 0 = h (x + r), 1 = y (the norm). Inputs: x, r, w, b.
class AddLayerNormBackward : public NodeWithSaved<4> {
 public:
  AddLayerNormBackward(const Tensor& h, const Tensor& w, const Tensor& mean, const Tensor& rstd)
      : NodeWithSaved({SavedTensor("h", h), SavedTensor("weight", w), SavedTensor("mean", mean),
                       SavedTensor("rstd", rstd)}) {}
  const char* name() const override { return "AddLayerNormBackward"; }
  uint32_t num_outputs() const override { return 2; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& dh = grads[0];
    const Tensor& dy = grads[1];
    if (!dy.defined()) return {dh, dh, Tensor(), Tensor()};  // only h was used: the add's backward
    const auto [h, w, mean, rstd] = unpack();
    std::vector<Tensor> g = backward_into(h, w, mean, rstd, dy, dh,
                                          claim_grad_buffer(next_edges[2], w.shape(), w.dtype(), w.device()),
                                          claim_grad_buffer(next_edges[3], w.shape(), w.dtype(), w.device()));
    return {g[0], g[0], g[1], g[2]};  // gradients are never written in place, so x and r may share one
  }
};

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  std::vector<Tensor> out = forward_any(x, Tensor(), w, b, eps, "layer_norm");
  if (needs_grad({&x, &w, &b})) set_history(out[1], make_node<LayerNormBackward>({x, w, b}, x, w, out[2], out[3]));
  return out[1];
}

std::pair<Tensor, Tensor> add_layer_norm(const Tensor& x, const Tensor& r, const Tensor& w, const Tensor& b,
                                         double eps) {
  check_defined(r, "residual");
  check_floating(r, "add_layer_norm", "residual");
  std::vector<Tensor> out = forward_any(x, r, w, b, eps, "add_layer_norm");
  if (needs_grad({&x, &r, &w, &b})) {
    auto node = make_node<AddLayerNormBackward>({x, r, w, b}, out[0], w, out[2], out[3]);
    set_history(out[0], node, 0);
    set_history(out[1], node, 1);
  }
  return {out[0], out[1]};
}

}  // namespace ops
}  // namespace xt
