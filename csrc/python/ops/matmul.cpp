// xtrain._C.ops bindings of the matmul family (csrc/ops/matmul.cpp): matmul, linear, linear_multi,
// linear_multi_bias, rms_norm_linear_multi, swiglu_linear.
#include <optional>
#include <vector>

#include "ops/ops.h"
#include "python/op_registry.h"

XT_BIND_OPS(matmul, m) {
  using namespace xt;
  m.def("matmul", &ops::matmul, py::arg("a"), py::arg("b"), NoGil(),
        "a @ b: 2-D, batched 3-D, or [..., K] @ [K, N]");
  m.def("linear", &ops::linear, py::arg("x"), py::arg("weight"), NoGil(), "x @ weight^T, weight is [out, in]");
  m.def("linear_multi", &ops::linear_multi, py::arg("x"), py::arg("weights"), NoGil(),
        "[x @ w^T for w in weights] as views of one buffer, one batched GEMM per run of equal shapes");
  m.def("linear_multi_bias", &ops::linear_multi_bias, py::arg("x"), py::arg("weights"), py::arg("biases"), NoGil(),
        "[x @ w^T + b for w, b in zip(weights, biases)] as linear_multi's views; on CUDA the biases in the batched "
        "GEMM's epilogue (cuBLASLt), on the CPU linear_multi then add, bitwise");
  m.def("rms_norm_linear_multi", [](const Tensor& x, const std::vector<Tensor>& weights, const Tensor& norm_weight,
                                    double eps, const std::optional<Tensor>& residual) {
          return ops::rms_norm_linear_multi(x, weights, norm_weight, eps, residual.value_or(Tensor()));
        }, py::arg("x"), py::arg("weights"), py::arg("norm_weight"), py::arg("eps") = 1e-6,
        py::arg("residual") = py::none(), NoGil(),
        "(h, ys): h = x + residual (x itself without residual), ys = linear_multi(rms_norm(h, norm_weight, eps), "
        "weights); bitwise add_rms_norm (rms_norm) then linear_multi, forward and backward, keeping h for backward "
        "but not the normed input, which backward recomputes");
  m.def("swiglu_linear", &ops::swiglu_linear, py::arg("gate"), py::arg("up"), py::arg("weight"), NoGil(),
        "linear(swiglu(gate, up), weight), bitwise, keeping gate, up and weight for backward (not the hidden "
        "swiglu(gate, up), which backward recomputes): the SwiGLU MLP's down projection");
}
