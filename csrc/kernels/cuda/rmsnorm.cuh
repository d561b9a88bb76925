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

// Note [One-pass backward from packs]
// rmsnorm_backward_onepass_kernel reads x, dy (and dres) with 2-byte loads strided by the G lanes
// (64 bytes per warp instruction for bf16), twice per element (the dot pass, then the dx pass, whose
// loads wait behind the previous element's stores), and adds dy * xhat into shared memory per
// element and row: a row costs a chain of memory round trips, and the kernel ran at about a third
// of HBM bandwidth (28 us for 8192 x 768 bf16 on the H200). rmsnorm_backward_packed_kernel computes
// the same bits from 16-byte packs:
//  - the rows, blocks and groups are onepass_plan's, walked in the same order; group g of the block
//    takes rows r0 + g, r0 + g + groups, ... as before;
//  - lane l of the group loads packs l, l + G, ... of the row's x and dy (and dres) in one batch
//    (all in flight together; V = 16 / sizeof(T) elements a pack) and writes x and dy into the
//    group's staging rows in shared memory;
//  - the dot product is summed from the staging rows exactly as before: lane l adds the elements
//    l, l + G, ... in increasing order with the same expression (dy * w * (x * rstd), w read as
//    before), then group_sum;
//  - dx and dy * xhat are elementwise, so each lane computes them for the elements of its own packs
//    from its registers (the same expressions, each intermediate used as often as before, so nvcc
//    contracts them into the same fma), and stores dx as 16-byte packs;
//  - the per-group column sums of dy * xhat live in registers (column j is always the same lane's:
//    the same additions, row by row, starting from 0, as the shared row `my[j] +=` before), and go
//    to the group's row of shared memory once, after the last row; the block then adds its groups'
//    rows in group order as before, and rmsnorm_dw_tree_kernel adds the blocks' partial rows.
// So dx, dw and the partial rows are the same bits (tests/emu/rmsnorm_emu.cpp compares the two
// kernels bit for bit over shapes and thread schedules). Each element is read from HBM once, with
// wide loads, in one round trip per row; w comes from L1. Registers: kLaneElems values of C per
// lane for the column sums plus the row's packs, so E (the elements a lane owns, a multiple of 8:
// 24 for dim 768, 32 for dim 1024 with G = 32) is a template argument. Shared memory: the staging
// rows (2 dim values of T per group), reused for the column sums (dim values of C per group) after
// a barrier. Taken when the rows start at 16-byte boundaries, dim is a multiple of V, dim <= G * 32
// and the shared memory fits in kOnePassMaxSmem (packed_smem); otherwise the strided kernel above.
// Expected on the H200 (not measured yet): 8192 x 768 bf16 moves 38 MB (x, dy in, dx out), ~9 us
// at 4.3 TB/s; 512 blocks of 256 threads, 24 KB of shared memory each, 3 per SM (registers), so
// 396 at once and 116 after: about 11-13 us (was 28 us). 8192 x 1024: 51 MB, 2 blocks per SM,
// about 14-16 us.
constexpr int kLaneElemsMax = 32;  // elements of a row one lane owns at most (registers)

// The elements a lane owns for a row of dim (G lanes per row): ceil(dim / G) rounded up to 8, so
// that few instantiations cover every dim (G < 32 only for dim < 128: always 8). 0: too long.
template <int G>
constexpr int lane_elems(int64_t dim) {
  const int64_t e = (dim + G - 1) / G;
  return e > kLaneElemsMax ? 0 : static_cast<int>((e + 7) / 8 * 8);
}

// Calls fn(std::integral_constant<int, E>{}) for E = lane_elems<G>(dim) (nonzero).
template <int G, typename Fn>
void with_lane_elems(int64_t dim, Fn&& fn) {
  if constexpr (G < 32) {
    fn(std::integral_constant<int, 8>{});
  } else {
    switch (lane_elems<G>(dim)) {
      case 8: fn(std::integral_constant<int, 8>{}); break;
      case 16: fn(std::integral_constant<int, 16>{}); break;
      case 24: fn(std::integral_constant<int, 24>{}); break;
      default: fn(std::integral_constant<int, 32>{}); break;
    }
  }
}

