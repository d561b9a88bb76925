// The CUDA kernel of linear_rows (launched by kernels/cuda/linear_rows.cu), in a header so that
// tests/emu runs it on the CPU under the warp/block emulator (tests/emu/linear_rows_emu.cpp).
//
// Note [Matrix-vector products of the decode step]
// A decode step multiplies a few rows (M <= 8: one token per sequence) by every weight. A GEMM
// kernel tiles for many rows; here the cost is reading each weight row once, so:
//  - One warp per output column n of the concatenated weights [w_0; w_1; ...] (kRowsWarps warps a
//    block): the warp reads w_i's row n once and multiplies it with all M rows of x, keeping M
//    float32 (float64) sums per lane in registers. The block stages x once in shared memory when
//    M * K elements fit kRowsSmemBytes, otherwise each warp reads x from global memory (the cache
//    serves it); the order of the sums is the same either way.
//  - Chunks of V = 16 / sizeof(T) elements: lane l takes chunks l, l + 32, l + 64, ... of the row
//    and adds a chunk's V products in element order; then the M sums go through warp_sum's fixed
//    xor butterfly. kVec loads a chunk as one 16-byte pack (needs K % V == 0 and 16-byte aligned x
//    and weights); the scalar path reads the same chunks element by element (any K, any
//    alignment). So the bits of a result depend only on the values and K, never on the path, the
//    alignment, the staging or the schedule, and are the same on every call (deterministic).
//  - The first kRowsUnroll chunks of the row are loaded before the block waits for x's staging,
//    so the weight's memory latency overlaps it; later chunks go kRowsUnroll at a time.
//  - One launch for all weights of a call (at most kRowsMaxWeights; the launcher splits longer
//    lists): the grid covers the concatenated columns, a warp finds its weight by a short scan.
#pragma once
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"  // dynamic_smem()

