// xtrain._C.ops bindings of the linear_rows family (csrc/ops/linear_rows.cpp): the decode step's
// matrix-vector products, and rms_norm_linear_rows with the norm (and swiglu) fused in; not
// differentiable.
#include <optional>
#include <vector>

#include "ops/ops.h"
#include "python/op_registry.h"

XT_BIND_OPS(linear_rows, m) {
  using namespace xt;
  m.def("linear_rows", &ops::linear_rows, py::arg("x"), py::arg("weights"), NoGil(),
        "[x @ w^T for w in weights] for x [M, K] with 1 <= M <= 8, as views of one buffer laid out as "
        "linear_multi's: one matrix-vector kernel reading each weight row once (the decode step's linears); "
        "float32 accumulation, deterministic; not differentiable (raises when an input requires grad)");
  m.def("rms_norm_linear_rows", [](const Tensor& x, const std::vector<Tensor>& weights, const Tensor& norm_weight,
                                   double eps, const std::optional<Tensor>& residual, bool swiglu) {
          py::gil_scoped_release nogil;
          return ops::rms_norm_linear_rows(x, weights, norm_weight, eps, residual.value_or(Tensor()), swiglu);
        }, py::arg("x"), py::arg("weights"), py::arg("norm_weight"), py::arg("eps") = 1e-6,
        py::arg("residual") = py::none(), py::arg("swiglu") = false,
        "(h, ys): h = x + residual (x itself without residual), ys = linear_rows(rms_norm(h, norm_weight, eps), "
        "weights), or with swiglu=True (weights = [gate, up], one shape) [swiglu(gate, up)]; bitwise add_rms_norm "
        "(rms_norm), linear_rows and swiglu, in one kernel that recomputes the norm in every block (the decode "
        "step's norm + linear); x [M, K] with 1 <= M <= 8; not differentiable");
}
