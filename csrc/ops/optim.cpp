// Optimizer ops: fused AdamW over a parameter list, global gradient norm, clipping by norm.
// All tensors are float32 on one device (mixed precision keeps master weights, gradients and
// optimizer state in float32). The norm stays on the device: clipping never syncs the host.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "core/error.h"
#include "ops/dispatch.h"

namespace xt {
namespace ops {

namespace {

// Every tensor float32 on `dev`; fills the pointer and size arrays the fused kernels take.
void collect(const std::vector<Tensor>& ts, const char* op, const char* what, Device dev, std::vector<float*>& ptrs,
             std::vector<int64_t>* sizes) {
  ptrs.clear();
  for (size_t i = 0; i < ts.size(); ++i) {
    const Tensor& t = ts[i];
    XT_CHECK(t.defined(), ValueError, op, ": ", what, "[", i, "] is not a tensor");
    XT_CHECK(t.dtype() == DType::Float32, TypeError, op, ": ", what, "[", i, "] must be float32, got ",
             t.describe());
    XT_CHECK(t.device() == dev, ValueError, op, ": ", what, "[", i, "] is ", t.describe(), " but the first is on ",
             dev.str(), "; all tensors must share one device");
    ptrs.push_back(t.data<float>());
    if (sizes) sizes->push_back(t.numel());
  }
}

int list_size(size_t n, const char* op) {
  XT_CHECK(n <= static_cast<size_t>(std::numeric_limits<int>::max()), ValueError, op, ": too many tensors (", n, ")");
  return static_cast<int>(n);
}

}  // namespace

namespace {

// The kernel's hyper-parameters for (lr, step): checked, then converted as every backend sees them.
kernels::AdamWParams adamw_params(const char* op, double lr, double beta1, double beta2, double eps,
                                  double weight_decay, int64_t step) {
  XT_CHECK(step >= 1, ValueError, op, ": step must be >= 1 (it counts from 1), got ", step);
  XT_CHECK(lr >= 0.0 && std::isfinite(lr), ValueError, op, ": lr must be a finite value >= 0, got ", lr);
  XT_CHECK(beta1 >= 0.0 && beta1 < 1.0, ValueError, op, ": beta1 must be in [0, 1), got ", beta1);
  XT_CHECK(beta2 >= 0.0 && beta2 < 1.0, ValueError, op, ": beta2 must be in [0, 1), got ", beta2);
  XT_CHECK(eps >= 0.0, ValueError, op, ": eps must be >= 0, got ", eps);
  XT_CHECK(weight_decay >= 0.0, ValueError, op, ": weight_decay must be >= 0, got ", weight_decay);
  kernels::AdamWParams hp;
  hp.lr = static_cast<float>(lr);
  hp.beta1 = static_cast<float>(beta1);
  hp.beta2 = static_cast<float>(beta2);
  hp.eps = static_cast<float>(eps);
  hp.weight_decay = static_cast<float>(weight_decay);
  hp.bias_correction1 = static_cast<float>(1.0 - std::pow(beta1, static_cast<double>(step)));
  hp.bias_correction2 = static_cast<float>(1.0 - std::pow(beta2, static_cast<double>(step)));
  return hp;
}

}  // namespace

std::vector<float> adamw_consts(double lr, double beta1, double beta2, double eps, double weight_decay,
                                int64_t step) {
  const kernels::AdamWStepConsts c =
      kernels::adamw_step_consts(adamw_params("adamw_consts", lr, beta1, beta2, eps, weight_decay, step));
  return {c.decay, c.step_size, c.bc2_sqrt};
}

void adamw_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq, double lr, double beta1,
                double beta2, double eps, double weight_decay, int64_t step, const Tensor& guard,
                const Tensor& clip_norm, double max_norm, const Tensor& hyper, const std::vector<bool>& decays) {
  const char* op = "adamw_step";
  XT_CHECK(grads.size() == params.size() && exp_avg.size() == params.size() && exp_avg_sq.size() == params.size(),
           ValueError, op, ": params, grads, exp_avg and exp_avg_sq must have the same length, got ", params.size(),
           ", ", grads.size(), ", ", exp_avg.size(), ", ", exp_avg_sq.size());
  XT_CHECK(decays.empty() || decays.size() == params.size(), ValueError, op,
           ": decays must be empty (every tensor decays) or have one flag per parameter (", params.size(),
           "), got ", decays.size());
  kernels::AdamWParams hp = adamw_params(op, lr, beta1, beta2, eps, weight_decay, step);
  if (params.empty()) return;
  check_defined(params[0], "params[0]");
  const Device dev = params[0].device();
  XT_CHECK(!guard.defined() || (guard.dtype() == DType::Float32 && guard.numel() == 1 && guard.device() == dev),
           TypeError, op, ": guard must be a one-element float32 tensor on ", dev.str(), ", got ",
           guard.defined() ? guard.describe() : std::string());
  XT_CHECK(!clip_norm.defined() ||
               (clip_norm.dtype() == DType::Float32 && clip_norm.numel() == 1 && clip_norm.device() == dev),
           TypeError, op, ": clip_norm must be a one-element float32 tensor on ", dev.str(), ", got ",
           clip_norm.defined() ? clip_norm.describe() : std::string());
  XT_CHECK(!clip_norm.defined() || (max_norm > 0.0 && std::isfinite(max_norm)), ValueError, op,
           ": max_norm must be a finite value > 0 with clip_norm, got ", max_norm);
  std::vector<float*> p, g, m, v;
  std::vector<int64_t> sizes;
  collect(params, op, "params", dev, p, &sizes);
  collect(grads, op, "grads", dev, g, nullptr);
  collect(exp_avg, op, "exp_avg", dev, m, nullptr);
  collect(exp_avg_sq, op, "exp_avg_sq", dev, v, nullptr);
  for (size_t i = 0; i < params.size(); ++i) {
    XT_CHECK(grads[i].shape() == params[i].shape() && exp_avg[i].shape() == params[i].shape() &&
                 exp_avg_sq[i].shape() == params[i].shape(),
             ValueError, op, ": tensors at index ", i, " differ in shape: param ", params[i].describe(), ", grad ",
             grads[i].describe(), ", exp_avg ", exp_avg[i].describe(), ", exp_avg_sq ", exp_avg_sq[i].describe());
  }
  XT_CHECK(!hyper.defined() || (hyper.dtype() == DType::Float32 && hyper.numel() == 3 &&
                                 hyper.device() == dev),
           TypeError, op, ": hyper must be a 3-element float32 tensor on ", dev.str(), ", got ",
           hyper.defined() ? hyper.describe() : std::string());
  if (hyper.defined()) hp.hyper = hyper.data<float>();
  for (size_t i = 0; i < params.size(); ++i) {  // updated in place
    params[i].bump_version();
    exp_avg[i].bump_version();
    exp_avg_sq[i].bump_version();
  }
  std::vector<const float*> gc(g.begin(), g.end());
  std::unique_ptr<bool[]> flags;  // std::vector<bool> holds bits, the kernels take bools
  if (!decays.empty()) {
    flags.reset(new bool[decays.size()]);
    std::copy(decays.begin(), decays.end(), flags.get());
  }
  XT_KERNEL(dev, adamw_step, list_size(p.size(), op), p.data(), gc.data(), m.data(), v.data(), sizes.data(),
            flags.get(), hp,
            guard.defined() ? guard.data<float>() : nullptr, clip_norm.defined() ? clip_norm.data<float>() : nullptr,
            static_cast<float>(max_norm), stream_for(dev));
}

Tensor global_norm(const std::vector<Tensor>& tensors) {
  const Device dev = tensors.empty() || !tensors[0].defined() ? Device::cpu() : tensors[0].device();
  std::vector<float*> ptrs;
  std::vector<int64_t> sizes;
  collect(tensors, "global_norm", "tensors", dev, ptrs, &sizes);
  Tensor out = Tensor::empty({}, DType::Float32, dev);
  std::vector<const float*> cptrs(ptrs.begin(), ptrs.end());
  XT_KERNEL(dev, global_norm, list_size(cptrs.size(), "global_norm"), cptrs.data(), sizes.data(),
            out.data<float>(), stream_for(dev));
  return out;
}

void clip_by_norm_(const std::vector<Tensor>& tensors, const Tensor& norm, double max_norm) {
  const char* op = "clip_by_norm_";
  check_defined(norm, "norm");
  XT_CHECK(norm.dtype() == DType::Float32 && norm.numel() == 1, TypeError, op,
           ": norm must be a one-element float32 tensor, got ", norm.describe());
  XT_CHECK(max_norm >= 0.0, ValueError, op, ": max_norm must be >= 0, got ", max_norm);
  if (tensors.empty()) return;
  const Device dev = norm.device();
  std::vector<float*> ptrs;
  std::vector<int64_t> sizes;
  collect(tensors, op, "tensors", dev, ptrs, &sizes);
  for (const Tensor& t : tensors) t.bump_version();  // scaled in place
  XT_KERNEL(dev, clip_by_norm, list_size(ptrs.size(), op), ptrs.data(), sizes.data(), norm.data<float>(),
            static_cast<float>(max_norm), stream_for(dev));
}

}  // namespace ops
}  // namespace xt
