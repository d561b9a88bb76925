// xtrain._C.ops bindings of the cast family (csrc/ops/cast.cpp): cast, cast_many, to. The dtype
// and device arguments are converted while the GIL is held, then the op runs without it.
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "ops/ops.h"
#include "python/op_registry.h"

XT_BIND_OPS(cast, m) {
  using namespace xt;
  using T = const Tensor&;
  m.def("cast", [](T x, const py::object& dtype) {
          const DType dt = dtype_arg(dtype, x.dtype());
          py::gil_scoped_release nogil;
          return ops::cast(x, dt);
        }, py::arg("x"), py::arg("dtype"), "x in another dtype; the gradient comes back in x's dtype");
  m.def("cast_many", [](const std::vector<Tensor>& xs, const py::object& dtype,
                        const std::optional<std::vector<Tensor>>& cached, bool recast_saved) {
          XT_CHECK(!(cached && recast_saved), ValueError,
                   "cast_many: recast_saved needs the casts made here; cached casts are already made");
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
          return ops::cast_many(xs, dt, recast_saved);
        }, py::arg("tensors"), py::arg("dtype"), py::arg("cached") = py::none(), py::arg("recast_saved") = false,
        "[cast(x, dtype) for x in tensors] in one fused kernel; each output keeps its own CastBackward. "
        "cached: the casts' values, already computed (no kernel runs; the outputs share their memory). "
        "recast_saved: an op that saves an output for backward keeps its source instead and casts it again "
        "then (the casts' memory lives only while the forward uses them)");
  m.def("to", [](T x, const py::object& device, const py::object& dtype) {
          const Device dev = device_arg(device, x.device());
          const DType dt = dtype_arg(dtype, x.dtype());
          py::gil_scoped_release nogil;
          return ops::to(x, dev, dt);
        }, py::arg("x"), py::arg("device") = py::none(), py::arg("dtype") = py::none(),
        "Differentiable copy to another device and/or dtype (x itself when nothing changes)");
}
