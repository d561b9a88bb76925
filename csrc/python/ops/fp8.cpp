// xtrain._C.ops bindings of the fp8 family (csrc/ops/fp8.cpp): linear_fp8, linear_fp8_multi, mlp_fp8.
#include "ops/ops.h"
#include "python/op_registry.h"

XT_BIND_OPS(fp8, m) {
  using namespace xt;
  m.def("linear_fp8", &ops::linear_fp8, py::arg("x"), py::arg("weight"), NoGil(),
        "x @ weight^T through FP8: x and weight in E4M3, the backward's dy in E5M2, each scaled per tensor "
        "by a power of two from its amax; float32 accumulation, output in x's dtype (docs/fp8.md)");
  m.def("linear_fp8_multi", &ops::linear_fp8_multi, py::arg("x"), py::arg("weights"), NoGil(),
        "[linear_fp8(x, w) for w in weights] with x quantised once for all of them (one amax pass, one cast, "
        "one saved copy of its codes): the outputs and weight gradients are linear_fp8's bits, dx the weights' "
        "dgrad GEMMs accumulated in their order");
  m.def("mlp_fp8", &ops::mlp_fp8, py::arg("x"), py::arg("w_gate"), py::arg("w_up"), py::arg("w_down"), NoGil(),
        "linear_fp8(swiglu(*linear_fp8_multi(x, [w_gate, w_up])), w_down) as one op with the same bits: the "
        "SwiGLU kernels take the amax of what they write, so h, dgate and dup need no amax pass of their own");
}
