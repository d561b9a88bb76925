// The CUDA kernels of decode_attention (launched by kernels/cuda/decode_attention.cu), in a header
// so that tests/emu runs them on the CPU under the warp/block emulator
// (tests/emu/decode_attention_emu.cpp).
//
// Note [Decode attention in one kernel]
// Flash-decoding splits a row's keys into chunks so that a batch of 1 still fills the GPU; the
// chunks' partial results (o, m, l per query head) then have to be combined. That used to be a
// second kernel (decode_combine_kernel), a graph node and a launch gap per layer on the decode
// step's critical path. decode_attention_kernel does both: every block computes its chunk's
// partials exactly as decode_partial_kernel does and writes them to global memory, then
// announces itself on a per-(b, kv head) arrival counter (__threadfence, then an integer
// atomicAdd: the order of arrival decides only WHICH block combines, never a float result). The
// block that arrives last combines the group's G query heads with combine_item, the very code
// of decode_combine_kernel: chunks in order, the same max, sums and one rounding, so the output
// is bitwise the two-kernel path's. It reads the partials through L2 (__ldcg), since other SMs
// wrote them, and sets the counter back to 0, so the next launch, a CUDA graph replay included,
// starts from zero. The counters are a small persistent buffer per (device, stream), zeroed once
// when created (decode_attention.cu); a launch that cannot have one (first use inside a graph
// capture, more groups than slots) runs the two kernels instead, with the same bits.
// Only the chunks below the row's length take part (ceil(n / chunk) arrivals, one when n == 0:
// chunk 0 then writes nothing and the combine writes zeros, as decode_combine_kernel does).
#pragma once

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"  // dynamic_smem()

