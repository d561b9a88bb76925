// rope: the rotate-half rotary embedding on x [B, S, H, D], D even; positions int64 [S] or [B, S]
// (each row its own) on x's device, or undefined for 0..S-1; theta and, optionally, Llama 3's
// scaling of the frequencies (rope_freqs checks them for every op that rotates). The rotation is
// orthogonal, so the backward is the same rotation by -angle (inverse = true) applied to the
// upstream gradient; the node saves only the positions. rope_attention is rope on q and k followed
// by flash attention, keeping q and k unrotated (Note [Attention's rotated q and k recomputed]).
// document_positions makes the positions of RoPE restarting per document from flash attention's
// document starts.
#include <cmath>

#include "core/error.h"
#include "ops/dispatch.h"
#include "tape/node.h"

namespace xt {
namespace ops {

kernels::RopeFreqs rope_freqs(double theta, const RopeScaling& llama3, const char* op) {
  XT_CHECK(std::isfinite(theta) && theta > 0, ValueError, op, ": theta must be finite and > 0, got ", theta);
  if (!llama3) return kernels::rope_freqs(theta);
  const auto [factor, low, high, old_context] = *llama3;
  XT_CHECK(std::isfinite(factor) && factor >= 1, ValueError, op,
           ": the llama3 scaling's factor must be finite and >= 1, got ", factor);
  XT_CHECK(std::isfinite(low) && std::isfinite(high) && low > 0 && high > low, ValueError, op,
           ": the llama3 scaling needs 0 < low_freq_factor < high_freq_factor (finite), got ", low, " and ", high);
  XT_CHECK(std::isfinite(old_context) && old_context >= 1, ValueError, op,
           ": the llama3 scaling's original_max_position_embeddings must be finite and >= 1, got ", old_context);
  return kernels::rope_freqs_llama3(theta, factor, low, high, old_context);
}

kernels::RopePositions rope_positions(const Tensor& positions, const Tensor& x, const char* op) {
  if (!positions.defined()) return {};
  const int64_t B = x.size(0), S = x.size(1);
  XT_CHECK(positions.dtype() == DType::Int64, TypeError, op, ": positions must be int64, got ", positions.describe());
  const bool per_token = positions.dim() == 1 && positions.size(0) == S;
  const bool per_row = positions.dim() == 2 && positions.size(0) == B && positions.size(1) == S;
  XT_CHECK(per_token || per_row, ValueError, op, ": positions must have shape [", S, "] or [", B, ", ", S,
           "] (the B, S of x), got positions ", positions.describe(), " for x ", x.describe());
  check_same_device(x, positions, op, "x", "positions");
  return {positions.data<int64_t>(), per_row ? S : 0};
}

Tensor rope_forward(const Tensor& x, const Tensor& positions, const kernels::RopeFreqs& freqs, bool inverse) {
  check_floating(x, "rope", "x");
  XT_CHECK(x.dim() == 4, ValueError, "rope: x must be [B, S, H, D] (4 dimensions), got ", x.describe());
  const int64_t B = x.size(0), S = x.size(1), H = x.size(2), D = x.size(3);
  XT_CHECK(D % 2 == 0, ValueError, "rope: the head dimension D must be even (rotate-half pairs i with i + D/2), got ",
           x.describe());
  const kernels::RopePositions pos = rope_positions(positions, x, "rope");
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (x.numel())
    XT_KERNEL(x.device(), rope, x.dtype(), x.data_ptr(), out.data_ptr(), pos, B, S, H, D, freqs, inverse,
              stream_for(x.device()));
  return out;
}

namespace {

class RopeBackward : public NodeWithSaved<1> {
 public:
  RopeBackward(const Tensor& positions, const kernels::RopeFreqs& freqs)
      : NodeWithSaved({SavedTensor("positions", positions)}), freqs_(freqs) {}
  const char* name() const override { return "RopeBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!grads[0].defined()) return {Tensor()};
    const auto [positions] = unpack();  // undefined: 0..S-1
    return {rope_forward(grads[0], positions, freqs_, /*inverse=*/true)};
  }

