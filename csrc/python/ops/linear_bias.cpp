// xtrain._C.ops bindings of the biased linears with fused epilogues (csrc/ops/linear_bias.cpp):
// linear_bias and gelu_mlp.
#include "ops/ops.h"
#include "python/op_registry.h"

XT_BIND_OPS(linear_bias, m) {
  using namespace xt;
  m.def("linear_bias", &ops::linear_bias, py::arg("x"), py::arg("weight"), py::arg("bias"), NoGil(),
        "x @ weight^T + bias (weight [out, in], bias [out], x's dtype); on CUDA the bias is added in the GEMM's "
        "epilogue (cuBLASLt), on the CPU it is linear then add, bitwise");
  m.def("gelu_mlp", &ops::gelu_mlp, py::arg("x"), py::arg("fc_weight"), py::arg("fc_bias"), py::arg("proj_weight"),
        py::arg("proj_bias"), NoGil(),
        "gelu_tanh(x @ fc_weight^T + fc_bias) @ proj_weight^T + proj_bias (GPT-2's MLP); on CUDA bias and GELU in "
        "the GEMMs' epilogues both ways (cuBLASLt), on the CPU the unfused ops, bitwise");
}
