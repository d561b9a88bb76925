// Bindings for csrc/dist (NCCL). Builds without NCCL expose is_available() == False only.
#include "python/bind.h"

namespace xt {
void init_dist(py::module_& m) {
  py::module_ d = m.def_submodule("dist", "NCCL communicator (data-parallel training)");
#ifdef XT_NCCL
  d.def("is_available", [] { return true; }, "True when xtrain was built with NCCL");
#else
  d.def("is_available", [] { return false; }, "True when xtrain was built with NCCL");
#endif
}
}  // namespace xt