// n consecutive values of w from w[j] (j a multiple of n, w 16-byte aligned) widened to C, in
// loads of at most 16 bytes.
template <int N, typename W, typename C>
__device__ __forceinline__ void load_w_pack(const W* __restrict__ w, int64_t j, C (&out)[N]) {
  constexpr int WV = N * sizeof(W) > 16 ? 16 / static_cast<int>(sizeof(W)) : N;
  static_assert(N % WV == 0, "w pack");
#pragma unroll
  for (int q = 0; q < N / WV; ++q) {
    const Pack<W, WV> p = *reinterpret_cast<const Pack<W, WV>*>(w + j + q * WV);
#pragma unroll
    for (int e = 0; e < WV; ++e) out[q * WV + e] = static_cast<C>(to_compute(p.v[e]));
  }
}

// Blocks per SM the registers must allow (__launch_bounds__). Unbounded, nvcc issues every load of
// a phase at once (the dot's x, dy and w; the dx pass's packs and w): 78 / 95 / 115 registers for
// E = 16 / 24 / 32 (bf16 x, float32 w). 4 blocks (64 registers) fit E = 16 without spilling; E = 24
// gets 3 blocks (80 registers: ptxas spills 80 bytes of the column sums, read and written through
// L1 once per row), E = 32 (dim 1024) 2 blocks with no spill. Even 2 blocks keep 16 warps' rows
// (16 x 3-4 KB) in flight per SM, more than HBM's bandwidth-latency product (~30 KB per SM).
template <int E, typename T>
constexpr int packed_min_blocks() {
  constexpr size_t bytes = E * sizeof(compute_t<T>);  // the column sums of a lane
  return bytes <= 16 * sizeof(float) ? 4 : bytes <= 24 * sizeof(float) ? 3 : 2;
}

// Note [One-pass backward from packs]. E: the elements a lane owns (lane_elems); the launch is
// rmsnorm_backward_onepass_kernel's (onepass_plan's grid and rows_per_block), with
// packed_plan's shared memory.
template <int G, int E, typename T, typename W>
__global__ void __launch_bounds__(kThreads, packed_min_blocks<E, T>())
rmsnorm_backward_packed_kernel(const T* __restrict__ x, const W* __restrict__ w, const float* __restrict__ rstd,
                               const T* __restrict__ dy, const T* __restrict__ dres, T* __restrict__ dx,
                               W* __restrict__ dw, compute_t<T>* __restrict__ partial, int64_t rows, int64_t dim,
                               int64_t rows_per_block) {
  using C = compute_t<T>;
  constexpr int V = 16 / static_cast<int>(sizeof(T));  // elements per pack
  constexpr int P = E / V;                              // packs per lane at most
  static_assert(E % V == 0, "a lane owns whole packs");
  constexpr int groups = kThreads / G;
  constexpr size_t kStride = 2 * sizeof(T) > sizeof(C) ? 2 * sizeof(T) : sizeof(C);  // bytes per column per group
  const int lane = threadIdx.x % G, group = threadIdx.x / G;
  unsigned char* smem = dynamic_smem();
  T* xs = reinterpret_cast<T*>(smem + static_cast<size_t>(group) * kStride * static_cast<size_t>(dim));
  T* dys = xs + dim;
  const int npacks = static_cast<int>(dim / V), n = static_cast<int>(dim);
  C acc[P][V];
#pragma unroll
  for (int i = 0; i < P; ++i)
#pragma unroll
    for (int e = 0; e < V; ++e) acc[i][e] = 0;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t r1 = rows < r0 + rows_per_block ? rows : r0 + rows_per_block;
  // Every thread runs the same trip count (group_sum's shuffles and __syncwarp take the whole
  // warp); a group past the last row adds nothing and writes nothing.
  for (int64_t base = r0; base < r1; base += groups) {
    const int64_t r = base + group;
    const bool valid = r < r1;
    if (valid) {
      const T* xr = x + r * dim;
      const T* dyr = dy + r * dim;
      Pack<T, V> xv[P], dyv[P];
#pragma unroll
      for (int i = 0; i < P; ++i) {
        const int p = lane + i * G;
        if (p >= npacks) break;
        xv[i] = *reinterpret_cast<const Pack<T, V>*>(xr + p * V);
        dyv[i] = *reinterpret_cast<const Pack<T, V>*>(dyr + p * V);
      }
#pragma unroll
      for (int i = 0; i < P; ++i) {
        const int p = lane + i * G;
        if (p >= npacks) break;
        *reinterpret_cast<Pack<T, V>*>(xs + p * V) = xv[i];
        *reinterpret_cast<Pack<T, V>*>(dys + p * V) = dyv[i];
      }
    }
    __syncwarp();  // the group's staging rows are written
    const C inv = valid ? static_cast<C>(rstd[r]) : C(0);
    C dot = 0;
    if (valid)
#pragma unroll
      for (int k = 0; k < E; ++k) {
        const int j = lane + k * G;
        if (j >= n) break;
        dot += load(dys, j) * static_cast<C>(load(w, j)) * (load(xs, j) * inv);
      }
    dot = group_sum<G>(dot);
    if (valid) {
      const C mean_dot = dot / static_cast<C>(dim);
      T* dxr = dx + r * dim;
#pragma unroll
      for (int i = 0; i < P; ++i) {
        const int p = lane + i * G;
        if (p >= npacks) break;
        // The lane's own packs back from the staging rows (registers are what bounds the
        // blocks per SM, Note [One-pass backward from packs]), dres from memory.
        const Pack<T, V> xv = *reinterpret_cast<const Pack<T, V>*>(xs + p * V);
        const Pack<T, V> dyv = *reinterpret_cast<const Pack<T, V>*>(dys + p * V);
        Pack<T, V> dresv;
        if (dres != nullptr) dresv = *reinterpret_cast<const Pack<T, V>*>(dres + r * dim + p * V);
        C wv[V];
        load_w_pack<V>(w, p * V, wv);
        Pack<T, V> o;
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const C xhat = to_compute(xv.v[e]) * inv;
          const C d = to_compute(dyv.v[e]);
          const C g = d * wv[e];
          C v = mul_rn(inv, g - xhat * mean_dot);
          if (dres != nullptr) v = to_compute(from_compute<T>(v)) + to_compute(dresv.v[e]);
          o.v[e] = from_compute<T>(v);
          acc[i][e] += d * xhat;
        }
        *reinterpret_cast<Pack<T, V>*>(dxr + p * V) = o;
      }
    }
    __syncwarp();  // the group's reads of the staging rows are done before the next row's writes
  }
  __syncthreads();  // every group is done with its staging rows: the memory takes the column sums
  C* sums = reinterpret_cast<C*>(smem);  // [groups][dim]
  C* my = sums + static_cast<int64_t>(group) * dim;
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const int p = lane + i * G;
    if (p >= npacks) break;