 private:
  kernels::RopeFreqs freqs_;
};

}  // namespace

Tensor rope(const Tensor& x, const Tensor& positions, double theta, const RopeScaling& llama3) {
  const kernels::RopeFreqs freqs = rope_freqs(theta, llama3, "rope");
  Tensor out = rope_forward(x, positions, freqs, /*inverse=*/false);
  if (needs_grad({&x})) set_history(out, make_node<RopeBackward>({x}, positions, freqs));
  return out;
}

// Note [Attention's rotated q and k recomputed]
// flash_attention(rope(q), rope(k), v) as three ops keeps the rotated pair for attention's backward
// while v, a view of the q/k/v projections' one buffer, keeps q and k as projected alive anyway:
// (H + Hkv) * D elements per token kept twice (Llama-3.2-1B: 5,120 bytes per token per layer of
// 56,456). rope_attention keeps q, k, v, the positions, out and lse; its backward rotates q and k
// again with the same kernel (the forward's bits), runs flash attention's backward (dq, dk, dv of
// the rotated pair) and rotates dq and dk back (RoPE's backward, the inverse rotation): the loss
// and every gradient are the three ops', bit for bit, on every device. Cost: one rotation of q
// and k more per backward (~0.7 ms a step at Llama-3.2-1B batch 4 x 4096). The models without
// q/k norm use it where the Qwen3 ones use qk_norm_rope_attention (Note [Attention's q and k
// recomputed], ops/qk_norm_rope.cpp).

namespace {

class RopeAttentionBackward : public NodeWithSaved<7> {
 public:
  RopeAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& positions, const Tensor& out,
                        const Tensor& lse, const Tensor& doc_start, const kernels::RopeFreqs& freqs, bool causal,
                        double scale)
      : NodeWithSaved({SavedTensor("q", q), SavedTensor("k", k), SavedTensor("v", v), SavedTensor("positions", positions),
                       SavedTensor("out", out), SavedTensor("lse", lse), SavedTensor("doc_start", doc_start)}),
        freqs_(freqs), causal_(causal), scale_(scale) {}
  const char* name() const override { return "RopeAttentionBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!grads[0].defined()) return std::vector<Tensor>(3);
    const auto [q, k, v, positions, out, lse, doc_start] = unpack();  // positions undefined: 0..S-1
    std::vector<Tensor> d = flash_attention_backward(rope_forward(q, positions, freqs_, false),
                                                     rope_forward(k, positions, freqs_, false), v, out, lse, grads[0],
                                                     causal_, scale_, doc_start);
    Tensor dq = rope_forward(d[0], positions, freqs_, /*inverse=*/true);
    d[0] = Tensor();
    Tensor dk = rope_forward(d[1], positions, freqs_, /*inverse=*/true);
    return {dq, dk, d[2]};
  }

 private:
  kernels::RopeFreqs freqs_;
  bool causal_;
  double scale_;  // as given: <= 0 selects 1/sqrt(D)
};

}  // namespace

Tensor rope_attention(const Tensor& q, const Tensor& k, const Tensor& v, double theta, const Tensor& positions,
                      const RopeScaling& llama3, bool causal, double scale, const Tensor& doc_start) {
  const kernels::RopeFreqs freqs = rope_freqs(theta, llama3, "rope_attention");
  check_defined(q, "q");
  check_defined(k, "k");
  auto [out, lse] = flash_attention_forward(rope_forward(q, positions, freqs, false),
                                            rope_forward(k, positions, freqs, false), v, causal, scale, doc_start);
  if (needs_grad({&q, &k, &v}))  // the rotated pair dies here: backward rotates q and k again
    set_history(out, make_node<RopeAttentionBackward>({q, k, v}, q, k, v, positions, out, lse, doc_start, freqs,
                                                      causal, scale));
  return out;
}

Tensor document_positions(const Tensor& doc_start) {
  check_defined(doc_start, "doc_start");
  XT_CHECK(doc_start.dtype() == DType::Int32 && doc_start.dim() == 2, ValueError,
           "document_positions: doc_start must be int32 [B, S] (document_starts' output), got ", doc_start.describe());
  Tensor pos = Tensor::empty(doc_start.shape(), DType::Int64, doc_start.device());
  if (doc_start.numel())
    XT_KERNEL(doc_start.device(), document_positions, doc_start.data<int32_t>(), pos.data<int64_t>(),
              doc_start.size(0), doc_start.size(1), stream_for(doc_start.device()));
  return pos;
}

}  // namespace ops
}  // namespace xt
