// xtrain._C.ops bindings of the reductions (csrc/ops/reduce.cpp): sum and mean over all elements
// or the last dimension; the Python `dim` argument becomes the op's `all` flag here.
#include <optional>

#include "core/error.h"
#include "ops/ops.h"
#include "python/op_registry.h"

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
}  // namespace xt

XT_BIND_OPS(reduce, m) {
  using namespace xt;
  using T = const Tensor&;
  m.def("sum", [](T x, std::optional<int64_t> dim, bool keepdim) {
          return ops::sum(x, reduce_all(x, dim, "sum"), keepdim);
        }, py::arg("x"), py::arg("dim") = py::none(), py::arg("keepdim") = false, NoGil(),
        "Sum over all elements (dim=None) or the last dimension (dim=-1)");
  m.def("mean", [](T x, std::optional<int64_t> dim, bool keepdim) {
          return ops::mean(x, reduce_all(x, dim, "mean"), keepdim);
        }, py::arg("x"), py::arg("dim") = py::none(), py::arg("keepdim") = false, NoGil(),
        "Mean over all elements (dim=None) or the last dimension (dim=-1)");
}
