// The xtrain._C extension module: exception mapping, then the submodules in dependency order
// (Tensor first, so every later signature names the Python type).
#include "core/error.h"
#include "python/bind.h"
#include "python/op_registry.h"

namespace xt {
namespace {
PyObject* g_oom_type = nullptr;
}
}  // namespace xt

PYBIND11_MODULE(_C, m) {
  namespace py = pybind11;
  using namespace xt;
  m.doc() = "xtrain engine: tensors, caching allocator, autodiff tape, CPU/CUDA kernels";

  // xtrain.OutOfMemoryError is both a RuntimeError and a MemoryError.
  py::tuple bases = py::make_tuple(py::handle(PyExc_RuntimeError), py::handle(PyExc_MemoryError));
  g_oom_type = PyErr_NewExceptionWithDoc("xtrain._C.OutOfMemoryError",
                                         "A device or a memory limit ran out of memory; the message "
                                         "gives the request, what is allocated and reserved, and the limit.",
                                         bases.ptr(), nullptr);
  m.attr("OutOfMemoryError") = py::handle(g_oom_type);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const xt::OutOfMemoryError& e) {
      PyErr_SetString(g_oom_type, e.what());
    } catch (const xt::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const xt::TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const xt::IndexError& e) {
      PyErr_SetString(PyExc_IndexError, e.what());
    } catch (const xt::RuntimeError& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  init_tensor(m);
  init_dlpack(m);
  init_memory(m);
  init_autograd(m);
  py::module_ ops = m.def_submodule("ops", "Differentiable ops (xtrain.ops re-exports these)");
  bind_registered_ops(ops);  // csrc/python/ops/*.cpp, one file per op family
  init_optim(m);
  init_dist(m);
  init_profile(m);
}
