// xtrain._C.ops bindings of the elementwise family (csrc/ops/elementwise.cpp): binary ops with
// numpy broadcasting, ops with a Python scalar, the fused SwiGLU, and every unary op of the ops
// layer's table (ops::unary_ops(): activations included), each as <name>(x).
#include "ops/ops.h"
#include "python/op_registry.h"

XT_BIND_OPS(elementwise, m) {
  using namespace xt;
  m.def("add", &ops::add, py::arg("a"), py::arg("b"), NoGil(), "a + b (numpy broadcasting)");
  m.def("sub", &ops::sub, py::arg("a"), py::arg("b"), NoGil(), "a - b (numpy broadcasting)");
  m.def("mul", &ops::mul, py::arg("a"), py::arg("b"), NoGil(), "a * b (numpy broadcasting)");
  m.def("div", &ops::div, py::arg("a"), py::arg("b"), NoGil(), "a / b (numpy broadcasting)");
  m.def("add_scalar", &ops::add_scalar, py::arg("x"), py::arg("s"), NoGil(), "x + s");
  m.def("mul_scalar", &ops::mul_scalar, py::arg("x"), py::arg("s"), NoGil(), "x * s");
  m.def("rsub_scalar", &ops::rsub_scalar, py::arg("x"), py::arg("s"), NoGil(), "s - x");
  m.def("div_scalar", &ops::div_scalar, py::arg("x"), py::arg("s"), NoGil(), "x / s");
  m.def("rdiv_scalar", &ops::rdiv_scalar, py::arg("x"), py::arg("s"), NoGil(), "s / x");
  m.def("pow_scalar", &ops::pow_scalar, py::arg("x"), py::arg("s"), NoGil(), "x ** s");
  for (const ops::UnaryOpInfo& u : ops::unary_ops())  // neg, exp, log, sqrt, silu, gelu, ...
    m.def(u.name, [op = u.op](const Tensor& x) { return ops::unary_fn(op, x); }, py::arg("x"), NoGil(), u.doc);
  m.def("swiglu", &ops::swiglu, py::arg("gate"), py::arg("up"), NoGil(), "silu(gate) * up (fused)");
}
