// xtrain._C.ops binding of rope, rope_attention (rope on q and k followed by flash attention,
// keeping q and k unrotated) and document_positions (csrc/ops/rope.cpp). rope_attention's scale is
// None or a positive number (flash_attention's).
#include <array>
#include <cmath>
#include <optional>

#include "core/error.h"
#include "ops/ops.h"
#include "python/op_registry.h"

XT_BIND_OPS(rope, m) {
  using namespace xt;
  m.def("rope", [](const Tensor& x, const std::optional<Tensor>& positions, double theta,
                   const ops::RopeScaling& llama3) {
          return ops::rope(x, positions ? *positions : Tensor(), theta, llama3);
        }, py::arg("x"), py::arg("positions") = py::none(), py::arg("theta") = 10000.0,
        py::arg("llama3") = py::none(), NoGil(),
        "Rotary embedding (rotate-half) on x [B, S, H, D]; positions int64 [S] or [B, S] (each row its own), "
        "default 0..S-1; llama3: Llama 3's frequency scaling (factor, low_freq_factor, high_freq_factor, "
        "original_max_position_embeddings), default none");
  m.def("rope_attention", [](const Tensor& q, const Tensor& k, const Tensor& v, double theta,
                             const std::optional<Tensor>& positions, const ops::RopeScaling& llama3, bool causal,
                             std::optional<double> scale, const std::optional<Tensor>& doc_start) {
          XT_CHECK(!scale || (std::isfinite(*scale) && *scale > 0), ValueError,
                   "rope_attention: scale must be a positive finite number or None, got ", *scale);
          py::gil_scoped_release nogil;
          return ops::rope_attention(q, k, v, theta, positions.value_or(Tensor()), llama3, causal,
                                     scale ? *scale : 0.0, doc_start.value_or(Tensor()));
        }, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("theta") = 10000.0, py::arg("positions") = py::none(),
        py::arg("llama3") = py::none(), py::arg("causal") = true, py::arg("scale") = py::none(),
        py::arg("doc_start") = py::none(),
        "flash_attention(rope(q, ...), rope(k, ...), v, causal, scale, doc_start=doc_start), bitwise, keeping q and "
        "k unrotated for backward (which rotates them again); returns out [B, S, H, D]");
  m.def("document_positions", &ops::document_positions, py::arg("doc_start"), NoGil(),
        "int64 [B, S] positions s - doc_start[b, s] of document_starts' int32 [B, S]: each token's distance from "
        "the start of its document (RoPE restarting per document)");
}
