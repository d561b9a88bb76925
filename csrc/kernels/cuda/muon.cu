// CUDA Muon kernels: the elementwise parts of a Muon step (the Newton-Schulz GEMMs are the
// engine's gemm, called by ops/muon.cpp), over a list of float32 matrices. The same element
// formulas as kernels/cpu/muon.cpp (kernels/muon_math.h).
//
//  - The matrix list travels in the kernel's parameters (up to kMaxMatrices per launch; longer
//    lists take a few launches), so nothing is copied to the device and nothing waits on the host.
//  - muon_momentum, muon_apply: block b takes elements [b * kChunk, (b + 1) * kChunk) of the
//    list's matrices laid end to end; each element is computed by one thread with fixed
//    arithmetic, so the bits do not depend on the launch shape. A tall matrix's bf16 operand is
//    written (momentum) and read (apply) transposed.
//  - muon_normalize: one block per matrix sums the squares of its bf16 operand in float64 (thread
//    t takes elements t, t + blockDim.x, ..., then block_sum's fixed tree), then scales it:
//    deterministic, no atomics.
//  - A non-finite guard (the step's loss or gradient norm, on the device) makes momentum and
//    apply return before writing anything; the clip norm scales each gradient as it is read.
//  - muon_apply reads [decay, lr] from device memory when hp.hyper is set (CUDA graphs).
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/optim.cuh"  // find_start
#include "kernels/muon_math.h"

namespace xt {
namespace kernels {
namespace cuda {

namespace {

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
  int t = optim::find_start(L.start, L.n, c0);
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
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) x[i] = bf16_round(__fdiv_rn(bf16_load(x[i]), d));
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

// Splits the matrices (empty ones skipped) into lists of at most kMaxMatrices and calls
// fn(list) for each, in order; fill(list, slot, i) sets the pointers of matrix i.
template <typename Fill, typename Fn>
void for_each_matrix_list(int n, const int64_t* rows, const int64_t* cols, Fill&& fill, Fn&& fn) {
  MatrixList L;
  auto flush = [&] {
    if (L.n == 0) return;
    fn(L);
    L.n = 0;
  };
  L.start[0] = 0;
  for (int i = 0; i < n; ++i) {
    if (rows[i] * cols[i] == 0) continue;
    L.rows[L.n] = rows[i];
    L.cols[L.n] = cols[i];
    fill(L, L.n, i);
    L.start[L.n + 1] = L.start[L.n] + rows[i] * cols[i];
    if (++L.n == kMaxMatrices) flush();
  }
  flush();
}

unsigned chunks_of(const MatrixList& L) { return static_cast<unsigned>(ceil_div(L.start[L.n], kChunk)); }

}  // namespace

void muon_momentum(int n_tensors, const float* const* grads, float* const* bufs, void* const* x, const int64_t* rows,
                   const int64_t* cols, MuonParams hp, const float* guard, const float* clip_norm, float max_norm,
                   void* stream) {
  OnStream on(stream);
  for_each_matrix_list(
      n_tensors, rows, cols,
      [&](MatrixList& L, int s, int i) {
        L.g[s] = grads[i];
        L.f[s] = bufs[i];
        L.x[s] = static_cast<bf16_t*>(x[i]);
      },
      [&](const MatrixList& L) {
        muon_momentum_kernel<<<chunks_of(L), kMuonThreads, 0, on.s>>>(L, hp, guard, clip_norm, max_norm);
        XT_LAUNCH_CHECK();
      });
}

void muon_normalize(int n_tensors, void* const* x, const int64_t* sizes, float eps, void* stream) {
  OnStream on(stream);
  std::vector<int64_t> ones(static_cast<size_t>(n_tensors), 1);
  for_each_matrix_list(
      n_tensors, sizes, ones.data(), [&](MatrixList& L, int s, int i) { L.x[s] = static_cast<bf16_t*>(x[i]); },
      [&](const MatrixList& L) {
        muon_normalize_kernel<<<static_cast<unsigned>(L.n), kNormThreads, 0, on.s>>>(L, eps);
        XT_LAUNCH_CHECK();
      });
}

void muon_apply(int n_tensors, float* const* params, const void* const* x, const int64_t* rows, const int64_t* cols,
                const float* scales, MuonParams hp, const float* guard, void* stream) {
  OnStream on(stream);
  for_each_matrix_list(
      n_tensors, rows, cols,
      [&](MatrixList& L, int s, int i) {
        L.f[s] = params[i];
        L.x[s] = static_cast<bf16_t*>(const_cast<void*>(x[i]));
        L.scale[s] = scales[i];
      },
      [&](const MatrixList& L) {
        muon_apply_kernel<<<chunks_of(L), kMuonThreads, 0, on.s>>>(L, hp, guard);
        XT_LAUNCH_CHECK();
      });
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
