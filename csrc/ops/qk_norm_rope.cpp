// The fused q/k head preparation on tensors in the (B, S, heads, D) layout that the projection
// GEMMs write: argument checks, dispatch to kernels/{cpu,cuda}/qk_norm_rope, the backward node and
// the differentiable op.
//
//  - qk_norm_rope(q, k, wq, wk) is rms_norm over D then rope (positions 0..S-1, or rope's [S] or
//    [B, S] positions; theta with or without Llama 3's scaling) for q and k in one kernel, bitwise
//    equal to ops::rms_norm followed by ops::rope on the same device. The node saves q, k, the
//    weights, the float32 rstd rows and the positions; backward returns dq, dk, dwq, dwk (dwq,
//    dwk straight into the weights' gradient slots when the leaves have them free:
//    claim_grad_buffer, the parameter store's flat gradients; no copy afterwards).
//  - qk_norm_rope_attention(q, k, v, wq, wk, ...) is flash_attention(qk_norm_rope(q, k), v): the
//    same kernels, bitwise, with one node that keeps q and k as they came (views of the projections'
//    buffer, which v keeps alive anyway) and not the normed, rotated pair flash attention reads; its
//    backward recomputes that pair (Note [Attention's q and k recomputed]).
#include <cmath>

#include "core/error.h"
#include "ops/dispatch.h"
#include "tape/node.h"

