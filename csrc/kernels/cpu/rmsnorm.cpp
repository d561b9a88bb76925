// RMSNorm on the CPU: rmsnorm_forward and rmsnorm_backward over the last dim of a [rows, dim]
// matrix; y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps).
//
//  - float32/bfloat16 compute in float32 and round once on store; float64 computes in double.
//    w is x's dtype or float32. rstd is saved as float32 (the contract), so in float64 the
//    forward uses its double rstd while the backward sees it rounded to float32 (a relative
//    error of ~6e-8 in the float64 gradients).
//  - dx and dw are written with `=`. dw[j] = sum over rows of dy * x * rstd, added row by row in
//    increasing row order into a float32 (double for float64) buffer, rounded once.
//  - add_rmsnorm_forward: h = x + r rounded to x's dtype, y = rmsnorm(h) of the rounded h (bitwise
//    add then rms_norm). With dres, the backward rounds dx once and adds dres (bitwise rms_norm's
//    dx followed by the gradient add of the unfused graph).
//  - The forwards split their rows over the CPU backend's threads (parallel.h); the backward
//    splits dx's rows, then dw's columns (each column still adds the rows in order).
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/common.h"
#include "kernels/cpu/parallel.h"
#include "kernels/kernels.h"

namespace xt {
namespace kernels {
namespace cpu {

namespace {

constexpr int64_t kRowElements = 1 << 14;  // elements per thread at the least

template <typename T, typename W>
void norm_row(const T* xr, const W* w, T* yr, float* rstd_r, int64_t dim, float eps) {
  using C = compute_t<T>;
  C ss = 0;
  for (int64_t j = 0; j < dim; ++j) {
    const C v = load(xr, j);
    ss += v * v;
  }
  const C inv = rms_rstd(ss, dim, eps);
  *rstd_r = static_cast<float>(inv);
  for (int64_t j = 0; j < dim; ++j) store(yr, j, rms_scaled(xr, w, j, inv));
}

template <typename T, typename W>
void forward_rows(const T* x, const W* w, T* y, float* rstd, int64_t rows, int64_t dim, float eps) {
  parallel_for(rows, kRowElements / std::max<int64_t>(dim, 1), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) norm_row(x + r * dim, w, y + r * dim, rstd + r, dim, eps);
  });
}

// With xhat = x * rstd and g = dy * w:  dx = rstd * (g - xhat * mean(g * xhat)),  dw = sum_r dy * xhat.
template <typename T, typename W>
void add_forward_rows(const T* x, const T* res, const W* w, T* h, T* y, float* rstd, int64_t rows, int64_t dim,
                      float eps) {
  parallel_for(rows, kRowElements / std::max<int64_t>(dim, 1), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      for (int64_t j = 0; j < dim; ++j)
        store(h, r * dim + j, apply_binary(BinaryOp::Add, load(x, r * dim + j), load(res, r * dim + j)));
      norm_row(static_cast<const T*>(h) + r * dim, w, y + r * dim, rstd + r, dim, eps);
    }
  });
}

template <typename T, typename W>
void backward_rows(const T* x, const W* w, const float* rstd, const T* dy, const T* dres, T* dx, W* dw, int64_t rows,
                   int64_t dim) {
  using C = compute_t<T>;
  parallel_for(rows, kRowElements / std::max<int64_t>(dim, 1), [&](int64_t lo, int64_t hi) {  // dx, row by row
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * dim;
      const T* dyr = dy + r * dim;
      T* dxr = dx + r * dim;
      const C inv = static_cast<C>(rstd[r]);
      C dot = 0;  // sum_j g_j * xhat_j
      for (int64_t j = 0; j < dim; ++j) {
        const C xhat = load(xr, j) * inv;
        dot += load(dyr, j) * static_cast<C>(load(w, j)) * xhat;
      }
      const C mean_dot = dot / static_cast<C>(dim);
      for (int64_t j = 0; j < dim; ++j) {
        const C xhat = load(xr, j) * inv;
        const C g = load(dyr, j) * static_cast<C>(load(w, j));
        C v = static_cast<C>(inv * (g - xhat * mean_dot));
        if (dres != nullptr) v = to_compute(from_compute<T>(v)) + load(dres + r * dim, j);
        store(dxr, j, v);
      }
    }
  });
  // dw, column by column: each column's sum runs over the rows in increasing order.
  parallel_for(dim, std::max<int64_t>(1, kRowElements / std::max<int64_t>(rows, 1)), [&](int64_t lo, int64_t hi) {
    std::vector<C> acc(static_cast<size_t>(hi - lo), C(0));
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = x + r * dim;
      const T* dyr = dy + r * dim;
      const C inv = static_cast<C>(rstd[r]);
      for (int64_t j = lo; j < hi; ++j) acc[j - lo] += load(dyr, j) * (load(xr, j) * inv);
    }
    for (int64_t j = lo; j < hi; ++j) store(dw, j, static_cast<compute_t<W>>(acc[j - lo]));
  });
}

}  // namespace

