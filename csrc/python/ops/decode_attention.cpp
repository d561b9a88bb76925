// xtrain._C.ops bindings of the decode attention family (csrc/ops/decode_attention.cpp):
// generation's KV-cache write, decode attention and the fused head preparation + attention of a
// decode step; none is differentiable. The Python scale is None or a positive number; the ops
// take 0 for their default 1/sqrt(D).
#include <array>
#include <cmath>
#include <optional>
#include <vector>

#include "core/error.h"
#include "ops/ops.h"
#include "python/op_registry.h"

XT_BIND_OPS(decode_attention, m) {
  using namespace xt;
  m.def("kv_cache_write_", &ops::kv_cache_write_, py::arg("cache"), py::arg("x"), py::arg("positions"), NoGil(),
        "In place: cache [B, L, H_kv, D][b, positions[b] + s] = x [B, S, H_kv, D][b, s]; positions int64 [B] "
        "(generation's KV cache; not differentiable)");
  m.def("decode_attention", [](const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& lengths,
                               std::optional<double> scale) {
          XT_CHECK(!scale || (std::isfinite(*scale) && *scale > 0), ValueError,
                   "decode_attention: scale must be a positive finite number or None, got ", *scale);
          py::gil_scoped_release nogil;
          return ops::decode_attention(q, k_cache, v_cache, lengths, scale ? *scale : 0.0);
        }, py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("lengths"), py::arg("scale") = py::none(),
        "One query per row against a KV cache: q [B, H, D], k_cache and v_cache [B, L, H_kv, D], row b attends to "
        "its first lengths[b] slots (int64 [B]); returns [B, H, D]; scale None means 1/sqrt(D); not differentiable");
  m.def("decode_prep_attention", [](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_cache,
                                    const Tensor& v_cache, const Tensor& positions, const Tensor& lengths,
                                    const std::optional<Tensor>& q_norm_weight,
                                    const std::optional<Tensor>& k_norm_weight, double eps, double theta,
                                    std::optional<double> scale, const std::vector<Tensor>& prefetch,
                                    const ops::RopeScaling& llama3) {
          py::gil_scoped_release nogil;
          return ops::decode_prep_attention(q, k, v, k_cache, v_cache, positions, lengths,
                                            q_norm_weight.value_or(Tensor()), k_norm_weight.value_or(Tensor()), eps,
                                            theta, scale ? *scale : 0.0, prefetch, llama3);
        }, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("k_cache"), py::arg("v_cache"), py::arg("positions"),
        py::arg("lengths"), py::arg("q_norm_weight") = py::none(), py::arg("k_norm_weight") = py::none(),
        py::arg("eps") = 1e-6, py::arg("theta") = 10000.0, py::arg("scale") = py::none(),
        py::arg("prefetch") = std::vector<Tensor>{}, py::arg("llama3") = py::none(),
        "A decode step's head preparation then its attention: k and v [B, H_kv, D] into their cache slots at "
        "positions[b] (int64 [B]), q [B, H, D] and k normed (rms_norm(eps), with the norm weights) and rotated "
        "(rope(theta, llama3)) at that position, then decode_attention of that q over each row's first "
        "lengths[b] slots; "
        "returns [B, H, D]. Bitwise those ops; on CUDA one kernel where the one-pass attention applies; not "
        "differentiable. prefetch: up to 8 tensors on q's device that the next ops read, asked into L2 by the SMs "
        "the attention leaves idle (a hint: no value changes)");
}
