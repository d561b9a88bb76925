// Cross-entropy on the CPU: logits [rows, vocab] with row stride ld >= vocab (float32/bfloat16/
// float64), targets int32/int64 [rows]. Columns vocab..ld-1 are never read; backward sets them to 0.
//
//  - forward writes per row lse = logsumexp(logits) and loss = lse - logit[target] (0 for a row
//    whose target is ignore_index), both float32; the softmax is never materialised.
//  - reduce: loss = sum(losses) / max(count, 1), count = number of non-ignored rows; the sum runs
//    in row order, in double.
//  - backward recomputes softmax = exp(logit - lse) and writes dlogits with `=`:
//    (softmax - onehot) * dloss / max(count, 1), exactly 0 on ignored rows. dlogits may alias
//    logits (the fused linear_cross_entropy writes it in place): each element is read, then
//    written, and nothing else of the row is read afterwards.
//  - Targets are range-checked by the ops layer; one outside [0, vocab) that reaches a kernel
//    anyway gives a NaN loss and a zero gradient row, never a read out of bounds.
//  - float32/bfloat16 compute in float32 (dlogits rounded once); float64 computes in double, but
//    lse and the losses are float32 by the contract.
//  - The forward's float32/bfloat16 exps and row sums go through vec_math.h (xtrain's exp_f32,
//    the sum in its fixed lane order); the backward's exp is the C library's (see backward_row);
//    float64 uses the C library's exp and a sequential sum.
//  - forward and backward split their rows over the CPU backend's threads (parallel.h): a row's
//    values do not depend on who computes it.
//  - scale_grad: grad = acc * (dloss / max(count, 1)), the backward's factor, rounded once to dt
//    (the row-chunked head's unscaled float32/float64 gradients, ops/cross_entropy.cpp).
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/common.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/kernels.h"

namespace xt {
namespace kernels {
namespace cpu {

namespace {

constexpr int64_t kRowGrain = 64;  // rows per thread at the least

// Row r of a float32/bfloat16 matrix as float32: the row itself, or widened into buf.
template <typename T>
const float* row_f32(const T* xr, int64_t vocab, std::vector<float>& buf) {
  if constexpr (std::is_same_v<T, float>) {
    return xr;
  } else {
    buf.resize(static_cast<size_t>(vocab));
    for (int64_t j = 0; j < vocab; ++j) buf[j] = load(xr, j);
    return buf.data();
  }
}

// Row r's max and sum_j e^(x_j - max): float32 through vec_math.h, float64 through the C library.
template <typename T>
void row_max_sum(const T* xr, int64_t vocab, std::vector<float>& buf, compute_t<T>* mx_out, compute_t<T>* sum_out) {
  using C = compute_t<T>;
  C mx, sum = 0;
  if constexpr (std::is_same_v<C, float>) {
    const float* x = row_f32(xr, vocab, buf);
    mx = max_f32(x, vocab);
    if (mx == -std::numeric_limits<C>::infinity()) mx = 0;  // an all -inf row: avoid inf - inf
    sum = exp_shift_sum_f32(x, mx, nullptr, vocab);
  } else {
    mx = -std::numeric_limits<C>::infinity();
    for (int64_t j = 0; j < vocab; ++j) {
      const C v = load(xr, j);
      mx = v > mx ? v : mx;
    }
    if (mx == -std::numeric_limits<C>::infinity()) mx = 0;
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(load(xr, j) - mx);
  }
  *mx_out = mx;
  *sum_out = sum;
}

template <typename T>
void forward_rows(const T* logits, bool t64, const void* targets, float* losses, float* lse, int64_t rows,
                  int64_t vocab, int64_t ld, int64_t ignore_index) {
  using C = compute_t<T>;
  parallel_for(rows, kRowGrain, [&](int64_t lo, int64_t hi) {
    std::vector<float> buf;
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = logits + r * ld;
      C mx, sum;
      row_max_sum(xr, vocab, buf, &mx, &sum);
      const C log_sum = std::log(sum);
      lse[r] = static_cast<float>(mx + log_sum);
      const int64_t t = load_index(t64, targets, r);
      if (t == ignore_index)
        losses[r] = 0.0f;
      else if (t < 0 || t >= vocab)
        losses[r] = std::numeric_limits<float>::quiet_NaN();
      else
        losses[r] = static_cast<float>(log_sum - (load(xr, t) - mx));  // keeps digits when |logits| is large
    }
  });
}

// dlogits of one row: (e^(x_j - lse) - [j == t]) * coef, with the C library's exp: the CUDA
// kernel's emulation checks its backward from the CPU's lse against this bit for bit
// (tests/emu/cross_entropy_emu.cpp), the host's expf standing in for the device's.
template <typename T>
void backward_row(const T* xr, T* dr, compute_t<T> row_lse, int64_t t, compute_t<T> coef, int64_t vocab) {
  using C = compute_t<T>;
  for (int64_t j = 0; j < vocab; ++j) {
    const C p = std::exp(load(xr, j) - row_lse);
    store(dr, j, static_cast<C>((p - (j == t ? C(1) : C(0))) * coef));
  }
}

template <typename T>
void backward_rows(const T* logits, const float* lse, bool t64, const void* targets, float dloss, float count,
                   T* dlogits, int64_t rows, int64_t vocab, int64_t ld, int64_t ignore_index) {
  using C = compute_t<T>;
  const C coef = static_cast<C>(dloss) / static_cast<C>(count > 1.0f ? count : 1.0f);
  parallel_for(rows, kRowGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = logits + r * ld;
      T* dr = dlogits + r * ld;
      const int64_t t = load_index(t64, targets, r);
      for (int64_t j = vocab; j < ld; ++j) store(dr, j, C(0));  // row padding
      if (t == ignore_index || t < 0 || t >= vocab) {
        for (int64_t j = 0; j < vocab; ++j) store(dr, j, C(0));
        continue;
      }
      backward_row(xr, dr, static_cast<C>(lse[r]), t, coef, vocab);
    }
  });
}

}  // namespace

