// xtrain._C.ops binding of rope and document_positions (csrc/ops/rope.cpp).
#include <array>
#include <optional>

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
  m.def("document_positions", &ops::document_positions, py::arg("doc_start"), NoGil(),
        "int64 [B, S] positions s - doc_start[b, s] of document_starts' int32 [B, S]: each token's distance from "
        "the start of its document (RoPE restarting per document)");
}
