// Bindings for the model ops (xtrain.ops.*): rms_norm, add_rms_norm, rope, to_heads, from_heads, sdpa,
// flash_attention, qk_norm_rope, kv_cache_write_, decode_attention, decode_prep, decode_prep_attention,
// greedy_next_, linear_rows, rms_norm_linear_rows, softmax, log_softmax, cross_entropy, linear_cross_entropy.
// Argument conversion only; the ops live in csrc/ops/.
#include <cmath>
#include <optional>
#include <utility>

#include "core/error.h"
#include "ops/ops.h"
#include "python/bind.h"

namespace xt {

namespace {

// softmax/log_softmax run over the last dim only.
void check_last_dim(const Tensor& x, int64_t dim, const char* op) {
  const int64_t n = x.defined() ? x.dim() : 0;
  XT_CHECK(dim == -1 || (n > 0 && dim == n - 1), ValueError, op, ": only the last dimension is supported (dim=-1",
           n > 0 ? str(" or ", n - 1) : std::string(), "), got dim=", dim, " for x ", x.describe());
}

// None selects 1/sqrt(D) (passed on as 0); an explicit scale must be a positive number.
double scale_arg(const std::optional<double>& scale) {
  if (!scale) return 0.0;
  XT_CHECK(std::isfinite(*scale) && *scale > 0, ValueError, "sdpa: scale must be a positive finite number or None, got ",
           *scale);
  return *scale;
}

}  // namespace

void init_ops_model(py::module_& ops) {
  ops.def("rms_norm", &ops::rms_norm, py::arg("x"), py::arg("weight"), py::arg("eps") = 1e-6, NoGil(),
          "RMSNorm over the last dim: x / sqrt(mean(x^2) + eps) * weight (weight [D], x's dtype or float32)");
  ops.def("add_rms_norm", &ops::add_rms_norm, py::arg("x"), py::arg("residual"), py::arg("weight"),
          py::arg("eps") = 1e-6, NoGil(),
          "(h, rms_norm(h, weight, eps)) with h = x + residual, in one kernel; bitwise add then rms_norm");
  ops.def("rope", [](const Tensor& x, const std::optional<Tensor>& positions, double theta) {
            return ops::rope(x, positions ? *positions : Tensor(), theta);
          }, py::arg("x"), py::arg("positions") = py::none(), py::arg("theta") = 10000.0, NoGil(),
          "Rotary embedding (rotate-half) on x [B, S, H, D]; positions int64 [S], default 0..S-1");
  ops.def("to_heads", [](const Tensor& x, int64_t seq, int64_t n_heads, const std::optional<Tensor>& norm_weight,
                         double eps, std::optional<double> rope_theta) {
            return ops::to_heads(x, seq, n_heads, norm_weight ? *norm_weight : Tensor(), eps, rope_theta);
          }, py::arg("x"), py::arg("seq"), py::arg("n_heads"), py::arg("norm_weight") = py::none(), py::arg("eps") = 1e-6,
          py::arg("rope_theta") = py::none(), NoGil(),
          "x [B*S, H*D] -> [B, H, S, D]: reshape, rms_norm over D (if norm_weight), rope (if rope_theta), permute");
  ops.def("from_heads", &ops::from_heads, py::arg("x"), NoGil(),
          "x [B, H, S, D] -> [B*S, H*D]: permute to [B, S, H, D], reshape (the inverse of to_heads' layout change)");
  ops.def("sdpa", [](const Tensor& q, const Tensor& k, const Tensor& v, bool causal, std::optional<double> scale) {
            return ops::sdpa(q, k, v, causal, scale_arg(scale));
          }, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal") = true, py::arg("scale") = py::none(), NoGil(),
          "Scaled dot-product attention on q, k, v [B, H, S, D]; scale None means 1/sqrt(D)");
  ops.def("flash_attention", [](const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                std::optional<double> scale, bool return_lse) -> py::object {
            XT_CHECK(!scale || (std::isfinite(*scale) && *scale > 0), ValueError,
                     "flash_attention: scale must be a positive finite number or None, got ", *scale);
            std::pair<Tensor, Tensor> r;
            {
              py::gil_scoped_release nogil;
              r = ops::flash_attention(q, k, v, causal, scale ? *scale : 0.0);
            }
            return return_lse ? py::object(py::make_tuple(r.first, r.second)) : py::cast(r.first);
          }, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal") = true, py::arg("scale") = py::none(),
          py::arg("return_lse") = false,
          "Fused (flash) attention on q [B, S, H, D], k and v [B, S, H_kv, D] (H a multiple of H_kv), output "
          "[B, S, H, D]; scale None means 1/sqrt(D); return_lse adds the row log-sum-exp [B, H, S]");
  ops.def("qk_norm_rope", &ops::qk_norm_rope, py::arg("q"), py::arg("k"), py::arg("q_norm_weight"),
          py::arg("k_norm_weight"), py::arg("eps") = 1e-6, py::arg("theta") = 10000.0, NoGil(),
          "rope(rms_norm(x, weight, eps), theta) over D for q [B, S, H, D] and k [B, S, H_kv, D] in one kernel "
          "(positions 0..S-1); returns (q, k), bitwise equal to rms_norm followed by rope");
  ops.def("kv_cache_write_", &ops::kv_cache_write_, py::arg("cache"), py::arg("x"), py::arg("positions"), NoGil(),
          "In place: cache [B, L, H_kv, D][b, positions[b] + s] = x [B, S, H_kv, D][b, s]; positions int64 [B] "
          "(generation's KV cache; not differentiable)");
  ops.def("decode_attention", [](const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& lengths,
                                 std::optional<double> scale) {
            XT_CHECK(!scale || (std::isfinite(*scale) && *scale > 0), ValueError,
                     "decode_attention: scale must be a positive finite number or None, got ", *scale);
            py::gil_scoped_release nogil;
            return ops::decode_attention(q, k_cache, v_cache, lengths, scale ? *scale : 0.0);
          }, py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("lengths"), py::arg("scale") = py::none(),
          "One query per row against a KV cache: q [B, H, D], k_cache and v_cache [B, L, H_kv, D], row b attends to "
          "its first lengths[b] slots (int64 [B]); returns [B, H, D]; scale None means 1/sqrt(D); not differentiable");
  ops.def("decode_prep", [](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_cache,
                            const Tensor& v_cache, const Tensor& positions, const std::optional<Tensor>& q_norm_weight,
                            const std::optional<Tensor>& k_norm_weight, double eps, double theta) {
            py::gil_scoped_release nogil;
            return ops::decode_prep(q, k, v, k_cache, v_cache, positions, q_norm_weight.value_or(Tensor()),
                                    k_norm_weight.value_or(Tensor()), eps, theta);
          }, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("k_cache"), py::arg("v_cache"), py::arg("positions"),
          py::arg("q_norm_weight") = py::none(), py::arg("k_norm_weight") = py::none(), py::arg("eps") = 1e-6,
          py::arg("theta") = 10000.0,
          "A decode step's head preparation in one kernel: q [B, H, D], k, v [B, H_kv, D]; with the norm weights "
          "rms_norm(eps) then rope(theta) of q and k at each row's slot positions[b] (int64 [B]), without them rope "
          "only; k and v written into k_cache, v_cache [B, L, H_kv, D] at that slot; returns q. Bitwise rms_norm "
          "then rope; not differentiable");
  ops.def("decode_prep_attention", [](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_cache,
                                      const Tensor& v_cache, const Tensor& positions, const Tensor& lengths,
                                      const std::optional<Tensor>& q_norm_weight,
                                      const std::optional<Tensor>& k_norm_weight, double eps, double theta,
                                      std::optional<double> scale, const std::vector<Tensor>& prefetch) {
            py::gil_scoped_release nogil;
            return ops::decode_prep_attention(q, k, v, k_cache, v_cache, positions, lengths,
                                              q_norm_weight.value_or(Tensor()), k_norm_weight.value_or(Tensor()), eps,
                                              theta, scale ? *scale : 0.0, prefetch);
          }, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("k_cache"), py::arg("v_cache"), py::arg("positions"),
          py::arg("lengths"), py::arg("q_norm_weight") = py::none(), py::arg("k_norm_weight") = py::none(),
          py::arg("eps") = 1e-6, py::arg("theta") = 10000.0, py::arg("scale") = py::none(),
          py::arg("prefetch") = std::vector<Tensor>{},
          "decode_prep (k and v into their cache slots at positions[b], q normed and rotated) then decode_attention "
          "of that q over each row's first lengths[b] slots; returns [B, H, D]. Bitwise the two ops; on CUDA one "
          "kernel where the one-pass attention applies; not differentiable. prefetch: up to 8 tensors on q's device "
          "that the next ops read, asked into L2 by the SMs the attention leaves idle (a hint: no value changes)");
  ops.def("greedy_next_", [](const Tensor& logits, const Tensor& state, const Tensor& ring,
                             std::optional<int64_t> stop_token) {
            XT_CHECK(!stop_token || *stop_token >= 0, ValueError,
                     "greedy_next_: stop_token must be a token id >= 0 or None, got ", *stop_token);
            py::gil_scoped_release nogil;
            ops::greedy_next_(logits, state, ring, stop_token ? *stop_token : -1);
          }, py::arg("logits"), py::arg("state"), py::arg("ring"), py::arg("stop_token") = py::none(),
          "Greedy decoding on the device: row b's most likely token of logits [B, V] (the first of equal maxima, NaN "
          "first) advances its state int64 [6, B] = (token, position, length, limit, done, count) when the row is "
          "not done and position + 1 < limit (done after stop_token); ring [R, B][count % R, b] gets the token "
          "taken or -1; count += 1. In place, not differentiable");
  ops.def("linear_rows", &ops::linear_rows, py::arg("x"), py::arg("weights"), NoGil(),
          "[x @ w^T for w in weights] for x [M, K] with 1 <= M <= 8, as views of one buffer laid out as "
          "linear_multi's: one matrix-vector kernel reading each weight row once (the decode step's linears); "
          "float32 accumulation, deterministic; not differentiable (raises when an input requires grad)");
  ops.def("rms_norm_linear_rows", [](const Tensor& x, const std::vector<Tensor>& weights, const Tensor& norm_weight,
                                     double eps, const std::optional<Tensor>& residual, bool swiglu) {
            py::gil_scoped_release nogil;
            return ops::rms_norm_linear_rows(x, weights, norm_weight, eps, residual.value_or(Tensor()), swiglu);
          }, py::arg("x"), py::arg("weights"), py::arg("norm_weight"), py::arg("eps") = 1e-6,
          py::arg("residual") = py::none(), py::arg("swiglu") = false,
          "(h, ys): h = x + residual (x itself without residual), ys = linear_rows(rms_norm(h, norm_weight, eps), "
          "weights), or with swiglu=True (weights = [gate, up], one shape) [swiglu(gate, up)]; bitwise add_rms_norm "
          "(rms_norm), linear_rows and swiglu, in one kernel that recomputes the norm in every block (the decode "
          "step's norm + linear); x [M, K] with 1 <= M <= 8; not differentiable");
  ops.def("softmax", [](const Tensor& x, int64_t dim) {
            check_last_dim(x, dim, "softmax");
            return ops::softmax(x);
          }, py::arg("x"), py::arg("dim") = -1, NoGil(), "Softmax over the last dim (computed in float32 for bf16)");
  ops.def("log_softmax", [](const Tensor& x, int64_t dim) {
            check_last_dim(x, dim, "log_softmax");
            return ops::log_softmax(x);
          }, py::arg("x"), py::arg("dim") = -1, NoGil(), "Log-softmax over the last dim (computed in float32 for bf16)");
  ops.def("cross_entropy", &ops::cross_entropy, py::arg("logits"), py::arg("targets"),
          py::arg("ignore_index") = -100, NoGil(),
          "Mean cross-entropy of logits [N, V] against int targets [N], skipping ignore_index; float32 scalar");
  ops.def("linear_cross_entropy", [](const Tensor& x, const Tensor& w, const Tensor& targets, int64_t ignore_index,
                                     bool return_logits) {
            auto [loss, logits] = ops::linear_cross_entropy(x, w, targets, ignore_index, return_logits);
            return std::make_pair(loss, logits.defined() ? std::optional<Tensor>(logits) : std::nullopt);
          }, py::arg("x"), py::arg("w"), py::arg("targets"), py::arg("ignore_index") = -100,
          py::arg("return_logits") = false, NoGil(),
          "cross_entropy(linear(x, w), targets) fused (x [N, K], w [V, K]): returns (loss, logits [N, V] copy "
          "when return_logits else None)");
}

}  // namespace xt
