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
// (parallel.h); every element's arithmetic is the same whoever computes it, and adamw_step's AVX2
// loop is its scalar loop's arithmetic 8 elements at a time (same bits).
#include <algorithm>
#include <cmath>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "kernels/cpu/parallel.h"
#include "kernels/kernels.h"

namespace xt {
namespace kernels {
namespace cpu {

constexpr int64_t kElementGrain = 1 << 15;  // elements per thread at the least

namespace {

// One tensor's AdamW update of elements [lo, hi): the scalar loop is the definition, the AVX2
// loop (8 lanes, the same IEEE operations in the same order, no fused multiply-add) its fast path
// on the CPUs that have it, so an element's bits do not depend on which of them computed it.
struct AdamWRange {
  float* p;
  const float* g;
  float* m;
  float* v;
  float gscale;  // the clip factor, 1 without clipping (g * 1 is g)
  float b1, b2, one_b1, one_b2, bc2_sqrt, eps, decay, step_size;
};

void adamw_scalar(const AdamWRange& a, int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi; ++i) {
    const float gi = a.g[i] * a.gscale;
    const float mi = a.b1 * a.m[i] + a.one_b1 * gi;
    const float vi = a.b2 * a.v[i] + a.one_b2 * gi * gi;
    a.m[i] = mi;
    a.v[i] = vi;
    const float denom = std::sqrt(vi) / a.bc2_sqrt + a.eps;
    a.p[i] = a.p[i] * a.decay - a.step_size * (mi / denom);
  }
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx2"))) void adamw_avx2(const AdamWRange& a, int64_t lo, int64_t hi) {
  const __m256 gs = _mm256_set1_ps(a.gscale), b1 = _mm256_set1_ps(a.b1), b2 = _mm256_set1_ps(a.b2),
               ob1 = _mm256_set1_ps(a.one_b1), ob2 = _mm256_set1_ps(a.one_b2), bc = _mm256_set1_ps(a.bc2_sqrt),
               eps = _mm256_set1_ps(a.eps), dec = _mm256_set1_ps(a.decay), step = _mm256_set1_ps(a.step_size);
  int64_t i = lo;
  for (; i + 8 <= hi; i += 8) {
    const __m256 gi = _mm256_mul_ps(_mm256_loadu_ps(a.g + i), gs);
    const __m256 mi = _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(a.m + i)), _mm256_mul_ps(ob1, gi));
    const __m256 vi =
        _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(a.v + i)), _mm256_mul_ps(_mm256_mul_ps(ob2, gi), gi));
    _mm256_storeu_ps(a.m + i, mi);
    _mm256_storeu_ps(a.v + i, vi);
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bc), eps);
    const __m256 pi = _mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(a.p + i), dec),
                                    _mm256_mul_ps(step, _mm256_div_ps(mi, denom)));
    _mm256_storeu_ps(a.p + i, pi);
  }
  adamw_scalar(a, i, hi);
}

bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}
#endif

void adamw_range(const AdamWRange& a, int64_t lo, int64_t hi) {
#if defined(__x86_64__) || defined(__i386__)
  if (has_avx2()) return adamw_avx2(a, lo, hi);
#endif
  adamw_scalar(a, lo, hi);
}

}  // namespace

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
    const AdamWRange a{params[t], grads[t], m[t], v[t], coef, hp.beta1, hp.beta2, 1.0f - hp.beta1,
                       1.0f - hp.beta2, bc2_sqrt, hp.eps, d, step_size};
    parallel_for(sizes[t], kElementGrain, [&](int64_t lo, int64_t hi) { adamw_range(a, lo, hi); });
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
