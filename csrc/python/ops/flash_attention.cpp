// xtrain._C.ops binding of flash_attention (csrc/ops/flash_attention.cpp). The Python scale is
// None or a positive number; the op takes 0 for its default 1/sqrt(D).
#include <cmath>
#include <optional>
#include <utility>

#include "core/error.h"
#include "ops/ops.h"
#include "python/op_registry.h"

XT_BIND_OPS(flash_attention, m) {
  using namespace xt;
  m.def("flash_attention", [](const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                              std::optional<double> scale, bool return_lse,
                              std::optional<Tensor> doc_start) -> py::object {
          XT_CHECK(!scale || (std::isfinite(*scale) && *scale > 0), ValueError,
                   "flash_attention: scale must be a positive finite number or None, got ", *scale);
          std::pair<Tensor, Tensor> r;
          {
            py::gil_scoped_release nogil;
            r = ops::flash_attention(q, k, v, causal, scale ? *scale : 0.0, doc_start ? *doc_start : Tensor());
          }
          return return_lse ? py::object(py::make_tuple(r.first, r.second)) : py::cast(r.first);
        }, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal") = true, py::arg("scale") = py::none(),
        py::arg("return_lse") = false, py::arg("doc_start") = py::none(),
        "Fused (flash) attention on q [B, S, H, D], k and v [B, S, H_kv, D] (H a multiple of H_kv), output "
        "[B, S, H, D]; scale None means 1/sqrt(D); return_lse adds the row log-sum-exp [B, H, S]; doc_start "
        "(int32 [B, S] from document_starts, causal only): each query sees only the keys of its own document");
  m.def("document_starts", [](const Tensor& ids, int64_t sep) {
          py::gil_scoped_release nogil;
          return ops::document_starts(ids, sep);
        }, py::arg("ids"), py::arg("sep"),
        "int32 [B, S]: the position where each token's document begins, for ids [B, S] (int32 or int64) in "
        "which a document begins at 0 and after every token equal to sep (flash_attention's doc_start)");
}
