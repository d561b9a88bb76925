// xtrain._C.ops bindings of the layernorm family (csrc/ops/layernorm.cpp): layer_norm and the fused
// residual add + norm add_layer_norm.
#include "ops/ops.h"
#include "python/op_registry.h"

XT_BIND_OPS(layernorm, m) {
  using namespace xt;
  m.def("layer_norm", &ops::layer_norm, py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("eps") = 1e-5,
        NoGil(),
        "LayerNorm over the last dim: (x - mean) / sqrt(var + eps) * weight + bias (weight, bias [D], x's dtype or "
        "float32)");
  m.def("add_layer_norm", &ops::add_layer_norm, py::arg("x"), py::arg("residual"), py::arg("weight"),
        py::arg("bias"), py::arg("eps") = 1e-5, NoGil(),
        "(h, layer_norm(h, weight, bias, eps)) with h = x + residual, in one kernel; bitwise add then layer_norm");
}
