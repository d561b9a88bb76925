// CUDA cross-entropy, fused: logits [rows, vocab] with row stride ld >= vocab (float32/bfloat16/
// float64; columns vocab..ld-1 are never read, backward sets them to 0), targets int32/int64.
//
//  - forward: one block per row computes lse = logsumexp(logits) and loss = lse - logit[target]
//    (0 for ignore_index); both float32. The softmax is never materialised. A target outside
//    [0, vocab) that is not ignore_index reads nothing: its loss is NaN, its gradient row 0, and
//    it is reported to the host's next sync point as IndexError (Note [Device-side index checks],
//    core/cuda/cuda_check.h).
//  - reduce: one block sums the non-ignored losses (in float64, fixed order) and counts them;
//    loss = sum / max(count, 1) and count stay on the device (no host sync).
//  - backward: one pass over the logits recomputes softmax = exp(logit - lse) and writes dlogits
//    with `=`: (softmax - onehot) * dloss[0] / max(count[0], 1), exactly 0 on ignored rows. dloss
//    and count are read on the device. dlogits may alias logits (in place, as the fused
//    linear_cross_entropy does): each thread reads an element, then writes that same element.
// Same formulas as kernels/cpu/cross_entropy.cpp; float32 compute (float64 for float64).
#include <math_constants.h>

#include "kernels/cuda/common.cuh"

namespace xt {
namespace kernels {
namespace cuda {

namespace {

constexpr int kReduceThreads = 1024;

inline int row_threads(int64_t vocab) { return vocab > 4096 ? 512 : 128; }

template <typename T>
__global__ void ce_forward_kernel(const T* logits, const void* targets, bool t64, float* losses, float* lse,
                                  int64_t vocab, int64_t ld, int64_t ignore_index, IndexErrorRecord* err) {
  using C = compute_t<T>;
  const int64_t r = blockIdx.x;
  const T* xr = logits + r * ld;
  C mx = NegInf<C>::get();
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) mx = xmax(mx, load(xr, j));
  mx = block_max(mx);
  if (mx == NegInf<C>::get()) mx = 0;  // an all -inf row: avoid inf - inf
  C sum = 0;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) sum += xexp(load(xr, j) - mx);
  sum = block_sum(sum);
  if (threadIdx.x != 0) return;
  const C log_sum = xlog(sum);
  lse[r] = static_cast<float>(mx + log_sum);
  const int64_t t = load_index(t64, targets, r);
  if (t == ignore_index) {
    losses[r] = 0.0f;
  } else if (t < 0 || t >= vocab) {
    losses[r] = CUDART_NAN_F;
    report_bad_index(err, IndexSite::CrossEntropy, t, vocab, ignore_index);
  } else {
    losses[r] = static_cast<float>(log_sum - (load(xr, t) - mx));  // keeps digits when |logits| is large
  }
}

__global__ void ce_reduce_kernel(const float* losses, const void* targets, bool t64, float* loss, float* count,
                                 int64_t rows, int64_t ignore_index) {
  double sum = 0.0, n = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    if (load_index(t64, targets, r) == ignore_index) continue;
    sum += static_cast<double>(losses[r]);
    n += 1.0;
  }
  sum = block_sum(sum);
  n = block_sum(n);
  if (threadIdx.x == 0) {
    *count = static_cast<float>(n);
    *loss = static_cast<float>(sum / (n > 1.0 ? n : 1.0));
  }
}

template <typename T>
__global__ void ce_backward_kernel(const T* logits, const float* lse, const void* targets, bool t64,
                                   const float* dloss, const float* count, T* dlogits, int64_t vocab, int64_t ld,
                                   int64_t ignore_index) {
  using C = compute_t<T>;
  const int64_t r = blockIdx.x;
  const T* xr = logits + r * ld;
  T* dr = dlogits + r * ld;
  const int64_t t = load_index(t64, targets, r);
  for (int64_t j = vocab + threadIdx.x; j < ld; j += blockDim.x) store(dr, j, C(0));  // row padding
  if (t == ignore_index || t < 0 || t >= vocab) {
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) store(dr, j, C(0));
    return;
  }
  const float cnt = count[0];
  const C coef = static_cast<C>(dloss[0]) / static_cast<C>(cnt > 1.0f ? cnt : 1.0f);
  const C row_lse = static_cast<C>(lse[r]);
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    const C p = xexp(load(xr, j) - row_lse);
    store(dr, j, static_cast<C>((p - (j == t ? C(1) : C(0))) * coef));
  }
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
    ce_forward_kernel<T><<<static_cast<unsigned>(rows), row_threads(vocab), 0, on.s>>>(
        static_cast<const T*>(logits), targets, t64, losses, lse, vocab, ld, ignore_index,
        xt::cuda::index_error_record(on.device));
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
    ce_backward_kernel<T><<<static_cast<unsigned>(rows), row_threads(vocab), 0, on.s>>>(
        static_cast<const T*>(logits), lse, targets, t64, dloss, count, static_cast<T*>(dlogits), vocab, ld, ignore_index);
    XT_LAUNCH_CHECK();
  });
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
