// The CUDA optimizer kernels (launched by kernels/cuda/optim.cu), in a header so that tests/emu
// runs them on the CPU under the warp/block emulator (tests/emu/optim_emu.cpp).
//
// Note [Optimizer kernels at the memory roofline]
// AdamW reads p, g, m, v and writes p, m, v: 28 bytes per parameter and nothing else, so its time
// is bytes / HBM bandwidth when enough bytes are in flight. The global norm reads 4 bytes per
// gradient. Both run over a few long runs of memory (the parameter store's flats: AdamW's
// ranges, the norm's regions) or over a list of separate tensors:
//  - AdamW: a range is cut into chunks of kChunk elements; chunk c of the launch belongs to the
//    range r with chunk0[r] <= c < chunk0[r + 1]. A block takes chunks blockIdx.x, + gridDim.x, ...
//    (a grid of at most kOptMaxBlocks: every block stays resident and keeps loading). A full
//    chunk of a range whose four pointers are 16-byte aligned moves as 16-byte packs, kUnroll of
//    each array per thread loaded before any is used (8 loads, 128 bytes in flight per thread);
//    a range's last, partial chunk, or a misaligned range, goes element by element. The update of
//    an element is one function (adamw_element), so every path does the same float operations.
//  - Weight decay per range (AdamWList::decays): a range outside the decaying group multiplies by
//    no_decay = 1 - lr * 0 = 1, the constant a launch with weight_decay 0 computes (it does not
//    depend on lr or the step, so it is a launch constant even when hyper holds the step's
//    values). Both groups of a model are one launch.
//  - Global norm: block b owns elements [b * kChunk, (b + 1) * kChunk) of the concatenated
//    tensors, and thread t sums the squares of elements t, t + kOptThreads, ... of it in float64,
//    in that order, before block_sum: the partial of chunk b depends only on the values, and the
//    final pass adds the partials in chunk order. The fast path keeps exactly that mapping but
//    stages a chunk lying in one 16-byte aligned tensor into shared memory with 16-byte loads
//    (two per thread), then each thread reads its own elements from there; other chunks (across
//    tensors, misaligned, the last partial one) are walked element by element as before. The
//    bits of the norm are therefore those of the element-by-element kernel, whichever path a
//    chunk takes (tests/emu/optim_emu.cpp checks it against that kernel).
#pragma once
#include "kernels/cuda/common.cuh"

