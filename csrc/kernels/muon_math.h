// Muon's element formulas, compiled for the host and the device alike (XT_HD), so the CPU and
// CUDA kernels (kernels/cpu/muon.cpp, kernels/cuda/muon.cu) evaluate the same expressions.
// They follow torch.optim.Muon: torch.lerp's float formula (the weight's size picks the form,
// as ATen's lerp does), the momentum buffer before the Nesterov mix, decay before the update.
#pragma once
#include "kernels/common.h"
#include "kernels/kernels.h"

namespace xt {
namespace kernels {

// self + w * (end - self) for |w| < 0.5, else end - (end - self) * (1 - w): ATen's lerp.
XT_HD float muon_lerp(float self, float end, float w) {
  return fabsf(w) < 0.5f ? self + w * (end - self) : end - (end - self) * (1.0f - w);
}

// The momentum step of one element: buf advanced in place, the update (Nesterov's mix or the
// buffer) returned. g is the gradient as read (clipped).
XT_HD float muon_momentum_element(float g, float& buf, const MuonParams& hp) {
  buf = muon_lerp(buf, g, hp.one_minus_momentum);
  return hp.nesterov ? muon_lerp(g, buf, hp.momentum) : buf;
}

// torch's order: p.mul_(1 - lr * wd), then p.add_(update, alpha=-adjusted_lr).
XT_HD float muon_apply_element(float p, float update, float decay, float adjusted_lr) {
  const float decayed = p * decay;
  return decayed - adjusted_lr * update;
}

// The divisor of the Newton-Schulz input, from its sum of squares: the norm rounded to bf16 (the
// norm of a bf16 tensor is bf16), clamped at eps, rounded to bf16.
XT_HD float muon_norm_divisor(double sumsq, float eps) {
  const float norm = bf16_load(bf16_round(static_cast<float>(sqrt(sumsq))));
  return bf16_load(bf16_round(norm > eps ? norm : eps));
}

}  // namespace kernels
}  // namespace xt
