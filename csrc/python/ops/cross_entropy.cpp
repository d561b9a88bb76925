// xtrain._C.ops bindings of the cross_entropy family (csrc/ops/cross_entropy.cpp): cross_entropy
// and the fused lm_head + loss linear_cross_entropy (its logits copy becomes None when not asked).
#include <optional>
#include <utility>

#include "ops/ops.h"
#include "python/op_registry.h"

XT_BIND_OPS(cross_entropy, m) {
  using namespace xt;
  m.def("cross_entropy", &ops::cross_entropy, py::arg("logits"), py::arg("targets"),
        py::arg("ignore_index") = -100, NoGil(),
        "Mean cross-entropy of logits [N, V] against int targets [N], skipping ignore_index; float32 scalar");
  m.def("linear_cross_entropy", [](const Tensor& x, const Tensor& w, const Tensor& targets, int64_t ignore_index,
                                   bool return_logits, int64_t chunk_rows) {
          auto [loss, logits] = ops::linear_cross_entropy(x, w, targets, ignore_index, return_logits, chunk_rows);
          return std::make_pair(loss, logits.defined() ? std::optional<Tensor>(logits) : std::nullopt);
        }, py::arg("x"), py::arg("w"), py::arg("targets"), py::arg("ignore_index") = -100,
        py::arg("return_logits") = false, py::arg("chunk_rows") = 0, NoGil(),
        "cross_entropy(linear(x, w), targets) fused (x [N, K], w [V, K]), in row chunks of chunk_rows (0: "
        "chosen from the shapes): returns (loss, logits [N, V] copy when return_logits else None)");
  m.def("head_layout", [](int64_t rows, int64_t vocab, const py::object& dtype) {
          XT_CHECK(vocab > 0 && vocab <= (int64_t{1} << 40), ValueError, "head_layout: vocab must be in 1..2^40, got ",
                   vocab);
          const int64_t ld = ops::logits_ld(vocab);
          return std::make_pair(ops::head_chunk_rows(rows, ld, dtype_size(dtype_arg(dtype, DType::Float32))), ld);
        }, py::arg("rows"), py::arg("vocab"), py::arg("dtype"),
        "How linear_cross_entropy lays out the head of `rows` rows and vocabulary `vocab` in dtype: (rows per "
        "chunk, the logits' row stride); rows per chunk >= rows means unchunked");
}
