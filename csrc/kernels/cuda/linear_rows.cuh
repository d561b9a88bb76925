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
//    so the weight's memory latency overlaps it; later chunks go kRowsUnroll at a time (4: a
//    row of up to 1024 bf16 elements is one round; 8 would make the down projection's one round
//    too but costs registers, hence resident warps, in every call: ptxas gives the bf16 16-byte
//    kernels 62-80 registers with 4 and 96-128 with 8, the swiglu kernel 96-128 and 167-203).
//  - Each kernel is compiled for R = 1 row (batch 1, the latency-critical case) and for R =
//    kMaxRows rows (M <= 8, the loops over rows stopping at M): R sets the M sums and x reads a
//    lane keeps, so R = 1 needs fewer registers (ptxas, bf16 16-byte path: 72 instead of 80 for
//    the staged kernel and the norm kernel, 96 instead of 128 for the swiglu kernel: 7 and 5
//    blocks of 128 threads per SM, so the q/k/v and gate/up grids of dim768 are each one wave).
//    The bits do not depend on R.
//  - One launch for all weights of a call (at most kRowsMaxWeights; the launcher splits longer
//    lists): the grid covers the concatenated columns, a warp finds its weight by a short scan.
#pragma once
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"  // dynamic_smem()
#include "kernels/cuda/rmsnorm.cuh"  // the norm's order (Note [Wide RMSNorm forward])

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
// R: the rows the kernel was compiled for (M <= R), 1 or kMaxRows (Note above).
template <bool kVec, int R, typename T, typename C = compute_t<T>>
__device__ __forceinline__ void add_chunk(C (&acc)[R], const Pack<T, chunk_elems<T>()>& wp,
                                          const T* __restrict__ x, int M, int64_t K, int64_t c) {
  constexpr int V = chunk_elems<T>();
#pragma unroll
  for (int m = 0; m < R; ++m) {
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

// The first round of the lane's chunks of weight row wr: chunks c0, c0 + 32, ... (kRowsUnroll of
// them, those below nchunks), into wp.
template <bool kVec, typename T>
__device__ __forceinline__ void load_round(Pack<T, chunk_elems<T>()> (&wp)[kRowsUnroll], const T* __restrict__ wr,
                                           int64_t K, int64_t nchunks, int64_t c0) {
#pragma unroll
  for (int u = 0; u < kRowsUnroll; ++u) {
    const int64_t c = c0 + static_cast<int64_t>(u) * kWarp;
    if (c < nchunks) wp[u] = load_chunk<kVec>(wr, K, c);
  }
}

// The lane's sums over its chunks of weight row wr (lane, lane + 32, ... in increasing order)
// with the M rows of xs; wp holds the first round (load_round(..., lane)), later rounds are loaded
// here.
template <bool kVec, int R, typename T, typename C = compute_t<T>>
__device__ __forceinline__ void column_sums(C (&acc)[R], Pack<T, chunk_elems<T>()> (&wp)[kRowsUnroll],
                                            const T* __restrict__ wr, const T* __restrict__ xs, int M, int64_t K,
                                            int64_t nchunks, int lane) {
#pragma unroll
  for (int m = 0; m < R; ++m) acc[m] = 0;
  for (int64_t c0 = lane;; c0 += static_cast<int64_t>(kRowsUnroll) * kWarp) {
#pragma unroll
    for (int u = 0; u < kRowsUnroll; ++u) {
      const int64_t c = c0 + static_cast<int64_t>(u) * kWarp;
      if (c < nchunks) add_chunk<kVec, R>(acc, wp[u], xs, M, K, c);
    }
    const int64_t next = c0 + static_cast<int64_t>(kRowsUnroll) * kWarp;
    if (next >= nchunks) break;
    load_round<kVec>(wp, wr, K, nchunks, next);
  }
}

// The warp's output column col of the concatenated weights (kFirst: of the first weight alone, as
// kGlu's gate, whose column n of up is the same n): weight i, its column n of N; valid: col is
// inside (else i and n are those of a column past the end, and the warp computes nothing).
struct Column {
  bool valid;
  int i;
  int64_t n, N;
};
template <bool kFirst>
__device__ __forceinline__ Column find_column(const Weights& ws, int64_t col) {
  const int64_t total = kFirst ? ws.col0[1] : ws.col0[ws.n];
  const bool valid = col < total;
  int i = 0;
  if constexpr (!kFirst)
    while (i + 1 < ws.n && col >= ws.col0[i + 1]) ++i;
  return {valid, i, col - ws.col0[i], ws.col0[i + 1] - ws.col0[i]};
}

// The warp's column sums into column n of the [M, N] output block o. Every lane of the warp takes
// part (the column is the warp's): the butterfly gives each lane the same sums; lane m writes row m.
template <int R, typename T, typename C>
__device__ __forceinline__ void store_column(C (&acc)[R], T* o, int M, int64_t N, int64_t n, int lane) {
#pragma unroll
  for (int m = 0; m < R; ++m) {
    if (m >= M) break;
    const C s = warp_sum(acc[m]);
    if (lane == m) o[m * N + n] = from_compute<T>(s);
  }
}

// grid: ceil(total columns / kRowsWarps) blocks of kRowsThreads; dynamic shared memory M*K*sizeof(T)
// when kSmemX. x [M, K]; out as the Weights say.
template <bool kVec, bool kSmemX, int R, typename T>
__global__ void __launch_bounds__(kRowsThreads)
    linear_rows_kernel(const T* __restrict__ x, Weights ws, T* __restrict__ out, int M, int64_t K) {
  using C = compute_t<T>;
  constexpr int V = chunk_elems<T>();
  const int lane = threadIdx.x % kWarp;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kRowsWarps + threadIdx.x / kWarp;
  const auto [valid, i, n, N] = find_column<false>(ws, col);
  const T* wr = static_cast<const T*>(ws.w[i]) + (valid ? n : 0) * K;
  const int64_t nchunks = (K + V - 1) / V;

  // The first round of chunks, in flight while x is staged.
  Pack<T, V> wp[kRowsUnroll];
  if (valid) load_round<kVec>(wp, wr, K, nchunks, lane);
  wait_prior_grids();  // x is the kernel ahead's output (Note [Early launch of the decode step's kernels])
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

  C acc[R];
  column_sums<kVec, R>(acc, wp, wr, xs, M, K, nchunks, lane);
  store_column(acc, out + M * ws.col0[i], M, N, n, lane);
}

// Note [The decode step's norm fused into its matrix-vector product]
// A decode step at batch <= 8 ran, per layer, add_rms_norm -> q/k/v linear_rows and add_rms_norm
// -> gate/up linear_rows -> swiglu: three kernels (~1.7 us each on the H200, plus ~1.4 us between
// graph nodes) that each move a few KB. norm_linear_rows_kernel does each chain in one launch:
//  - Every block first issues its warps' first round of weight loads (as linear_rows_kernel),
//    then recomputes the norm of the M rows it multiplies (M * K elements: 1.5 KB per row at dim
//    768, from L2 after the first block): h = x + res rounded to T (block 0 writes it: the new
//    residual stream), the sums of squares, y = h * rstd * w rounded to T into shared memory,
//    which the matrix-vector loop then reads as linear_rows_kernel reads its staged x.
//  - The norm's bits are rmsnorm_rows_kernel's (Note [Few rows: a block per row],
//    kernels/cuda/rmsnorm.cuh), hence the group-per-row kernels': the same elementwise add and
//    rounding; per row, lanes 0..G-1 of one warp (G = lanes_for(K)) sum the squares of elements
//    l, l + G, ... in increasing order with `ss += e * e` (wide bf16 rows: in the wide order of
//    Note [Wide RMSNorm forward]), then group_sum's xor tree over G lanes; rms_rstd; y = v *
//    rstd * w rounded once. The products are linear_rows_kernel's sums
//    (same chunks, same order, same butterfly) over that y, so the output is bitwise the
//    composition the unfused decode step ran.
//  - kGlu (the MLP's gate and up, ws = {gate, up}): a warp takes column n of both weights, so
//    both rows' first rounds are in flight together; gate and up are rounded to T as linear_rows
//    stores them, then swiglu_value as swiglu's map kernel computes it, rounded once. The
//    (M, ffn) gate/up buffer and the swiglu kernel disappear.
//  - The shared memory holds y [M, K] (T), the rows [M, K] and norm weight [K] in the compute
//    type and M rstds (kernels.h's norm_rows_smem_bytes); the op composes the unfused ops when
//    that exceeds 48 KB (bf16: M * K <= ~7,700, so dim 768 at every M <= 8).
// Cost: a memory round trip for x, res and w (overlapping the weights' first round), two short
// barrier phases (the sums: K / 32 dependent fmas per lane, ~0.3 us) and a third barrier; the
// composition paid two more launches and two more graph gaps.

// The norm of norm_linear_rows_kernel: h = x + res (res null: h = x), y = rms_norm(h, w).
struct RowsNorm {
  const void* res;  // T [M, K] or null
  const void* w;    // [K]: float when w_f32, else T
  void* h;          // T [M, K]: written by block 0 when res is given
  float eps;
  int G;            // lanes_for(K): rms_norm's group width, which fixes its sum order
  bool w_f32;
};

// grid: ceil(columns / kRowsWarps) blocks of kRowsThreads, columns = the concatenated weights' (or
// kGlu: gate's); dynamic shared memory norm_rows_smem_bytes(sizeof(T), sizeof(C), M, K). kVec: K
// % V == 0, and x, res, h and every weight start at 16-byte boundaries.
template <bool kVec, bool kGlu, int R, typename T>
__global__ void __launch_bounds__(kRowsThreads)
    norm_linear_rows_kernel(const T* __restrict__ x, RowsNorm nm, Weights ws, T* __restrict__ out, int M, int64_t K) {
  using C = compute_t<T>;
  constexpr int V = chunk_elems<T>();
  constexpr int V1 = kVec ? V : 1;  // elements per load of the norm's rows
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kRowsWarps + warp;
  const auto [valid, i, n, N] = find_column<kGlu>(ws, col);
  const T* wr = static_cast<const T*>(ws.w[i]) + (valid ? n : 0) * K;
  const T* ur = kGlu ? static_cast<const T*>(ws.w[1]) + (valid ? n : 0) * K : nullptr;
  const int64_t nchunks = (K + V - 1) / V;
  Pack<T, V> wp[kRowsUnroll], up[kGlu ? kRowsUnroll : 1];
  if (valid) {
    load_round<kVec>(wp, wr, K, nchunks, lane);
    if constexpr (kGlu) load_round<kVec>(up, ur, K, nchunks, lane);
  }

  // The norm (Note above): shared memory y [M, K] (T), then rows [M, K], w [K], rstd [M] (C).
  const int64_t n_x = static_cast<int64_t>(M) * K;
  T* y = reinterpret_cast<T*>(dynamic_smem());
  C* rows = reinterpret_cast<C*>(reinterpret_cast<char*>(y) + (static_cast<size_t>(n_x) * sizeof(T) + 15) / 16 * 16);
  C* wn = rows + n_x;
  C* inv = wn + K;
  const T* __restrict__ res = static_cast<const T*>(nm.res);
  T* __restrict__ h = blockIdx.x == 0 ? static_cast<T*>(nm.h) : nullptr;
  // Phase 1: w, then (once the kernel ahead is done: Note [Early launch of the decode step's
  // kernels]) x (+ res), every load issued before any value is used.
#pragma unroll 4
  for (int64_t j = threadIdx.x; j < K; j += kRowsThreads)
    wn[j] = nm.w_f32 ? static_cast<C>(static_cast<const float*>(nm.w)[j]) : to_compute(static_cast<const T*>(nm.w)[j]);
  wait_prior_grids();
#pragma unroll 4
  for (int64_t p = threadIdx.x; p < n_x / V1; p += kRowsThreads) {
    Pack<T, V1> a = *reinterpret_cast<const Pack<T, V1>*>(x + p * V1), b;
    if (res != nullptr) b = *reinterpret_cast<const Pack<T, V1>*>(res + p * V1);
#pragma unroll
    for (int e = 0; e < V1; ++e) {
      C v = to_compute(a.v[e]);
      if (res != nullptr) {
        v = rounded<T>(apply_binary(BinaryOp::Add, v, to_compute(b.v[e])));
        a.v[e] = from_compute<T>(v);  // h as add_rms_norm stores it
      }
      rows[p * V1 + e] = v;
    }
    if (h != nullptr) *reinterpret_cast<Pack<T, V1>*>(h + p * V1) = a;
  }
  __syncthreads();
  // Phase 2: row m's sum of squares by lanes 0..G-1 of warp m % kRowsWarps, in rms_norm's order.
  for (int m = warp; m < M; m += kRowsWarps) {
    C ss = 0;
    const int nc = nm.G == kWarp ? rmsnorm::wide_forward_chunks<T>(K) : 0;
    if (nc > 0)  // Note [Wide RMSNorm forward] (rmsnorm.cuh)
      ss = rmsnorm::wide_lane_sum_sq<C>(nc, lane, [&](int64_t j) { return rows[m * K + j]; });
    else if (lane < nm.G)
#pragma unroll 8
      for (int64_t j = lane; j < K; j += nm.G) {
        const C e = rows[m * K + j];
        ss += e * e;
      }
    for (int o = nm.G / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);  // group_sum<G>
    if (lane == 0) inv[m] = rms_rstd(ss, K, nm.eps);
  }
  __syncthreads();
  // Phase 3: y, rms_scaled's expression rounded once.
  for (int m = 0; m < M; ++m) {
    const C r = inv[m];
    for (int64_t j = threadIdx.x; j < K; j += kRowsThreads)
      y[m * K + j] = from_compute<T>(static_cast<C>(rows[m * K + j] * r * wn[j]));
  }
  __syncthreads();
  if (!valid) return;  // after the block's last barrier

  C acc[R];
  column_sums<kVec, R>(acc, wp, wr, y, M, K, nchunks, lane);
  if constexpr (kGlu) {
    C acc_u[R];
    column_sums<kVec, R>(acc_u, up, ur, y, M, K, nchunks, lane);
#pragma unroll
    for (int m = 0; m < R; ++m) {
      if (m >= M) break;
      const C g = rounded<T>(warp_sum(acc[m])), u = rounded<T>(warp_sum(acc_u[m]));
      if (lane == m) out[m * N + n] = from_compute<T>(swiglu_value(g, u));
    }
  } else {
    store_column(acc, out + M * ws.col0[i], M, N, n, lane);
  }
}

// Note [A lone row's norm in registers]
// At batch 1 (M = 1) of a wide bf16 row (K = 256 * NC, NC = 1..4: rmsnorm::kWideFwdRegisterChunks)
// on the 16-byte path, the chunks a lane multiplies (lane, lane + 32, ...: elements [256c + 8 lane,
// 256c + 8 lane + 8) for c < NC) are exactly the elements the wide norm order gives that lane
// (Note [Wide RMSNorm forward]). So norm_linear_row_kernel lets every warp normalise the row
// itself, in registers: the lane loads its NC 16-byte packs of x (and res) and of the norm weight,
// forms h rounded to bf16, sums its squares in the wide order, warp_sum (group_sum<32>), rms_rstd,
// y = h * rstd * w rounded once, then multiplies y with its weight rows. No shared memory and no
// barrier: norm_linear_rows_kernel's three barrier phases (and their ~2 us at dim 768) disappear,
// at the price of each warp reading the 1.5 KB row (3 KB with res) from L2 instead of each block.
// Warp 0 of block 0 writes h. The bits are norm_linear_rows_kernel's: the same sums in the same
// order, the same rounding points (tests/emu/linear_rows_emu.cpp compares them).
// grid: ceil(columns / kRowsWarps) blocks (at least one: block 0 writes h) of kRowsThreads, no
// shared memory. x, res, h, the norm weight w (W) and every weight start at 16-byte boundaries.
template <int NC, bool kGlu, bool kAdd, typename W>
__global__ void __launch_bounds__(kRowsThreads)
    norm_linear_row_kernel(const bf16_t* __restrict__ x, RowsNorm nm, Weights ws, bf16_t* __restrict__ out) {
  using T = bf16_t;
  using C = float;
  using P = Pack<T, 8>;
  constexpr int kPW = 16 / static_cast<int>(sizeof(W));  // norm weights per 16-byte pack
  constexpr int kW = 8 / kPW;                             // 16-byte packs of the norm weight per chunk
  using PW = Pack<W, kPW>;
  constexpr int64_t K = static_cast<int64_t>(NC) * rmsnorm::kWideChunk;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kRowsWarps + warp;
  const auto [valid, i, n, N] = find_column<kGlu>(ws, col);
  T* __restrict__ h = blockIdx.x == 0 && warp == 0 ? static_cast<T*>(nm.h) : nullptr;
  if (!valid && h == nullptr) return;  // no barrier below
  const int64_t base = lane * 8;       // the lane's element in each chunk of 256
  const T* wr = static_cast<const T*>(ws.w[i]) + (valid ? n : 0) * K + base;
  const T* ur = kGlu ? static_cast<const T*>(ws.w[1]) + (valid ? n : 0) * K + base : nullptr;
  P wp[NC], up[kGlu ? NC : 1];
  if (valid) {
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      wp[c] = *reinterpret_cast<const P*>(wr + c * rmsnorm::kWideChunk);
      if constexpr (kGlu) up[c] = *reinterpret_cast<const P*>(ur + c * rmsnorm::kWideChunk);
    }
  }
  // The norm: every load of the row before any use, then norm_linear_rows_kernel's expressions;
  // the residual and the norm weight before the wait, x (the kernel ahead's output) after it
  // (Note [Early launch of the decode step's kernels]).
  const T* __restrict__ res = kAdd ? static_cast<const T*>(nm.res) : nullptr;
  const W* __restrict__ nw = static_cast<const W*>(nm.w) + base;
  P a[NC], b[NC];
  PW g[NC][kW];
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    if constexpr (kAdd) b[c] = *reinterpret_cast<const P*>(res + base + c * rmsnorm::kWideChunk);
#pragma unroll
    for (int k = 0; k < kW; ++k) g[c][k] = *reinterpret_cast<const PW*>(nw + c * rmsnorm::kWideChunk + k * kPW);
  }
  wait_prior_grids();
#pragma unroll
  for (int c = 0; c < NC; ++c) a[c] = *reinterpret_cast<const P*>(x + base + c * rmsnorm::kWideChunk);
  const C ss = rmsnorm::wide_add_sum_sq<NC, kAdd>(a, b);  // h as add_rms_norm stores it, in a
  if (kAdd && h != nullptr)
#pragma unroll
    for (int c = 0; c < NC; ++c) *reinterpret_cast<P*>(h + base + c * rmsnorm::kWideChunk) = a[c];
  if (!valid) return;
  const C r = rms_rstd(warp_sum(ss), K, nm.eps);
  C acc = 0, acc_u = 0;
#pragma unroll
  for (int c = 0; c < NC; ++c)
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const C wn = static_cast<C>(to_compute(g[c][e / kPW].v[e % kPW]));
      const C y = to_compute(from_compute<T>(static_cast<C>(to_compute(a[c].v[e]) * r * wn)));  // y as the staged kernel rounds it
      acc += to_compute(wp[c].v[e]) * y;
      if constexpr (kGlu) acc_u += to_compute(up[c].v[e]) * y;
    }
  if constexpr (kGlu) {
    const C gs = rounded<T>(warp_sum(acc)), us = rounded<T>(warp_sum(acc_u));
    if (lane == 0) out[n] = from_compute<T>(swiglu_value(gs, us));
  } else {
    const C s = warp_sum(acc);
    if (lane == 0) out[ws.col0[i] + n] = from_compute<T>(s);
  }
}

}  // namespace rows
}  // namespace cuda
}  // namespace kernels
}  // namespace xt