namespace xt {
namespace kernels {
namespace cuda {
namespace optim {

constexpr int kMaxTensors = 256;
constexpr int kOptThreads = 256;
constexpr int64_t kChunk = 8 * kOptThreads;  // elements per chunk (the norm's partials are per chunk)
constexpr int kUnroll = static_cast<int>(kChunk / (4 * kOptThreads));  // 16-byte packs per array per thread
static_assert(kChunk == 4 * kOptThreads * kUnroll, "a chunk is whole packs for every thread");
// AdamW's grid: 132 SMs (H200) x 4 resident blocks of 256 threads (the update holds 32 floats of
// loads per thread, ~64 registers); a fixed number, so the launch shape depends on the sizes only.
constexpr int64_t kOptMaxBlocks = 132 * 4;

// ------------------------------------------------------------------ AdamW

struct AdamWList {
  int n = 0;
  int64_t chunk0[kMaxTensors + 1];  // first chunk of each range (cumulative ceil(size / kChunk))
  int64_t size[kMaxTensors];
  float* p[kMaxTensors];
  const float* g[kMaxTensors];
  float* m[kMaxTensors];
  float* v[kMaxTensors];
  bool decays[kMaxTensors];  // multiplied by the decay constant, else by no_decay
  bool packed[kMaxTensors];  // p, g, m, v all 16-byte aligned
};
// Kernel parameters may take up to 32 KiB on sm_70+ with CUDA >= 12.1.
static_assert(sizeof(AdamWList) < 32000, "AdamWList must fit in the kernel parameter space");

// Appends range r = L.n (size > 0) to L, as the launcher builds its lists (L.chunk0[0] = 0 first).
inline void push_range(AdamWList& L, float* p, const float* g, float* m, float* v, int64_t size, bool decays) {
  const int r = L.n++;
  L.p[r] = p;
  L.g[r] = g;
  L.m[r] = m;
  L.v[r] = v;
  L.size[r] = size;
  L.decays[r] = decays;
  L.packed[r] = aligned_to(p, 16) && aligned_to(g, 16) && aligned_to(m, 16) && aligned_to(v, 16);
  L.chunk0[r + 1] = L.chunk0[r] + ceil_div(size, kChunk);
}

// The grid of a launch over L: a block per chunk, at most kOptMaxBlocks.
inline unsigned adamw_blocks(const AdamWList& L) {
  return static_cast<unsigned>(L.chunk0[L.n] < kOptMaxBlocks ? L.chunk0[L.n] : kOptMaxBlocks);
}

struct AdamWConsts {
  float beta1, beta2, eps, decay, step_size, bc2_sqrt, no_decay;
};
inline AdamWConsts adamw_kernel_consts(const AdamWParams& hp) {
  const AdamWStepConsts c = adamw_step_consts(hp);
  return {hp.beta1, hp.beta2, hp.eps, c.decay, c.step_size, c.bc2_sqrt, adamw_no_decay(hp)};
}

// One element of torch.optim.AdamW's update (kernels/cpu/optim.cpp has the same operations).
// On the device every rounding is spelled out: nvcc contracts a * b + c into fma by its own
// heuristics, which picked different products for the unrolled packs than for the former
// element-by-element kernel. These are the former kernel's operations as nvcc compiled them
// (its PTX): m = fma(b1, m, (1 - b1) * g), v = fma(g, (1 - b2) * g, b2 * v), the rest unfused.
// The emulator (host) runs the plain expressions, as the CPU kernel does.
__device__ __forceinline__ void adamw_element(float& p, float& m, float& v, float g, const AdamWConsts& k,
                                              bool clip, float coef, float decay, float step_size,
                                              float bc2_sqrt) {
#if defined(__CUDA_ARCH__)
  const float gi = clip ? __fmul_rn(g, coef) : g;
  const float mi = __fmaf_rn(k.beta1, m, __fmul_rn(1.0f - k.beta1, gi));
  const float vi = __fmaf_rn(gi, __fmul_rn(1.0f - k.beta2, gi), __fmul_rn(k.beta2, v));
  const float denom = __fadd_rn(__fdiv_rn(sqrtf(vi), bc2_sqrt), k.eps);
  p = __fsub_rn(__fmul_rn(p, decay), __fmul_rn(step_size, __fdiv_rn(mi, denom)));
#else
  const float gi = clip ? g * coef : g;
  const float mi = k.beta1 * m + (1.0f - k.beta1) * gi;
  const float vi = k.beta2 * v + (1.0f - k.beta2) * gi * gi;
  const float denom = sqrtf(vi) / bc2_sqrt + k.eps;
  p = p * decay - step_size * (mi / denom);
#endif
  m = mi;
  v = vi;
}

// guard (nullable): skip everything when not finite. clip_norm (nullable): gradients read scaled
// by clip_by_norm's factor. hyper (nullable): decay, step_size, bc2_sqrt in device memory instead
// of k's (CUDA graphs).
__global__ void __launch_bounds__(kOptThreads)
adamw_kernel(const AdamWList L, AdamWConsts k, const float* guard, const float* clip_norm, float max_norm,
             const float* hyper) {
  if (guard && !isfinite(*guard)) return;  // a non-finite step: no update (the same for every thread)
  const bool clip = clip_norm != nullptr;
  const float coef = clip ? fminf(1.0f, max_norm / (*clip_norm + 1e-6f)) : 1.0f;
  const float decay = hyper ? hyper[0] : k.decay;
  const float step_size = hyper ? hyper[1] : k.step_size;
  const float bc2_sqrt = hyper ? hyper[2] : k.bc2_sqrt;
  for (int64_t c = blockIdx.x; c < L.chunk0[L.n]; c += gridDim.x) {
    const int r = find_start(L.chunk0, L.n, c);
    const int64_t i0 = (c - L.chunk0[r]) * kChunk;
    const int64_t n = L.size[r] - i0 < kChunk ? L.size[r] - i0 : kChunk;
    const float d = L.decays[r] ? decay : k.no_decay;
    float* p = L.p[r] + i0;
    const float* g = L.g[r] + i0;
    float* m = L.m[r] + i0;
    float* v = L.v[r] + i0;
    if (L.packed[r] && n == kChunk) {
      using P4 = Pack<float, 4>;
      P4 pp[kUnroll], gp[kUnroll], mp[kUnroll], vp[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {  // every load of the chunk issued before the first use
        const int j = threadIdx.x + u * kOptThreads;
        pp[u] = reinterpret_cast<const P4*>(p)[j];
        gp[u] = reinterpret_cast<const P4*>(g)[j];
        mp[u] = reinterpret_cast<const P4*>(m)[j];
        vp[u] = reinterpret_cast<const P4*>(v)[j];
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          adamw_element(pp[u].v[e], mp[u].v[e], vp[u].v[e], gp[u].v[e], k, clip, coef, d, step_size, bc2_sqrt);
        const int j = threadIdx.x + u * kOptThreads;
        reinterpret_cast<P4*>(p)[j] = pp[u];
        reinterpret_cast<P4*>(m)[j] = mp[u];
        reinterpret_cast<P4*>(v)[j] = vp[u];
      }
    } else {
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        float pj = p[j], mj = m[j], vj = v[j];
        adamw_element(pj, mj, vj, g[j], k, clip, coef, d, step_size, bc2_sqrt);
        m[j] = mj;
        v[j] = vj;
        p[j] = pj;
      }
    }
  }
}

// ------------------------------------------------------------------ global norm, clip

struct TensorList {
  int n = 0;
  int64_t start[kMaxTensors + 1];  // cumulative element offsets within this launch
  float* a[kMaxTensors];
};
static_assert(sizeof(TensorList) < 32000, "TensorList must fit in the kernel parameter space");

// The tensor holding element i of the launch, searching upward from t (elements a thread
// visits only increase, so each thread walks the list once).
__device__ __forceinline__ int advance(const TensorList& L, int t, int64_t i) {
  while (t + 1 < L.n && i >= L.start[t + 1]) ++t;
  return t;
}

// Block b: partial[b] = the float64 sum of squares of chunk b (see the Note for the order).
__global__ void __launch_bounds__(kOptThreads) sumsq_partial_kernel(const TensorList L, double* partial) {
  __shared__ float staged[kChunk];
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kChunk;
  const int64_t c1 = L.start[L.n] < c0 + kChunk ? L.start[L.n] : c0 + kChunk;
  int t = find_start(L.start, L.n, c0);
  const float* x = L.a[t] + (c0 - L.start[t]);
  double acc = 0.0;
  // The same branch for the whole block (it depends on the chunk only), so the barrier is safe.
  if (c1 - c0 == kChunk && c1 <= L.start[t + 1] &&
      reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    using P4 = Pack<float, 4>;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = threadIdx.x + u * kOptThreads;
      reinterpret_cast<P4*>(staged)[j] = reinterpret_cast<const P4*>(x)[j];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < static_cast<int>(kChunk / kOptThreads); ++k) {
      const double xi = staged[threadIdx.x + k * kOptThreads];
      acc += xi * xi;
    }
  } else {
    for (int64_t i = c0 + threadIdx.x; i < c1; i += blockDim.x) {
      t = advance(L, t, i);
      const double xi = L.a[t][i - L.start[t]];
      acc += xi * xi;
    }
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void norm_final_kernel(const double* partial, int64_t nparts, float* out) {
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < nparts; i += blockDim.x) acc += partial[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) out[0] = static_cast<float>(sqrt(acc));
}

__global__ void clip_kernel(const TensorList L, const float* norm, float max_norm) {
  const float coef = fminf(1.0f, max_norm / (norm[0] + 1e-6f));
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kChunk;
  const int64_t c1 = L.start[L.n] < c0 + kChunk ? L.start[L.n] : c0 + kChunk;
  int t = find_start(L.start, L.n, c0);
  for (int64_t i = c0 + threadIdx.x; i < c1; i += blockDim.x) {
    t = advance(L, t, i);
    L.a[t][i - L.start[t]] *= coef;
  }
}

}  // namespace optim
}  // namespace cuda
}  // namespace kernels
}  // namespace xt
