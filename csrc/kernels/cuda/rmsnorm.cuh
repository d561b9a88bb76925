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

// One block: rows [blockIdx.x * rows_per_block, ...); group g of G lanes takes rows r0 + g,
// r0 + g + groups, ... in order. dres (may be null): dx = round(dx) + dres. Writes dx, and dw
// directly when there is one block, else the block's partial row partial[blockIdx.x, :].
template <int G, typename T, typename W>
__global__ void __launch_bounds__(kThreads)
rmsnorm_backward_onepass_kernel(const T* x, const W* w, const float* rstd, const T* dy, const T* dres, T* dx, W* dw,
                                compute_t<T>* partial, int64_t rows, int64_t dim, int64_t rows_per_block) {
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
      for (int64_t j = lane; j < dim; j += G) dot += load(dyr, j) * static_cast<C>(load(w, j)) * (load(xr, j) * inv);
    dot = group_sum<G>(dot);
    if (!valid) continue;
    const C mean_dot = dot / static_cast<C>(dim);
    T* dxr = dx + r * dim;
    for (int64_t j = lane; j < dim; j += G) {
      const C xhat = load(xr, j) * inv;
      const C d = load(dyr, j);
      const C g = d * static_cast<C>(load(w, j));
      C v = mul_rn(inv, g - xhat * mean_dot);
      if (dres != nullptr) v = to_compute(from_compute<T>(v)) + load(dres + r * dim, j);
      store(dxr, j, v);
      my[j] += d * xhat;
    }
  }
  __syncthreads();
  for (int64_t j = threadIdx.x; j < dim; j += kThreads) {
    C s = 0;
    for (int g = 0; g < groups; ++g) s += acc[static_cast<int64_t>(g) * dim + j];
    if (gridDim.x == 1) store(dw, j, static_cast<compute_t<W>>(s));
    else partial[static_cast<int64_t>(blockIdx.x) * dim + j] = s;
  }
}

// dw[j] = sum over the nparts partial rows in order: block = 32 columns x 8 slices; slice s adds
// rows s, s + 8, ... in order, then slice 0 adds the 8 slice sums in order.
constexpr int kFinalCols = 32, kFinalSlices = kThreads / kFinalCols;
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
__global__ void __launch_bounds__(kThreads)
rmsnorm_dw_tree_kernel(const C* partial, int64_t nparts, W* dw, int64_t dim) {
  dw_tree<C, W>(partial, nparts, dw, dim, blockIdx.x);
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
  const C ss = group_sum_sq<G>(xr, dim, lane, valid);
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

// The one-pass plan: blocks of rows (a count that depends only on rows and dim), and the shared
// memory per block; bytes == 0 when a row is too long for it (then the dx + column-sum path).
struct OnePassPlan {
  int64_t nblocks = 0, rows_per_block = 0;
  size_t smem = 0;
};
constexpr int64_t kOnePassMaxBlocks = 1024;  // partial rows the final pass adds per column
constexpr int64_t kOnePassRowsPerGroup = 2;  // rows each group walks at least (amortises the block sum)
constexpr size_t kOnePassMaxSmem = 48 * 1024;  // no opt-in needed: dim <= 1536 (float), 768 (double)
template <int G, typename C>
OnePassPlan onepass_plan(int64_t rows, int64_t dim) {
  OnePassPlan p;
  const size_t smem = sizeof(C) * static_cast<size_t>(kThreads / G) * static_cast<size_t>(dim);
  if (smem > kOnePassMaxSmem) return p;
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
