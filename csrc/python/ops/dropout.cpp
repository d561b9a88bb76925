// xtrain._C.ops binding of dropout (csrc/ops/dropout.cpp).
#include <memory>

#include "core/generator.h"
#include "ops/ops.h"
#include "python/op_registry.h"

XT_BIND_OPS(dropout, m) {
  using namespace xt;
  m.def("dropout", [](const Tensor& x, double p, bool training, const std::shared_ptr<Generator>& gen) {
          return ops::dropout(x, p, training, gen);
        }, py::arg("x"), py::arg("p"), py::arg("training") = true, py::arg("generator") = py::none(), NoGil(),
        "Zero elements with probability p and scale the rest by 1/(1-p); identity when not training");
}
