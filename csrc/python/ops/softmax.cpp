// xtrain._C.ops bindings of the softmax family (csrc/ops/softmax.cpp): softmax and log_softmax
// over the last dimension (the only `dim` the Python argument may name).
#include <string>

#include "core/error.h"
#include "ops/ops.h"
#include "python/op_registry.h"

namespace xt {
namespace {

void check_last_dim(const Tensor& x, int64_t dim, const char* op) {
  const int64_t n = x.defined() ? x.dim() : 0;
  XT_CHECK(dim == -1 || (n > 0 && dim == n - 1), ValueError, op, ": only the last dimension is supported (dim=-1",
           n > 0 ? str(" or ", n - 1) : std::string(), "), got dim=", dim, " for x ", x.describe());
}

}  // namespace
}  // namespace xt

XT_BIND_OPS(softmax, m) {
  using namespace xt;
  m.def("softmax", [](const Tensor& x, int64_t dim) {
          check_last_dim(x, dim, "softmax");
          return ops::softmax(x);
        }, py::arg("x"), py::arg("dim") = -1, NoGil(), "Softmax over the last dim (computed in float32 for bf16)");
  m.def("log_softmax", [](const Tensor& x, int64_t dim) {
          check_last_dim(x, dim, "log_softmax");
          return ops::log_softmax(x);
        }, py::arg("x"), py::arg("dim") = -1, NoGil(), "Log-softmax over the last dim (computed in float32 for bf16)");
}
