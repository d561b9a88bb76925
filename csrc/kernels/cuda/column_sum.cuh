// Column sums of a row-major [R, N] tensor: out[n] = sum over r of in[r, n]. sum_to (reduce.cu)
// takes this path whenever the dims it reduces all lead the dims it keeps over a contiguous input:
// the gradient of a bias broadcast over rows (linear_bias, linear_multi_bias, gelu_mlp) and of
// any per-feature parameter. In a header so that tests/emu/column_sum_emu.cpp runs the kernels on
// the CPU under the warp/block emulator.
//
// Note [Column sums in packs]
// sum_to's general kernel gives each output a thread that walks the reduced indices one 2-byte
// load at a time: a warp asks for 64 bytes per row, and at GPT-2 d12 (32768 rows x 768 in bf16)
// one bias gradient took ~270 us, 72 of them per step, a quarter of the step (19.3 ms of 77.7
// measured on the H200, profile-gpt2-124m-b32-20261203-183033.json). Here a block of kColThreads
// threads is kColRowsInFlight rows x 32 lanes, and lane l owns the V consecutive columns
// [V l, V l + V) of the block's 32 V columns (V = 16 bytes / sizeof(T): one 16-byte load per row
// where the columns and the row starts allow, else V scalar loads of the same elements); so a
// warp reads 512 contiguous bytes of a row, and each thread has kColUnroll rows' loads in flight.
//
// The order of every sum is fixed by (R, N) alone (packed_plan; not by the pointers'
// alignment, not by V's path):
//  1. the rows are cut into nchunks chunks of rows_per_chunk;
//  2. in a chunk, row group g (0 .. kColRowsInFlight - 1) adds rows r0 + g, r0 + g + kColRowsInFlight,
//     ... in increasing order into a float accumulator per column, from 0;
//  3. the chunk's value of a column is its row groups' sums added in group order, from 0;
//  4. with one chunk its values are written directly; else the chunks' values are added in
//     kColRowsInFlight interleaved sets, set g holding chunks g, g + kColRowsInFlight, ... in
//     increasing order from 0, and out[n] = the sets' sums added in set order, from 0 (a warp
//     per set in column_sum_final_kernel, so a warp reads 32 adjacent partials per chunk: a
//     thread per column walking every chunk took ~20 us a call at d12's ~350 chunks).
// So the result is bitwise reproducible; it differs from the general kernel's order in the last
// bits (nothing compares the two bitwise: every bias gradient takes this path on CUDA, the fused
// GEMM epilogues' and the unfused add's alike).
#pragma once
#include "kernels/cuda/common.cuh"

