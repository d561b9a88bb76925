// xtrain._C.ops bindings of the elementwise family (csrc/ops/elementwise.cpp): binary ops with
// numpy broadcasting, ops with a Python scalar, unary ops and activations, the fused SwiGLU.
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
  m.def("neg", &ops::neg, py::arg("x"), NoGil(), "-x");
  m.def("exp", &ops::exp, py::arg("x"), NoGil(), "e ** x");
  m.def("log", &ops::log, py::arg("x"), NoGil(), "Natural logarithm");
  m.def("sqrt", &ops::sqrt, py::arg("x"), NoGil(), "Square root");
  m.def("silu", &ops::silu, py::arg("x"), NoGil(), "x * sigmoid(x)");
  m.def("gelu", &ops::gelu, py::arg("x"), NoGil(),
        "GELU, tanh approximation: x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))), as GPT-2 and "
        "torch.nn.functional.gelu(x, approximate='tanh')");
  m.def("swiglu", &ops::swiglu, py::arg("gate"), py::arg("up"), NoGil(), "silu(gate) * up (fused)");
}
