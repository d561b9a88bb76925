// Rotary position embedding on the CPU, rotate-half convention (Hugging Face Llama/Qwen3):
//   out[i]       = x[i] * cos(a_i) - x[i + D/2] * sin(a_i)
//   out[i + D/2] = x[i + D/2] * cos(a_i) + x[i] * sin(a_i),   a_i = pos * inv_freq[i], i < D/2
// on x [B, S, H, D] at positions pos[s] ([S]), pos[b, s] ([B, S], each row its own) or s.
// document_positions writes [B, S] positions from document starts.
//
//  - inv_freq[i] = rope_inv_freq(freqs, i, D) (1 / theta^(2i/D), with Llama 3's scaling when set)
//    and the angles are float32, as Hugging Face computes them (exponent, reciprocal and product
//    in float32; the power rounded once to float32).
//  - inverse rotates by -angle: the transpose of the forward rotation, hence the exact backward.
//  - out is written with `=` and must not alias x. float32/bfloat16 rotate in float32 and
//    round once; float64 rotates in double with cos/sin of the float32 angle.
//  - Positions split over the CPU backend's threads (parallel.h); cos/sin once per (s, i), or per
//    (b, s, i) when the rows have positions of their own.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/common.h"
#include "kernels/cpu/parallel.h"
#include "kernels/kernels.h"

namespace xt {
namespace kernels {
namespace cpu {

namespace {

constexpr int64_t kGrainElements = 1 << 15;  // elements per thread at the least

template <typename T>
void rope_rows(const T* x, T* out, RopePositions pos, int64_t B, int64_t S, int64_t H, int64_t D,
               const RopeFreqs& freqs, bool inverse) {
  using C = compute_t<T>;
  const int64_t half = D / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv_freq[i] = rope_inv_freq(freqs, i, D);
  const C sign = inverse ? C(-1) : C(1);
  const bool per_row = pos.row_stride != 0;  // else every row of the batch has position s's angles
  parallel_for(S, std::max<int64_t>(1, kGrainElements / std::max<int64_t>(1, B * H * D)), [&](int64_t lo, int64_t hi) {
    std::vector<C> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
    const auto angles = [&](int64_t t) {  // cos and sin of token t = b * S + s
      const float ps = pos.at(t, S);
      for (int64_t i = 0; i < half; ++i) {
        rope_cos_sin(ps * inv_freq[i], &cs[i], &sn[i]);
        sn[i] *= sign;
      }
    };
    for (int64_t s = lo; s < hi; ++s) {
      if (!per_row) angles(s);
      for (int64_t b = 0; b < B; ++b) {
        if (per_row) angles(b * S + s);
        for (int64_t h = 0; h < H; ++h) {
          const int64_t base = ((b * S + s) * H + h) * D;
          const T* xr = x + base;
          T* orow = out + base;
          for (int64_t i = 0; i < half; ++i) {
            C y1, y2;
            rope_rotate(load(xr, i), load(xr, i + half), cs[i], sn[i], &y1, &y2);
            store(orow, i, y1);
            store(orow, i + half, y2);
          }
        }
      }
    }
  });
}

}  // namespace

void rope(DType dt, const void* x, void* out, RopePositions pos, int64_t B, int64_t S, int64_t H, int64_t D,
          const RopeFreqs& freqs, bool inverse, void*) {
  XT_ASSERT(D % 2 == 0, "rope: odd head dim ", D);
  XT_DISPATCH_FLOAT(dt, "rope", T, {
    rope_rows(static_cast<const T*>(x), static_cast<T*>(out), pos, B, S, H, D, freqs, inverse);
  });
}

void document_positions(const int32_t* doc_start, int64_t* pos, int64_t B, int64_t S, void*) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) pos[b * S + s] = s - doc_start[b * S + s];
}

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
