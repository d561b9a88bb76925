// xtrain._C.ops bindings of the rmsnorm family (csrc/ops/rmsnorm.cpp): rms_norm and the fused
// residual add + norm add_rms_norm.
#include "ops/ops.h"
#include "python/op_registry.h"

XT_BIND_OPS(rmsnorm, m) {
  using namespace xt;
  m.def("rms_norm", &ops::rms_norm, py::arg("x"), py::arg("weight"), py::arg("eps") = 1e-6, NoGil(),
        "RMSNorm over the last dim: x / sqrt(mean(x^2) + eps) * weight (weight [D], x's dtype or float32)");
  m.def("add_rms_norm", &ops::add_rms_norm, py::arg("x"), py::arg("residual"), py::arg("weight"),
        py::arg("eps") = 1e-6, NoGil(),
        "(h, rms_norm(h, weight, eps)) with h = x + residual, in one kernel; bitwise add then rms_norm");
}