namespace xt {
namespace kernels {
namespace cuda {
namespace colsum {

constexpr int kColRowsInFlight = 8;                      // row groups per block
constexpr int kColThreads = kWarp * kColRowsInFlight;    // 256
constexpr int kColUnroll = 4;                            // rows a thread loads before adding them
constexpr int64_t kColTargetBlocks = 1056;               // ~8 blocks per SM of an H100/H200 (132)
constexpr int64_t kColMinRowsPerChunk = 64;

// Columns per thread: one 16-byte pack of T.
template <typename T>
constexpr int vec_of() {
  return static_cast<int>(16 / sizeof(T));
}

// The plan of the packed column sums (not common.cuh's column_sum_plan, which the norms' weight
// gradients take: a thread per column).
struct PackedPlan {
  int64_t rows = 0, cols = 0;
  int64_t col_blocks = 0;      // blocks across the columns, 32 * V columns each
  int64_t nchunks = 1, rows_per_chunk = 0;
};

// The plan of a [rows, cols] sum of T: a function of (rows, cols, T) only.
template <typename T>
inline PackedPlan packed_plan(int64_t rows, int64_t cols) {
  PackedPlan p;
  p.rows = rows;
  p.cols = cols;
  p.col_blocks = ceil_div(cols, static_cast<int64_t>(kWarp) * vec_of<T>());
  int64_t nchunks = ceil_div(kColTargetBlocks, p.col_blocks);
  const int64_t by_rows = rows / kColMinRowsPerChunk;
  if (nchunks > by_rows) nchunks = by_rows;
  if (nchunks > 65535) nchunks = 65535;
  if (nchunks < 1) nchunks = 1;
  p.rows_per_chunk = ceil_div(rows, nchunks);
  p.nchunks = ceil_div(rows, p.rows_per_chunk);  // no empty chunk
  return p;
}

// Block (column block blockIdx.x, chunk blockIdx.y): the chunk's column values (steps 2 and 3)
// written to out (one chunk) or to partial[chunk, col] (float compute type). kVec: 16-byte loads
// (cols a multiple of V and `in` 16-byte aligned), else the same elements one by one.
template <typename T, bool kVec>
__global__ void __launch_bounds__(kColThreads)
column_sum_partial_kernel(const T* __restrict__ in, T* __restrict__ out, compute_t<T>* __restrict__ partial,
                          PackedPlan plan) {
  using C = compute_t<T>;
  constexpr int V = vec_of<T>();
  constexpr int kBlockCols = kWarp * V;
  __shared__ C sums[kColRowsInFlight][kBlockCols];
  const int lane = threadIdx.x % kWarp, group = threadIdx.x / kWarp;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kBlockCols + static_cast<int64_t>(lane) * V;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * plan.rows_per_chunk;
  const int64_t r1 = plan.rows < r0 + plan.rows_per_chunk ? plan.rows : r0 + plan.rows_per_chunk;
  const int64_t cols = plan.cols;
  C acc[V];
#pragma unroll
  for (int e = 0; e < V; ++e) acc[e] = 0;
  if (c0 < cols) {
    const int64_t step = kColRowsInFlight;
    for (int64_t r = r0 + group; r < r1; r += step * kColUnroll) {
      Pack<T, V> p[kColUnroll];
#pragma unroll
      for (int u = 0; u < kColUnroll; ++u) {
        const int64_t ru = r + u * step;
        if (ru >= r1) continue;
        const T* row = in + ru * cols + c0;
        if constexpr (kVec) {
          p[u] = *reinterpret_cast<const Pack<T, V>*>(row);
        } else {
#pragma unroll
          for (int e = 0; e < V; ++e)
            if (c0 + e < cols) p[u].v[e] = row[e];
        }
      }
#pragma unroll
      for (int u = 0; u < kColUnroll; ++u) {
        if (r + u * step >= r1) break;
#pragma unroll
        for (int e = 0; e < V; ++e)
          if (kVec || c0 + e < cols) acc[e] += to_compute(p[u].v[e]);
      }
    }
  }
#pragma unroll
  for (int e = 0; e < V; ++e) sums[group][lane * V + e] = acc[e];
  __syncthreads();
  // Step 3: column j of the block (one per thread while j < 32 V) adds its groups in order.
  for (int j = threadIdx.x; j < kBlockCols; j += kColThreads) {
    const int64_t col = static_cast<int64_t>(blockIdx.x) * kBlockCols + j;
    if (col >= cols) continue;
    C v = 0;
#pragma unroll
    for (int g = 0; g < kColRowsInFlight; ++g) v += sums[g][j];
    if (gridDim.y == 1) store(out, col, v);
    else partial[static_cast<int64_t>(blockIdx.y) * cols + col] = v;
  }
}

// Step 4 with several chunks: block b takes columns [32 b, 32 b + 32), lane l column 32 b + l;
// warp g adds the chunks of set g in increasing order, then warp 0 adds the sets in order.
template <typename T>
__global__ void __launch_bounds__(kColThreads)
column_sum_final_kernel(const compute_t<T>* __restrict__ partial, T* __restrict__ out, PackedPlan plan) {
  using C = compute_t<T>;
  __shared__ C sets[kColRowsInFlight][kWarp];
  const int lane = threadIdx.x % kWarp, set = threadIdx.x / kWarp;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kWarp + lane;
  C v = 0;
  if (col < plan.cols)
#pragma unroll 4
    for (int64_t k = set; k < plan.nchunks; k += kColRowsInFlight) v += partial[k * plan.cols + col];
  sets[set][lane] = v;
  __syncthreads();
  if (set != 0 || col >= plan.cols) return;
  C total = 0;
#pragma unroll
  for (int g = 0; g < kColRowsInFlight; ++g) total += sets[g][lane];
  store(out, col, total);
}

}  // namespace colsum
}  // namespace cuda
}  // namespace kernels
}  // namespace xt
