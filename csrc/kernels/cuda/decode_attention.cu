// CUDA decode attention: the KV cache write and one query row per (b, h) against the cache
// [B, L, Hkv, D], split over the keys (flash-decoding) so that a batch of 1 still fills the GPU.
//
//  - kv_cache_write: a grid-stride copy in the widest word (16 bytes when the row allows it); the
//    slots of a row are contiguous, so it is a strided memcpy. A bad position is reported (Note
//    [Device-side index checks]) and its row is not written.
//  - decode_attention runs two kernels. partial: grid (B*Hkv, chunks of `chunk` keys); a block
//    handles the G = H/Hkv query heads of one kv head over one chunk, so each K/V row is read from
//    memory once per group: scores thread-per-key into shared memory (q pre-scaled by
//    scale * log2 e), the chunk's max m and sum l of exp2(s - m) by fixed-order block reductions,
//    o = sum_j p_j v_j by (g, d) items with the keys split among thread subgroups and the subgroup
//    sums added in order. combine: one block per (b, h), M = max of the chunks' m, out =
//    sum_c o_c 2^(m_c - M) / sum_c l_c 2^(m_c - M), chunks in order, rounded once.
//  - Deterministic: the chunk size and launch shapes depend only on (B, L, H, Hkv, D, dtype), every
//    sum has a fixed order, no atomics. Chunks past a row's length exit at once and are not read.
//    Compute type float32 (float64 for float64).
//  - decode_prep: one block per row, the rows' head preparation of a decode step in one launch (it
//    was rms_norm, rope, rms_norm, rope and two cache writes): the row's cos/sin at its position in
//    shared memory, then G lanes per q or k head row with rms_norm's sum of squares and rounding
//    (the same lanes_for(D) groups as the rms_norm kernel, so the same sums) and rope's rotation,
//    k written straight into its cache slot; v copied into its slot.
//  - decode_prep_attention: where the one-pass attention applies, one kernel whose block (b, kv
//    head) prepares its own query rows and k/v head, then attends (Note [Decode head preparation
//    inside the one-pass attention]); elsewhere decode_prep then decode_attention.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rmsnorm.cuh"  // row_sum_sq: rms_norm's order
#include "kernels/cuda/static_switch.h"

