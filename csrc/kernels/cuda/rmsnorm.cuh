// The CUDA kernels of RMSNorm's forward, its one-pass backward and the fused residual add + RMSNorm
// forward (launched by kernels/cuda/rmsnorm.cu), in a header so that tests/emu runs them on the CPU under
// the warp/block emulator (tests/emu/rmsnorm_emu.cpp). Note [One-pass RMSNorm weight gradient] in
// rmsnorm.cu describes the scheme. Launch shapes depend only on rows and dim (onepass_plan).
#pragma once
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"  // dynamic_smem()

namespace xt {
namespace kernels {
namespace cuda {
namespace rmsnorm {

// a * b rounded on its own: nvcc would otherwise contract `a * b + c` into one fma, and the fused
// residual form (dx = round(dx) + dres) must round dx exactly as the unfused rms_norm backward
// followed by the engine's add does.
template <typename C>
__device__ __forceinline__ C mul_rn(C a, C b) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(C) == 4) return __fmul_rn(a, b);
  else return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

// a * b + c: one rounding on the device, the host build's two. The one-pass backwards spell out
// the multiply-adds nvcc contracts (sm_90 SASS of the loops as first written: dot = fma(dy * w,
// x * inv, dot); dx = inv * fma(dy, w, -(xhat * mean_dot)); acc = fma(xhat, dy, acc)), so that
// their bits do not hang on how nvcc contracts a differently shaped (unrolled, register) loop.
template <typename C>
__device__ __forceinline__ C fma_dev(C a, C b, C c) {
#if defined(__CUDA_ARCH__)
  return fma(a, b, c);
#else
  return a * b + c;
#endif
}

// The block's dw row once its groups' rows acc [groups][dim] are complete: their sum in group
// order, stored to dw when the plan has one block, else as the block's partial row (the one-pass
// backwards here and qk_norm_rope's). Index: the type of the row offsets (int where dim is a
// constant, which lets nvcc unroll the sum). at(j): column j's offset within a group's row (the
// long-row backward's lane-major layout; j itself by default).
struct ColumnAt {
  __device__ int operator()(int j) const { return j; }
};
template <typename Index, typename C, typename W, typename At = ColumnAt>
__device__ __forceinline__ void store_block_dw(const C* acc, int groups, int dim, bool one_block, W* dw, C* partial,
                                               int64_t block, At at = {}) {
  __syncthreads();
  for (int j = threadIdx.x; j < dim; j += kThreads) {
    C s = 0;
    const int i = at(j);
    for (int g = 0; g < groups; ++g) s += acc[static_cast<Index>(g) * dim + i];
    if (one_block) store(dw, j, static_cast<compute_t<W>>(s));
    else partial[block * dim + j] = s;
  }
}

// One block: rows [blockIdx.x * rows_per_block, ...); group g of G lanes takes rows r0 + g,
// r0 + g + groups, ... in order. dres (may be null): dx = round(dx) + dres. Writes dx, and dw
// directly when there is one block, else the block's partial row partial[blockIdx.x, :].
// The row loops are unrolled and the pointers __restrict__ (Note [Latency of a lone row],
// common.cuh): without both, each element waited one memory round trip, since the next load may
// not pass the dx store before it (48 round trips per row at dim 768; 115 us per call at
// B*S = 32768 on the H200, ~40% of HBM bandwidth). The sums keep their order.
template <int G, typename T, typename W>
__global__ void __launch_bounds__(kThreads)
rmsnorm_backward_onepass_kernel(const T* __restrict__ x, const W* __restrict__ w, const float* __restrict__ rstd,
                                const T* __restrict__ dy, const T* __restrict__ dres, T* __restrict__ dx,
                                W* __restrict__ dw, compute_t<T>* __restrict__ partial, int64_t rows, int64_t dim,
                                int64_t rows_per_block) {
  using C = compute_t<T>;
  C* acc = reinterpret_cast<C*>(dynamic_smem());  // [groups][dim]
  constexpr int groups = kThreads / G;
  const int lane = threadIdx.x % G, group = threadIdx.x / G;
  C* my = acc + static_cast<int64_t>(group) * dim;
  for (int64_t j = lane; j < dim; j += G) my[j] = 0;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t r1 = rows < r0 + rows_per_block ? rows : r0 + rows_per_block;
  // Every thread of the block runs the same trip count: group_sum's shuffles take the whole warp,
  // which holds 32 / G groups; a group past the last row adds nothing and writes nothing.
  for (int64_t base = r0; base < r1; base += groups) {
    const int64_t r = base + group;
    const bool valid = r < r1;
    const T* xr = x + (valid ? r : 0) * dim;
    const T* dyr = dy + (valid ? r : 0) * dim;
    const C inv = valid ? static_cast<C>(rstd[r]) : C(0);
    C dot = 0;
    if (valid)
#pragma unroll 8
      for (int64_t j = lane; j < dim; j += G)
        dot = fma_dev(mul_rn(load(dyr, j), static_cast<C>(load(w, j))), mul_rn(load(xr, j), inv), dot);
    dot = group_sum<G>(dot);
    if (!valid) continue;
    const C mean_dot = dot / static_cast<C>(dim);
    T* dxr = dx + r * dim;
    const T* dresr = dres != nullptr ? dres + r * dim : nullptr;
#pragma unroll 8
    for (int64_t j = lane; j < dim; j += G) {
      const C xhat = mul_rn(load(xr, j), inv);
      const C d = load(dyr, j);
      C v = mul_rn(inv, fma_dev(d, static_cast<C>(load(w, j)), -mul_rn(xhat, mean_dot)));
      if (dresr != nullptr) v = to_compute(from_compute<T>(v)) + load(dresr, j);
      store(dxr, j, v);
      my[j] = fma_dev(xhat, d, my[j]);
    }
  }
  store_block_dw<int64_t>(acc, groups, static_cast<int>(dim), gridDim.x == 1, dw, partial, blockIdx.x);
}

// Note [Wide RMSNorm backward]
// bf16 rows of dim = 256 * NC (NC <= kWideMaxChunks: widths 256, 512, 768) take a kernel
// whose lane L owns the 8 consecutive elements [256c + 8L, 256c + 8L + 8) of each chunk c, so x,
// dy, dres and dx move in 16-byte packs: a warp's request covers 512 bytes instead of 64. The
// lane-strided kernel above issues 2-byte accesses and stayed at ~50% of HBM bandwidth even with
// its loops unrolled (103 us per call for 32768 rows of 768 on the H200, 201 MB). A warp takes a
// row (group = warp, G = 32), all of the row's loads (x, dy, dres, rstd) issued together; the
// lane's dw partials stay in registers across its rows, w sits widened in shared memory. The
// blocks, the rows of each warp and
// their order, the block sum and the final pass are onepass_plan<32>'s, as above; the difference
// is the order of a row's dot (a lane's elements chunk by chunk, then group_sum<32>), so dx and
// dw differ from the lane-strided kernel in the last bits. Nothing else has to agree with it
// bitwise but qk_norm_rope's one-pass backward at such head dims, which runs the composition
// itself there (rope's inverse, then rmsnorm_backward: kernels/cuda/qk_norm_rope.cu).
// Measured on the H200 (1ecc263): 56 us per call at that shape, ~3.6 TB/s.
constexpr int kWideChunk = 256;  // elements per chunk: 32 lanes x 8 bf16 (16 bytes)
// At most 3 chunks: under kWideBlocks' 128 registers 4 (dim 1024) spill 232 bytes per thread.
constexpr int kWideMaxChunks = 3;
// Blocks per SM the registers must leave room for: with w in registers too, dim 768 took 152
// registers (one block of 8 warps per SM, 8 rows in flight); w is read from shared memory instead.
constexpr int kWideBlocks = 2;
constexpr int wide_chunks(int64_t dim) {
  return dim >= kWideChunk && dim % kWideChunk == 0 && dim / kWideChunk <= kWideMaxChunks
             ? static_cast<int>(dim / kWideChunk)
             : 0;
}

template <int NC, typename W>
__global__ void __launch_bounds__(kThreads, kWideBlocks)
rmsnorm_backward_wide_kernel(const bf16_t* __restrict__ x, const W* __restrict__ w, const float* __restrict__ rstd,
                             const bf16_t* __restrict__ dy, const bf16_t* __restrict__ dres, bf16_t* __restrict__ dx,
                             W* __restrict__ dw, float* __restrict__ partial, int64_t rows, int64_t rows_per_block) {
  using T = bf16_t;
  using C = float;
  using P = Pack<T, 8>;
  constexpr int dim = NC * kWideChunk, groups = kThreads / kWarp;
  C* acc_s = reinterpret_cast<C*>(dynamic_smem());  // [groups][dim]; w widened in row 0 until the rows are done
  const int lane = threadIdx.x % kWarp, group = threadIdx.x / kWarp;
  for (int j = threadIdx.x; j < dim; j += kThreads) acc_s[j] = static_cast<C>(load(w, j));
  C acc[NC][8];
#pragma unroll
  for (int c = 0; c < NC; ++c)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[c][e] = 0;
  __syncthreads();
  const C* wl = acc_s + lane * 8;  // this lane's w: wl[c * kWideChunk + e]
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t r1 = rows < r0 + rows_per_block ? rows : r0 + rows_per_block;
  for (int64_t r = r0 + group; r < r1; r += groups) {  // the whole warp takes row r
    const int64_t off = r * dim + lane * 8;
    P xp[NC], dp[NC], rp[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      xp[c] = *reinterpret_cast<const P*>(x + off + c * kWideChunk);
      dp[c] = *reinterpret_cast<const P*>(dy + off + c * kWideChunk);
      if (dres != nullptr) rp[c] = *reinterpret_cast<const P*>(dres + off + c * kWideChunk);
    }
    const C inv = static_cast<C>(rstd[r]);
    C dot = 0;
#pragma unroll
    for (int c = 0; c < NC; ++c)
#pragma unroll
      for (int e = 0; e < 8; ++e)
        dot = fma_dev(mul_rn(to_compute(dp[c].v[e]), wl[c * kWideChunk + e]), mul_rn(to_compute(xp[c].v[e]), inv),
                      dot);
    dot = group_sum<kWarp>(dot);
    const C mean_dot = dot / static_cast<C>(dim);
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      P o;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const C xhat = mul_rn(to_compute(xp[c].v[e]), inv);
        const C d = to_compute(dp[c].v[e]);
        C v = mul_rn(inv, fma_dev(d, wl[c * kWideChunk + e], -mul_rn(xhat, mean_dot)));
        if (dres != nullptr) v = to_compute(from_compute<T>(v)) + to_compute(rp[c].v[e]);
        o.v[e] = from_compute<T>(v);
        acc[c][e] = fma_dev(xhat, d, acc[c][e]);
      }
      *reinterpret_cast<P*>(dx + off + c * kWideChunk) = o;
    }
  }
  __syncthreads();  // every warp is done reading w from row 0
  C* my = acc_s + group * dim;
#pragma unroll
  for (int c = 0; c < NC; ++c)
#pragma unroll
    for (int e = 0; e < 8; ++e) my[c * kWideChunk + lane * 8 + e] = acc[c][e];
  store_block_dw<int>(acc_s, groups, dim, gridDim.x == 1, dw, partial, blockIdx.x);
}

// Note [Wide RMSNorm backward, long rows]
// Rows of dim = 256 * NC with NC in kWideLongChunks (1024 and 2048: Qwen3-0.6B's, Llama-3.2-1B's
// and Qwen3-1.7B's width) do not fit the wide kernel's registers (its dw partials alone are 8 * NC
// floats a lane), and at dim 2048 the lane-strided one-pass kernel's [groups][dim] float rows
// (64 KB) are over the default shared memory, so those rows took the two-kernel path (dx, then a
// column sum for dw: x and dy read three times, 2-byte accesses; 159 + 50 us per call for 16384
// rows of 2048 on the H200, ~1.2 TB/s). This kernel keeps the wide kernel's lanes, order and plan
// and moves what does not fit into shared memory:
//  - a warp per row, lane L owns the 8 consecutive elements [256c + 8L, 256c + 8L + 8) of each
//    chunk c; two passes over the row: the first adds the dot chunk by chunk (each chunk's 8 in
//    order, then group_sum<32>: the wide kernel's dot, so the same dx bits for a given NC), the
//    second reads the row again (from the cache: the warp's row is 8-12 KB) and writes dx;
//  - the dw partials and w in shared memory, lane-major ([groups][c][e][lane] and [c][e][lane]),
//    so a warp's accesses are 32 consecutive floats (with the row layout a lane's 8 floats at a
//    stride of 8 would be an 8-way bank conflict); the block's dw row is the groups' sum in group
//    order, as store_block_dw adds it, then onepass_plan<32>'s blocks and final tree.
// Shared memory (groups + 1) * dim * 4 bytes: 36 KB at 1024, 72 KB at 2048 (the launcher's opt-in).
constexpr int kWideLongMaxChunks = 8;
constexpr int wide_long_chunks(int64_t dim) {
  return dim == 4 * kWideChunk || dim == 8 * kWideChunk ? static_cast<int>(dim / kWideChunk) : 0;
}
constexpr size_t wide_long_smem(int nc) {
  return sizeof(float) * static_cast<size_t>(kThreads / kWarp + 1) * static_cast<size_t>(nc * kWideChunk);
}
// Index of element e of lane L's 8 in chunk c, in the lane-major layout.
__host__ __device__ constexpr int wide_long_index(int c, int e, int lane) { return (c * 8 + e) * kWarp + lane; }

// A compiler barrier: loads after it are issued again rather than served from the registers of
// loads before it (a no-op under the host emulation).
__device__ __forceinline__ void reload_barrier() {
#ifndef XT_CUDA_EMULATION
  asm volatile("" ::: "memory");
#endif
}

template <int NC, typename W>
__global__ void __launch_bounds__(kThreads, kWideBlocks)
rmsnorm_backward_wide_long_kernel(const bf16_t* __restrict__ x, const W* __restrict__ w,
                                  const float* __restrict__ rstd, const bf16_t* __restrict__ dy,
                                  const bf16_t* __restrict__ dres, bf16_t* __restrict__ dx, W* __restrict__ dw,
                                  float* __restrict__ partial, int64_t rows, int64_t rows_per_block) {
  using T = bf16_t;
  using C = float;
  using P = Pack<T, 8>;
  constexpr int dim = NC * kWideChunk, groups = kThreads / kWarp;
  C* acc_s = reinterpret_cast<C*>(dynamic_smem());  // [groups][dim], lane-major within a group's row
  C* w_s = acc_s + groups * dim;                     // [dim], lane-major
  const int lane = threadIdx.x % kWarp, group = threadIdx.x / kWarp;
  for (int j = threadIdx.x; j < dim; j += kThreads)
    w_s[wide_long_index(j / kWideChunk, j % 8, (j % kWideChunk) / 8)] = static_cast<C>(load(w, j));
  for (int j = threadIdx.x; j < groups * dim; j += kThreads) acc_s[j] = 0;
  __syncthreads();
  C* my = acc_s + group * dim;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t r1 = rows < r0 + rows_per_block ? rows : r0 + rows_per_block;
  for (int64_t r = r0 + group; r < r1; r += groups) {  // the whole warp takes row r
    const int64_t off = r * dim + lane * 8;
    const C inv = static_cast<C>(rstd[r]);
    C dot = 0;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const P xp = *reinterpret_cast<const P*>(x + off + c * kWideChunk);
      const P dp = *reinterpret_cast<const P*>(dy + off + c * kWideChunk);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        dot = fma_dev(mul_rn(to_compute(dp.v[e]), w_s[wide_long_index(c, e, lane)]),
                      mul_rn(to_compute(xp.v[e]), inv), dot);
    }
    dot = group_sum<kWarp>(dot);
    const C mean_dot = dot / static_cast<C>(dim);
    reload_barrier();  // the second pass loads the row again (the cache has it) instead of keeping 8 * NC registers
#pragma unroll 2
    for (int c = 0; c < NC; ++c) {
      const P xp = *reinterpret_cast<const P*>(x + off + c * kWideChunk);
      const P dp = *reinterpret_cast<const P*>(dy + off + c * kWideChunk);
      P rp;
      if (dres != nullptr) rp = *reinterpret_cast<const P*>(dres + off + c * kWideChunk);
      P o;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const C xhat = mul_rn(to_compute(xp.v[e]), inv);
        const C d = to_compute(dp.v[e]);
        C v = mul_rn(inv, fma_dev(d, w_s[wide_long_index(c, e, lane)], -mul_rn(xhat, mean_dot)));
        if (dres != nullptr) v = to_compute(from_compute<T>(v)) + to_compute(rp.v[e]);
        o.v[e] = from_compute<T>(v);
        C& a = my[wide_long_index(c, e, lane)];
        a = fma_dev(xhat, d, a);
      }
      *reinterpret_cast<P*>(dx + off + c * kWideChunk) = o;
    }
  }
  store_block_dw<int>(acc_s, groups, dim, gridDim.x == 1, dw, partial, blockIdx.x,
                      [](int j) { return wide_long_index(j / kWideChunk, j % 8, (j % kWideChunk) / 8); });
}

