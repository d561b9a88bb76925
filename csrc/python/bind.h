// Shared declarations for the binding files. Bindings only convert arguments, release the
// GIL around real work and attach docstrings; logic lives in csrc/ops and csrc/tape. The op
// families bind themselves into xtrain._C.ops from csrc/python/ops/ (op_registry.h); the
// init functions below are the rest of the module, which module.cpp calls in order.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "core/tensor.h"

namespace xt {
namespace py = pybind11;

// Release the GIL for the duration of a call: py::call_guard<NoGil>().
using NoGil = py::call_guard<py::gil_scoped_release>;


// Argument conversion helpers (bind_tensor.cpp).
DType dtype_arg(const py::object& o, DType fallback);  // None, str, or xtrain dtype name
Device device_arg(const py::object& o, Device fallback);  // None, str, or Device
py::dtype numpy_dtype(DType dt);  // a tensor's values in numpy (bf16 as float32)

void init_tensor(py::module_& m);          // bind_tensor.cpp: Tensor, creation, numpy
void init_dlpack(py::module_& m);          // dlpack.cpp
void init_memory(py::module_& m);          // bind_memory.cpp: memory stats, cuda queries, seeds
void init_autograd(py::module_& m);        // bind_autograd.cpp: backward, grad mode, checkpoint
void init_optim(py::module_& m);           // bind_optim.cpp: fused AdamW, global norm, clipping
void init_dist(py::module_& m);            // bind_dist.cpp: NCCL communicator
void init_profile(py::module_& m);         // bind_profile.cpp: the CPU profile

}  // namespace xt
