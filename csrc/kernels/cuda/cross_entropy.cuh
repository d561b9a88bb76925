// The CUDA cross-entropy kernels (launched by kernels/cuda/cross_entropy.cu), in a header so that
// tests/emu runs them on the CPU under the warp/block emulator (tests/emu/cross_entropy_emu.cpp).
// Note [One-pass cross-entropy] below describes the scheme.
//
// Invariants:
//  - One block per row, row_threads<T>(vocab) threads: the launch shape, and with it every sum's
//    order, depends only on vocab and the dtype, never on ld, the pointers or the GPU.
//  - Thread i owns the packs i, i + T, i + 2T, ... of its row (a pack: 16 bytes of elements,
//    pack_width<T>() of them) and visits them in that order whether it moves them as one 16-byte
//    load/store (rows 16-byte aligned) or element by element (any other ld or pointer): both ways
//    give the same bits.
//  - Columns [vocab, ld) are never read; the backward writes them with 0.
//  - The backward reads each element before it writes it, in the same thread, so dlogits may be
//    logits itself.
#pragma once
#include <limits>

#include "kernels/cuda/common.cuh"

namespace xt {
namespace kernels {
namespace cuda {
namespace ce {

// Note [One-pass cross-entropy]
// The forward reads each row once. A thread keeps an online softmax over its packs: the running
// max m and s = sum of exp(x - m); a pack whose max exceeds m first rescales s by exp(m_old -
// m_new), then adds its exps. The block then combines the threads' (m, s) pairs in a fixed order
// (a xor butterfly in each warp, the warps' pairs in warp order), and thread 0 writes lse = m +
// log(s) and loss = log(s) - (logit[target] - m), the formulas of the CPU reference
// (kernels/cpu/cross_entropy.cpp), which sums in index order: the two agree to float32 rounding,
// not bit for bit. -inf, +inf and NaN logits give what the two-pass reference gives: m is taken as
// 0 while nothing but -inf has been seen (exp(-inf - 0) = 0, no inf - inf), NaN propagates
// through s, and +inf makes s NaN.
//
// Bandwidth: a thread moves 16 bytes per load and has kUnroll packs in flight, which is what
// keeps HBM busy with 2-byte bf16 elements (one scalar load per element and a second pass over
// the row ran at 17% of copy bandwidth). The packs are absorbed in index order after the loads,
// so unrolling changes no bits. The last, partial pack (vocab not a multiple of the pack width)
// is read element by element by its owner, so nothing at or past column vocab is read; its
// missing elements count as -inf, which adds exactly 0.

template <typename T>
constexpr int pack_width() { return static_cast<int>(16 / sizeof(T)); }  // bf16 8, float32 4, float64 2

constexpr int kMaxRowThreads = 512;
constexpr int kUnroll = 4;  // packs a thread loads before it uses the first
constexpr int kReduceThreads = 1024;

// Threads per row: about kUnroll packs per thread in a multiple of a warp, 32..512 (vocab 4096:
// bf16 128, float32 256; vocab 50257: 512). A function of vocab and the dtype only.
template <typename T>
inline int row_threads(int64_t vocab) {
  const int64_t packs = ceil_div(vocab, pack_width<T>());
  const int64_t t = ceil_div(ceil_div(packs, kUnroll), kWarp) * kWarp;
  return static_cast<int>(t < kWarp ? kWarp : (t > kMaxRowThreads ? kMaxRowThreads : t));
}

// Whether every row of a [rows, ld] matrix at p starts 16-byte aligned, so packs move as one load.
template <typename T>
inline bool rows_vectorizable(const void* p, int64_t ld) {
  return aligned_to(p, 16) && (ld * static_cast<int64_t>(sizeof(T))) % 16 == 0;
}

template <typename C>
struct MaxSum {
  C m;  // the max seen, -inf when nothing (or only -inf) was seen
  C s;  // sum of exp(x - ref(m))
};

// The reference point of a running max: m, or 0 while it is -inf (avoids -inf - -inf).
template <typename C>
__device__ __forceinline__ C ref_of(C m) {
  return m == NegInf<C>::get() ? C(0) : m;
}

// Two partial sums as one. Called with the lower lane's pair first, so both lanes of a butterfly
// step evaluate the same expression (the same bits, contractions included).
template <typename C>
__device__ __forceinline__ MaxSum<C> combine(MaxSum<C> a, MaxSum<C> b) {
  const C m = xmax(a.m, b.m);
  const C r = ref_of(m);
  return {m, a.s * xexp(a.m - r) + b.s * xexp(b.m - r)};  // exp(-inf - r) = 0: an empty side adds 0
}

// The pack's W values into the running (m, s): rescale once if the max grows, then add the exps
// (pairwise within the pack, then onto s).
template <typename C, int W>
__device__ __forceinline__ void absorb(MaxSum<C>& acc, const C (&v)[W]) {
  C pm = v[0];
#pragma unroll
  for (int k = 1; k < W; ++k) pm = xmax(pm, v[k]);
  if (pm > acc.m) {
    acc.s *= xexp(acc.m - ref_of(pm));  // 0 when acc.m is -inf
    acc.m = pm;
  }
  const C r = ref_of(acc.m);
  C e[W];
#pragma unroll
  for (int k = 0; k < W; ++k) e[k] = xexp(v[k] - r);
#pragma unroll
  for (int w = 1; w < W; w *= 2)
#pragma unroll
    for (int k = 0; k + w < W; k += 2 * w) e[k] += e[k + w];
  acc.s += e[0];
}

// Pack p of a row (elements p*W .. p*W+W-1, all < vocab) in the compute type.
template <typename T, bool Vec>
__device__ __forceinline__ void load_pack(const T* row, int64_t p, compute_t<T> (&v)[pack_width<T>()]) {
  constexpr int W = pack_width<T>();
  if constexpr (Vec) {
    const Pack<T, W> in = *reinterpret_cast<const Pack<T, W>*>(row + p * W);
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = to_compute(in.v[k]);
  } else {
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = load(row, p * W + k);
  }
}

template <typename T, bool Vec>
__device__ __forceinline__ void store_pack(T* row, int64_t p, const compute_t<T> (&v)[pack_width<T>()]) {
  constexpr int W = pack_width<T>();
  if constexpr (Vec) {
    Pack<T, W> out;
#pragma unroll
    for (int k = 0; k < W; ++k) out.v[k] = from_compute<T>(v[k]);
    *reinterpret_cast<Pack<T, W>*>(row + p * W) = out;
  } else {
#pragma unroll
    for (int k = 0; k < W; ++k) store(row, p * W + k, v[k]);
  }
}

// A thread's packs wholly inside a row, p = threadIdx.x, + nt, ... < full, in that order: kUnroll
// packs' loads issued before the first is used, then the rest one at a time; f(v, p) takes pack
// p's values (and may change them). Returns the thread's next pack: full when the thread owns the
// partial last pack, if there is one.
template <typename T, bool Vec, typename F>
__device__ __forceinline__ int64_t for_full_packs(const T* row, int64_t full, int64_t nt, F&& f) {
  using C = compute_t<T>;
  constexpr int W = pack_width<T>();
  int64_t p = threadIdx.x;
  for (; p + (kUnroll - 1) * nt < full; p += kUnroll * nt) {
    C v[kUnroll][W];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) load_pack<T, Vec>(row, p + u * nt, v[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) f(v[u], p + u * nt);
  }
  for (; p < full; p += nt) {
    C v[W];
    load_pack<T, Vec>(row, p, v);
    f(v, p);
  }
  return p;
}

// (m, s) over the block, in a fixed order; every thread gets the result (blockDim.x a multiple of
// 32, at most 1024).
template <typename C>
__device__ MaxSum<C> block_combine(MaxSum<C> a) {
  __shared__ C ms[32], ss[32];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, nwarps = blockDim.x / kWarp;
  auto warp_combine = [lane](MaxSum<C> x) {
    for (int o = kWarp / 2; o > 0; o >>= 1) {
      const MaxSum<C> y{__shfl_xor_sync(0xffffffffu, x.m, o), __shfl_xor_sync(0xffffffffu, x.s, o)};
      x = (lane & o) ? combine(y, x) : combine(x, y);
    }
    return x;
  };
  a = warp_combine(a);
  if (lane == 0) ms[warp] = a.m, ss[warp] = a.s;
  __syncthreads();
  const MaxSum<C> w = lane < nwarps ? MaxSum<C>{ms[lane], ss[lane]} : MaxSum<C>{NegInf<C>::get(), C(0)};
  return warp_combine(w);
}

// Forward, one block per row: lse[r] and losses[r] (Note [One-pass cross-entropy]).
template <typename T, bool Vec>
__global__ void __launch_bounds__(kMaxRowThreads)
ce_forward_kernel(const T* __restrict__ logits, const void* __restrict__ targets, bool t64,
                  float* __restrict__ losses, float* __restrict__ lse, int64_t vocab, int64_t ld,
                  int64_t ignore_index, IndexErrorRecord* err) {
  using C = compute_t<T>;
  constexpr int W = pack_width<T>();
  const int64_t r = blockIdx.x, nt = blockDim.x;
  const T* xr = logits + r * ld;
  const int64_t full = vocab / W;  // packs wholly inside the row
  MaxSum<C> acc{NegInf<C>::get(), C(0)};
  const int64_t p = for_full_packs<T, Vec>(xr, full, nt, [&](const C(&v)[W], int64_t) { absorb(acc, v); });
  if (p == full && full * W < vocab) {  // the partial last pack, after this thread's full ones
    C v[W];
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = full * W + k < vocab ? load(xr, full * W + k) : NegInf<C>::get();
    absorb(acc, v);
  }
  acc = block_combine(acc);
  if (threadIdx.x != 0) return;
  const C mx = ref_of(acc.m);  // an all -inf row: 0, as the reference
  const C log_sum = xlog(acc.s);
  lse[r] = static_cast<float>(mx + log_sum);
  const int64_t t = load_index(t64, targets, r);
  if (t == ignore_index) {
    losses[r] = 0.0f;
  } else if (t < 0 || t >= vocab) {
    losses[r] = std::numeric_limits<float>::quiet_NaN();
    report_bad_index(err, IndexSite::CrossEntropy, t, vocab, ignore_index);
  } else {
    losses[r] = static_cast<float>(log_sum - (load(xr, t) - mx));  // keeps digits when |logits| is large
  }
}

// One block: the sum of the non-ignored losses (in float64, fixed order) and their count;
// loss = sum / max(count, 1) and count stay on the device (no host sync).
__global__ void __launch_bounds__(kReduceThreads)
ce_reduce_kernel(const float* losses, const void* targets, bool t64, float* loss, float* count, int64_t rows,
                 int64_t ignore_index) {
  double sum = 0.0, n = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    if (load_index(t64, targets, r) == ignore_index) continue;
    sum += static_cast<double>(losses[r]);
    n += 1.0;
  }
  sum = block_sum(sum);
  n = block_sum(n);
  if (threadIdx.x == 0) {
    *count = static_cast<float>(n);
    *loss = static_cast<float>(sum / (n > 1.0 ? n : 1.0));
  }
}

// dlogits of pack p's W elements (first element j0) from its logits, in place in v.
template <typename C, int W>
__device__ __forceinline__ void grad_pack(C (&v)[W], int64_t j0, int64_t t, C row_lse, C coef) {
#pragma unroll
  for (int k = 0; k < W; ++k) {
    const C p = xexp(v[k] - row_lse);
    v[k] = static_cast<C>((p - (j0 + k == t ? C(1) : C(0))) * coef);
  }
}

// Backward, one block per row: dlogits = (softmax - onehot) * dloss[0] / max(count[0], 1), 0 on
// ignored (and out-of-range) rows and in columns [vocab, ld). Packs as the forward's; logits and
// dlogits may be the same memory (no __restrict__): a thread loads its packs, then stores them.
template <typename T, bool Vec>
__global__ void __launch_bounds__(kMaxRowThreads)
ce_backward_kernel(const T* logits, const float* lse, const void* targets, bool t64, const float* dloss,
                   const float* count, T* dlogits, int64_t vocab, int64_t ld, int64_t ignore_index) {
  using C = compute_t<T>;
  constexpr int W = pack_width<T>();
  const int64_t r = blockIdx.x, nt = blockDim.x;
  const T* xr = logits + r * ld;
  T* dr = dlogits + r * ld;
  const int64_t full = vocab / W;
  const bool tail = full * W < vocab;
  for (int64_t j = vocab + threadIdx.x; j < ld; j += nt) store(dr, j, C(0));  // row padding
  const int64_t t = load_index(t64, targets, r);
  if (t == ignore_index || t < 0 || t >= vocab) {
    C z[W];
#pragma unroll
    for (int k = 0; k < W; ++k) z[k] = C(0);
    for (int64_t p = threadIdx.x; p < full; p += nt) store_pack<T, Vec>(dr, p, z);
    if (tail && threadIdx.x == full % nt)
      for (int64_t j = full * W; j < vocab; ++j) store(dr, j, C(0));
    return;
  }
  const float cnt = count[0];
  const C coef = static_cast<C>(dloss[0]) / static_cast<C>(cnt > 1.0f ? cnt : 1.0f);
  const C row_lse = static_cast<C>(lse[r]);
  const int64_t p = for_full_packs<T, Vec>(xr, full, nt, [&](C(&v)[W], int64_t q) {
    grad_pack(v, q * W, t, row_lse, coef);
    store_pack<T, Vec>(dr, q, v);
  });
  if (p == full && tail) {
    for (int64_t j = full * W; j < vocab; ++j) {
      const C x = load(xr, j);
      const C e = xexp(x - row_lse);
      store(dr, j, static_cast<C>((e - (j == t ? C(1) : C(0))) * coef));
    }
  }
}

}  // namespace ce
}  // namespace cuda
}  // namespace kernels
}  // namespace xt
