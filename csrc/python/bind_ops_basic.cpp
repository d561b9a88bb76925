// Bindings for the basic differentiable ops (xtrain.ops.*): elementwise, reductions, layout,
// matmul, embedding. Each releases the GIL around the op; dtype/device arguments are converted
// while the GIL is still held.
#include <optional>

#include "core/error.h"
#include "core/generator.h"
#include "ops/ops.h"
#include "python/bind.h"

namespace xt {

namespace {

// dim=None reduces everything; -1 (or ndim-1) reduces the last dimension; nothing else yet.
bool reduce_all(const Tensor& x, const std::optional<int64_t>& dim, const char* op) {
  if (!dim) return true;
  XT_CHECK(*dim == -1 || (x.dim() > 0 && *dim == x.dim() - 1), ValueError, op,
           ": only dim=None (all elements) or dim=-1 (the last dimension) are supported, got dim=", *dim, " for ",
           x.describe());
  return false;
}

}  // namespace

void init_ops_basic(py::module_& m) {
  using T = const Tensor&;
  // ---- elementwise
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
  m.def("cast", [](T x, const py::object& dtype) {
          const DType dt = dtype_arg(dtype, x.dtype());
          py::gil_scoped_release nogil;
          return ops::cast(x, dt);
        }, py::arg("x"), py::arg("dtype"), "x in another dtype; the gradient comes back in x's dtype");
  m.def("cast_many", [](const std::vector<Tensor>& xs, const py::object& dtype,
                        const std::optional<std::vector<Tensor>>& cached) {
          if (cached) {
            for (size_t i = 0; i < cached->size() && i < xs.size(); ++i)
              XT_CHECK(dtype.is_none() || (*cached)[i].dtype() == dtype_arg(dtype, DType::Float32), ValueError,
                       "cast_many: cached[", i, "] is ", (*cached)[i].describe(), ", not of dtype ",
                       py::str(dtype).cast<std::string>());
            py::gil_scoped_release nogil;
            return ops::cast_many_cached(xs, *cached);
          }
          if (dtype.is_none()) return xs;  // like cast: no dtype keeps each tensor as it is
          const DType dt = dtype_arg(dtype, DType::Float32);
          py::gil_scoped_release nogil;
          return ops::cast_many(xs, dt);
        }, py::arg("tensors"), py::arg("dtype"), py::arg("cached") = py::none(),
        "[cast(x, dtype) for x in tensors] in one fused kernel; each output keeps its own CastBackward. "
        "cached: the casts' values, already computed (no kernel runs; the outputs share their memory)");
  m.def("to", [](T x, const py::object& device, const py::object& dtype) {
          const Device dev = device_arg(device, x.device());
          const DType dt = dtype_arg(dtype, x.dtype());
          py::gil_scoped_release nogil;
          return ops::to(x, dev, dt);
        }, py::arg("x"), py::arg("device") = py::none(), py::arg("dtype") = py::none(),
        "Differentiable copy to another device and/or dtype (x itself when nothing changes)");
  m.def("dropout", [](T x, double p, bool training, const std::shared_ptr<Generator>& gen) {
          return ops::dropout(x, p, training, gen);
        }, py::arg("x"), py::arg("p"), py::arg("training") = true, py::arg("generator") = py::none(), NoGil(),
        "Zero elements with probability p and scale the rest by 1/(1-p); identity when not training");
  // ---- reductions
  m.def("sum", [](T x, std::optional<int64_t> dim, bool keepdim) {
          return ops::sum(x, reduce_all(x, dim, "sum"), keepdim);
        }, py::arg("x"), py::arg("dim") = py::none(), py::arg("keepdim") = false, NoGil(),
        "Sum over all elements (dim=None) or the last dimension (dim=-1)");
  m.def("mean", [](T x, std::optional<int64_t> dim, bool keepdim) {
          return ops::mean(x, reduce_all(x, dim, "mean"), keepdim);
        }, py::arg("x"), py::arg("dim") = py::none(), py::arg("keepdim") = false, NoGil(),
        "Mean over all elements (dim=None) or the last dimension (dim=-1)");
  // ---- layout
  m.def("reshape", &ops::reshape, py::arg("x"), py::arg("shape"), NoGil(),
        "Same data in a new shape (shares storage; one -1 is inferred)");
  m.def("view", &ops::reshape, py::arg("x"), py::arg("shape"), NoGil(), "Alias of reshape (shares storage)");
  m.def("transpose", &ops::transpose, py::arg("x"), py::arg("dim0"), py::arg("dim1"), NoGil(),
        "Swap two dimensions (a copy)");
  m.def("permute", &ops::permute, py::arg("x"), py::arg("dims"), NoGil(), "Reorder dimensions (a copy)");
  // ---- matmul
  m.def("matmul", &ops::matmul, py::arg("a"), py::arg("b"), NoGil(),
        "a @ b: 2-D, batched 3-D, or [..., K] @ [K, N]");
  m.def("linear", &ops::linear, py::arg("x"), py::arg("weight"), NoGil(), "x @ weight^T, weight is [out, in]");
  m.def("linear_multi", &ops::linear_multi, py::arg("x"), py::arg("weights"), NoGil(),
        "[x @ w^T for w in weights] as views of one buffer, one batched GEMM per run of equal shapes");
  // ---- embedding
  m.def("embedding", &ops::embedding, py::arg("weight"), py::arg("ids"), NoGil(),
        "Rows of weight [vocab, dim] picked by integer ids (IndexError when out of range)");
}

}  // namespace xt