#pragma unroll
    for (int e = 0; e < V; ++e) my[p * V + e] = acc[i][e];
  }
  __syncthreads();
  for (int64_t j = threadIdx.x; j < dim; j += kThreads) {
    C s = 0;
    for (int g = 0; g < groups; ++g) s += sums[static_cast<int64_t>(g) * dim + j];
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
    if (tid < G)
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

// The packed kernel's shared memory per column: the staging rows' 2 values of T or the column
// sums' value of C, for each of the kThreads / G groups.
template <int G, typename T>
constexpr size_t packed_bytes_per_column() {
  using C = compute_t<T>;
  return (2 * sizeof(T) > sizeof(C) ? 2 * sizeof(T) : sizeof(C)) * static_cast<size_t>(kThreads / G);
}

// The largest E (lane_elems) of a dim whose shared memory fits kOnePassMaxSmem: the instantiations
// the launcher needs (G = 32: 32 for bf16, 24 for float32, 16 for float64).
template <int G, typename T>
constexpr int packed_max_elems() {
  const int64_t dim = static_cast<int64_t>(kOnePassMaxSmem / packed_bytes_per_column<G, T>());
  const int e = lane_elems<G>(dim);
  return e == 0 ? kLaneElemsMax : e;
}

// The packed kernel's shared memory for (dim, alignment), or 0 when it does not apply (then
// rmsnorm_backward_onepass_kernel). aligned16: x, dy, dx, w (and dres) start at 16-byte boundaries.
template <int G, typename T>
size_t packed_smem(int64_t dim, bool aligned16) {
  constexpr int64_t V = 16 / static_cast<int64_t>(sizeof(T));
  if (!aligned16 || dim <= 0 || dim % V != 0 || lane_elems<G>(dim) == 0) return 0;
  const size_t bytes = packed_bytes_per_column<G, T>() * static_cast<size_t>(dim);
  return bytes > kOnePassMaxSmem ? 0 : bytes;
}

// Calls fn(std::integral_constant<int, E>{}) for the E of a dim that packed_smem accepts
// (instantiating only the E that such a dim can have).
template <int G, typename T, typename Fn>
void with_packed_elems(int64_t dim, Fn&& fn) {
  with_lane_elems<G>(dim, [&](auto e) {
    constexpr int E = decltype(e)::value;
    if constexpr (E <= packed_max_elems<G, T>()) fn(e);
    else XT_ASSERT(false, "rmsnorm: no packed plan for dim ", dim);
  });
}

}  // namespace rmsnorm
}  // namespace cuda
}  // namespace kernels
}  // namespace xt