namespace xt {
namespace ops {

namespace {

void check_qk(const Tensor& q, const Tensor& k, const Tensor& wq, const Tensor& wk) {
  const char* op = "qk_norm_rope";
  check_floating(q, op, "q");
  check_floating(k, op, "k");
  XT_CHECK(q.dim() == 4, ValueError, op, ": q must be [B, S, H, D] (4 dimensions), got ", q.describe());
  XT_CHECK(k.dim() == 4, ValueError, op, ": k must be [B, S, H_kv, D] (4 dimensions), got ", k.describe());
  XT_CHECK(k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == q.size(3), ValueError, op,
           ": q [B, S, H, D] and k [B, S, H_kv, D] must agree in B, S and D, got q ", q.describe(), ", k ",
           k.describe());
  XT_CHECK(q.size(3) % 2 == 0, ValueError, op,
           ": the head dimension D must be even (rotate-half pairs i with i + D/2), got q ", q.describe());
  check_same_dtype(q, k, op, "q", "k");
  check_same_device(q, k, op, "q", "k");
  check_head_norm_weight(wq, q, q.size(3), op, "q_norm_weight");
  check_head_norm_weight(wk, q, q.size(3), op, "k_norm_weight");
  check_same_dtype(wq, wk, op, "q_norm_weight", "k_norm_weight");
}

}  // namespace

std::vector<Tensor> qk_norm_rope_forward(const Tensor& q, const Tensor& k, const Tensor& wq, const Tensor& wk,
                                         double eps, const kernels::RopeFreqs& freqs, const Tensor& positions) {
  check_qk(q, k, wq, wk);
  XT_CHECK(std::isfinite(eps) && eps >= 0, ValueError, "qk_norm_rope: eps must be finite and >= 0, got ", eps);
  const kernels::RopePositions pos = rope_positions(positions, q, "qk_norm_rope");
  const int64_t B = q.size(0), S = q.size(1), H = q.size(2), Hkv = k.size(2), D = q.size(3);
  Tensor q_out = Tensor::empty(q.shape(), q.dtype(), q.device());
  Tensor k_out = Tensor::empty(k.shape(), k.dtype(), k.device());
  Tensor rstd_q = Tensor::empty({B * S * H}, DType::Float32, q.device());
  Tensor rstd_k = Tensor::empty({B * S * Hkv}, DType::Float32, q.device());
  if (q.numel() + k.numel() > 0)
    XT_KERNEL(q.device(), qk_norm_rope_forward, q.dtype(), wq.dtype(), q.data_ptr(), k.data_ptr(), wq.data_ptr(),
              wk.data_ptr(), q_out.data_ptr(), k_out.data_ptr(), rstd_q.data<float>(), rstd_k.data<float>(), B, S, H,
              Hkv, D, static_cast<float>(eps), freqs, pos, stream_for(q.device()));
  return {q_out, k_out, rstd_q, rstd_k};
}

namespace {

// qk_norm_rope_backward writing dwq, dwk into dwq_into, dwk_into when defined (claimed slots).
std::vector<Tensor> qk_norm_rope_backward_into(const Tensor& q, const Tensor& k, const Tensor& wq, const Tensor& wk,
                                               const Tensor& rstd_q, const Tensor& rstd_k, const Tensor& dq_out,
                                               const Tensor& dk_out, const kernels::RopeFreqs& freqs,
                                               const Tensor& positions, const Tensor& dwq_into,
                                               const Tensor& dwk_into) {
  check_qk(q, k, wq, wk);
  const char* op = "qk_norm_rope_backward";
  const kernels::RopePositions pos = rope_positions(positions, q, op);
  const int64_t B = q.size(0), S = q.size(1), D = q.size(3);
  const bool do_q = dq_out.defined(), do_k = dk_out.defined();
  const int64_t H = do_q ? q.size(2) : 0, Hkv = do_k ? k.size(2) : 0;
  const auto check_grad = [&](const Tensor& dy, const Tensor& x, const char* name) {
    XT_CHECK(!dy.defined() || (dy.shape() == x.shape() && dy.dtype() == x.dtype() && dy.device() == x.device()),
             ValueError, op, ": ", name, " must match its input, got ", dy.describe(), " for ", x.describe());
  };
  check_grad(dq_out, q, "dq_out");
  check_grad(dk_out, k, "dk_out");
  check_defined(rstd_q, "rstd_q");
  check_defined(rstd_k, "rstd_k");
  XT_CHECK(rstd_q.dtype() == DType::Float32 && rstd_q.numel() == q.numel() / D && rstd_k.dtype() == DType::Float32 &&
               rstd_k.numel() == k.numel() / D && rstd_q.device() == q.device() && rstd_k.device() == q.device(),
           ValueError, op, ": rstd_q, rstd_k must be float32 with one element per row of q, k, got ", rstd_q.describe(),
           ", ", rstd_k.describe());
  // dwq, dwk: sums over the rows, zero when there are none
  const auto weight_grad = [&](const Tensor& w, const Tensor& into) {
    if (B * S == 0) return zeros(w.shape(), w.dtype(), w.device());
    return into.defined() ? into : Tensor::empty(w.shape(), w.dtype(), w.device());
  };
  std::vector<Tensor> grads(4);
  if (do_q) {
    grads[0] = Tensor::empty(q.shape(), q.dtype(), q.device());
    grads[2] = weight_grad(wq, dwq_into);
  }
  if (do_k) {
    grads[1] = Tensor::empty(k.shape(), k.dtype(), k.device());
    grads[3] = weight_grad(wk, dwk_into);
  }
  if (B * S == 0) return grads;
  if (H + Hkv > 0)
    XT_KERNEL(q.device(), qk_norm_rope_backward, q.dtype(), wq.dtype(), q.data_ptr(), k.data_ptr(), wq.data_ptr(),
              wk.data_ptr(), rstd_q.data<float>(), rstd_k.data<float>(), do_q ? dq_out.data_ptr() : nullptr,
              do_k ? dk_out.data_ptr() : nullptr, do_q ? grads[0].data_ptr() : nullptr,
              do_k ? grads[1].data_ptr() : nullptr, do_q ? grads[2].data_ptr() : nullptr,
              do_k ? grads[3].data_ptr() : nullptr, B, S, H, Hkv, D, freqs, pos,
              stream_for(q.device()));
  return grads;
}

}  // namespace

std::vector<Tensor> qk_norm_rope_backward(const Tensor& q, const Tensor& k, const Tensor& wq, const Tensor& wk,
                                          const Tensor& rstd_q, const Tensor& rstd_k, const Tensor& dq_out,
                                          const Tensor& dk_out, const kernels::RopeFreqs& freqs,
                                          const Tensor& positions) {
  return qk_norm_rope_backward_into(q, k, wq, wk, rstd_q, rstd_k, dq_out, dk_out, freqs, positions, Tensor(),
                                    Tensor());
}

namespace {

class QkNormRopeBackward : public NodeWithSaved<7> {
 public:
  QkNormRopeBackward(const Tensor& q, const Tensor& k, const Tensor& wq, const Tensor& wk, const Tensor& rstd_q,
                     const Tensor& rstd_k, const Tensor& positions, const kernels::RopeFreqs& freqs)
      : NodeWithSaved({SavedTensor("q", q), SavedTensor("k", k), SavedTensor("q_norm_weight", wq),
                       SavedTensor("k_norm_weight", wk), SavedTensor("rstd_q", rstd_q),
                       SavedTensor("rstd_k", rstd_k), SavedTensor("positions", positions)}),
        freqs_(freqs) {}
  const char* name() const override { return "QkNormRopeBackward"; }
  uint32_t num_outputs() const override { return 2; }  // q_out, k_out
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!grads[0].defined() && !grads[1].defined()) return std::vector<Tensor>(4);
    const auto [q, k, wq, wk, rstd_q, rstd_k, positions] = unpack();  // positions undefined: 0..S-1
    // a weight's gradient is written only with its half's (dwq with dq), so claim only those
    const Tensor dwq = grads[0].defined() ? claim_grad_buffer(next_edges[2], wq.shape(), wq.dtype(), wq.device())
                                          : Tensor();
    const Tensor dwk = grads[1].defined() ? claim_grad_buffer(next_edges[3], wk.shape(), wk.dtype(), wk.device())
                                          : Tensor();
    return qk_norm_rope_backward_into(q, k, wq, wk, rstd_q, rstd_k, grads[0], grads[1], freqs_, positions, dwq,
                                      dwk);
  }