// dw[j] = sum over the nparts partial rows in order: block = 32 columns x 32 slices (1024
// threads); slice s adds rows s, s + 32, ... in order, then slice 0 adds the 32 slice sums in
// order. (With 8 slices of 256-thread blocks a thread walked up to 128 partial rows one after the
// other: 3.6 us per call at dim768 b32, 9.4 us at b128, and 10 us for qk_norm_rope's two-block
// tree, on the H200.)
constexpr int kFinalCols = 32, kTreeThreads = 1024, kFinalSlices = kTreeThreads / kFinalCols;
template <typename C>
constexpr size_t tree_smem() { return sizeof(C) * kFinalCols * kFinalSlices; }
// The body, for column block col_block (qk_norm_rope's backward runs it for its q and k sides).
template <typename C, typename W>
__device__ __forceinline__ void dw_tree(const C* partial, int64_t nparts, W* dw, int64_t dim, int64_t col_block) {
  C* part = reinterpret_cast<C*>(dynamic_smem());  // [kFinalSlices][kFinalCols]: tree_smem<C>() bytes
  const int col = threadIdx.x % kFinalCols, slice = threadIdx.x / kFinalCols;
  const int64_t j = col_block * kFinalCols + col;
  C s = 0;
  if (j < dim)
    for (int64_t k = slice; k < nparts; k += kFinalSlices) s += partial[k * dim + j];
  part[slice * kFinalCols + col] = s;
  __syncthreads();
  if (slice != 0 || j >= dim) return;
  C t = 0;
  for (int k = 0; k < kFinalSlices; ++k) t += part[k * kFinalCols + col];
  store(dw, j, static_cast<compute_t<W>>(t));
}

