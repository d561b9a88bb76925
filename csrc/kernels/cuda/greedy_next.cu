// CUDA greedy_next: the greedy pick of a decode step on the device. One block per row, each
// thread's first maximum over a strided share of the row, then a reduction that keeps the better
// value and, of equal ones, the lower index (so the result does not depend on the order: the row's
// first maximum); thread 0 updates the row's decode state (kernels/common.h's greedy_take), so a
// greedy decode loop needs no host round trip per token. Launched early (Note [Early launch of the
// decode step's kernels], common.cuh): the logits are read only after the wait.
#include "kernels/cuda/common.cuh"

namespace xt {
namespace kernels {
namespace cuda {

namespace {

constexpr int kGreedyThreads = 512;

template <typename T>
__global__ void __launch_bounds__(kGreedyThreads)
    greedy_next_kernel(const T* logits, int64_t B, int64_t V, int64_t* state, int64_t* ring, int64_t R,
                       int64_t stop) {
  using C = compute_t<T>;
  __shared__ C best_v[kGreedyThreads / kWarp];
  __shared__ int64_t best_i[kGreedyThreads / kWarp];
  const int64_t b = blockIdx.x;
  const T* row = logits + b * V;
  wait_prior_grids();  // the logits are the kernel ahead's output (Note [Early launch of the decode step's kernels])
  C v = load(row, 0);
  int64_t idx = 0;
  // kUnroll loads in flight per thread before any comparison (a lone row of 152K logits was a
  // chain of ~300 dependent load-compare steps per thread, ~0.1 ms); greedy_beats is a total
  // order, so the order of the comparisons does not change the pick
  constexpr int kUnroll = 8;
  const int64_t stride = blockDim.x;
  int64_t i = threadIdx.x;
  for (; i + (kUnroll - 1) * stride < V; i += kUnroll * stride) {
    C x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) x[u] = load(row, i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (greedy_beats(x[u], i + u * stride, v, idx)) v = x[u], idx = i + u * stride;
  }
  for (; i < V; i += stride) {
    const C x = load(row, i);
    if (greedy_beats(x, i, v, idx)) v = x, idx = i;
  }
  for (int o = kWarp / 2; o > 0; o >>= 1) {
    const C ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (greedy_beats(ov, oi, v, idx)) v = ov, idx = oi;
  }
  const int warp = threadIdx.x / kWarp;
  if (threadIdx.x % kWarp == 0) best_v[warp] = v, best_i[warp] = idx;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < static_cast<int>(blockDim.x / kWarp); ++w)
    if (greedy_beats(best_v[w], best_i[w], v, idx)) v = best_v[w], idx = best_i[w];
  greedy_take(state, B, b, idx, ring, R, stop);
}

}  // namespace

void greedy_next(DType dt, const void* logits, int64_t B, int64_t V, int64_t* state, int64_t* ring, int64_t R,
                 int64_t stop, void* stream) {
  if (B == 0) return;
  XT_CHECK(B <= INT32_MAX, ValueError, "greedy_next: too many rows for CUDA: ", B);
  OnStream on(stream);
  XT_DISPATCH_FLOAT(dt, "greedy_next", T, {
    launch_early(greedy_next_kernel<T>, static_cast<unsigned>(B), kGreedyThreads, 0, on, static_cast<const T*>(logits),
                 B, V, state, ring, R, stop);
  });
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