 private:
  kernels::RopeFreqs freqs_;
};

}  // namespace

std::pair<Tensor, Tensor> qk_norm_rope(const Tensor& q, const Tensor& k, const Tensor& wq, const Tensor& wk,
                                       double eps, double theta, const Tensor& positions,
                                       const RopeScaling& llama3) {
  const kernels::RopeFreqs freqs = rope_freqs(theta, llama3, "qk_norm_rope");
  std::vector<Tensor> r = qk_norm_rope_forward(q, k, wq, wk, eps, freqs, positions);
  if (needs_grad({&q, &k, &wq, &wk})) {
    auto node = make_node<QkNormRopeBackward>({q, k, wq, wk}, q, k, wq, wk, r[2], r[3], positions, freqs);
    set_history(r[0], node, 0);
    set_history(r[1], node, 1);
  }
  return {r[0], r[1]};
}

// Note [Attention's q and k recomputed]
// flash_attention(qk_norm_rope(q, k), v) as two ops keeps q and k twice: as they came (views of the
// q/k/v projections' buffer, for the norm's backward) and normed and rotated (new tensors, for
// attention's backward): (H + Hkv) * D elements per token more than needed. qk_norm_rope_attention
// keeps q, k, v, the norm weights, the positions, out and lse, and its backward first recomputes
// the normed, rotated pair with the same kernel on the same inputs (bitwise the pair the forward
// attended over, and the same rstd rows), then runs the composition's backward kernels in its
// order: flash attention's (dq, dk, dv), then the norm's and RoPE's (dq, dk of the inputs and the
// weights' gradients, straight into their slots). The loss and every gradient are therefore those
// of the two ops, bit for bit, on every device. Cost: one qk_norm_rope pass more per backward (it
// reads q and k and writes the pair), against (H + Hkv) * D elements per token not kept.

namespace {

class QkNormRopeAttentionBackward : public NodeWithSaved<9> {
 public:
  QkNormRopeAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& wq, const Tensor& wk,
                              const Tensor& positions, const Tensor& out, const Tensor& lse, const Tensor& doc_start,
                              double eps, const kernels::RopeFreqs& freqs, bool causal, double scale)
      : NodeWithSaved({SavedTensor("q", q), SavedTensor("k", k), SavedTensor("v", v), SavedTensor("q_norm_weight", wq),
                       SavedTensor("k_norm_weight", wk), SavedTensor("positions", positions),
                       SavedTensor("out", out), SavedTensor("lse", lse), SavedTensor("doc_start", doc_start)}),
        eps_(eps), freqs_(freqs), causal_(causal), scale_(scale) {}
  const char* name() const override { return "QkNormRopeAttentionBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!grads[0].defined()) return std::vector<Tensor>(5);
    const auto [q, k, v, wq, wk, positions, out, lse, doc_start] = unpack();  // positions undefined: 0..S-1
    std::vector<Tensor> prep = qk_norm_rope_forward(q, k, wq, wk, eps_, freqs_, positions);  // the forward's bits
    std::vector<Tensor> d = flash_attention_backward(prep[0], prep[1], v, out, lse, grads[0], causal_, scale_,
                                                     doc_start);
    prep[0] = prep[1] = Tensor();
    const Tensor dwq = claim_grad_buffer(next_edges[3], wq.shape(), wq.dtype(), wq.device());
    const Tensor dwk = claim_grad_buffer(next_edges[4], wk.shape(), wk.dtype(), wk.device());
    std::vector<Tensor> g = qk_norm_rope_backward_into(q, k, wq, wk, prep[2], prep[3], d[0], d[1], freqs_, positions,
                                                       dwq, dwk);
    return {g[0], g[1], d[2], g[2], g[3]};
  }

 private:
  double eps_;
  kernels::RopeFreqs freqs_;
  bool causal_;
  double scale_;  // as given: <= 0 selects 1/sqrt(D)
};

}  // namespace

Tensor qk_norm_rope_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& wq, const Tensor& wk,
                              double eps, double theta, const Tensor& positions, const RopeScaling& llama3,
                              bool causal, double scale, const Tensor& doc_start) {
  const kernels::RopeFreqs freqs = rope_freqs(theta, llama3, "qk_norm_rope_attention");
  std::vector<Tensor> prep = qk_norm_rope_forward(q, k, wq, wk, eps, freqs, positions);
  auto [out, lse] = flash_attention_forward(prep[0], prep[1], v, causal, scale, doc_start);
  if (needs_grad({&q, &k, &v, &wq, &wk}))  // the pair and the rstd rows die here: backward recomputes them
    set_history(out, make_node<QkNormRopeAttentionBackward>({q, k, v, wq, wk}, q, k, v, wq, wk, positions, out, lse,
                                                            doc_start, eps, freqs, causal, scale));
  return out;
}

}  // namespace ops
}  // namespace xt
