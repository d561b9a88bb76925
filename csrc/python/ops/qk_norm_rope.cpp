// xtrain._C.ops binding of qk_norm_rope, the fused per-head q/k RMSNorm + RoPE of attention's
// prefill and training forward.
#include <array>
#include <optional>

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
}
