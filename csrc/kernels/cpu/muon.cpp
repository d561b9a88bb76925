// CPU Muon kernels: the elementwise parts of a Muon step (the Newton-Schulz GEMMs are the
// engine's gemm, called by ops/muon.cpp), over a list of float32 matrices.
//
// muon_momentum: g = grad (read clipped), buf = lerp(buf, g, 1 - mu), x = bf16(Nesterov's
//   lerp(g, buf, mu), or buf), x stored transposed for a tall matrix; nothing written when the
//   guard is not finite.
// muon_normalize: x /= bf16(max(bf16(||x||_F), eps)) in bf16, the squares summed in float64 in
//   element order.
// muon_apply: p = p * (1 - lr * wd) - lr * scale * x, nothing written when the guard is not finite.
// The element formulas are kernels/muon_math.h's (the CUDA kernels evaluate the same). Rows are
// split over the CPU backend's threads (parallel.h); each element's arithmetic is the same
// whoever computes it.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/parallel.h"
#include "kernels/kernels.h"
#include "kernels/muon_math.h"

namespace xt {
namespace kernels {
namespace cpu {

namespace {
constexpr int64_t kRowGrain = 1 << 15;  // elements per thread at the least, in whole rows
int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, kRowGrain / std::max<int64_t>(1, cols)); }
}  // namespace

void muon_momentum(int n_tensors, const float* const* grads, float* const* bufs, void* const* x, const int64_t* rows,
                   const int64_t* cols, MuonParams hp, const float* guard, const float* clip_norm, float max_norm,
                   void*) {
  if (guard && !std::isfinite(guard[0])) return;  // a non-finite step: no update
  const float coef = clip_norm ? std::min(1.0f, max_norm / (clip_norm[0] + 1e-6f)) : 1.0f;
  for (int t = 0; t < n_tensors; ++t) {
    const float* g = grads[t];
    float* buf = bufs[t];
    bf16_t* out = static_cast<bf16_t*>(x[t]);
    const int64_t R = rows[t], C = cols[t];
    const bool transposed = R > C;
    parallel_for(R, row_grain(C), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r)
        for (int64_t c = 0; c < C; ++c) {
          const int64_t i = r * C + c;
          const float gi = clip_norm ? g[i] * coef : g[i];
          const float u = muon_momentum_element(gi, buf[i], hp);
          out[transposed ? c * R + r : i] = bf16_round(u);
        }
    });
  }
}

void muon_normalize(int n_tensors, void* const* x, const int64_t* sizes, float eps, void*) {
  for (int t = 0; t < n_tensors; ++t) {
    bf16_t* v = static_cast<bf16_t*>(x[t]);
    double acc = 0.0;
    for (int64_t i = 0; i < sizes[t]; ++i) {
      const double vi = bf16_load(v[i]);
      acc += vi * vi;
    }
    const float d = muon_norm_divisor(acc, eps);
    parallel_for(sizes[t], kRowGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) v[i] = bf16_round(bf16_load(v[i]) / d);
    });
  }
}

void muon_apply(int n_tensors, float* const* params, const void* const* x, const int64_t* rows, const int64_t* cols,
                const float* scales, MuonParams hp, const float* guard, void*) {
  if (guard && !std::isfinite(guard[0])) return;  // a non-finite step: no update
  const float decay = hp.hyper ? hp.hyper[0] : hp.decay;  // hyper: the step's values, in memory
  const float lr = hp.hyper ? hp.hyper[1] : hp.lr;
  for (int t = 0; t < n_tensors; ++t) {
    float* p = params[t];
    const bf16_t* u = static_cast<const bf16_t*>(x[t]);
    const int64_t R = rows[t], C = cols[t];
    const bool transposed = R > C;
    const float adjusted_lr = lr * scales[t];
    parallel_for(R, row_grain(C), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r)
        for (int64_t c = 0; c < C; ++c) {
          const int64_t i = r * C + c;
          p[i] = muon_apply_element(p[i], bf16_load(u[transposed ? c * R + r : i]), decay, adjusted_lr);
        }
    });
  }
}

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