template <typename C, typename W>
__global__ void __launch_bounds__(kTreeThreads)
rmsnorm_dw_tree_kernel(const C* partial, int64_t nparts, W* dw, int64_t dim) {
  dw_tree<C, W>(partial, nparts, dw, dim, blockIdx.x);
}

// Note [Wide RMSNorm forward]
// The forward's sum of squares fixes rstd's bits, so every kernel that normalises a row must add
// the squares in one order. For bf16 rows of dim = 256 * NC (wide_forward_chunks: NC = 1..4 and
// 8, the model widths 256 to 1024 and 2048) that order is the wide kernel's: lane L of the row's warp adds its
// elements [256c + 8L, 256c + 8L + 8) chunk by chunk (c = 0, 1, ..., each chunk's 8 in order),
// each as ss = fma(v, v, ss) from 0, then group_sum<32>. So a lane's elements are 16 contiguous
// bytes per chunk, and rmsnorm_forward_wide_kernel moves x, res, h and y in 16-byte packs (a
// warp's request covers 512 bytes instead of the lane-strided kernels' 64: those ran add_rms_norm
// at ~2.9 TB/s, 69 us per call for 32768 rows of 768 on the H200, 200 MB). The other kernels
// that sum such a row's squares take the same order through row_sum_sq / wide_lane_sum_sq: the
// group-per-row rms_norm, the few-row kernel (Note [Few rows: a block per row]), the decode
// step's fused norm (linear_rows.cuh) and the head preparations (qk_norm_rope's general forward,
// decode_prep) at head dims 256 and up; lanes_for gives every such row G = 32. Other widths and
// types keep group_sum_sq's lane-strided order. Elementwise values (h, y = v * rstd * w) do not
// depend on the order. tests/emu/rmsnorm_emu.cpp and linear_rows_emu.cpp compare the kernels
// bit for bit. NC = 8 (Llama-3.2-1B's and Qwen3-1.7B's 2048) joined later: the lane-strided
// kernels ran add_rms_norm there at ~2.1 TB/s (120 us per call for 16384 rows, 256 MB) and
// rms_norm at ~2.6 (52 us); the wide kernel holds the row's 8 packs of x (and res) a lane in
// registers. The decode step's lone-row norm in registers (linear_rows.cuh) stays at NC <= 4
// (kWideFwdRegisterChunks); wider rows take its shared-memory path, in the same order.
constexpr int kWideFwdMaxChunks = 4;
constexpr int kWideFwdLongChunks = 8;
template <typename T>
constexpr int wide_forward_chunks(int64_t dim) {
  return std::is_same_v<T, bf16_t> && dim >= kWideChunk && dim % kWideChunk == 0 &&
                 (dim / kWideChunk <= kWideFwdMaxChunks || dim / kWideChunk == kWideFwdLongChunks)
             ? static_cast<int>(dim / kWideChunk)
             : 0;
}
constexpr int kWideFwdRegisterChunks = 4;  // the decode step's lone row in registers (linear_rows.cuh)

