// CUDA rotary position embedding, rotate-half convention (Hugging Face Llama/Qwen3), on
// x [B, S, H, D] at positions pos[s] ([S]), pos[b, s] ([B, S]) or s (common.h's RopePositions):
//   out[i]       = x[i] * cos(a_i) - x[i + D/2] * sin(a_i)
//   out[i + D/2] = x[i + D/2] * cos(a_i) + x[i] * sin(a_i),   a_i = pos * inv_freq[i], i < D/2
//
//  - inv_freq[i] = rope_inv_freq(freqs, i, D) (1 / theta^(2i/D), with Llama 3's scaling when set)
//    and the angles are float32, computed exactly as the CPU kernel does (the power in double,
//    rounded once to float32; the scaling's float32 operations uncontracted).
//  - document_positions: pos [B, S] = s - doc_start[b, s], one thread per token.
//  - inverse rotates by -angle (the backward). out is written with `=` and must not alias x.
//  - One block per (b, s) row with a shared cos/sin table; float32 compute for float32/bfloat16, float64 with the cos/sin
//    of the float32 angle for float64.
#include "kernels/cuda/common.cuh"

namespace xt {
namespace kernels {
namespace cuda {

namespace {

// One block per (b, s) row of [H, D]. The block first tabulates cos/sin of its position for the
// D/2 frequencies in shared memory (H times fewer sincos and pow than one per element, and no
// 64-bit index division per element), then rotates the row's H*D/2 pairs. The frequency, angle and
// rotation are kernels/common.h's rope_* (the fused head preparation uses them too).
template <typename T>
__global__ void rope_rows_kernel(const T* x, T* out, RopePositions pos, int S, int H, int D, RopeFreqs freqs,
                                 bool inverse) {
  using C = compute_t<T>;
  extern __shared__ unsigned char rope_smem[];
  C* tab_cos = reinterpret_cast<C*>(rope_smem);
  const int half = D / 2;
  C* tab_sin = tab_cos + half;
  const int64_t row = blockIdx.x;  // b * S + s
  const float p = pos.at(row, S);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    C sn, cs;
    rope_cos_sin(p * rope_inv_freq(freqs, i, D), &cs, &sn);
    tab_cos[i] = cs;
    tab_sin[i] = inverse ? -sn : sn;
  }
  __syncthreads();
  const int64_t row_base = row * static_cast<int64_t>(H) * D;
  const int pairs = H * half;
  for (int j = threadIdx.x; j < pairs; j += blockDim.x) {
    const int h = j / half;
    const int i = j - h * half;
    const int64_t base = row_base + static_cast<int64_t>(h) * D;
    const C cs = tab_cos[i], sn = tab_sin[i];
    C y1, y2;
    rope_rotate(load(x, base + i), load(x, base + i + half), cs, sn, &y1, &y2);
    store(out, base + i, y1);
    store(out, base + i + half, y2);
  }
}

constexpr int kRopeThreads = 128;

__global__ void document_positions_kernel(const int32_t* doc_start, int64_t* pos, int64_t n, int64_t S) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < n) pos[t] = t % S - doc_start[t];
}

}  // namespace

void rope(DType dt, const void* x, void* out, RopePositions pos, int64_t B, int64_t S, int64_t H, int64_t D,
          const RopeFreqs& freqs, bool inverse, void* stream) {
  XT_ASSERT(D % 2 == 0, "rope: odd head dim ", D);
  if (B * S * H * (D / 2) == 0) return;
  XT_CHECK(B * S <= INT32_MAX && S <= INT32_MAX && H * D <= INT32_MAX, ValueError, "rope: shape too large for CUDA: [",
           B, ", ", S, ", ", H, ", ", D, "]");
  OnStream on(stream);
  XT_DISPATCH_FLOAT(dt, "rope", T, {
    const size_t smem = sizeof(compute_t<T>) * static_cast<size_t>(D);  // cos and sin, D/2 each
    rope_rows_kernel<T><<<static_cast<unsigned>(B * S), kRopeThreads, smem, on.s>>>(
        static_cast<const T*>(x), static_cast<T*>(out), pos, static_cast<int>(S), static_cast<int>(H),
        static_cast<int>(D), freqs, inverse);
    XT_LAUNCH_CHECK();
  });
}

void document_positions(const int32_t* doc_start, int64_t* pos, int64_t B, int64_t S, void* stream) {
  const int64_t n = B * S;
  if (n == 0) return;
  OnStream on(stream);
  constexpr int kThreadsPerBlock = 256;
  document_positions_kernel<<<static_cast<unsigned>(ceil_div(n, kThreadsPerBlock)), kThreadsPerBlock, 0, on.s>>>(
      doc_start, pos, n, S);
  XT_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
