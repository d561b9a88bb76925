// xtrain._C.ops bindings of the layout family (csrc/ops/layout.cpp): reshape (and its alias
// view), transpose, permute.
#include "ops/ops.h"
#include "python/op_registry.h"

XT_BIND_OPS(layout, m) {
  using namespace xt;
  m.def("reshape", &ops::reshape, py::arg("x"), py::arg("shape"), NoGil(),
        "Same data in a new shape (shares storage; one -1 is inferred)");
  m.def("view", &ops::reshape, py::arg("x"), py::arg("shape"), NoGil(), "Alias of reshape (shares storage)");
  m.def("transpose", &ops::transpose, py::arg("x"), py::arg("dim0"), py::arg("dim1"), NoGil(),
        "Swap two dimensions (a copy)");
  m.def("permute", &ops::permute, py::arg("x"), py::arg("dims"), NoGil(), "Reorder dimensions (a copy)");
}