// Lane `lane`'s part of a wide row's sum of squares, at(j) giving element j in the compute type.
template <typename C, typename F>
__device__ __forceinline__ C wide_lane_sum_sq(int nc, int lane, F&& at) {
  C ss = 0;
  for (int c = 0; c < nc; ++c)
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const C v = at(static_cast<int64_t>(c) * kWideChunk + lane * 8 + e);
      ss = fma_dev(v, v, ss);
    }
  return ss;
}

// A row's sum of squares over its group (every lane gets it) in the order Note [Wide RMSNorm
// forward] fixes: the wide order for wide rows, else group_sum_sq's.
template <int G, typename T>
__device__ __forceinline__ compute_t<T> row_sum_sq(const T* x, int64_t dim, int lane, bool valid) {
  using C = compute_t<T>;
  if constexpr (G == kWarp) {
    const int nc = wide_forward_chunks<T>(dim);
    if (nc > 0)
      return group_sum<G>(valid ? wide_lane_sum_sq<C>(nc, lane, [&](int64_t j) { return load(x, j); }) : C(0));
  }
  return group_sum_sq<G>(x, dim, lane, valid);
}

// A lane's part of a wide bf16 row (its NC packs of 8): with kAdd, h = a + b rounded to bf16 as
// ops::add rounds it, left in a; returns the lane's sum of squares of h (of a without kAdd) in
// wide_lane_sum_sq's order and expression. h stays in bf16: its float value is exact from a.
template <int NC, bool kAdd>
__device__ __forceinline__ float wide_add_sum_sq(Pack<bf16_t, 8> (&a)[NC], const Pack<bf16_t, 8> (&b)[NC]) {
  float ss = 0;
#pragma unroll
  for (int c = 0; c < NC; ++c)
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      float t = to_compute(a[c].v[e]);
      if constexpr (kAdd) {
        t = rounded<bf16_t>(apply_binary(BinaryOp::Add, t, to_compute(b[c].v[e])));
        a[c].v[e] = from_compute<bf16_t>(t);
      }
      ss = fma_dev(t, t, ss);
    }
  return ss;
}

