// xtrain._C.ops bindings of the fp8 family (csrc/ops/fp8.cpp): linear_fp8.
#include "ops/ops.h"
#include "python/op_registry.h"

XT_BIND_OPS(fp8, m) {
  using namespace xt;
  m.def("linear_fp8", &ops::linear_fp8, py::arg("x"), py::arg("weight"), NoGil(),
        "x @ weight^T through FP8: x and weight in E4M3, the backward's dy in E5M2, each scaled per tensor "
        "by a power of two from its amax; float32 accumulation, output in x's dtype (docs/fp8.md)");
}