namespace xt {
namespace kernels {
namespace cuda {
namespace rows {

constexpr int kRowsWarps = 4;  // output columns per block
constexpr int kRowsThreads = kRowsWarps * kWarp;
constexpr int kRowsMaxWeights = 8;
constexpr int kRowsUnroll = 4;                        // 16-byte chunks in flight per lane
constexpr size_t kRowsSmemBytes = 48 * 1024;          // the default dynamic shared memory limit
constexpr int kMaxRows = static_cast<int>(kLinearRowsMaxRows);

// The weights of one launch: w[i] [col0[i + 1] - col0[i], K]; out block i at out + M * col0[i].
struct Weights {
  const void* w[kRowsMaxWeights];
  int64_t col0[kRowsMaxWeights + 1];
  int n;
};

template <typename T>
constexpr int chunk_elems() { return 16 / static_cast<int>(sizeof(T)); }

// acc[m] += the products of chunk c (elements c*V .. c*V+V-1 below K) of w's row and x's rows.
template <bool kVec, typename T, typename C = compute_t<T>>
__device__ __forceinline__ void add_chunk(C (&acc)[kMaxRows], const Pack<T, chunk_elems<T>()>& wp,
                                          const T* __restrict__ x, int M, int64_t K, int64_t c) {
  constexpr int V = chunk_elems<T>();
#pragma unroll
  for (int m = 0; m < kMaxRows; ++m) {
    if (m >= M) break;
    const T* xr = x + m * K + c * V;
    if constexpr (kVec) {
      const Pack<T, V> xp = *reinterpret_cast<const Pack<T, V>*>(xr);
#pragma unroll
      for (int e = 0; e < V; ++e) acc[m] += to_compute(wp.v[e]) * to_compute(xp.v[e]);
    } else {
#pragma unroll
      for (int e = 0; e < V; ++e)
        if (c * V + e < K) acc[m] += to_compute(wp.v[e]) * to_compute(xr[e]);
    }
  }
}

// Chunk c of a weight row (elements past K read as zero, never added: add_chunk stops at K).
template <bool kVec, typename T>
__device__ __forceinline__ Pack<T, chunk_elems<T>()> load_chunk(const T* __restrict__ wr, int64_t K, int64_t c) {
  constexpr int V = chunk_elems<T>();
  if constexpr (kVec) {
    return *reinterpret_cast<const Pack<T, V>*>(wr + c * V);
  } else {
    Pack<T, V> p;
#pragma unroll
    for (int e = 0; e < V; ++e) p.v[e] = c * V + e < K ? wr[c * V + e] : from_compute<T>(compute_t<T>(0));
    return p;
  }
}

// grid: ceil(total columns / kRowsWarps) blocks of kRowsThreads; dynamic shared memory M*K*sizeof(T)
// when kSmemX. x [M, K]; out as the Weights say.
template <bool kVec, bool kSmemX, typename T>
__global__ void __launch_bounds__(kRowsThreads)
    linear_rows_kernel(const T* __restrict__ x, Weights ws, T* __restrict__ out, int M, int64_t K) {
  using C = compute_t<T>;
  constexpr int V = chunk_elems<T>();
  const int lane = threadIdx.x % kWarp;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kRowsWarps + threadIdx.x / kWarp;
  const int64_t total = ws.col0[ws.n];
  const bool valid = col < total;
  int i = 0;
  while (i + 1 < ws.n && col >= ws.col0[i + 1]) ++i;
  const int64_t n = col - ws.col0[i], N = ws.col0[i + 1] - ws.col0[i];
  const T* wr = static_cast<const T*>(ws.w[i]) + (valid ? n : 0) * K;
  const int64_t nchunks = (K + V - 1) / V;

  // The first round of chunks, in flight while x is staged.
  Pack<T, V> wp[kRowsUnroll];
#pragma unroll
  for (int u = 0; u < kRowsUnroll; ++u) {
    const int64_t c = lane + static_cast<int64_t>(u) * kWarp;
    if (valid && c < nchunks) wp[u] = load_chunk<kVec>(wr, K, c);
  }
  const T* xs = x;
  if constexpr (kSmemX) {
    T* sx = reinterpret_cast<T*>(dynamic_smem());
    const int64_t n_x = static_cast<int64_t>(M) * K;
    if constexpr (kVec) {
      for (int64_t j = threadIdx.x; j < n_x / V; j += kRowsThreads)
        reinterpret_cast<Pack<T, V>*>(sx)[j] = reinterpret_cast<const Pack<T, V>*>(x)[j];
    } else {
      for (int64_t j = threadIdx.x; j < n_x; j += kRowsThreads) sx[j] = x[j];
    }
    __syncthreads();
    xs = sx;
  }
  if (!valid) return;  // after the block's only barrier

  C acc[kMaxRows];
#pragma unroll
  for (int m = 0; m < kMaxRows; ++m) acc[m] = 0;
  for (int64_t c0 = lane;; c0 += static_cast<int64_t>(kRowsUnroll) * kWarp) {
#pragma unroll
    for (int u = 0; u < kRowsUnroll; ++u) {
      const int64_t c = c0 + static_cast<int64_t>(u) * kWarp;
      if (c < nchunks) add_chunk<kVec>(acc, wp[u], xs, M, K, c);
    }
    const int64_t next = c0 + static_cast<int64_t>(kRowsUnroll) * kWarp;
    if (next >= nchunks) break;
#pragma unroll
    for (int u = 0; u < kRowsUnroll; ++u) {
      const int64_t c = next + static_cast<int64_t>(u) * kWarp;
      if (c < nchunks) wp[u] = load_chunk<kVec>(wr, K, c);
    }
  }
  // Every lane of the warp takes part (the column is the warp's): the butterfly gives each lane
  // the same sums; lane m writes row m.
  T* o = out + M * ws.col0[i];
#pragma unroll
  for (int m = 0; m < kMaxRows; ++m) {
    if (m >= M) break;
    const C s = warp_sum(acc[m]);
    if (lane == m) o[m * N + n] = from_compute<T>(s);
  }
}

}  // namespace rows
}  // namespace cuda
}  // namespace kernels
}  // namespace xt
