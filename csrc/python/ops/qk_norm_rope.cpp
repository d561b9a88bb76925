// xtrain._C.ops binding of qk_norm_rope, the fused per-head q/k RMSNorm + RoPE of attention's
// prefill and training forward.
#include "ops/ops.h"
#include "python/op_registry.h"

XT_BIND_OPS(qk_norm_rope, m) {
  using namespace xt;
  m.def("qk_norm_rope", &ops::qk_norm_rope, py::arg("q"), py::arg("k"), py::arg("q_norm_weight"),
        py::arg("k_norm_weight"), py::arg("eps") = 1e-6, py::arg("theta") = 10000.0, NoGil(),
        "rope(rms_norm(x, weight, eps), theta) over D for q [B, S, H, D] and k [B, S, H_kv, D] in one kernel "
        "(positions 0..S-1); returns (q, k), bitwise equal to rms_norm followed by rope");
}