// rms_norm (kAdd false: res and h unused) or add_rms_norm forward of wide bf16 rows, a warp per
// row (Note [Wide RMSNorm forward]); kVec: 16-byte packs (x, res, h, y 16-byte aligned), else the
// same elements one by one (the same bits).
template <int NC, bool kAdd, bool kVec, typename W>
__global__ void __launch_bounds__(kThreads)
rmsnorm_forward_wide_kernel(const bf16_t* __restrict__ x, const bf16_t* __restrict__ res, const W* __restrict__ w,
                            bf16_t* __restrict__ h, bf16_t* __restrict__ y, float* __restrict__ rstd, int64_t rows,
                            float eps) {
  using T = bf16_t;
  using C = float;
  using P = Pack<T, 8>;
  constexpr int dim = NC * kWideChunk;
  const int lane = threadIdx.x % kWarp;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (kThreads / kWarp) + threadIdx.x / kWarp;
  if (r >= rows) return;  // a whole warp: the shuffles below are the warp's own
  const int64_t base = r * dim + lane * 8;
  P a[NC], b[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) {  // every load of the row before any use
    if constexpr (kVec) {
      a[c] = *reinterpret_cast<const P*>(x + base + c * kWideChunk);
      if constexpr (kAdd) b[c] = *reinterpret_cast<const P*>(res + base + c * kWideChunk);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        a[c].v[e] = x[base + c * kWideChunk + e];
        if constexpr (kAdd) b[c].v[e] = res[base + c * kWideChunk + e];
      }
    }
  }
  C ss = wide_add_sum_sq<NC, kAdd>(a, b);
  if constexpr (kAdd) {
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      if constexpr (kVec) {
        *reinterpret_cast<P*>(h + base + c * kWideChunk) = a[c];
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) h[base + c * kWideChunk + e] = a[c].v[e];
      }
    }
  }
  ss = group_sum<kWarp>(ss);
  const C inv = rms_rstd(ss, dim, eps);
  if (lane == 0) rstd[r] = static_cast<float>(inv);
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    P o;
#pragma unroll
    for (int e = 0; e < 8; ++e)
      o.v[e] = from_compute<T>(
          static_cast<C>(to_compute(a[c].v[e]) * inv * static_cast<C>(load(w, c * kWideChunk + lane * 8 + e))));
    if constexpr (kVec) {
      *reinterpret_cast<P*>(y + base + c * kWideChunk) = o;
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) y[base + c * kWideChunk + e] = o.v[e];
    }
  }
}

