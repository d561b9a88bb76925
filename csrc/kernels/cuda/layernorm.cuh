// The CUDA kernels of LayerNorm (launched by kernels/cuda/layernorm.cu), in a header so that
// tests/emu runs them on the CPU under the warp/block emulator (tests/emu/layernorm_emu.cpp): the
// forward (with the fused residual add), the one-pass backward (dx, dw, db from one read of x and
// dy: Note [One-pass LayerNorm backward], layernorm.cu), and the two-pass form for rows too long
// for it (dx, then the ordered column sums of dw and db). Launch shapes depend only on rows and dim.
#pragma once
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rmsnorm.cuh"  // the one-pass plan, the block's row sum and the final tree
#include "kernels/layernorm_math.h"

namespace xt {
namespace kernels {
namespace cuda {
namespace layernorm {

template <int G, typename T, typename W>
__global__ void __launch_bounds__(kThreads)
layernorm_forward_kernel(const T* __restrict__ x, const T* __restrict__ res, const W* __restrict__ w,
                         const W* __restrict__ b, T* __restrict__ h, T* __restrict__ y,
                         compute_t<T>* __restrict__ mean, compute_t<T>* __restrict__ rstd, int64_t rows,
                         int64_t dim, float eps) {
  using C = compute_t<T>;
  const int64_t r = group_row<G>();
  const bool valid = r < rows;  // every lane takes part in the shuffles
  const int lane = threadIdx.x % G;
  const int64_t rr = valid ? r : 0;
  const T* xr = x + rr * dim;
  C sum = 0;
  if (res != nullptr) {  // h = x + res as stored; this lane reads back only what it wrote
    const T* resr = res + rr * dim;
    T* hr = h + rr * dim;
    if (valid)
#pragma unroll 8
      for (int64_t j = lane; j < dim; j += G) {
        const T v = from_compute<T>(apply_binary(BinaryOp::Add, load(xr, j), load(resr, j)));
        hr[j] = v;
        sum += to_compute(v);
      }
    xr = hr;
  } else if (valid) {
#pragma unroll 8
    for (int64_t j = lane; j < dim; j += G) sum += load(xr, j);
  }
  const C mu = group_sum<G>(sum) / static_cast<C>(dim);
  C sq = 0;
  if (valid)
#pragma unroll 8
    for (int64_t j = lane; j < dim; j += G) {
      const C d = load(xr, j) - mu;
      sq += d * d;
    }
  const C inv = layernorm_rstd(group_sum<G>(sq), dim, eps);
  if (!valid) return;
  if (lane == 0) {
    mean[r] = mu;
    rstd[r] = inv;
  }
  T* yr = y + r * dim;
#pragma unroll 8
  for (int64_t j = lane; j < dim; j += G) store(yr, j, layernorm_scaled(xr, w, b, j, mu, inv));
}

// With xhat = (x - mean) * rstd and g = dy * w:  dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
// The row's mean(g) and mean(g * xhat): lane-strided partial sums, then group_sum (every lane of
// the group calls it, valid or not: the shuffles); both backward kernels take them from here.
template <int G, typename T, typename W>
__device__ __forceinline__ void layernorm_dx_means(const T* __restrict__ xr, const T* __restrict__ dyr,
                                                   const W* __restrict__ w, compute_t<T> mu, compute_t<T> inv,
                                                   int64_t dim, int lane, bool valid, compute_t<T>& mean_g,
                                                   compute_t<T>& mean_gx) {
  using C = compute_t<T>;
  C sum_g = 0, sum_gx = 0;
  if (valid)
#pragma unroll 8
    for (int64_t j = lane; j < dim; j += G) {
      const C g = load(dyr, j) * static_cast<C>(load(w, j));
      sum_g += g;
      sum_gx += g * ((load(xr, j) - mu) * inv);
    }
  mean_g = group_sum<G>(sum_g) / static_cast<C>(dim);
  mean_gx = group_sum<G>(sum_gx) / static_cast<C>(dim);
}

// Row r's backward by the G lanes of a group (every lane calls it, valid or not: the shuffles):
// dx (dres: the residual form's round(dx) + dres), and with kAcc dy * xhat and dy of the lane's
// columns added into acc_w and acc_b (the one-pass kernel's rows of shared memory).
template <int G, bool kAcc, typename T, typename W>
__device__ __forceinline__ void layernorm_backward_row(const T* __restrict__ x, const W* __restrict__ w,
                                                       const compute_t<T>* __restrict__ mean,
                                                       const compute_t<T>* __restrict__ rstd,
                                                       const T* __restrict__ dy, const T* __restrict__ dres,
                                                       T* __restrict__ dx, int64_t r, bool valid, int64_t dim,
                                                       int lane, compute_t<T>* acc_w, compute_t<T>* acc_b) {
  using C = compute_t<T>;
  const int64_t rr = valid ? r : 0;
  const T* xr = x + rr * dim;
  const T* dyr = dy + rr * dim;
  const C mu = mean[rr], inv = rstd[rr];
  C mean_g, mean_gx;
  layernorm_dx_means<G>(xr, dyr, w, mu, inv, dim, lane, valid, mean_g, mean_gx);
  if (!valid) return;
  T* dxr = dx + r * dim;
  const T* dresr = dres != nullptr ? dres + r * dim : nullptr;
#pragma unroll 8
  for (int64_t j = lane; j < dim; j += G) {
    const C xhat = (load(xr, j) - mu) * inv;
    const C d = load(dyr, j);
    C v = layernorm_dx(d * static_cast<C>(load(w, j)), mean_g, xhat, mean_gx, inv);
    if (dresr != nullptr) v = rounded<T>(v) + load(dresr, j);
    store(dxr, j, v);
    if constexpr (kAcc) {
      acc_w[j] += d * xhat;
      acc_b[j] += d;
    }
  }
}

template <int G, typename T, typename W>
__global__ void __launch_bounds__(kThreads)
layernorm_dx_kernel(const T* __restrict__ x, const W* __restrict__ w, const compute_t<T>* __restrict__ mean,
                    const compute_t<T>* __restrict__ rstd, const T* __restrict__ dy, const T* __restrict__ dres,
                    T* __restrict__ dx, int64_t rows, int64_t dim) {
  const int64_t r = group_row<G>();
  layernorm_backward_row<G, false>(x, w, mean, rstd, dy, dres, dx, r, r < rows, dim, threadIdx.x % G, nullptr,
                                   nullptr);
}

// The one-pass backward: block b takes rows [b * rows_per_block, ...); group g of G lanes walks
// rows r0 + g, r0 + g + groups, ... in order and per row computes dx as layernorm_dx_kernel does
// (layernorm_backward_row, the same code), then adds dy * xhat and dy of its
// columns into its own rows of shared memory (acc_w, acc_b: [groups][dim] each). At the end the
// block adds its groups' rows in group order (rmsnorm::store_block_dw): dw and db directly with
// one block, else the block's partial rows, partial[b, :] for dw and partial[nblocks + b, :] for
// db, which rmsnorm_dw_tree_kernel then adds in block order.
template <int G, typename T, typename W>
__global__ void __launch_bounds__(kThreads)
layernorm_backward_onepass_kernel(const T* __restrict__ x, const W* __restrict__ w,
                                  const compute_t<T>* __restrict__ mean, const compute_t<T>* __restrict__ rstd,
                                  const T* __restrict__ dy, const T* __restrict__ dres, T* __restrict__ dx,
                                  W* __restrict__ dw, W* __restrict__ db, compute_t<T>* __restrict__ partial,
                                  int64_t rows, int64_t dim, int64_t rows_per_block) {
  using C = compute_t<T>;
  constexpr int groups = kThreads / G;
  C* acc_w = reinterpret_cast<C*>(dynamic_smem());  // [groups][dim], then acc_b [groups][dim]
  C* acc_b = acc_w + static_cast<int64_t>(groups) * dim;
  const int lane = threadIdx.x % G, group = threadIdx.x / G;
  C* my_w = acc_w + static_cast<int64_t>(group) * dim;
  C* my_b = acc_b + static_cast<int64_t>(group) * dim;
  for (int64_t j = lane; j < dim; j += G) my_w[j] = my_b[j] = 0;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t r1 = rows < r0 + rows_per_block ? rows : r0 + rows_per_block;
  // Every thread runs the same trip count (group_sum's shuffles take the whole warp); a group past
  // the block's last row adds nothing and writes nothing.
  for (int64_t base = r0; base < r1; base += groups)
    layernorm_backward_row<G, true>(x, w, mean, rstd, dy, dres, dx, base + group, base + group < r1, dim, lane, my_w,
                                    my_b);
  const bool one_block = gridDim.x == 1;
  rmsnorm::store_block_dw<int64_t>(acc_w, groups, static_cast<int>(dim), one_block, dw, partial, blockIdx.x);
  rmsnorm::store_block_dw<int64_t>(acc_b, groups, static_cast<int>(dim), one_block, db,
                                   one_block ? partial : partial + static_cast<int64_t>(gridDim.x) * dim, blockIdx.x);
}

// The wide one-pass backward for bf16 rows of dim = 256 * NC (NC <= 3: widths 256, 512, 768)
// whose x, dy, dres and dx start at 16-byte boundaries, as RMSNorm's (Note [Wide RMSNorm
// backward]): a warp per row, lane L owning the 8 consecutive elements [256c + 8L, 256c + 8L + 8)
// of each chunk c, so every row moves in 16-byte packs; the lane's dw and db partials stay in
// registers across its rows, w sits widened in shared memory (the row of acc_w that the block sum
// later overwrites). The blocks, the rows of each warp and their order, the block sum and the
// final trees are the lane-strided kernel's plan (onepass_plan<32>); the difference is the order of
// a row's two sums (a lane's elements chunk by chunk, then group_sum<32>), so dx, dw and db
// differ from the lane-strided kernel's in the last bits. Nothing has to agree with it bitwise
// but itself: layer_norm and add_layer_norm take the same kernel for a row.
template <int NC, typename W>
__global__ void __launch_bounds__(kThreads, rmsnorm::kWideBlocks)
layernorm_backward_wide_kernel(const bf16_t* __restrict__ x, const W* __restrict__ w, const float* __restrict__ mean,
                               const float* __restrict__ rstd, const bf16_t* __restrict__ dy,
                               const bf16_t* __restrict__ dres, bf16_t* __restrict__ dx, W* __restrict__ dw,
                               W* __restrict__ db, float* __restrict__ partial, int64_t rows, int64_t rows_per_block) {
  using C = float;
  using P = Pack<bf16_t, 8>;
  constexpr int kChunk = rmsnorm::kWideChunk;
  constexpr int dim = NC * kChunk, groups = kThreads / kWarp;
  C* acc_w = reinterpret_cast<C*>(dynamic_smem());  // [groups][dim]; w widened in row 0 until the rows are done
  C* acc_b = acc_w + groups * dim;                    // [groups][dim]
  const int lane = threadIdx.x % kWarp, group = threadIdx.x / kWarp;
  for (int j = threadIdx.x; j < dim; j += kThreads) acc_w[j] = static_cast<C>(load(w, j));
  C aw[NC][8], ab[NC][8];
#pragma unroll
  for (int c = 0; c < NC; ++c)
#pragma unroll
    for (int e = 0; e < 8; ++e) aw[c][e] = ab[c][e] = 0;
  __syncthreads();
  const C* wl = acc_w + lane * 8;  // this lane's w: wl[c * kChunk + e]
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t r1 = rows < r0 + rows_per_block ? rows : r0 + rows_per_block;
  for (int64_t r = r0 + group; r < r1; r += groups) {  // the whole warp takes row r
    const int64_t off = r * dim + lane * 8;
    P xp[NC], dp[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      xp[c] = *reinterpret_cast<const P*>(x + off + c * kChunk);
      dp[c] = *reinterpret_cast<const P*>(dy + off + c * kChunk);
    }
    const C mu = mean[r], inv = rstd[r];
    C sum_g = 0, sum_gx = 0;
#pragma unroll
    for (int c = 0; c < NC; ++c)
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const C g = to_compute(dp[c].v[e]) * wl[c * kChunk + e];
        sum_g += g;
        sum_gx += g * ((to_compute(xp[c].v[e]) - mu) * inv);
      }
    const C mean_g = group_sum<kWarp>(sum_g) / static_cast<C>(dim);
    const C mean_gx = group_sum<kWarp>(sum_gx) / static_cast<C>(dim);
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      P o, rp;  // dres's pack is loaded here, not with x and dy: 12 registers fewer (dim 768 spilled)
      if (dres != nullptr) rp = *reinterpret_cast<const P*>(dres + off + c * kChunk);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const C xhat = (to_compute(xp[c].v[e]) - mu) * inv;
        const C d = to_compute(dp[c].v[e]);
        C v = layernorm_dx(d * wl[c * kChunk + e], mean_g, xhat, mean_gx, inv);
        if (dres != nullptr) v = rounded<bf16_t>(v) + to_compute(rp.v[e]);
        o.v[e] = from_compute<bf16_t>(v);
        aw[c][e] += d * xhat;
        ab[c][e] += d;
      }
      *reinterpret_cast<P*>(dx + off + c * kChunk) = o;
    }
  }
  __syncthreads();  // every warp is done reading w from row 0
  C* my_w = acc_w + group * dim;
  C* my_b = acc_b + group * dim;
#pragma unroll
  for (int c = 0; c < NC; ++c)
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      my_w[c * kChunk + lane * 8 + e] = aw[c][e];
      my_b[c * kChunk + lane * 8 + e] = ab[c][e];
    }
  const bool one_block = gridDim.x == 1;
  rmsnorm::store_block_dw<int>(acc_w, groups, dim, one_block, dw, partial, blockIdx.x);
  rmsnorm::store_block_dw<int>(acc_b, groups, dim, one_block, db,
                               one_block ? partial : partial + static_cast<int64_t>(gridDim.x) * dim, blockIdx.x);
}

