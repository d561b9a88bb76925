// Softmax on the CPU over the last dim of [rows, cols]: softmax/log_softmax forward and
// backward.
//
//  - float32/bfloat16 compute in float32 and round once on store; float64 in double. float32
//    exps and their row sums go through vec_math.h (exp_f32, the sum in its fixed lane order);
//    float64 sums run left to right. Every run gives the same bits.
//  - Every output (y, dx) is written with `=`.
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/common.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/kernels.h"

namespace xt {
namespace kernels {
namespace cpu {

namespace {

// buf[0..n) holds one row in the compute type; turns it into softmax (or log_softmax) in place.
template <typename C>
void softmax_row(C* buf, int64_t n, bool log) {
  if (log) {
    C mx = -std::numeric_limits<C>::infinity();
    for (int64_t j = 0; j < n; ++j) mx = buf[j] > mx ? buf[j] : mx;
    if (mx == -std::numeric_limits<C>::infinity()) mx = 0;  // an all -inf row: avoid inf - inf here
    C sum;
    if constexpr (std::is_same_v<C, float>) {
      sum = exp_shift_sum_f32(buf, mx, nullptr, n);
    } else {
      sum = 0;
      for (int64_t j = 0; j < n; ++j) sum += std::exp(buf[j] - mx);
    }
    const C log_sum = std::log(sum);
    // (x - max) - log(sum), not x - (max + log(sum)): exact where |x| is large and the result is not
    for (int64_t j = 0; j < n; ++j) buf[j] = (buf[j] - mx) - log_sum;
  } else {
    C mx;
    const C sum = exp_row(buf, n, &mx);  // an all -inf row gives NaN, as e^(-inf - -inf) does
    const C inv = C(1) / sum;
    for (int64_t j = 0; j < n; ++j) buf[j] *= inv;
  }
}

template <typename T>
void forward_rows(const T* x, T* y, int64_t rows, int64_t cols, bool log) {
  using C = compute_t<T>;
  std::vector<C> buf(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) buf[j] = load(x + r * cols, j);
    softmax_row(buf.data(), cols, log);
    for (int64_t j = 0; j < cols; ++j) store(y + r * cols, j, buf[j]);
  }
}

// softmax:     dx = y * (dy - sum(dy * y))
// log_softmax: dx = dy - exp(y) * sum(dy)
template <typename T>
void backward_rows(const T* y, const T* dy, T* dx, int64_t rows, int64_t cols, bool log) {
  using C = compute_t<T>;
  std::vector<C> ey(log ? static_cast<size_t>(cols) : 0);
  for (int64_t r = 0; r < rows; ++r) {
    const T* yr = y + r * cols;
    const T* dyr = dy + r * cols;
    T* dxr = dx + r * cols;
    C s = 0;
    if (log) {
      for (int64_t j = 0; j < cols; ++j) s += load(dyr, j);
      for (int64_t j = 0; j < cols; ++j) ey[j] = load(yr, j);
      exp_shift(ey.data(), C(0), cols);  // y - 0 is y
      for (int64_t j = 0; j < cols; ++j) store(dxr, j, static_cast<C>(load(dyr, j) - ey[j] * s));
    } else {
      for (int64_t j = 0; j < cols; ++j) s += load(dyr, j) * load(yr, j);
      for (int64_t j = 0; j < cols; ++j) store(dxr, j, static_cast<C>(load(yr, j) * (load(dyr, j) - s)));
    }
  }
}

}  // namespace

void softmax_forward(DType dt, const void* x, void* y, int64_t rows, int64_t cols, bool log, void*) {
  XT_DISPATCH_FLOAT(dt, "softmax_forward", T, {
    forward_rows(static_cast<const T*>(x), static_cast<T*>(y), rows, cols, log);
  });
}

void softmax_backward(DType dt, const void* y, const void* dy, void* dx, int64_t rows, int64_t cols, bool log,
                      void*) {
  XT_DISPATCH_FLOAT(dt, "softmax_backward", T, {
    backward_rows(static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx), rows, cols, log);
  });
}

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
