// linear_rows on the CPU, as plain loops: the reference the CUDA kernel is tested against
// (kernels/cuda/linear_rows.cu).
//
//  - out_i[m, n] = sum_k x[m, k] * w_i[n, k], the terms added in increasing k into one float32
//    accumulator (double for float64), rounded once to dt.
//  - kCols columns of a weight run side by side (independent sums, each still in k order), so the
//    loop keeps several additions in flight; the order of every single sum is unchanged.
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "kernels/common.h"
#include "kernels/kernels.h"

namespace xt {
namespace kernels {
namespace cpu {

namespace {

constexpr int64_t kCols = 8;  // independent column sums per pass over K

template <typename T>
void rows_times_weight(const T* x, const T* w, T* out, int64_t M, int64_t K, int64_t N) {
  using C = compute_t<T>;
  for (int64_t m = 0; m < M; ++m) {
    const T* xr = x + m * K;
    for (int64_t n0 = 0; n0 < N; n0 += kCols) {
      const int64_t nc = std::min(kCols, N - n0);
      C acc[kCols] = {};
      for (int64_t k = 0; k < K; ++k) {
        const C xv = load(xr, k);
        for (int64_t j = 0; j < nc; ++j) acc[j] += xv * load(w, (n0 + j) * K + k);
      }
      for (int64_t j = 0; j < nc; ++j) store(out, m * N + n0 + j, acc[j]);
    }
  }
}

}  // namespace

void linear_rows(DType dt, const void* x, int64_t M, int64_t K, int n_w, const void* const* w, const int64_t* N,
                 void* out, void* /*stream*/) {
  XT_DISPATCH_FLOAT(dt, "linear_rows", T, {
    T* o = static_cast<T*>(out);
    for (int i = 0; i < n_w; ++i) {
      rows_times_weight(static_cast<const T*>(x), static_cast<const T*>(w[i]), o, M, K, N[i]);
      o += M * N[i];
    }
  });
}

// The composition the fused CUDA kernel reproduces bit for bit: add_rmsnorm_forward (rmsnorm_forward
// without res), linear_rows on the normed rows, and swiglu_forward of the two products for glu.
void rms_norm_linear_rows(DType dt, DType w_dt, const void* x, const void* res, const void* norm_w, void* h,
                          float eps, int64_t M, int64_t K, int n_w, const void* const* w, const int64_t* N, bool glu,
                          void* out, void* stream) {
  const size_t elem = dtype_size(dt);
  std::vector<unsigned char> y(static_cast<size_t>(M * K) * elem);
  std::vector<float> rstd(static_cast<size_t>(M));
  if (res != nullptr)
    add_rmsnorm_forward(dt, w_dt, x, res, norm_w, h, y.data(), rstd.data(), M, K, eps, stream);
  else
    rmsnorm_forward(dt, w_dt, x, norm_w, y.data(), rstd.data(), M, K, eps, stream);
  if (!glu) {
    linear_rows(dt, y.data(), M, K, n_w, w, N, out, stream);
    return;
  }
  XT_CHECK(n_w == 2 && N[0] == N[1], ValueError, "rms_norm_linear_rows: swiglu takes two weights of one shape (gate, up)");
  std::vector<unsigned char> gate_up(static_cast<size_t>(2 * M * N[0]) * elem);
  linear_rows(dt, y.data(), M, K, n_w, w, N, gate_up.data(), stream);
  swiglu_forward(dt, gate_up.data(), gate_up.data() + static_cast<size_t>(M * N[0]) * elem, out, M * N[0], nullptr, stream);
}

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