namespace xt {
namespace kernels {
namespace cuda {
namespace decode {

constexpr int kDecodeThreads = 128;
// Keys per block: 256 at most (scores of a chunk fit shared memory for any G and D the flash
// limit allows, after halving), at least 32; halved while the grid is under kDecodeMinBlocks.
constexpr int kMaxChunk = 256;
constexpr int kMinChunk = 32;
constexpr int64_t kDecodeMinBlocks = 512;
constexpr size_t kDecodeSmem = 48 * 1024;  // the default dynamic shared memory limit

// Dynamic shared memory of a block: q [G][D], the scores [G][chunk], the reduction [threads].
inline size_t decode_smem_bytes(int64_t G, int64_t D, int64_t chunk, size_t compute_size) {
  return static_cast<size_t>(G * D + G * chunk + kDecodeThreads) * compute_size;
}

// The launch's chunk: a function of the shapes only (so of nothing the data or the device hold).
inline int decode_chunk(int64_t B, int64_t L, int64_t Hkv, int64_t G, int64_t D, size_t compute_size) {
  int chunk = kMaxChunk;
  while (chunk > kMinChunk && (decode_smem_bytes(G, D, chunk, compute_size) > kDecodeSmem ||
                               B * Hkv * ((L + chunk - 1) / chunk) < kDecodeMinBlocks))
    chunk /= 2;
  return chunk;
}

__device__ __forceinline__ float exp2_c(float x) { return exp2f(x); }
__device__ __forceinline__ double exp2_c(double x) { return exp2(x); }

// q . k for one key row, q (pre-scaled, compute type) in shared memory; kVec reads k in 16-byte
// packs (same order of additions as the scalar loop).
template <bool kVec, typename T, typename C = compute_t<T>>
__device__ __forceinline__ C dot_key(const C* qs, const T* kr, int D) {
  C s = 0;
  if constexpr (kVec) {
    constexpr int V = 16 / sizeof(T);
    for (int d = 0; d < D; d += V) {
      const Pack<T, V> p = *reinterpret_cast<const Pack<T, V>*>(kr + d);
#pragma unroll
      for (int e = 0; e < V; ++e) s += qs[d + e] * to_compute(p.v[e]);
    }
  } else {
    for (int d = 0; d < D; ++d) s += qs[d] * load(kr, d);
  }
  return s;
}

// The row's valid length; a bad one is reported once (by block (b*Hkv, 0)'s thread 0) and read as 0.
__device__ __forceinline__ int64_t row_length(const int64_t* len, int64_t b, int64_t L, bool reporter,
                                              IndexErrorRecord* err) {
  const int64_t n = len[b];
  if (n >= 0 && n <= L) return n;
  if (reporter && err) report_bad_index(err, IndexSite::DecodeAttention, n, L + 1, 0);
  return 0;
}

// One block's chunk c (keys k0 = c * chunk .. below n, k0 < n) of kv head hk of row b: the G
// query heads' o (unnormalised), m and l, written to po, pm, pl. Every thread of the block calls it.
template <bool kVec, typename T>
__device__ __forceinline__ void partial_chunk(const T* q, const T* k, const T* v, compute_t<T>* po,
                                              compute_t<T>* pm, compute_t<T>* pl, int64_t b, int64_t hk, int c,
                                              int64_t n, int64_t L, int H, int Hkv, int D, int chunk, int nchunks,
                                              compute_t<T> qscale) {
  using C = compute_t<T>;
  const int G = H / Hkv, tid = threadIdx.x, nthreads = blockDim.x;
  C* qs = reinterpret_cast<C*>(dynamic_smem());  // [G][D]
  C* ps = qs + G * D;                             // [G][chunk]
  C* red = ps + G * chunk;                        // [nthreads]
  const int64_t k0 = static_cast<int64_t>(c) * chunk;
  const int nk = static_cast<int>(n - k0 < chunk ? n - k0 : chunk);
  const int64_t qh0 = b * H + hk * G;  // the group's first query head, as a (b, h) row
  for (int i = tid; i < G * D; i += nthreads) qs[i] = load(q, qh0 * D + i) * qscale;
  __syncthreads();

  const int64_t kstride = static_cast<int64_t>(Hkv) * D;
  const T* kbase = k + ((b * L + k0) * Hkv + hk) * D;
  const T* vbase = v + ((b * L + k0) * Hkv + hk) * D;
  for (int t = tid; t < nk; t += nthreads)
    for (int g = 0; g < G; ++g) ps[g * chunk + t] = dot_key<kVec>(qs + g * D, kbase + t * kstride, D);
  __syncthreads();

  for (int g = 0; g < G; ++g) {
    C m = NegInf<C>::get();
    for (int t = tid; t < nk; t += nthreads) m = xmax(m, ps[g * chunk + t]);
    m = block_max(m);
    C l = 0;
    for (int t = tid; t < nk; t += nthreads) {
      const C p = exp2_c(ps[g * chunk + t] - m);
      ps[g * chunk + t] = p;
      l += p;
    }
    l = block_sum(l);
    if (tid == 0) {
      pm[(qh0 + g) * nchunks + c] = m;
      pl[(qh0 + g) * nchunks + c] = l;
    }
  }
  __syncthreads();

  const int items = G * D;
  if (items >= nthreads) {
    for (int it = tid; it < items; it += nthreads) {
      const int g = it / D, d = it % D;
      C acc = 0;
      for (int t = 0; t < nk; ++t) acc += ps[g * chunk + t] * load(vbase, t * kstride + d);
      po[((qh0 + g) * nchunks + c) * D + d] = acc;
    }
    return;
  }
  // Fewer items than threads: R subgroups of `items` threads take every R-th key, then their sums
  // are added in subgroup order.
  const int R = nthreads / items, r = tid / items, it = tid % items;
  C acc = 0;
  if (r < R) {
    const int g = it / D, d = it % D;
    for (int t = r; t < nk; t += R) acc += ps[g * chunk + t] * load(vbase, t * kstride + d);
  }
  red[tid] = acc;
  __syncthreads();
  if (tid < items) {
    C s = 0;
    for (int rr = 0; rr < R; ++rr) s += red[rr * items + tid];
    const int g = tid / D, d = tid % D;
    po[((qh0 + g) * nchunks + c) * D + d] = s;
  }
}

// out[bh, d] from the nc chunks' partials of query row bh: M = max of the chunks' m, out =
// sum_c o_c 2^(m_c - M) / sum_c l_c 2^(m_c - M), chunks in order, rounded once. kL2: the partials
// were written by other blocks of this launch, read them through L2 (__ldcg).
template <bool kL2, typename C>
__device__ __forceinline__ C partial_at(const C* p, int64_t i) {
  if constexpr (kL2) return __ldcg(p + i);
  else return p[i];
}

template <bool kL2, typename T, typename C = compute_t<T>>
__device__ __forceinline__ void combine_item(const C* po, const C* pm, const C* pl, T* out, int64_t bh, int d, int D,
                                             int nc, int nchunks) {
  const C* m = pm + bh * nchunks;  // the row's chunks
  const C* l_c = pl + bh * nchunks;
  const C* o = po + bh * nchunks * D + d;
  C M = NegInf<C>::get();
  for (int c = 0; c < nc; ++c) M = xmax(M, partial_at<kL2>(m, c));
  C l = 0;
  for (int c = 0; c < nc; ++c) l += partial_at<kL2>(l_c, c) * exp2_c(partial_at<kL2>(m, c) - M);
  const C inv = nc > 0 ? C(1) / l : C(0);
  C acc = 0;
  for (int c = 0; c < nc; ++c)
    acc += partial_at<kL2>(o, static_cast<int64_t>(c) * D) * exp2_c(partial_at<kL2>(m, c) - M);
  store(out, bh * D + d, acc * inv);
}

// grid (B*Hkv, nchunks): the partials of chunk blockIdx.y of one kv head's group.
template <bool kVec, typename T>
__global__ void __launch_bounds__(kDecodeThreads)
    decode_partial_kernel(const T* q, const T* k, const T* v, const int64_t* len, compute_t<T>* po,
                          compute_t<T>* pm, compute_t<T>* pl, int64_t L, int H, int Hkv, int D, int chunk,
                          int nchunks, compute_t<T> qscale, IndexErrorRecord* err) {
  const int64_t b = blockIdx.x / Hkv, hk = blockIdx.x % Hkv;
  const int c = blockIdx.y;
  const int64_t n = row_length(len, b, L, hk == 0 && c == 0 && threadIdx.x == 0, err);
  if (static_cast<int64_t>(c) * chunk >= n) return;  // the combine reads only the chunks below the length
  partial_chunk<kVec>(q, k, v, po, pm, pl, b, hk, c, n, L, H, Hkv, D, chunk, nchunks, qscale);
}

// One block per (b, h) row; the chunks' partials of the whole launch before it.
template <typename T>
__global__ void decode_combine_kernel(const compute_t<T>* po, const compute_t<T>* pm, const compute_t<T>* pl,
                                      const int64_t* len, T* out, int64_t L, int H, int D, int chunk, int nchunks) {
  const int64_t bh = blockIdx.x, b = bh / H;
  const int64_t n = row_length(len, b, L, false, nullptr);
  const int nc = static_cast<int>((n + chunk - 1) / chunk);
  for (int d = threadIdx.x; d < D; d += blockDim.x) combine_item<false>(po, pm, pl, out, bh, d, D, nc, nchunks);
}

// Both in one launch (Note [Decode attention in one kernel]); arrivals[B*Hkv], zero on entry and
// on exit. At least 4 blocks per SM: left to itself, ptxas gives the float32 16-byte instance 40
// registers and spills; with the bound it takes 72-117 (bf16: 85, so 6 blocks of 128 threads per
// SM, a dim768 decode grid is still one wave) and spills nothing.
template <bool kVec, typename T>
__global__ void __launch_bounds__(kDecodeThreads, 4)
    decode_attention_kernel(const T* q, const T* k, const T* v, const int64_t* len, compute_t<T>* po,
                            compute_t<T>* pm, compute_t<T>* pl, T* out, int* arrivals, int64_t L, int H, int Hkv,
                            int D, int chunk, int nchunks, compute_t<T> qscale, IndexErrorRecord* err) {
  __shared__ int is_last;
  const int64_t b = blockIdx.x / Hkv, hk = blockIdx.x % Hkv;
  const int c = blockIdx.y, tid = threadIdx.x;
  const int64_t n = row_length(len, b, L, hk == 0 && c == 0 && tid == 0, err);
  const int nc = static_cast<int>((n + chunk - 1) / chunk);
  const int arriving = nc > 0 ? nc : 1;  // n == 0: chunk 0 alone, to write the zeros
  if (c >= arriving) return;
  if (c < nc) partial_chunk<kVec>(q, k, v, po, pm, pl, b, hk, c, n, L, H, Hkv, D, chunk, nchunks, qscale);
  __threadfence();  // this block's partials, visible device-wide before its arrival is
  __syncthreads();
  if (tid == 0) is_last = atomicAdd(arrivals + blockIdx.x, 1) == arriving - 1;
  __syncthreads();
  if (!is_last) return;
  if (tid == 0) arrivals[blockIdx.x] = 0;  // for the next launch (kernel boundaries order it)
  __threadfence();                         // the other blocks' partials, seen after their arrivals
  const int G = H / Hkv;
  const int64_t qh0 = b * H + hk * G;
  for (int it = tid; it < G * D; it += blockDim.x)
    combine_item<true>(po, pm, pl, out, qh0 + it / D, it % D, D, nc, nchunks);
}

}  // namespace decode
}  // namespace cuda
}  // namespace kernels
}  // namespace xt