// The one-pass plan: rmsnorm's (the same blocks of rows, which depend only on rows) for a row twice
// as long, since each group keeps two accumulator rows (dw's and db's); smem == 0 when they do not
// fit in the 48 KiB a block gets without opting in (float: dim <= 768; double: 384), and then the
// two-pass form runs.
template <int G, typename C>
rmsnorm::OnePassPlan onepass_plan(int64_t rows, int64_t dim) {
  return rmsnorm::onepass_plan<G, C>(rows, 2 * dim);
}

// Thread = column j, blockIdx.y = row chunk: sums dy * xhat and dy over the chunk's rows in order.
// With one chunk it writes dw and db directly; otherwise partial rows at [chunk, j] of each.
template <typename T, typename W>
__global__ void layernorm_dwdb_partial_kernel(const T* __restrict__ x, const compute_t<T>* __restrict__ mean,
                                              const compute_t<T>* __restrict__ rstd, const T* __restrict__ dy,
                                              W* __restrict__ dw, W* __restrict__ db,
                                              compute_t<T>* __restrict__ partial, int64_t rows, int64_t dim,
                                              int64_t rows_per_chunk) {
  using C = compute_t<T>;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= dim) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = rows < r0 + rows_per_chunk ? rows : r0 + rows_per_chunk;
  C acc_w = 0, acc_b = 0;
  for (int64_t r = r0; r < r1; ++r) {
    const C d = load(dy, r * dim + j);
    acc_w += d * ((load(x, r * dim + j) - mean[r]) * rstd[r]);
    acc_b += d;
  }
  if (gridDim.y == 1) {
    store(dw, j, static_cast<compute_t<W>>(acc_w));
    store(db, j, static_cast<compute_t<W>>(acc_b));
  } else {
    const int64_t nchunks = gridDim.y;
    partial[static_cast<int64_t>(blockIdx.y) * dim + j] = acc_w;
    partial[(nchunks + blockIdx.y) * dim + j] = acc_b;
  }
}

template <typename C, typename W>
__global__ void layernorm_dwdb_final_kernel(const C* __restrict__ partial, int nchunks, W* __restrict__ dw,
                                            W* __restrict__ db, int64_t dim) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= dim) return;
  C acc_w = 0, acc_b = 0;
  for (int k = 0; k < nchunks; ++k) {
    acc_w += partial[static_cast<int64_t>(k) * dim + j];
    acc_b += partial[static_cast<int64_t>(nchunks + k) * dim + j];
  }
  store(dw, j, static_cast<compute_t<W>>(acc_w));
  store(db, j, static_cast<compute_t<W>>(acc_b));
}

}  // namespace layernorm
}  // namespace cuda
}  // namespace kernels
}  // namespace xt
