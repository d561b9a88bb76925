// xtrain._C.ops binding of embedding (csrc/ops/embedding.cpp).
#include "ops/ops.h"
#include "python/op_registry.h"

XT_BIND_OPS(embedding, m) {
  using namespace xt;
  m.def("embedding", &ops::embedding, py::arg("weight"), py::arg("ids"), NoGil(),
        "Rows of weight [vocab, dim] picked by integer ids (IndexError when out of range)");
}
