// rope: the rotate-half rotary embedding on x [B, S, H, D], D even; positions int64 [S] or [B, S]
// (each row its own) on x's device, or undefined for 0..S-1; theta and, optionally, Llama 3's
// scaling of the frequencies (rope_freqs checks them for every op that rotates). The rotation is
// orthogonal, so the backward is the same rotation by -angle (inverse = true) applied to the
// upstream gradient; the node saves only the positions. document_positions makes the positions of
// RoPE restarting per document from flash attention's document starts.
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
