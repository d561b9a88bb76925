// LayerNorm on the CPU: layernorm_forward and layernorm_backward over the last dim of a [rows, dim]
// matrix; y = (x - mean) * rstd * w + b, rstd = 1/sqrt(var + eps), var the biased variance.
//
//  - float32/bfloat16 compute in float32 and round once on store; float64 in double. mean and
//    rstd are saved in the compute type (float32, or float64 for float64), so float64 gradients
//    are exact to rounding. w and b are x's dtype or float32.
//  - The row statistics are two passes in index order: the mean, then the mean of (x - mean)^2
//    (the element formulas: kernels/layernorm_math.h, shared with the CUDA kernels).
//  - With res (add_layer_norm): h = x + res rounded to x's dtype is written and normed from the
//    rounded values (bitwise add then layer_norm). With dres, the backward rounds dx once and adds
//    dres (bitwise layer_norm's dx followed by the gradient add of the unfused graph).
//  - dx, dw, db are written with `=`; dw[j] and db[j] add the rows in increasing row order into a
//    compute-type buffer, rounded once. The forward splits its rows over the CPU backend's threads
//    (parallel.h); the backward's dx rows too, the dw/db sums stay on the calling thread.
#include <algorithm>
#include <vector>

#include "kernels/common.h"
#include "kernels/cpu/parallel.h"
#include "kernels/kernels.h"
#include "kernels/layernorm_math.h"

namespace xt {
namespace kernels {
namespace cpu {

namespace {

constexpr int64_t kRowElements = 1 << 14;  // elements per thread at the least

template <typename T, typename W>
void forward_rows(const T* x, const T* res, const W* w, const W* b, T* h, T* y, compute_t<T>* mean,
                  compute_t<T>* rstd, int64_t rows, int64_t dim, float eps) {
  using C = compute_t<T>;
  parallel_for(rows, kRowElements / std::max<int64_t>(dim, 1), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * dim;
      if (res != nullptr) {  // h = x + res as stored; the norm reads the rounded sum
        for (int64_t j = 0; j < dim; ++j)
          store(h, r * dim + j, apply_binary(BinaryOp::Add, load(x, r * dim + j), load(res, r * dim + j)));
        xr = h + r * dim;
      }
      C sum = 0;
      for (int64_t j = 0; j < dim; ++j) sum += load(xr, j);
      const C mu = sum / static_cast<C>(dim);
      C sq = 0;
      for (int64_t j = 0; j < dim; ++j) {
        const C d = load(xr, j) - mu;
        sq += d * d;
      }
      const C inv = layernorm_rstd(sq, dim, eps);
      mean[r] = mu;
      rstd[r] = inv;
      for (int64_t j = 0; j < dim; ++j) store(y + r * dim, j, layernorm_scaled(xr, w, b, j, mu, inv));
    }
  });
}

// With xhat = (x - mean) * rstd and g = dy * w:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  dw = sum_r dy * xhat,  db = sum_r dy.
template <typename T, typename W>
void backward_rows(const T* x, const W* w, const compute_t<T>* mean, const compute_t<T>* rstd, const T* dy,
                   const T* dres, T* dx, W* dw, W* db, int64_t rows, int64_t dim) {
  using C = compute_t<T>;
  parallel_for(rows, kRowElements / std::max<int64_t>(dim, 1), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * dim;
      const T* dyr = dy + r * dim;
      const C mu = mean[r], inv = rstd[r];
      C sum_g = 0, sum_gx = 0;
      for (int64_t j = 0; j < dim; ++j) {
        const C g = load(dyr, j) * static_cast<C>(load(w, j));
        sum_g += g;
        sum_gx += g * ((load(xr, j) - mu) * inv);
      }
      const C mean_g = sum_g / static_cast<C>(dim), mean_gx = sum_gx / static_cast<C>(dim);
      for (int64_t j = 0; j < dim; ++j) {
        const C xhat = (load(xr, j) - mu) * inv;
        const C g = load(dyr, j) * static_cast<C>(load(w, j));
        C v = layernorm_dx(g, mean_g, xhat, mean_gx, inv);
        if (dres != nullptr) v = rounded<T>(v) + load(dres + r * dim, j);
        store(dx + r * dim, j, v);
      }
    }
  });
  std::vector<C> dw_acc(static_cast<size_t>(dim), C(0)), db_acc(static_cast<size_t>(dim), C(0));
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    const T* dyr = dy + r * dim;
    const C mu = mean[r], inv = rstd[r];
    for (int64_t j = 0; j < dim; ++j) {
      const C d = load(dyr, j);
      dw_acc[j] += d * ((load(xr, j) - mu) * inv);
      db_acc[j] += d;
    }
  }
  for (int64_t j = 0; j < dim; ++j) {
    store(dw, j, static_cast<compute_t<W>>(dw_acc[j]));
    store(db, j, static_cast<compute_t<W>>(db_acc[j]));
  }
}

}  // namespace

void layernorm_forward(DType dt, DType w_dt, const void* x, const void* res, const void* w, const void* b, void* h,
                       void* y, void* mean, void* rstd, int64_t rows, int64_t dim, float eps, void*) {
  dispatch_float_weight(dt, w_dt, "layernorm_forward", [&](auto t, auto wt) {
    using T = typename decltype(t)::type;
    using W = typename decltype(wt)::type;
    forward_rows(static_cast<const T*>(x), static_cast<const T*>(res), static_cast<const W*>(w),
                 static_cast<const W*>(b), static_cast<T*>(h), static_cast<T*>(y), static_cast<compute_t<T>*>(mean),
                 static_cast<compute_t<T>*>(rstd), rows, dim, eps);
  });
}

void layernorm_backward(DType dt, DType w_dt, const void* x, const void* w, const void* mean, const void* rstd,
                        const void* dy, const void* dres, void* dx, void* dw, void* db, int64_t rows, int64_t dim,
                        void*) {
  dispatch_float_weight(dt, w_dt, "layernorm_backward", [&](auto t, auto wt) {
    using T = typename decltype(t)::type;
    using W = typename decltype(wt)::type;
    backward_rows(static_cast<const T*>(x), static_cast<const W*>(w), static_cast<const compute_t<T>*>(mean),
                  static_cast<const compute_t<T>*>(rstd), static_cast<const T*>(dy), static_cast<const T*>(dres),
                  static_cast<T*>(dx), static_cast<W*>(dw), static_cast<W*>(db), rows, dim);
  });
}

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
