// Scaled dot-product attention on q, k, v [B, H, S, D], batched over B*H:
//   scores = q @ k^T                  (B*H, S, S)   one batched GEMM
//   P      = softmax(scale * scores + causal mask), in place over scores (masked P exactly 0)
//   out    = P @ v                    (B*H, S, D)   one batched GEMM
// Backward from the saved P:  dP = dO @ v^T,  dv = P^T @ dO,  dS = attn_softmax_backward(P, dP)
// (scale folded in),  dq = dS @ k,  dk = dS^T @ q. Every GEMM is deterministic, so dq needs no
// atomics. The S x S scores/probs live in the inputs' dtype (bf16 under mixed precision; the
// softmax itself computes in float32). The node saves q, k, v and P; scale is kept as given
// (<= 0 selects 1/sqrt(D), forward and backward alike).
#include <cmath>

#include "core/error.h"
#include "ops/dispatch.h"
#include "tape/node.h"

namespace xt {
namespace ops {

namespace {

void check_qkv(const Tensor& q, const Tensor& k, const Tensor& v, const char* op) {
  check_floating(q, op, "q");
  check_floating(k, op, "k");
  check_floating(v, op, "v");
  XT_CHECK(q.dim() == 4, ValueError, op, ": q must be [B, H, S, D] (4 dimensions), got ", q.describe());
  XT_CHECK(k.shape() == q.shape() && v.shape() == q.shape(), ValueError, op,
           ": q, k and v must have the same shape [B, H, S, D], got q ", q.describe(), ", k ", k.describe(), ", v ",
           v.describe());
  check_same_dtype(q, k, op, "q", "k");
  check_same_dtype(q, v, op, "q", "v");
  check_same_device(q, k, op, "q", "k");
  check_same_device(q, v, op, "q", "v");
}

// scale <= 0 selects the usual 1/sqrt(D).
float resolve_scale(double scale, int64_t D) {
  XT_CHECK(std::isfinite(scale), ValueError, "sdpa: scale must be finite, got ", scale);
  return static_cast<float>(scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(D)));
}

}  // namespace

std::pair<Tensor, Tensor> sdpa_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                       double scale) {
  check_qkv(q, k, v, "sdpa");
  const int64_t B = q.size(0), H = q.size(1), S = q.size(2), D = q.size(3);
  const int64_t BH = B * H;
  if (q.numel() == 0)  // nothing to attend over (or D == 0): empty/zero results, no kernels
    return {zeros(q.shape(), q.dtype(), q.device()), zeros({B, H, S, S}, q.dtype(), q.device())};
  const float sc = resolve_scale(scale, D);
  Tensor q3 = q.view_as_shape({BH, S, D});
  Tensor k3 = k.view_as_shape({BH, S, D});
  Tensor v3 = v.view_as_shape({BH, S, D});
  Tensor probs = matmul_forward(q3, k3, false, true);  // (BH, S, S) raw scores, then P in place
  XT_KERNEL(q.device(), attn_softmax_forward, q.dtype(), probs.data_ptr(), probs.data_ptr(), BH, S, sc, causal,
            stream_for(q.device()));
  Tensor out = matmul_forward(probs, v3);  // (BH, S, D)
  return {out.view_as_shape(q.shape()), probs.view_as_shape({B, H, S, S})};
}

std::vector<Tensor> sdpa_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& probs,
                                  const Tensor& dout, double scale) {
  check_qkv(q, k, v, "sdpa_backward");
  const int64_t B = q.size(0), H = q.size(1), S = q.size(2), D = q.size(3);
  const int64_t BH = B * H;
  check_defined(probs, "probs");
  check_defined(dout, "dout");
  XT_CHECK(dout.shape() == q.shape() && dout.dtype() == q.dtype() && dout.device() == q.device(), ValueError,
           "sdpa_backward: dout must match q, got dout ", dout.describe(), " for q ", q.describe());
  XT_CHECK(probs.shape() == Shape({B, H, S, S}) && probs.dtype() == q.dtype() && probs.device() == q.device(),
           ValueError, "sdpa_backward: probs must be [B, H, S, S] like q, got probs ", probs.describe(), " for q ",
           q.describe());
  if (q.numel() == 0)
    return {zeros(q.shape(), q.dtype(), q.device()), zeros(k.shape(), k.dtype(), k.device()),
            zeros(v.shape(), v.dtype(), v.device())};
  const float sc = resolve_scale(scale, D);
  Tensor q3 = q.view_as_shape({BH, S, D});
  Tensor k3 = k.view_as_shape({BH, S, D});
  Tensor v3 = v.view_as_shape({BH, S, D});
  Tensor p3 = probs.view_as_shape({BH, S, S});
  Tensor do3 = dout.view_as_shape({BH, S, D});
  Tensor dv = matmul_forward(p3, do3, true, false);  // P^T @ dO  (BH, S, D)
  Tensor ds = matmul_forward(do3, v3, false, true);  // dP = dO @ v^T (BH, S, S), then dS in place
  XT_KERNEL(q.device(), attn_softmax_backward, q.dtype(), p3.data_ptr(), ds.data_ptr(), ds.data_ptr(), BH, S, sc,
            stream_for(q.device()));
  Tensor dq = matmul_forward(ds, k3);               // dS @ k    (BH, S, D)
  Tensor dk = matmul_forward(ds, q3, true, false);  // dS^T @ q  (BH, S, D)
  return {dq.view_as_shape(q.shape()), dk.view_as_shape(k.shape()), dv.view_as_shape(v.shape())};
}

namespace {

class SdpaBackward : public NodeWithSaved<4> {
 public:
  SdpaBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& probs, double scale)
      : NodeWithSaved({SavedTensor("q", q), SavedTensor("k", k), SavedTensor("v", v), SavedTensor("probs", probs)}),
        scale_(scale) {}
  const char* name() const override { return "SdpaBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!grads[0].defined()) return {Tensor(), Tensor(), Tensor()};
    const auto [q, k, v, probs] = unpack();
    return sdpa_backward(q, k, v, probs, grads[0], scale_);
  }

 private:
  double scale_;
};

}  // namespace

Tensor sdpa(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale) {
  auto [out, probs] = sdpa_forward(q, k, v, causal, scale);
  if (needs_grad({&q, &k, &v})) set_history(out, make_node<SdpaBackward>({q, k, v}, q, k, v, probs, scale));
  return out;
}

}  // namespace ops
}  // namespace xt
