// CUDA cross-entropy, fused: logits [rows, vocab] with row stride ld >= vocab (float32/bfloat16/
// float64; columns vocab..ld-1 are never read, backward sets them to 0), targets int32/int64.
// The kernels are in cross_entropy.cuh (Note [One-pass cross-entropy]); this file launches them.
//
//  - forward: one block per row reads the row once (an online softmax per thread, then a
//    fixed-order combine of the threads' (max, sum) pairs) and writes lse = logsumexp(logits) and
//    loss = lse - logit[target] (0 for ignore_index); both float32. The softmax is never
//    materialised. A target outside [0, vocab) that is not ignore_index reads nothing: its loss is
//    NaN, its gradient row 0, and it is reported to the host's next sync point as IndexError
//    (Note [Device-side index checks], core/cuda/cuda_check.h).
//  - reduce: one block sums the non-ignored losses (in float64, fixed order) and counts them;
//    loss = sum / max(count, 1) and count stay on the device (no host sync).
//  - backward: one pass over the logits recomputes softmax = exp(logit - lse) and writes dlogits
//    with `=`: (softmax - onehot) * dloss[0] / max(count[0], 1), exactly 0 on ignored rows. dloss
//    and count are read on the device. dlogits may alias logits (in place, as the fused
//    linear_cross_entropy does): each thread reads an element, then writes that same element.
//  - Rows that start 16-byte aligned (pointer and ld) move in 16-byte packs; others element by
//    element, in the same order and with the same bits.
//  - scale_grad: grad = acc * (dloss[0] / max(count[0], 1)), the backward's factor, rounded once
//    to dt; elementwise, grid-stride (the row-chunked head's unscaled gradients).
// Same formulas as kernels/cpu/cross_entropy.cpp; float32 compute (float64 for float64). The sums
// run in another order than the CPU's (per-thread partial sums, then a tree), so the two backends
// agree to rounding, not bit for bit; the launch shape depends only on vocab and the dtype, so each
// backend repeats its own bits.
#include "kernels/cuda/cross_entropy.cuh"
#include "kernels/cuda/static_switch.h"

namespace xt {
namespace kernels {
namespace cuda {

using namespace ce;

namespace {

constexpr int kScaleThreads = 256;
constexpr int64_t kScaleMaxBlocks = 4096;  // grid-stride past this: ~8 blocks per SM on an H200

template <typename T>
__global__ void ce_scale_grad_kernel(const compute_t<T>* acc, const float* dloss, const float* count, T* grad,
                                     int64_t n) {
  using C = compute_t<T>;
  const float cnt = *count;
  const C coef = static_cast<C>(*dloss) / static_cast<C>(cnt > 1.0f ? cnt : 1.0f);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    grad[i] = from_compute<T>(acc[i] * coef);
}

}  // namespace

void cross_entropy_forward(DType dt, const void* logits, DType t_dt, const void* targets, float* losses, float* lse,
                           int64_t rows, int64_t vocab, int64_t ld, int64_t ignore_index, void* stream) {
  const bool t64 = index_is_64(t_dt, "cross_entropy_forward");
  XT_ASSERT(ld >= vocab, "cross_entropy_forward: ld ", ld, " < vocab ", vocab);
  if (rows == 0) return;
  XT_CHECK(rows <= INT32_MAX, ValueError, "cross_entropy: too many rows for CUDA: ", rows);
  OnStream on(stream);
  XT_DISPATCH_FLOAT(dt, "cross_entropy_forward", T, {
    const auto* x = static_cast<const T*>(logits);
    IndexErrorRecord* err = xt::cuda::index_error_record(on.device);
    const dim3 grid(static_cast<unsigned>(rows)), block(row_threads<T>(vocab));
    // The same packs in the same order either way: only the speed depends on the alignment.
    XT_BOOL_SWITCH(rows_vectorizable<T>(x, ld), kVec, [&] {
      ce_forward_kernel<T, kVec><<<grid, block, 0, on.s>>>(x, targets, t64, losses, lse, vocab, ld, ignore_index, err);
    });
    XT_LAUNCH_CHECK();
  });
}

void cross_entropy_reduce(const float* losses, DType t_dt, const void* targets, float* loss, float* count,
                          int64_t rows, int64_t ignore_index, void* stream) {
  const bool t64 = index_is_64(t_dt, "cross_entropy_reduce");
  OnStream on(stream);
  ce_reduce_kernel<<<1, kReduceThreads, 0, on.s>>>(losses, targets, t64, loss, count, rows, ignore_index);
  XT_LAUNCH_CHECK();
}

void cross_entropy_backward(DType dt, const void* logits, const float* lse, DType t_dt, const void* targets,
                            const float* dloss, const float* count, void* dlogits, int64_t rows, int64_t vocab,
                            int64_t ld, int64_t ignore_index, void* stream) {
  const bool t64 = index_is_64(t_dt, "cross_entropy_backward");
  XT_ASSERT(ld >= vocab, "cross_entropy_backward: ld ", ld, " < vocab ", vocab);
  if (rows == 0 || vocab == 0) return;
  XT_CHECK(rows <= INT32_MAX, ValueError, "cross_entropy: too many rows for CUDA: ", rows);
  OnStream on(stream);
  XT_DISPATCH_FLOAT(dt, "cross_entropy_backward", T, {
    const auto* x = static_cast<const T*>(logits);
    auto* dx = static_cast<T*>(dlogits);
    const dim3 grid(static_cast<unsigned>(rows)), block(row_threads<T>(vocab));
    XT_BOOL_SWITCH(rows_vectorizable<T>(x, ld) && rows_vectorizable<T>(dx, ld), kVec, [&] {
      ce_backward_kernel<T, kVec><<<grid, block, 0, on.s>>>(x, lse, targets, t64, dloss, count, dx, vocab, ld,
                                                            ignore_index);
    });
    XT_LAUNCH_CHECK();
  });
}

void cross_entropy_scale_grad(DType dt, const void* acc, const float* dloss, const float* count, void* grad,
                              int64_t n, void* stream) {
  if (n == 0) return;
  OnStream on(stream);
  XT_DISPATCH_FLOAT(dt, "cross_entropy_scale_grad", T, {
    const int64_t blocks = ceil_div(n, kScaleThreads) < kScaleMaxBlocks ? ceil_div(n, kScaleThreads) : kScaleMaxBlocks;
    ce_scale_grad_kernel<T><<<static_cast<unsigned>(blocks), kScaleThreads, 0, on.s>>>(
        static_cast<const compute_t<T>*>(acc), dloss, count, static_cast<T*>(grad), n);
    XT_LAUNCH_CHECK();
  });
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