// y = rmsnorm(x): G lanes per row (group_row), rows_per_block<G>() rows per block.
template <int G, typename T, typename W>
__global__ void rmsnorm_forward_kernel(const T* __restrict__ x, const W* __restrict__ w, T* __restrict__ y,
                                       float* __restrict__ rstd, int64_t rows, int64_t dim, float eps) {
  using C = compute_t<T>;
  const int64_t r = group_row<G>();
  const bool valid = r < rows;  // every lane takes part in the shuffles
  const int lane = threadIdx.x % G;
  const T* xr = x + (valid ? r : 0) * dim;
  const C ss = row_sum_sq<G>(xr, dim, lane, valid);  // Note [Wide RMSNorm forward]
  if (!valid) return;
  T* yr = y + r * dim;
  const C inv = rms_rstd(ss, dim, eps);
  if (lane == 0) rstd[r] = static_cast<float>(inv);
#pragma unroll 8  // Note [Latency of a lone row]
  for (int64_t j = lane; j < dim; j += G) store(yr, j, rms_scaled(xr, w, j, inv));
}

// h = x + r (rounded, as ops::add), then y = rmsnorm(h) of the rounded h: bitwise add +
// rmsnorm_forward_kernel (each lane sums the squares of the elements it wrote, in group_sum_sq's
// order, and recomputes them for y, so no barrier and no read-back is needed).
template <int G, typename T, typename W>
__global__ void add_rmsnorm_forward_kernel(const T* __restrict__ x, const T* __restrict__ res, const W* __restrict__ w,
                                           T* __restrict__ h, T* __restrict__ y, float* __restrict__ rstd, int64_t rows,
                                           int64_t dim, float eps) {
  using C = compute_t<T>;
  const int64_t r = group_row<G>();
  const bool valid = r < rows;
  const int lane = threadIdx.x % G;
  const T* xr = x + (valid ? r : 0) * dim;
  const T* rr = res + (valid ? r : 0) * dim;
  // h = x + res as stored (rounded to T), and the sum of its squares in group_sum_sq's order from
  // the rounded values in registers: reading h back from memory cost a round trip per element
  // batch (Note [Latency of a lone row], kernels/cuda/common.cuh).
  C ss = 0;
  if (valid) {
    T* hr = h + r * dim;
#pragma unroll 8
    for (int64_t j = lane; j < dim; j += G) {
      const C v = rounded<T>(apply_binary(BinaryOp::Add, load(xr, j), load(rr, j)));
      store(hr, j, v);
      ss += v * v;
    }
  }
  if constexpr (G == kWarp) {  // Note [Wide RMSNorm forward]: a wide row's squares in the wide order
    const int nc = wide_forward_chunks<T>(dim);
    if (nc > 0 && valid)
      ss = wide_lane_sum_sq<C>(nc, lane, [&](int64_t j) {
        return rounded<T>(apply_binary(BinaryOp::Add, load(xr, j), load(rr, j)));
      });
  }
  ss = group_sum<G>(ss);
  if (!valid) return;
  T* yr = y + r * dim;
  const C inv = rms_rstd(ss, dim, eps);
  if (lane == 0) rstd[r] = static_cast<float>(inv);
  // y = rms_scaled of h, with h recomputed from x and res (their loads hit the cache) rather than
  // read back: the same value as the stored h.
#pragma unroll 8
  for (int64_t j = lane; j < dim; j += G) {
    const C v = rounded<T>(apply_binary(BinaryOp::Add, load(xr, j), load(rr, j)));
    store(yr, j, static_cast<C>(v * inv * static_cast<C>(load(w, j))));
  }
}