namespace xt {
namespace kernels {
namespace cuda {

namespace {

constexpr int kDecodeThreads = 128;
// Keys per block: 256 at most (scores of a chunk fit shared memory for any G and D the flash
// limit allows, after halving), at least 32; halved while the grid is under kDecodeMinBlocks.
constexpr int kMaxChunk = 256;
constexpr int kMinChunk = 32;
constexpr int64_t kDecodeMinBlocks = 512;
constexpr size_t kDecodeSmem = 48 * 1024;  // the default dynamic shared memory limit
constexpr double kLog2e = 1.4426950408889634;

__device__ __forceinline__ float exp2_c(float x) { return exp2f(x); }
__device__ __forceinline__ double exp2_c(double x) { return exp2(x); }

// ------------------------------------------------------------------ cache write

template <typename W>
__global__ void kv_cache_write_kernel(W* cache, const W* x, const int64_t* pos, int64_t B, int64_t L, int64_t S,
                                      int64_t row_words, IndexErrorRecord* err) {
  const int64_t per_row = S * row_words;
  XT_GRID_STRIDE(i, B * per_row) {
    const int64_t b = i / per_row, r = i - b * per_row;
    const int64_t p = pos[b];
    if (p < 0 || p > L - S) {
      if (r == 0) report_bad_index(err, IndexSite::KvCacheWrite, p, L - S + 1, 0);
      continue;
    }
    cache[(b * L + p) * row_words + r] = x[i];
  }
}

template <typename W>
void launch_cache_write(void* cache, const void* x, const int64_t* pos, int64_t B, int64_t L, int64_t S,
                        int64_t row_bytes, const OnStream& on) {
  const int64_t row_words = row_bytes / static_cast<int64_t>(sizeof(W));
  kv_cache_write_kernel<<<grid_for(B * S * row_words), kThreads, 0, on.s>>>(
      static_cast<W*>(cache), static_cast<const W*>(x), pos, B, L, S, row_words,
      xt::cuda::index_error_record(on.device));
  XT_LAUNCH_CHECK();
}

// ------------------------------------------------------------------ attention

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

// The row's valid length n (read from len[b]); a bad one is reported once (by block (b*Hkv, 0)'s
// thread 0) and read as 0.
__device__ __forceinline__ int64_t checked_length(int64_t n, int64_t L, bool reporter, IndexErrorRecord* err) {
  if (n >= 0 && n <= L) return n;
  if (reporter && err) report_bad_index(err, IndexSite::DecodeAttention, n, L + 1, 0);
  return 0;
}
__device__ __forceinline__ int64_t row_length(const int64_t* len, int64_t b, int64_t L, bool reporter,
                                              IndexErrorRecord* err) {
  return checked_length(len[b], L, reporter, err);
}

template <bool kVec, typename T>
__global__ void __launch_bounds__(kDecodeThreads)
    decode_partial_kernel(const T* q, const T* k, const T* v, const int64_t* len, compute_t<T>* po,
                          compute_t<T>* pm, compute_t<T>* pl, int64_t L, int H, int Hkv, int D, int chunk,
                          int nchunks, compute_t<T> qscale, IndexErrorRecord* err) {
  using C = compute_t<T>;
  extern __shared__ __align__(16) unsigned char decode_smem[];
  const int G = H / Hkv, tid = threadIdx.x, nthreads = blockDim.x;
  C* qs = reinterpret_cast<C*>(decode_smem);  // [G][D]
  C* ps = qs + G * D;                          // [G][chunk]
  C* red = ps + G * chunk;                     // [nthreads]
  const int64_t b = blockIdx.x / Hkv, hk = blockIdx.x % Hkv;
  const int c = blockIdx.y;
  const int64_t n = row_length(len, b, L, hk == 0 && c == 0 && tid == 0, err);
  const int64_t k0 = static_cast<int64_t>(c) * chunk;
  if (k0 >= n) return;  // the combine reads only the chunks below the length
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

template <typename T>
__global__ void decode_combine_kernel(const compute_t<T>* po, const compute_t<T>* pm, const compute_t<T>* pl,
                                      const int64_t* len, T* out, int64_t L, int H, int D, int chunk, int nchunks) {
  using C = compute_t<T>;
  const int64_t bh = blockIdx.x, b = bh / H;
  const int64_t n = row_length(len, b, L, false, nullptr);
  const int nc = static_cast<int>((n + chunk - 1) / chunk);
  C M = NegInf<C>::get();
  for (int c = 0; c < nc; ++c) M = xmax(M, pm[bh * nchunks + c]);
  C l = 0;
  for (int c = 0; c < nc; ++c) l += pl[bh * nchunks + c] * exp2_c(pm[bh * nchunks + c] - M);
  const C inv = nc > 0 ? C(1) / l : C(0);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    C acc = 0;
    for (int c = 0; c < nc; ++c) acc += po[(bh * nchunks + c) * D + d] * exp2_c(pm[bh * nchunks + c] - M);
    store(out, bh * D + d, acc * inv);
  }
}

// ------------------------------------------------------------------ attention in one pass

// Note [Decode attention in one pass]
// A decode step at batch 1 has B*Hkv = 24 (b, kv head) pairs at dim768; the split kernels above
// then make 10 chunks of 32 keys each and a combine, and both are latency: ~7 us for the partial
// kernel (its phases wait on each other, each with a few loads per thread) plus ~3 us for the
// combine, per layer, for ~40 KB of keys and values. When the pairs are few (B*Hkv <= 256) and the
// row short (L <= 1024), one block of 512 threads per pair does all of a row's keys in one launch,
// with as few block-wide barriers as the data flow allows (each costs a round of the block's warps):
//  - scores thread-per-key, as the partial kernel (q pre-scaled, the same dot_key order);
//  - each thread's (max m, sum l of exp2(s - m)) over its keys, merged pairwise (m = max of the
//    two, each l rescaled to it; a merge is commutative bit for bit, so both lanes of a butterfly
//    step agree) over the warp, then over the warps by warp g for query head g;
//  - o = sum_t exp2(s_t - m) v_t with each thread owning one 16-byte pack of one query head's
//    output and every R-th key (R = 512 / (G * D / pack) key subgroups: 128 at G = 1, D = 32,
//    bf16), four keys' loads in flight; the subgroups' sums added by a butterfly within each warp
//    (when a warp holds whole subgroups) and over the warps in warp order, else by a fixed tree
//    in shared memory; then divided by l once (one rounding, as the combine).
// Deterministic: the launch shape and every order depend only on (B, L, H, Hkv, D, dtype) and the
// row's length. The results differ from the split kernels' in the last bits (another order).
constexpr int kOneThreads = 512;
constexpr int kOneWarps = kOneThreads / kWarp;
constexpr int64_t kOneMaxKeys = 1024;
constexpr int64_t kOneMaxBlocks = 256;
constexpr int64_t kOneMaxGroup = kOneWarps;  // query heads per kv head: one warp merges each one's statistics

// (m, l) += (om, ol): the softmax statistics of two sets of scores as one (m = -inf, l = 0: empty).
template <typename C>
__device__ __forceinline__ void merge_stats(C& m, C& l, C om, C ol) {
  const C M = xmax(m, om);
  l = (m == M ? l : l * exp2_c(m - M)) + (om == M ? ol : ol * exp2_c(om - M));
  m = M;
}

template <typename C>
__device__ __forceinline__ void warp_merge_stats(C& m, C& l) {
  for (int o = kWarp / 2; o > 0; o >>= 1) {
    const C om = __shfl_xor_sync(0xffffffffu, m, o), ol = __shfl_xor_sync(0xffffffffu, l, o);
    merge_stats(m, l, om, ol);
  }
}

// Note [The cache's earlier slots before the wait]
// The fused kernel (decode_prep_one_pass_kernel) is launched early (Note [Early launch of the decode
// step's kernels]); the slots before the new one were written by earlier steps, so the block loads
// them before its wait: each thread its first key row of the scores (key tid, when the row is at
// most kPreKPacks packs) and its first kPreVKeys value packs of the weighted sum (keys r, r + R,
// ...), into registers. The new slot, which the block itself writes after the wait, is read from
// the cache as before. The attention takes the registers where it would have loaded the same
// bytes, in the same order: the same bits. The row's length and slot are read before the wait too.
constexpr int kPreKPacks = 4;
constexpr int kPreVKeys = 4;
template <int kV, typename T>
struct CachePreload {
  Pack<T, kV> k[kPreKPacks];
  Pack<T, kV> v[kPreVKeys];
  bool k_ok;  // k holds key tid's row
  int skip;   // the slot the block writes (read from the cache after the barrier); -1: none
};

// pre: the block's earlier slots (above) for the row length n_row and new slot `slot` (-1: none).
template <int kV, typename T>
__device__ __forceinline__ void preload_cache(CachePreload<kV, T>& pre, const T* k, const T* v, int64_t n_row,
                                              int64_t slot, int64_t L, int H, int Hkv, int D) {
  const int G = H / Hkv, tid = threadIdx.x, nthreads = blockDim.x;
  const int64_t b = blockIdx.x / Hkv, hk = blockIdx.x % Hkv;
  const int n = n_row >= 0 && n_row <= L ? static_cast<int>(n_row) : 0;  // checked_length's value
  pre.skip = slot >= 0 && slot < L ? static_cast<int>(slot) : -1;
  const int64_t kstride = static_cast<int64_t>(Hkv) * D;
  const T* kbase = k + (b * L * Hkv + hk) * D;
  const T* vbase = v + (b * L * Hkv + hk) * D;
  pre.k_ok = D <= kPreKPacks * kV && tid < n && tid != pre.skip;
  if (pre.k_ok) {
#pragma unroll
    for (int c = 0; c < kPreKPacks; ++c)
      if (c * kV < D) pre.k[c] = *reinterpret_cast<const Pack<T, kV>*>(kbase + tid * kstride + c * kV);
  }
  const int P = D / kV, items = G * P, R = nthreads / items;
  const int r = tid / items, j = (tid % items) % P;
  if (r >= R) return;
#pragma unroll
  for (int u = 0; u < kPreVKeys; ++u) {
    const int t = r + u * R;
    if (t < n && t != pre.skip) pre.v[u] = *reinterpret_cast<const Pack<T, kV>*>(vbase + j * kV + t * kstride);
  }
}

// The block (b, kv head hk) = (blockIdx.x / Hkv, blockIdx.x % Hkv): qg is the group's G query rows
// [G, D] (global or shared memory), smem the block's one_pass_smem bytes, n_row the row's len[b] (read
// by the caller first thing, so its round trip overlaps the caller's other work).
// pre: the block's earlier slots, loaded before the kernel's wait (Note [The cache's earlier slots
// before the wait]), or null.
template <int kV, typename T>
__device__ __forceinline__ void one_pass_attention(const T* qg, const T* k, const T* v, int64_t n_row, T* out,
                                                   int64_t L, int H, int Hkv, int D, compute_t<T> qscale,
                                                   IndexErrorRecord* err, unsigned char* smem,
                                                   const CachePreload<kV, T>* pre = nullptr) {
  using C = compute_t<T>;
  const int G = H / Hkv, tid = threadIdx.x, nthreads = blockDim.x;
  const int lane = tid % kWarp, warp = tid / kWarp, nwarps = nthreads / kWarp;
  C* qs = reinterpret_cast<C*>(smem);         // [G][D]
  C* stat_m = qs + G * D;                      // [G][nwarps] the warps' statistics
  C* stat_l = stat_m + G * nwarps;
  C* row_m = stat_l + G * nwarps;              // [G] the row's max and 1 / sum
  C* row_inv = row_m + G;
  C* ps = row_inv + G;                         // [G][n] scores; then the key subgroups' sums
  const int64_t b = blockIdx.x / Hkv, hk = blockIdx.x % Hkv;
  const int n = static_cast<int>(checked_length(n_row, L, hk == 0 && tid == 0, err));
  const int64_t qh0 = b * H + hk * G;  // the group's first query head, as a (b, h) row
  if (n == 0) {                        // nothing to attend to: zeros, as the combine writes
    for (int i = tid; i < G * D; i += nthreads) store(out, qh0 * D + i, C(0));
    return;
  }
  for (int i = tid; i < G * D; i += nthreads) qs[i] = load(qg, i) * qscale;
  __syncthreads();

  const int64_t kstride = static_cast<int64_t>(Hkv) * D;
  const T* kbase = k + (b * L * Hkv + hk) * D;
  const T* vbase = v + (b * L * Hkv + hk) * D;
  for (int g = 0; g < G; ++g) {
    C m = NegInf<C>::get(), l = 0;
    for (int t = tid; t < n; t += nthreads) {
      C sc;
      if (pre != nullptr && t == tid && pre->k_ok) {  // dot_key's order over the registers
        sc = 0;
#pragma unroll
        for (int c = 0; c < kPreKPacks; ++c)
          if (c * kV < D) {
#pragma unroll
            for (int e = 0; e < kV; ++e) sc += qs[g * D + c * kV + e] * to_compute(pre->k[c].v[e]);
          }
      } else {
        sc = dot_key<(kV > 1)>(qs + g * D, kbase + t * kstride, D);
      }
      ps[g * n + t] = sc;
      merge_stats(m, l, sc, C(1));
    }
    warp_merge_stats(m, l);
    if (lane == 0) stat_m[g * nwarps + warp] = m, stat_l[g * nwarps + warp] = l;
  }
  __syncthreads();
  if (warp < G) {  // warp g: query head g's statistics over the warps, in one butterfly
    C m = lane < nwarps ? stat_m[warp * nwarps + lane] : NegInf<C>::get();
    C l = lane < nwarps ? stat_l[warp * nwarps + lane] : C(0);
    warp_merge_stats(m, l);
    if (lane == 0) row_m[warp] = m, row_inv[warp] = C(1) / l;
  }
  __syncthreads();

  // Thread (r, it): output pack it (query head g, elements j*kV ..) over the keys r, r + R, ...
  const int P = D / kV, items = G * P, R = nthreads / items;
  const int r = tid / items, it = tid % items, g = it / P, j = it % P;
  C acc[kV];
#pragma unroll
  for (int e = 0; e < kV; ++e) acc[e] = 0;
  if (r < R) {
    const C* sg = ps + g * n;
    const C mg = row_m[g];
    const T* vcol = vbase + j * kV;
    auto take = [&](const Pack<T, kV>& pk, C sc) {
      const C p = exp2_c(sc - mg);
#pragma unroll
      for (int e = 0; e < kV; ++e) acc[e] += p * to_compute(pk.v[e]);
    };
    int t = r;
    if (pre != nullptr) {  // the first kPreVKeys keys from the registers, but the block's own slot
#pragma unroll
      for (int u = 0; u < kPreVKeys; ++u, t += R) {
        if (t >= n) continue;
        Pack<T, kV> pk = pre->v[u];
        if (t == pre->skip) pk = *reinterpret_cast<const Pack<T, kV>*>(vcol + t * kstride);
        take(pk, sg[t]);
      }
    }
    for (; t + 3 * R < n; t += 4 * R) {  // four keys' loads in flight; the sum's order is still t, t + R, ..
      const Pack<T, kV> v0 = *reinterpret_cast<const Pack<T, kV>*>(vcol + t * kstride);
      const Pack<T, kV> v1 = *reinterpret_cast<const Pack<T, kV>*>(vcol + (t + R) * kstride);
      const Pack<T, kV> v2 = *reinterpret_cast<const Pack<T, kV>*>(vcol + (t + 2 * R) * kstride);
      const Pack<T, kV> v3 = *reinterpret_cast<const Pack<T, kV>*>(vcol + (t + 3 * R) * kstride);
      take(v0, sg[t]);
      take(v1, sg[t + R]);
      take(v2, sg[t + 2 * R]);
      take(v3, sg[t + 3 * R]);
    }
    for (; t < n; t += R) take(*reinterpret_cast<const Pack<T, kV>*>(vcol + t * kstride), sg[t]);
  }
  C* red = ps;  // the subgroups' sums, in the scores' space
  if (kWarp % items == 0) {
    // A warp holds 32 / items whole subgroups (and R * items = nthreads): a butterfly over them,
    // then the warps' sums in warp order.
    for (int o = items; o < kWarp; o *= 2) {
#pragma unroll
      for (int e = 0; e < kV; ++e) acc[e] += __shfl_xor_sync(0xffffffffu, acc[e], o);
    }
    __syncthreads();  // every thread is done with the scores
    if (lane < items) {
#pragma unroll
      for (int e = 0; e < kV; ++e) red[(warp * items + lane) * kV + e] = acc[e];
    }
    __syncthreads();
    for (int x = tid; x < items * kV; x += nthreads) {
      const int ix = x / kV, e = x % kV;
      C sum = 0;
      for (int w = 0; w < nwarps; ++w) sum += red[(w * items + ix) * kV + e];
      store(out, (qh0 + ix / P) * D + (ix % P) * kV + e, sum * row_inv[ix / P]);
    }
    return;
  }
  __syncthreads();  // every thread is done with the scores
  if (r < R) {      // red: [R][items][kV]
#pragma unroll
    for (int e = 0; e < kV; ++e) red[tid * kV + e] = acc[e];
  }
  __syncthreads();
  int span = 1;
  while (span < R) span *= 2;
  for (int s2 = span / 2; s2 > 0; s2 /= 2) {  // a fixed tree over the subgroups: row r += row r + s2
    if (r < s2 && r + s2 < R) {
#pragma unroll
      for (int e = 0; e < kV; ++e) red[tid * kV + e] += red[(tid + s2 * items) * kV + e];
    }
    __syncthreads();
  }
  if (r == 0) {
#pragma unroll
    for (int e = 0; e < kV; ++e) store(out, (qh0 + g) * D + j * kV + e, red[it * kV + e] * row_inv[g]);
  }
}

template <int kV, typename T>
__global__ void __launch_bounds__(kOneThreads, 1)
    decode_one_pass_kernel(const T* q, const T* k, const T* v, const int64_t* len, T* out, int64_t L, int H,
                           int Hkv, int D, compute_t<T> qscale, IndexErrorRecord* err) {
  extern __shared__ __align__(16) unsigned char decode_smem[];
  const int64_t b = blockIdx.x / Hkv, hk = blockIdx.x % Hkv;
  one_pass_attention<kV>(q + (b * H + hk * (H / Hkv)) * D, k, v, len[b], out, L, H, Hkv, D, qscale, err, decode_smem);
}

// The one-pass kernel's dynamic shared memory, or 0 when the problem is not one for it.
template <typename T>
size_t one_pass_smem(int64_t B, int64_t L, int64_t H, int64_t Hkv, int64_t D, int kV) {
  using C = compute_t<T>;
  const int64_t G = H / Hkv;
  if (B * Hkv > kOneMaxBlocks || L > kOneMaxKeys || G > kOneMaxGroup || D % kV != 0 || G * (D / kV) > kOneThreads)
    return 0;
  const int64_t keys = G * L > int64_t{kOneThreads} * kV ? G * L : int64_t{kOneThreads} * kV;
  const size_t bytes = static_cast<size_t>(G * D + 2 * G * kOneWarps + 2 * G + keys) * sizeof(C);
  return bytes <= kDecodeSmem ? bytes : 0;
}

// ------------------------------------------------------------------ decode head preparation

// Enough groups for every head row of a token at once at D <= 64 (G = 8 or 16 lanes per row):
// with one block per sequence, a decode step has few blocks and each round of rows is latency.
constexpr int kPrepThreads = 512;

// The rope table of position p (rope_rows_kernel's: the float32 angle) by the block's threads;
// kLast: by its last threads (entry i by thread blockDim.x - 1 - i), which the head rows leave idle.
template <bool kLast = false, typename C>
__device__ __forceinline__ void rope_table(C* tab_cos, C* tab_sin, int64_t p, int D, const RopeFreqs& freqs) {
  const int t = kLast ? static_cast<int>(blockDim.x) - 1 - static_cast<int>(threadIdx.x) : threadIdx.x;
  for (int i = t; i < D / 2; i += blockDim.x) {
    C sn, cs;
    rope_cos_sin(static_cast<float>(p) * rope_inv_freq(freqs, i, D), &cs, &sn);
    tab_cos[i] = cs;
    tab_sin[i] = sn;
  }
}

// The block's head rows: nq rows of qx [nq, D] -> qy, nk rows of kx -> ky (skipped when !k_ok),
// each rms_norm'ed (w non-null) and rotated by the table, by Gl lanes per row (rms_norm's groups
// for D, so rms_norm's sums) in rounds of blockDim.x / Gl rows. A row's bits do not depend on
// which group or round takes it. kTableBarrier (table_overlaps below): the table is still being
// written, by threads that take no row; every row is in the first round, and each lane computes
// its normed pairs (x1, x2) into registers, waits for the table at a block barrier, then rotates:
// the rows' loads, sums and norms overlap the table's pow and sincos. The same values either way.
constexpr int kPrepRegPairs = 8;  // the most pairs a lane holds across the barrier
template <int Gl, bool kTableBarrier = false, typename T, typename W>
__device__ __forceinline__ void prep_rows(const T* qx, T* qy, int nq, const T* kx, T* ky, int nk, const W* wq,
                                          const W* wk, int D, float eps, const compute_t<T>* tab_cos,
                                          const compute_t<T>* tab_sin, bool k_ok) {
  using C = compute_t<T>;
  const int half = D / 2;
  const int lane = threadIdx.x % Gl, group = threadIdx.x / Gl, groups = blockDim.x / Gl;
  const bool norm = wq != nullptr;
  for (int r0 = 0; r0 < nq + nk; r0 += groups) {
    const int r = r0 + group;
    const bool valid = r < nq + nk, is_q = r < nq;
    const T* x = !valid ? qx : is_q ? qx + r * D : kx + (r - nq) * D;
    // Every lane of the group takes part in the sum's shuffles, valid or not.
    const C inv = norm ? rms_rstd(rmsnorm::row_sum_sq<Gl>(x, D, lane, valid), D, eps) : C(0);  // rms_norm's order
    const bool act = valid && (is_q || k_ok);
    const W* w = is_q ? wq : wk;
    T* y = is_q ? qy + r * D : ky + (r - nq) * D;
    if constexpr (kTableBarrier) {  // one round: every thread reaches the barrier once
      C x1s[kPrepRegPairs], x2s[kPrepRegPairs];
#pragma unroll
      for (int u = 0; u < kPrepRegPairs; ++u) {
        const int j = lane + u * Gl, i = j < half ? j : j - half;
        if (act && j < D) {
          x1s[u] = norm ? rounded<T>(rms_scaled(x, w, i, inv)) : load(x, i);
          x2s[u] = norm ? rounded<T>(rms_scaled(x, w, i + half, inv)) : load(x, i + half);
        }
      }
      __syncthreads();  // the table is written
      if (!act) continue;
#pragma unroll
      for (int u = 0; u < kPrepRegPairs; ++u) {
        const int j = lane + u * Gl, i = j < half ? j : j - half;
        if (j < D) {
          C y1, y2;
          rope_rotate(x1s[u], x2s[u], tab_cos[i], tab_sin[i], &y1, &y2);
          store(y, j, j < half ? y1 : y2);
        }
      }
      continue;
    }
    if (!act) continue;
#pragma unroll 4
    for (int j = lane; j < D; j += Gl) {
      const int i = j < half ? j : j - half;
      // rms_norm's output as stored and read back by rope (rounded to T), or the input itself
      const C x1 = norm ? rounded<T>(rms_scaled(x, w, i, inv)) : load(x, i);
      const C x2 = norm ? rounded<T>(rms_scaled(x, w, i + half, inv)) : load(x, i + half);
      C y1, y2;
      rope_rotate(x1, x2, tab_cos[i], tab_sin[i], &y1, &y2);
      store(y, j, j < half ? y1 : y2);
    }
  }
}

template <int Gl, typename T, typename W>
__global__ void __launch_bounds__(kPrepThreads)
    decode_prep_kernel(const T* q, const T* k, const T* v, const W* wq, const W* wk, T* q_out, T* k_cache,
                       T* v_cache, const int64_t* pos, int64_t L, int H, int Hkv, int D, float eps,
                       RopeFreqs freqs, IndexErrorRecord* err) {
  using C = compute_t<T>;
  extern __shared__ __align__(16) unsigned char prep_smem[];
  C* tab_cos = reinterpret_cast<C*>(prep_smem);
  C* tab_sin = tab_cos + D / 2;
  const int64_t b = blockIdx.x;
  const int64_t p = pos[b];
  const bool slot_ok = p >= 0 && p < L;
  if (!slot_ok && threadIdx.x == 0) report_bad_index(err, IndexSite::DecodePrep, p, L, 0);
  rope_table(tab_cos, tab_sin, p, D, freqs);
  __syncthreads();
  const int64_t n = static_cast<int64_t>(Hkv) * D, slot = (b * L + (slot_ok ? p : 0)) * n;
  prep_rows<Gl>(q + b * H * D, q_out + b * H * D, H, k + b * n, k_cache + slot, Hkv, wq, wk, D, eps, tab_cos,
                tab_sin, slot_ok);
  if (!slot_ok) return;
  for (int64_t e = threadIdx.x; e < n; e += blockDim.x) v_cache[slot + e] = v[b * n + e];
}

// Note [The next matrices into L2 during the decode attention]
// At batch 1 the one-pass attention has B * Hkv blocks (24 at dim768) on an H200's 132 SMs, for
// ~9 us in which DRAM is idle: its keys and values come from L2. The matrix-vector kernels after
// it (o_proj, gate/up, down_proj, then the next layer's q/k/v or the head: 14 MB at dim768) each
// start by waiting on DRAM. So the fused kernel takes up to kMaxL2Prefetch byte ranges (the op's
// `prefetch` tensors) and launches extra blocks after its attention blocks that only ask L2 for
// those ranges' lines (prefetch.global.L2, up to kL2LinesPerThread per thread) and exit; the later
// kernels' weight loads then hit L2 (H200, dim768: o_proj and down_proj 3.17 -> 2.79 us, gate/up
// 4.92 -> 4.55 us; the attention itself unchanged). A hint: no value changes.
struct L2Ranges {
  const char* p[kMaxL2Prefetch];
  int64_t lines[kMaxL2Prefetch + 1];  // prefix sums of the ranges' 128-byte lines
  int n;
  int64_t first;                      // the first prefetching block (after the attention's)
};
constexpr int64_t kL2LinesPerThread = 8;
constexpr int64_t kL2MaxBlocks = 64;

// This block's share of the ranges' lines (blocks first..gridDim.x-1 share them, thread-strided).
__device__ __forceinline__ void prefetch_l2_ranges(const L2Ranges& r, int64_t first) {
  const int64_t nthreads = (gridDim.x - first) * static_cast<int64_t>(blockDim.x);
  int i = 0;
  for (int64_t x = (blockIdx.x - first) * static_cast<int64_t>(blockDim.x) + threadIdx.x; x < r.lines[r.n];
       x += nthreads) {
    while (x >= r.lines[i + 1]) ++i;
    prefetch_l2(r.p[i] + (x - r.lines[i]) * 128);
  }
}

// Note [Decode head preparation inside the one-pass attention]
// decode_prep_attention where the one-pass kernel applies: block (b, hk) first prepares what it
// attends with, its G query rows (into shared memory) and kv head hk's k (into its cache slot), as
// decode_prep_kernel prepares them (prep_rows, the same bits), copies v's head hk into its slot,
// and after a barrier (the block's own global writes are then visible to it) runs the one-pass
// attention, reading q from shared memory. Blocks touch disjoint kv heads, so no block waits on
// another: one launch instead of two, bitwise decode_prep then decode_attention.
// With 16-byte packs (kV > 1) the block loads its earlier slots before the wait (Note [The cache's
// earlier slots before the wait]).
template <int Gl, int kV, typename T, typename W>
__global__ void __launch_bounds__(kOneThreads, 1)
    decode_prep_one_pass_kernel(const T* q, const T* k, const T* v, const W* wq, const W* wk, T* k_cache, T* v_cache,
                                const int64_t* pos, const int64_t* len, T* out, int64_t L, int H, int Hkv, int D,
                                float eps, RopeFreqs freqs, compute_t<T> qscale, int attn_smem, L2Ranges pf,
                                IndexErrorRecord* err) {
  using C = compute_t<T>;
  extern __shared__ __align__(16) unsigned char decode_smem[];
  if (blockIdx.x >= pf.first) {  // Note [The next matrices into L2 during the decode attention]
    prefetch_l2_ranges(pf, pf.first);
    return;
  }
  const int G = H / Hkv;
  const int64_t b = blockIdx.x / Hkv, hk = blockIdx.x % Hkv;
  C* tab_cos = reinterpret_cast<C*>(decode_smem + attn_smem);  // past the attention's own space
  C* tab_sin = tab_cos + D / 2;
  T* qn = reinterpret_cast<T*>(tab_sin + D / 2);                // [G][D]: the prepared query rows
  const int64_t p = pos[b], n_row = len[b];  // both loads in flight before either is used
  const bool slot_ok = p >= 0 && p < L;
  constexpr bool kPre = kV > 1;
  CachePreload<kV, T> pre;  // Note [The cache's earlier slots before the wait]
  if constexpr (kPre) preload_cache<kV>(pre, k_cache, v_cache, n_row, slot_ok ? p : -1, L, H, Hkv, D);
  if (!slot_ok && hk == 0 && threadIdx.x == 0) report_bad_index(err, IndexSite::DecodePrep, p, L, 0);
  // The table by the block's last threads while the rows' groups load, sum and norm (prep_rows
  // waits for it before rotating) when the G + 1 rows leave those threads free and a lane's pairs
  // fit its registers; else the table goes first, as decode_prep_kernel does it.
  const int64_t slot = ((b * L + (slot_ok ? p : 0)) * Hkv + hk) * D;
  if ((G + 1) * Gl + D / 2 <= static_cast<int>(blockDim.x) && D <= kPrepRegPairs * Gl) {
    rope_table<true>(tab_cos, tab_sin, p, D, freqs);
    wait_prior_grids();  // q, k, v are the kernel ahead's output (Note [Early launch of the decode step's kernels])
    prep_rows<Gl, true>(q + (b * H + hk * G) * D, qn, G, k + (b * Hkv + hk) * D, k_cache + slot, 1, wq, wk, D, eps,
                        tab_cos, tab_sin, slot_ok);
  } else {
    rope_table(tab_cos, tab_sin, p, D, freqs);
    __syncthreads();
    wait_prior_grids();
    prep_rows<Gl>(q + (b * H + hk * G) * D, qn, G, k + (b * Hkv + hk) * D, k_cache + slot, 1, wq, wk, D, eps,
                  tab_cos, tab_sin, slot_ok);
  }
  if (slot_ok)
    for (int e = threadIdx.x; e < D; e += blockDim.x) v_cache[slot + e] = v[(b * Hkv + hk) * D + e];
  __syncthreads();
  one_pass_attention<kV>(qn, k_cache, v_cache, n_row, out, L, H, Hkv, D, qscale, err, decode_smem,
                         kPre ? &pre : nullptr);
}

}  // namespace

void kv_cache_write(DType dt, void* cache, const void* x, const int64_t* pos, int64_t B, int64_t L, int64_t S,
                    int64_t row, void* stream) {
  OnStream on(stream);
  const int64_t row_bytes = row * static_cast<int64_t>(dtype_size(dt));
  auto fits = [&](int64_t w) { return row_bytes % w == 0 && aligned_to(cache, w) && aligned_to(x, w); };
  if (fits(16)) launch_cache_write<uint4>(cache, x, pos, B, L, S, row_bytes, on);
  else if (fits(8)) launch_cache_write<uint2>(cache, x, pos, B, L, S, row_bytes, on);
  else if (fits(4)) launch_cache_write<uint32_t>(cache, x, pos, B, L, S, row_bytes, on);
  else launch_cache_write<uint16_t>(cache, x, pos, B, L, S, row_bytes, on);
}

void decode_attention(DType dt, const void* q, const void* k_cache, const void* v_cache, const int64_t* len,
                      void* out, int64_t B, int64_t L, int64_t H, int64_t Hkv, int64_t D, double scale,
                      void* stream) {
  OnStream on(stream);
  const int64_t G = H / Hkv;
  XT_DISPATCH_FLOAT(dt, "decode_attention", T, {
    using C = compute_t<T>;
    auto smem = [&](int64_t ch) { return static_cast<size_t>(G * D + G * ch + kDecodeThreads) * sizeof(C); };
    int chunk = kMaxChunk;
    while (chunk > kMinChunk && (smem(chunk) > kDecodeSmem || B * Hkv * ceil_div(L, chunk) < kDecodeMinBlocks))
      chunk /= 2;
    XT_CHECK(smem(chunk) <= kDecodeSmem, ValueError, "decode_attention: ", G, " query heads per kv head of dimension ",
             D, " need more shared memory than the kernel's ", kDecodeSmem, " bytes");
    const int64_t nchunks = ceil_div(L, chunk);
    XT_CHECK(nchunks <= 65535 && B * Hkv <= (int64_t{1} << 31) - 1, ValueError,
             "decode_attention: the cache is too large for one launch (B = ", B, ", L = ", L, ", H_kv = ", Hkv, ")");
    const T* qp = static_cast<const T*>(q);
    const T* kp = static_cast<const T*>(k_cache);
    const T* vp = static_cast<const T*>(v_cache);
    constexpr int kPackElems = 16 / static_cast<int>(sizeof(T));
    const bool packs = D % kPackElems == 0 && aligned_to(k_cache, 16) && aligned_to(v_cache, 16);
    const size_t one_smem = packs ? one_pass_smem<T>(B, L, H, Hkv, D, kPackElems) : one_pass_smem<T>(B, L, H, Hkv, D, 1);
    if (one_smem > 0 && B * Hkv > 0) {  // Note [Decode attention in one pass]
      const C qscale = static_cast<C>(scale * kLog2e);
      auto* err = xt::cuda::index_error_record(on.device);
      const unsigned blocks = static_cast<unsigned>(B * Hkv);
      XT_BOOL_SWITCH(packs, kPacks, [&] {
        decode_one_pass_kernel<kPacks ? kPackElems : 1, T><<<blocks, kOneThreads, one_smem, on.s>>>(
            qp, kp, vp, len, static_cast<T*>(out), L, static_cast<int>(H), static_cast<int>(Hkv),
            static_cast<int>(D), qscale, err);
      });
      XT_LAUNCH_CHECK();
      return;
    }
    const int64_t rows = B * H;
    Scratch part(static_cast<size_t>(rows * (nchunks > 0 ? nchunks : 1) * (D + 2)) * sizeof(C), on);
    C* po = part.as<C>();
    C* pm = po + rows * nchunks * D;
    C* pl = pm + rows * nchunks;
    if (nchunks > 0) {
      const dim3 grid(static_cast<unsigned>(B * Hkv), static_cast<unsigned>(nchunks));
      const bool vec = D % (16 / static_cast<int64_t>(sizeof(T))) == 0 && aligned_to(k_cache, 16);
      const C qscale = static_cast<C>(scale * kLog2e);
      auto* err = xt::cuda::index_error_record(on.device);
      XT_BOOL_SWITCH(vec, kVec, [&] {
        decode_partial_kernel<kVec, T><<<grid, kDecodeThreads, smem(chunk), on.s>>>(
            qp, kp, vp, len, po, pm, pl, L, static_cast<int>(H), static_cast<int>(Hkv), static_cast<int>(D), chunk,
            static_cast<int>(nchunks), qscale, err);
      });
      XT_LAUNCH_CHECK();
    }
    const int threads = static_cast<int>(ceil_div(D, kWarp) * kWarp);
    decode_combine_kernel<T><<<static_cast<unsigned>(rows), threads, 0, on.s>>>(
        po, pm, pl, len, static_cast<T*>(out), L, static_cast<int>(H), static_cast<int>(D), chunk,
        static_cast<int>(nchunks));
    XT_LAUNCH_CHECK();
  });
}

void decode_prep(DType dt, DType w_dt, const void* q, const void* k, const void* v, const void* wq, const void* wk,
                 void* q_out, void* k_cache, void* v_cache, const int64_t* pos, int64_t B, int64_t L, int64_t H,
                 int64_t Hkv, int64_t D, float eps, const RopeFreqs& freqs, void* stream) {
  if (B == 0 || D == 0) return;
  XT_ASSERT(D % 2 == 0, "decode_prep: odd head dim ", D);
  XT_CHECK(B <= INT32_MAX && (H + Hkv) * D <= INT32_MAX, ValueError, "decode_prep: shape too large for CUDA: B=", B,
           ", H=", H, ", H_kv=", Hkv, ", D=", D);
  OnStream on(stream);
  auto* err = xt::cuda::index_error_record(on.device);
  dispatch_float_weight(dt, w_dt, "decode_prep", [&](auto xtag, auto wtag) {
    using T = typename decltype(xtag)::type;
    using W = typename decltype(wtag)::type;
    with_lanes(D, [&](auto g) {
      constexpr int G = decltype(g)::value;
      const size_t smem = sizeof(compute_t<T>) * static_cast<size_t>(D);  // cos and sin, D/2 each
      decode_prep_kernel<G, T, W><<<static_cast<unsigned>(B), kPrepThreads, smem, on.s>>>(
          static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<const W*>(wq),
          static_cast<const W*>(wk), static_cast<T*>(q_out), static_cast<T*>(k_cache), static_cast<T*>(v_cache), pos,
          L, static_cast<int>(H), static_cast<int>(Hkv), static_cast<int>(D), eps, freqs, err);
      XT_LAUNCH_CHECK();
    });
  });
}

void decode_prep_attention(DType dt, DType w_dt, const void* q, const void* k, const void* v, const void* wq,
                           const void* wk, void* k_cache, void* v_cache, const int64_t* pos, const int64_t* len,
                           void* out, int64_t B, int64_t L, int64_t H, int64_t Hkv, int64_t D, float eps,
                           const RopeFreqs& freqs, double scale, int n_pf, const void* const* pf,
                           const int64_t* pf_bytes, void* stream) {
  if (B == 0 || D == 0) return;
  XT_ASSERT(D % 2 == 0, "decode_prep_attention: odd head dim ", D);
  XT_ASSERT(n_pf >= 0 && n_pf <= kMaxL2Prefetch, "decode_prep_attention: ", n_pf, " prefetch ranges");
  OnStream on(stream);
  bool fused = false;
  dispatch_float_weight(dt, w_dt, "decode_prep_attention", [&](auto xtag, auto wtag) {
    using T = typename decltype(xtag)::type;
    using W = typename decltype(wtag)::type;
    using C = compute_t<T>;
    constexpr int kPackElems = 16 / static_cast<int>(sizeof(T));
    const bool packs = D % kPackElems == 0 && aligned_to(k_cache, 16) && aligned_to(v_cache, 16);
    const size_t attn = packs ? one_pass_smem<T>(B, L, H, Hkv, D, kPackElems) : one_pass_smem<T>(B, L, H, Hkv, D, 1);
    if (attn == 0) return;
    const size_t attn_al = (attn + 15) / 16 * 16;
    const size_t total = attn_al + static_cast<size_t>(D) * sizeof(C) + static_cast<size_t>(H / Hkv * D) * sizeof(T);
    if (total > kDecodeSmem) return;
    fused = true;  // Note [Decode head preparation inside the one-pass attention]
    const C qscale = static_cast<C>(scale * kLog2e);
    auto* err = xt::cuda::index_error_record(on.device);
    L2Ranges ranges{};  // Note [The next matrices into L2 during the decode attention]
    ranges.first = B * Hkv;
    for (int i = 0; i < n_pf; ++i) {
      if (pf_bytes[i] <= 0) continue;
      const char* p = static_cast<const char*>(pf[i]);
      const auto start = reinterpret_cast<uintptr_t>(p) / 128 * 128;  // whole lines
      ranges.p[ranges.n] = reinterpret_cast<const char*>(start);
      ranges.lines[ranges.n + 1] =
          ranges.lines[ranges.n] + ceil_div(static_cast<int64_t>(reinterpret_cast<uintptr_t>(p) - start) + pf_bytes[i], 128);
      ++ranges.n;
    }
    const int64_t pf_blocks = ranges.n == 0 ? 0
                              : std::min(kL2MaxBlocks, ceil_div(ranges.lines[ranges.n], kL2LinesPerThread * kOneThreads));
    const unsigned blocks = static_cast<unsigned>(B * Hkv + pf_blocks);
    with_lanes(D, [&](auto g) {
      constexpr int Gl = decltype(g)::value;
      XT_BOOL_SWITCH(packs, kPacks, [&] {
        launch_early(decode_prep_one_pass_kernel<Gl, kPacks ? kPackElems : 1, T, W>, blocks, kOneThreads, total, on,
                     static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                     static_cast<const W*>(wq), static_cast<const W*>(wk), static_cast<T*>(k_cache),
                     static_cast<T*>(v_cache), pos, len, static_cast<T*>(out), L, static_cast<int>(H),
                     static_cast<int>(Hkv), static_cast<int>(D), eps, freqs, qscale, static_cast<int>(attn_al),
                     ranges, err);
      });
    });
  });
  if (fused) return;
  Scratch q_out(static_cast<size_t>(B * H * D) * dtype_size(dt), on);
  decode_prep(dt, w_dt, q, k, v, wq, wk, q_out.as<void>(), k_cache, v_cache, pos, B, L, H, Hkv, D, eps, freqs, stream);
  decode_attention(dt, q_out.as<void>(), k_cache, v_cache, len, out, B, L, H, Hkv, D, scale, stream);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
