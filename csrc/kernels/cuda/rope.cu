// CUDA rotary position embedding, rotate-half convention (Hugging Face Llama/Qwen3), on
// x [B, S, H, D] with pos int64 [S]:
//   out[i]       = x[i] * cos(a_i) - x[i + D/2] * sin(a_i)
//   out[i + D/2] = x[i + D/2] * cos(a_i) + x[i] * sin(a_i),   a_i = pos * inv_freq[i], i < D/2
//
//  - inv_freq[i] = 1 / theta^(2i/D) and the angles are float32, computed exactly as the CPU
//    kernel does (the power in double, rounded once to float32).
//  - inverse rotates by -angle (the backward). out is written with `=` and must not alias x.
//  - One thread per rotated pair; float32 compute for float32/bfloat16, float64 with the cos/sin
//    of the float32 angle for float64.
#include "kernels/cuda/common.cuh"

namespace xt {
namespace kernels {
namespace cuda {

namespace {

__device__ __forceinline__ void xsincos(float a, float* s, float* c) { sincosf(a, s, c); }
__device__ __forceinline__ void xsincos(double a, double* s, double* c) { sincos(a, s, c); }

template <typename T>
__global__ void rope_kernel(const T* x, T* out, const int64_t* pos, int64_t B, int64_t S, int64_t H, int64_t D,
                            float theta, bool inverse) {
  using C = compute_t<T>;
  const int64_t half = D / 2;
  const int64_t n = B * S * H * half;
  XT_GRID_STRIDE(k, n) {
    const int64_t i = k % half;
    int64_t rest = k / half;
    const int64_t h = rest % H;
    rest /= H;
    const int64_t s = rest % S;
    const int64_t b = rest / S;
    const float expo = static_cast<float>(2 * i) / static_cast<float>(D);
    const float p = static_cast<float>(pow(static_cast<double>(theta), static_cast<double>(expo)));
    const float inv_freq = 1.0f / p;
    const float angle = static_cast<float>(pos[s]) * inv_freq;
    C sn, cs;
    xsincos(static_cast<C>(angle), &sn, &cs);
    if (inverse) sn = -sn;
    const int64_t base = ((b * S + s) * H + h) * D;
    const C x1 = load(x, base + i);
    const C x2 = load(x, base + i + half);
    store(out, base + i, static_cast<C>(x1 * cs - x2 * sn));
    store(out, base + i + half, static_cast<C>(x2 * cs + x1 * sn));
  }
}

}  // namespace

void rope(DType dt, const void* x, void* out, const int64_t* pos, int64_t B, int64_t S, int64_t H, int64_t D,
          float theta, bool inverse, void* stream) {
  XT_ASSERT(D % 2 == 0, "rope: odd head dim ", D);
  const int64_t n = B * S * H * (D / 2);
  if (n == 0) return;
  OnStream on(stream);
  dispatch_float(dt, "rope", [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    rope_kernel<T><<<grid_for(n), kThreads, 0, on.s>>>(static_cast<const T*>(x), static_cast<T*>(out), pos, B, S, H,
                                                       D, theta, inverse);
    XT_LAUNCH_CHECK();
  });
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