// Note [Few rows: a block per row]
// A decode step normalises one row per sequence (batch 1: one row of dim 768), and the kernels
// above give a row to one group of G <= 32 lanes: each lane walks dim / G elements, so even with
// the loops unrolled (Note [Latency of a lone row], kernels/cuda/common.cuh) a lane waits for
// several dependent batches of loads, then for w after the sum, with nothing else on the GPU to
// hide it (5.5 us per one-row add_rms_norm on the H200). With few rows, rmsnorm_rows_kernel gives
// each row a block instead, in three phases:
//  1. every thread loads its share of the row (x, and res for add_rms_norm; 16-byte packs when
//     the rows are aligned) and of w, all in one memory round trip; it writes h (add_rms_norm:
//     x + res rounded to T, elementwise so order-free) and puts the row's values, as the sum reads
//     them (h rounded, or x widened), into shared memory; the values and w stay in registers;
//  2. after a barrier, lanes 0..G-1 of warp 0 sum the squares from shared memory exactly as lane
//     l of the row's group does in the kernels above (elements l, l + G, ... in increasing order,
//     the same `ss += v * v`, so the same contraction into fma), then the same group_sum<G>
//     shuffle tree, and lane 0 computes rstd with rms_rstd;
//  3. after a second barrier, every thread writes y for its elements from its registers, with
//     the same expression (v * rstd * w, rounded once).
// Each value is computed by the same operations in the same order as in the group-per-row
// kernels, so h, y and rstd are the same bits; tests/emu/rmsnorm_emu.cpp compares them bit for bit.
// A thread holds at most kRowElems elements, so the path takes dim <= kThreads * kRowElems; it is
// used for rows <= kFewRowsMax (few_rows_plan), where the group-per-row grid has at most
// kFewRowsMax / 8 blocks and one block per row is still at most one block per SM of an H100/H200
// (132 SMs): every row is in flight at once. Beyond that the group-per-row kernels have rows
// enough to hide latency and spend no barriers.
constexpr int kRowElems = 16;           // elements per thread, held in registers between phases
constexpr int64_t kFewRowsMax = 128;    // rows up to which a block per row is used
constexpr int64_t kFewRowsMaxDim = static_cast<int64_t>(kThreads) * kRowElems;  // 4096

// kAdd: add_rms_norm (res and h given), else rms_norm. kVec: the rows' x, res, h and y start at
// 16-byte boundaries and dim is a multiple of 16 / sizeof(T), so a thread moves 16-byte packs.
// Grid: one block per row; blockDim.x: a multiple of 32 with blockDim.x * kRowElems >= dim.
// Dynamic shared memory: (dim + 1) compute-type values (rows_smem).
template <int G, bool kAdd, bool kVec, typename T, typename W>
__global__ void __launch_bounds__(kThreads)
rmsnorm_rows_kernel(const T* __restrict__ x, const T* __restrict__ res, const W* __restrict__ w, T* __restrict__ h,
                    T* __restrict__ y, float* __restrict__ rstd, int64_t dim, float eps) {
  using C = compute_t<T>;
  constexpr int V = kVec ? 16 / static_cast<int>(sizeof(T)) : 1;  // elements per pack
  constexpr int P = kRowElems / V;                                  // packs per thread at most
  C* row = reinterpret_cast<C*>(dynamic_smem());  // [dim] the values the sum reads, then rstd
  const int64_t r = blockIdx.x, npacks = dim / V;
  const int tid = threadIdx.x, nthreads = blockDim.x;
  const T* xr = x + r * dim;
  const T* rr = kAdd ? res + r * dim : nullptr;
  // Phase 1: every load of the thread (x, res, w) is issued before any value is used.
  Pack<T, V> a[P], b[P];
  C wv[P][V], v[P][V];
#pragma unroll
  for (int k = 0; k < P; ++k) {
    const int64_t p = tid + static_cast<int64_t>(k) * nthreads;
    if (p >= npacks) break;
    a[k] = *reinterpret_cast<const Pack<T, V>*>(xr + p * V);
    if constexpr (kAdd) b[k] = *reinterpret_cast<const Pack<T, V>*>(rr + p * V);
#pragma unroll
    for (int e = 0; e < V; ++e) wv[k][e] = static_cast<C>(load(w, p * V + e));
  }
#pragma unroll
  for (int k = 0; k < P; ++k) {
    const int64_t p = tid + static_cast<int64_t>(k) * nthreads;
    if (p >= npacks) break;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      v[k][e] = to_compute(a[k].v[e]);
      if constexpr (kAdd) {
        v[k][e] = rounded<T>(apply_binary(BinaryOp::Add, v[k][e], to_compute(b[k].v[e])));
        a[k].v[e] = from_compute<T>(v[k][e]);  // h as store() writes it
      }
      row[p * V + e] = v[k][e];
    }
    if constexpr (kAdd) *reinterpret_cast<Pack<T, V>*>(h + r * dim + p * V) = a[k];
  }
  __syncthreads();
  // Phase 2: the group-per-row kernels' sum of squares, by lanes 0..G-1 of warp 0 (the whole warp
  // takes part in group_sum's shuffles; lanes G..31 are another group's and are not used).
  if (tid < kWarp) {
    C ss = 0;
    const int nc = G == kWarp ? wide_forward_chunks<T>(dim) : 0;
    if (nc > 0)  // Note [Wide RMSNorm forward]
      ss = wide_lane_sum_sq<C>(nc, tid, [&](int64_t j) { return row[j]; });
    else if (tid < G)
#pragma unroll 8
      for (int64_t j = tid; j < dim; j += G) {
        const C e = row[j];
        ss += e * e;
      }
    ss = group_sum<G>(ss);
    if (tid == 0) {
      const C inv = rms_rstd(ss, dim, eps);
      rstd[r] = static_cast<float>(inv);
      row[dim] = inv;
    }
  }
  __syncthreads();
  // Phase 3: y from the registers, rms_scaled's expression.
  const C inv = row[dim];
  T* yr = y + r * dim;
