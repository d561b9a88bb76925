// CPU optimizer kernels (float32, fused over a list of tensors): AdamW step, global norm, clip.
//
// adamw_step updates params, exp_avg and exp_avg_sq in place, with torch.optim.AdamW's math:
//   p *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g;
//   p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
// global_norm sums squares in float64 into kNormLanes partial sums (element i of every tensor into
// sum i % kNormLanes, tensor by tensor), added pairwise at the end: a fixed order, and independent
// sums the compiler keeps in vector registers instead of one chain of dependent adds.
// clip_by_norm scales in place by min(1, max_norm / (norm + 1e-6)).
// Tensors outside the decaying group (decays[t] false) multiply by the decay constant of
// weight_decay 0, as a call of their own with weight_decay 0 would.
// A non-finite guard value (the step's loss or gradient norm) makes adamw_step write nothing; a
// clip norm makes it read each gradient scaled by clip_by_norm's factor (the same float product).
// adamw_step and clip_by_norm split each tensor's elements over the CPU backend's threads
// (parallel.h); every element's arithmetic is the same whoever computes it.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/parallel.h"
#include "kernels/kernels.h"

namespace xt {
namespace kernels {
namespace cpu {

constexpr int64_t kElementGrain = 1 << 15;  // elements per thread at the least

void adamw_step(int n_tensors, float* const* params, const float* const* grads, float* const* m, float* const* v,
                const int64_t* sizes, const bool* decays, AdamWParams hp, const float* guard, const float* clip_norm,
                float max_norm, void*) {
  if (guard && !std::isfinite(guard[0])) return;  // a non-finite step: no update
  const float coef = clip_norm ? std::min(1.0f, max_norm / (clip_norm[0] + 1e-6f)) : 1.0f;
  const AdamWStepConsts c = adamw_step_consts(hp);
  const float decay = hp.hyper ? hp.hyper[0] : c.decay;  // hyper: the step's constants, in memory
  const float step_size = hp.hyper ? hp.hyper[1] : c.step_size;
  const float bc2_sqrt = hp.hyper ? hp.hyper[2] : c.bc2_sqrt;
  const float no_decay = adamw_no_decay(hp);
  for (int t = 0; t < n_tensors; ++t) {
    const float d = !decays || decays[t] ? decay : no_decay;
    float* p = params[t];
    const float* g = grads[t];
    float* mt = m[t];
    float* vt = v[t];
    parallel_for(sizes[t], kElementGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        const float gi = clip_norm ? g[i] * coef : g[i];
        const float mi = hp.beta1 * mt[i] + (1.0f - hp.beta1) * gi;
        const float vi = hp.beta2 * vt[i] + (1.0f - hp.beta2) * gi * gi;
        mt[i] = mi;
        vt[i] = vi;
        const float denom = std::sqrt(vi) / bc2_sqrt + hp.eps;
        p[i] = p[i] * d - step_size * (mi / denom);
      }
    });
  }
}

constexpr int kNormLanes = 8;

void global_norm(int n_tensors, const float* const* tensors, const int64_t* sizes, float* out, void*) {
  double acc[kNormLanes] = {};
  for (int t = 0; t < n_tensors; ++t) {
    const float* x = tensors[t];
    const int64_t n = sizes[t], body = n - n % kNormLanes;
    for (int64_t i = 0; i < body; i += kNormLanes)
      for (int l = 0; l < kNormLanes; ++l) acc[l] += static_cast<double>(x[i + l]) * static_cast<double>(x[i + l]);
    for (int64_t i = body; i < n; ++i) acc[i - body] += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  }
  for (int width = kNormLanes / 2; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) acc[l] += acc[l + width];
  out[0] = static_cast<float>(std::sqrt(acc[0]));
}

void clip_by_norm(int n_tensors, float* const* tensors, const int64_t* sizes, const float* norm, float max_norm,
                  void*) {
  const float coef = std::min(1.0f, max_norm / (norm[0] + 1e-6f));
  for (int t = 0; t < n_tensors; ++t) {
    float* x = tensors[t];
    parallel_for(sizes[t], kElementGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) x[i] *= coef;
    });
  }
}

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
