// xtrain._C.ops binding of rope (csrc/ops/rope.cpp).
#include <optional>

#include "ops/ops.h"
#include "python/op_registry.h"

XT_BIND_OPS(rope, m) {
  using namespace xt;
  m.def("rope", [](const Tensor& x, const std::optional<Tensor>& positions, double theta) {
          return ops::rope(x, positions ? *positions : Tensor(), theta);
        }, py::arg("x"), py::arg("positions") = py::none(), py::arg("theta") = 10000.0, NoGil(),
        "Rotary embedding (rotate-half) on x [B, S, H, D]; positions int64 [S], default 0..S-1");
}
