// Bindings for the fused optimizer ops (xtrain._C.optim): AdamW step, global norm, clipping.
#include "ops/ops.h"
#include "python/bind.h"

namespace xt {

void init_optim(py::module_& m) {
  py::module_ o = m.def_submodule("optim", "Fused optimizer kernels on float32 tensors of one device");
  o.def("adamw_step", &ops::adamw_step, py::arg("params"), py::arg("grads"), py::arg("exp_avg"),
        py::arg("exp_avg_sq"), py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"),
        py::arg("weight_decay"), py::arg("step"), NoGil(),
        "One AdamW step (torch.optim.AdamW math) over every tensor, in place; step counts from 1");
  o.def("global_norm", &ops::global_norm, py::arg("tensors"), NoGil(),
        "sqrt of the sum of squares over all tensors, as a float32 [] tensor on their device");
  o.def("clip_by_norm_", &ops::clip_by_norm_, py::arg("tensors"), py::arg("norm"), py::arg("max_norm"), NoGil(),
        "Scale every tensor in place by min(1, max_norm / (norm + 1e-6)); no host sync");
}

}  // namespace xt