#pragma unroll
  for (int k = 0; k < P; ++k) {
    const int64_t p = tid + static_cast<int64_t>(k) * nthreads;
    if (p >= npacks) break;
    Pack<T, V> o;
#pragma unroll
    for (int e = 0; e < V; ++e) o.v[e] = from_compute<T>(static_cast<C>(v[k][e] * inv * wv[k][e]));
    *reinterpret_cast<Pack<T, V>*>(yr + p * V) = o;
  }
}

// The launch of rmsnorm_rows_kernel for (rows, dim), or use == false for the group-per-row
// kernels. aligned16: x, res, h and y all start at a 16-byte boundary (the launcher checks).
struct FewRowsPlan {
  bool use = false, vec = false;
  int threads = 0;
  size_t smem = 0;
};
template <typename T>
FewRowsPlan few_rows_plan(int64_t rows, int64_t dim, bool aligned16) {
  FewRowsPlan p;
  if (rows <= 0 || rows > kFewRowsMax || dim <= 0 || dim > kFewRowsMaxDim) return p;
  constexpr int64_t V = 16 / static_cast<int64_t>(sizeof(T));
  p.use = true;
  p.vec = aligned16 && dim % V == 0;
  // A thread per pack up to a block of kThreads (short rows do not start idle warps).
  const int64_t npacks = p.vec ? dim / V : dim;
  const int64_t threads = ceil_div(npacks, kWarp) * kWarp;
  p.threads = static_cast<int>(threads < kThreads ? threads : kThreads);
  p.smem = sizeof(compute_t<T>) * static_cast<size_t>(dim + 1);
  return p;
}

// The one-pass plan: blocks of rows (a count that depends only on rows and dim), and the shared
// memory per block; bytes == 0 when a row is too long for it (then the dx + column-sum path).
struct OnePassPlan {
  int64_t nblocks = 0, rows_per_block = 0;
  size_t smem = 0;
};
constexpr int64_t kOnePassMaxBlocks = 1024;  // partial rows the final pass adds per column
constexpr int64_t kOnePassRowsPerGroup = 2;  // rows each group walks at least (amortises the block sum)
constexpr size_t kOnePassMaxSmem = 48 * 1024;  // no opt-in needed: dim <= 1536 (float), 768 (double)
// max_smem: the most the caller's kernel may take (above kDefaultSmem with its opt-in).
template <int G, typename C>
OnePassPlan onepass_plan(int64_t rows, int64_t dim, size_t max_smem = kOnePassMaxSmem) {
  OnePassPlan p;
  const size_t smem = sizeof(C) * static_cast<size_t>(kThreads / G) * static_cast<size_t>(dim);
  if (smem > max_smem) return p;
  if (rows <= 0) {  // nothing to sum (qk_norm_rope's side without a gradient): no block
    p.rows_per_block = 1;
    p.nblocks = 0;
    p.smem = smem;
    return p;
  }
  int64_t nblocks = ceil_div(rows, (kThreads / G) * kOnePassRowsPerGroup);
  if (nblocks > kOnePassMaxBlocks) nblocks = kOnePassMaxBlocks;
  if (nblocks < 1) nblocks = 1;
  p.rows_per_block = ceil_div(rows, nblocks);
  p.nblocks = ceil_div(rows, p.rows_per_block);
  p.smem = smem;
  return p;
}

}  // namespace rmsnorm
}  // namespace cuda
}  // namespace kernels
}  // namespace xt