void cross_entropy_forward(DType dt, const void* logits, DType t_dt, const void* targets, float* losses, float* lse,
                           int64_t rows, int64_t vocab, int64_t ld, int64_t ignore_index, void*) {
  const bool t64 = index_is_64(t_dt, "cross_entropy_forward");
  XT_ASSERT(ld >= vocab, "cross_entropy_forward: ld ", ld, " < vocab ", vocab);
  XT_DISPATCH_FLOAT(dt, "cross_entropy_forward", T, {
    forward_rows(static_cast<const T*>(logits), t64, targets, losses, lse, rows, vocab, ld, ignore_index);
  });
}

void cross_entropy_reduce(const float* losses, DType t_dt, const void* targets, float* loss, float* count,
                          int64_t rows, int64_t ignore_index, void*) {
  const bool t64 = index_is_64(t_dt, "cross_entropy_reduce");
  double sum = 0.0;
  int64_t n = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (load_index(t64, targets, r) == ignore_index) continue;
    sum += static_cast<double>(losses[r]);
    ++n;
  }
  *count = static_cast<float>(n);
  *loss = static_cast<float>(sum / static_cast<double>(n > 1 ? n : 1));
}

void cross_entropy_backward(DType dt, const void* logits, const float* lse, DType t_dt, const void* targets,
                            const float* dloss, const float* count, void* dlogits, int64_t rows, int64_t vocab,
                            int64_t ld, int64_t ignore_index, void*) {
  const bool t64 = index_is_64(t_dt, "cross_entropy_backward");
  XT_ASSERT(ld >= vocab, "cross_entropy_backward: ld ", ld, " < vocab ", vocab);
  XT_DISPATCH_FLOAT(dt, "cross_entropy_backward", T, {
    backward_rows(static_cast<const T*>(logits), lse, t64, targets, *dloss, *count, static_cast<T*>(dlogits), rows,
                  vocab, ld, ignore_index);
  });
}

void cross_entropy_scale_grad(DType dt, const void* acc, const float* dloss, const float* count, void* grad,
                              int64_t n, void*) {
  XT_DISPATCH_FLOAT(dt, "cross_entropy_scale_grad", T, {
    using C = compute_t<T>;
    const C coef = static_cast<C>(*dloss) / static_cast<C>(*count > 1.0f ? *count : 1.0f);
    const C* a = static_cast<const C*>(acc);
    T* g = static_cast<T*>(grad);
    parallel_for(n, kRowGrain * 1024, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) store(g, i, static_cast<C>(a[i] * coef));
    });
  });
}

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
