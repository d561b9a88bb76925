// xtrain._C.ops bindings of qk_norm_rope, the fused per-head q/k RMSNorm + RoPE of attention's
// prefill and training forward, and qk_norm_rope_attention (it followed by flash attention, keeping
// the q and k it was given). The Python scale is None or a positive number (flash_attention's).
#include <array>
#include <cmath>
#include <optional>

#include "core/error.h"
#include "ops/ops.h"
#include "python/op_registry.h"

XT_BIND_OPS(qk_norm_rope, m) {
  using namespace xt;
  m.def("qk_norm_rope", [](const Tensor& q, const Tensor& k, const Tensor& q_norm_weight,
                           const Tensor& k_norm_weight, double eps, double theta,
                           const std::optional<Tensor>& positions, const ops::RopeScaling& llama3) {
          return ops::qk_norm_rope(q, k, q_norm_weight, k_norm_weight, eps, theta, positions.value_or(Tensor()),
                                   llama3);
        }, py::arg("q"), py::arg("k"), py::arg("q_norm_weight"), py::arg("k_norm_weight"), py::arg("eps") = 1e-6,
        py::arg("theta") = 10000.0, py::arg("positions") = py::none(), py::arg("llama3") = py::none(), NoGil(),
        "rope(rms_norm(x, weight, eps), theta) over D for q [B, S, H, D] and k [B, S, H_kv, D] in one kernel "
        "(positions as rope's: int64 [S] or [B, S], default 0..S-1; llama3 as rope's); returns (q, k), bitwise "
        "equal to rms_norm followed by rope");
  m.def("qk_norm_rope_attention", [](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm_weight,
                                     const Tensor& k_norm_weight, double eps, double theta,
                                     const std::optional<Tensor>& positions, const ops::RopeScaling& llama3,
                                     bool causal, std::optional<double> scale, const std::optional<Tensor>& doc_start) {
          XT_CHECK(!scale || (std::isfinite(*scale) && *scale > 0), ValueError,
                   "qk_norm_rope_attention: scale must be a positive finite number or None, got ", *scale);
          py::gil_scoped_release nogil;
          return ops::qk_norm_rope_attention(q, k, v, q_norm_weight, k_norm_weight, eps, theta,
                                             positions.value_or(Tensor()), llama3, causal, scale ? *scale : 0.0,
                                             doc_start.value_or(Tensor()));
        }, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("q_norm_weight"), py::arg("k_norm_weight"),
        py::arg("eps") = 1e-6, py::arg("theta") = 10000.0, py::arg("positions") = py::none(),
        py::arg("llama3") = py::none(), py::arg("causal") = true, py::arg("scale") = py::none(),
        py::arg("doc_start") = py::none(),
        "flash_attention(*qk_norm_rope(q, k, ...), v, causal, scale, doc_start=doc_start), bitwise, keeping q and k "
        "as given for backward (not the normed, rotated pair, which backward recomputes); returns out [B, S, H, D]");
}
