// The CUDA Muon kernels (launched by kernels/cuda/muon.cu), in a header so that tests/emu runs
// them on the CPU under the warp/block emulator (tests/emu/muon_emu.cpp) against the CPU kernels.
//
//  - muon_momentum_kernel, muon_apply_kernel: block b takes elements [b * kChunk, (b + 1) * kChunk)
//    of the list's matrices laid end to end; each element is computed by one thread with the
//    element formulas of kernels/muon_math.h, so the bits depend neither on the launch shape nor on
//    the backend. A tall matrix's bf16 operand is written (momentum) and read (apply) transposed.
//  - muon_normalize_kernel: one block per matrix sums the squares of its bf16 operand in float64
//    (thread t takes elements t, t + blockDim.x, ..., then block_sum's fixed tree), then scales it.
#pragma once
#include "kernels/cuda/common.cuh"
#include "kernels/muon_math.h"

namespace xt {
namespace kernels {
namespace cuda {
namespace muon {

constexpr int kMaxMatrices = 128;
constexpr int kMuonThreads = 256;
constexpr int64_t kChunk = 8 * kMuonThreads;  // elements per block of the elementwise kernels
constexpr int kNormThreads = 1024;

struct MatrixList {
  int n = 0;
  int64_t start[kMaxMatrices + 1];  // cumulative element offsets within this launch
  int64_t rows[kMaxMatrices];
  int64_t cols[kMaxMatrices];
  const float* g[kMaxMatrices];  // momentum: the gradients
  float* f[kMaxMatrices];        // momentum: the buffers; apply: the parameters
  bf16_t* x[kMaxMatrices];       // the bf16 operands
  float scale[kMaxMatrices];     // apply: the adjust_lr ratios
};
static_assert(sizeof(MatrixList) < 32000, "MatrixList must fit in the kernel parameter space");

// fn(t, j) for element j of matrix t, for every element of this block's chunk, thread by thread.
template <typename Fn>
__device__ __forceinline__ void for_chunk_elements(const MatrixList& L, Fn&& fn) {
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kChunk;
  const int64_t c1 = L.start[L.n] < c0 + kChunk ? L.start[L.n] : c0 + kChunk;
  int t = find_start(L.start, L.n, c0);
  for (int64_t i = c0 + threadIdx.x; i < c1; i += blockDim.x) {
    while (t + 1 < L.n && i >= L.start[t + 1]) ++t;
    fn(t, i - L.start[t]);
  }
}

// Index of element j of a rows x cols matrix in its bf16 operand (transposed when tall).
__device__ __forceinline__ int64_t operand_index(int64_t j, int64_t rows, int64_t cols) {
  return rows > cols ? (j % cols) * rows + j / cols : j;
}

__global__ void __launch_bounds__(kMuonThreads)
muon_momentum_kernel(const MatrixList L, MuonParams hp, const float* guard, const float* clip_norm, float max_norm) {
  if (guard && !isfinite(*guard)) return;  // a non-finite step: no update (the same for every thread)
  const float coef = clip_norm ? fminf(1.0f, max_norm / (*clip_norm + 1e-6f)) : 1.0f;
  for_chunk_elements(L, [&](int t, int64_t j) {
    const float g = clip_norm ? L.g[t][j] * coef : L.g[t][j];
    float buf = L.f[t][j];
    const float u = muon_momentum_element(g, buf, hp);
    L.f[t][j] = buf;
    L.x[t][operand_index(j, L.rows[t], L.cols[t])] = bf16_round(u);
  });
}

__global__ void __launch_bounds__(kNormThreads) muon_normalize_kernel(const MatrixList L, float eps) {
  const int t = blockIdx.x;
  const int64_t n = L.start[t + 1] - L.start[t];
  bf16_t* x = L.x[t];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const double v = bf16_load(x[i]);
    acc += v * v;
  }
  const float d = muon_norm_divisor(block_sum(acc), eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) x[i] = bf16_round(bf16_load(x[i]) / d);  // IEEE division (no fast math)
}

__global__ void __launch_bounds__(kMuonThreads)
muon_apply_kernel(const MatrixList L, MuonParams hp, const float* guard) {
  if (guard && !isfinite(*guard)) return;
  const float decay = hp.hyper ? hp.hyper[0] : hp.decay;
  const float lr = hp.hyper ? hp.hyper[1] : hp.lr;
  for_chunk_elements(L, [&](int t, int64_t j) {
    const float u = bf16_load(L.x[t][operand_index(j, L.rows[t], L.cols[t])]);
    L.f[t][j] = muon_apply_element(L.f[t][j], u, decay, lr * L.scale[t]);
  });
}

}  // namespace muon
}  // namespace cuda
}  // namespace kernels
}  // namespace xt
