// Bindings for the fused optimizer ops (xtrain._C.optim): AdamW step, Muon step, global norm, clipping.
#include <optional>

#include "ops/ops.h"
#include "python/bind.h"

namespace xt {

void init_optim(py::module_& m) {
  py::module_ o = m.def_submodule("optim", "Fused optimizer kernels on float32 tensors of one device");
  o.def("adamw_step",
        [](const std::vector<Tensor>& params, const std::vector<Tensor>& grads, const std::vector<Tensor>& m,
           const std::vector<Tensor>& v, double lr, double beta1, double beta2, double eps, double wd, int64_t step,
           const std::optional<Tensor>& guard, const std::optional<Tensor>& clip_norm, double max_norm,
           const std::optional<Tensor>& hyper, const std::optional<std::vector<bool>>& decays) {
          ops::adamw_step(params, grads, m, v, lr, beta1, beta2, eps, wd, step, guard ? *guard : Tensor(),
                          clip_norm ? *clip_norm : Tensor(), max_norm, hyper ? *hyper : Tensor(),
                          decays ? *decays : std::vector<bool>());
        },
        py::arg("params"), py::arg("grads"), py::arg("exp_avg"),
        py::arg("exp_avg_sq"), py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"),
        py::arg("weight_decay"), py::arg("step"), py::arg("guard") = py::none(), py::arg("clip_norm") = py::none(),
        py::arg("max_norm") = 0.0, py::arg("hyper") = py::none(), py::arg("decays") = py::none(), NoGil(),
        "One AdamW step (torch.optim.AdamW math) over every tensor, in place; step counts from 1. guard: a "
        "one-element float32 tensor on the device; when it is not finite nothing is written (no host sync). "
        "clip_norm (with max_norm > 0): each gradient is read scaled by min(1, max_norm / (clip_norm + 1e-6)), "
        "the factor clip_by_norm_ would apply, without writing the gradients. hyper: a 3-element float32 tensor on "
        "the device holding adamw_consts(lr, ..., step), read by the kernel instead of lr and step (a CUDA graph "
        "replays with the values written there before each replay). decays: one bool per tensor, whether "
        "weight_decay applies to it (None: to every tensor); the others update as with weight_decay 0, in the same "
        "launch");
  o.def("adamw_consts", &ops::adamw_consts, py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"),
        py::arg("weight_decay"), py::arg("step"),
        "[decay, step_size, bc2_sqrt]: the per-step constants adamw_step computes from lr and step (float32 "
        "values as Python floats), for its `hyper` tensor");
  o.def("muon_step",
        [](const std::vector<Tensor>& params, const std::vector<Tensor>& grads, const std::vector<Tensor>& bufs,
           double lr, double wd, double momentum, bool nesterov, const std::vector<double>& ns_coefficients,
           int64_t ns_steps, double eps, const std::vector<double>& lr_ratios, const std::optional<Tensor>& guard,
           const std::optional<Tensor>& clip_norm, double max_norm, const std::optional<Tensor>& hyper) {
          ops::muon_step(params, grads, bufs, lr, wd, momentum, nesterov, ns_coefficients, ns_steps, eps, lr_ratios,
                         guard ? *guard : Tensor(), clip_norm ? *clip_norm : Tensor(), max_norm,
                         hyper ? *hyper : Tensor());
        },
        py::arg("params"), py::arg("grads"), py::arg("momentum_buffers"), py::arg("lr"), py::arg("weight_decay"),
        py::arg("momentum"), py::arg("nesterov"), py::arg("ns_coefficients"), py::arg("ns_steps"), py::arg("eps"),
        py::arg("lr_ratios"), py::arg("guard") = py::none(), py::arg("clip_norm") = py::none(),
        py::arg("max_norm") = 0.0, py::arg("hyper") = py::none(), NoGil(),
        "One Muon step (torch.optim.Muon math) over float32 2-D matrices, in place: momentum (Nesterov), "
        "ns_steps Newton-Schulz iterations with ns_coefficients (a, b, c) in bf16 on the engine's GEMMs (matrices "
        "of one shape batched), decoupled weight decay, and each matrix's lr * lr_ratios[i]. guard, clip_norm, "
        "max_norm: as adamw_step's. hyper: a 2-element float32 tensor on the device holding muon_consts(lr, "
        "weight_decay), read instead of lr and weight_decay (a CUDA graph replays with the values written there)");
  o.def("muon_consts", &ops::muon_consts, py::arg("lr"), py::arg("weight_decay"),
        "[decay, lr]: the per-step values muon_step computes from lr and weight_decay (float32 values as Python "
        "floats), for its `hyper` tensor");
  o.def("global_norm", &ops::global_norm, py::arg("tensors"), NoGil(),
        "sqrt of the sum of squares over all tensors, as a float32 [] tensor on their device");
  o.def("clip_by_norm_", &ops::clip_by_norm_, py::arg("tensors"), py::arg("norm"), py::arg("max_norm"), NoGil(),
        "Scale every tensor in place by min(1, max_norm / (norm + 1e-6)); no host sync");
}

}  // namespace xt