void rmsnorm_forward(DType dt, DType w_dt, const void* x, const void* w, void* y, float* rstd, int64_t rows,
                     int64_t dim, float eps, void*) {
  XT_ASSERT(w_dt == dt || w_dt == DType::Float32, "rmsnorm_forward: w dtype ", dtype_name(w_dt));
  XT_DISPATCH_FLOAT(dt, "rmsnorm_forward", T, {
    if (w_dt == DType::Float32)
      forward_rows(static_cast<const T*>(x), static_cast<const float*>(w), static_cast<T*>(y), rstd, rows, dim, eps);
    else
      forward_rows(static_cast<const T*>(x), static_cast<const T*>(w), static_cast<T*>(y), rstd, rows, dim, eps);
  });
}

namespace {

// rmsnorm_backward and add_rmsnorm_backward (dres null for the former).
void backward_any(DType dt, DType w_dt, const void* x, const void* w, const float* rstd, const void* dy,
                  const void* dres, void* dx, void* dw, int64_t rows, int64_t dim) {
  XT_ASSERT(w_dt == dt || w_dt == DType::Float32, "rmsnorm_backward: w dtype ", dtype_name(w_dt));
  XT_DISPATCH_FLOAT(dt, "rmsnorm_backward", T, {
    if (w_dt == DType::Float32)
      backward_rows(static_cast<const T*>(x), static_cast<const float*>(w), rstd, static_cast<const T*>(dy),
                    static_cast<const T*>(dres), static_cast<T*>(dx), static_cast<float*>(dw), rows, dim);
    else
      backward_rows(static_cast<const T*>(x), static_cast<const T*>(w), rstd, static_cast<const T*>(dy),
                    static_cast<const T*>(dres), static_cast<T*>(dx), static_cast<T*>(dw), rows, dim);
  });
}

}  // namespace

void rmsnorm_backward(DType dt, DType w_dt, const void* x, const void* w, const float* rstd, const void* dy,
                      void* dx, void* dw, int64_t rows, int64_t dim, void*) {
  backward_any(dt, w_dt, x, w, rstd, dy, nullptr, dx, dw, rows, dim);
}

void add_rmsnorm_backward(DType dt, DType w_dt, const void* h, const void* w, const float* rstd, const void* dy,
                          const void* dres, void* dx, void* dw, int64_t rows, int64_t dim, void*) {
  XT_ASSERT(dres != nullptr, "add_rmsnorm_backward: dres is required");
  backward_any(dt, w_dt, h, w, rstd, dy, dres, dx, dw, rows, dim);
}

void add_rmsnorm_forward(DType dt, DType w_dt, const void* x, const void* res, const void* w, void* h, void* y,
                         float* rstd, int64_t rows, int64_t dim, float eps, void*) {
  XT_ASSERT(w_dt == dt || w_dt == DType::Float32, "add_rmsnorm_forward: w dtype ", dtype_name(w_dt));
  XT_DISPATCH_FLOAT(dt, "add_rmsnorm_forward", T, {
    if (w_dt == DType::Float32)
      add_forward_rows(static_cast<const T*>(x), static_cast<const T*>(res), static_cast<const float*>(w),
                       static_cast<T*>(h), static_cast<T*>(y), rstd, rows, dim, eps);
    else
      add_forward_rows(static_cast<const T*>(x), static_cast<const T*>(res), static_cast<const T*>(w),
                       static_cast<T*>(h), static_cast<T*>(y), rstd, rows, dim, eps);
  });
}

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
