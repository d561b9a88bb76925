// CPU reductions: sum_all, sum_lastdim, sum_to (the reverse of a broadcast).
//
// Outputs are written with `=`. Each output element is a sequential sum over its inputs in
// increasing index order, accumulated in float64 (CPU only: exact enough that the one rounding
// to the storage type dominates), so results are deterministic run to run.
#include <type_traits>
#include <vector>

#include "kernels/common.h"
#include "kernels/kernels.h"

namespace xt {
namespace kernels {
namespace cpu {

void sum_all(DType dt, const void* x, void* out, int64_t n, void*) {
  XT_DISPATCH_FLOAT(dt, "sum_all", T, {
    using C = compute_t<T>;
    const T* px = static_cast<const T*>(x);
    double acc = 0.0;
    for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(load(px, i));
    store(static_cast<T*>(out), 0, static_cast<C>(acc));
  });
}

void sum_lastdim(DType dt, const void* x, void* out, int64_t rows, int64_t cols, void*) {
  XT_DISPATCH_FLOAT(dt, "sum_lastdim", T, {
    using C = compute_t<T>;
    const T* px = static_cast<const T*>(x);
    T* po = static_cast<T*>(out);
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = px + r * cols;
      double acc = 0.0;
      for (int64_t c = 0; c < cols; ++c) acc += static_cast<double>(load(row, c));
      store(po, r, static_cast<C>(acc));
    }
  });
}

// Walks `in` in row-major order; element (i0, i1, ...) adds into out[sum_d i_d * bstride[d]].
// Every out element thus sums its inputs in increasing input order.
void sum_to(DType dt, const void* in, void* out, int64_t out_n, const Broadcast* bc, void*) {
  XT_DISPATCH_FLOAT(dt, "sum_to", T, {
    using C = compute_t<T>;
    const T* pin = static_cast<const T*>(in);
    T* po = static_cast<T*>(out);
    std::vector<double> acc(static_cast<size_t>(out_n), 0.0);
    int64_t in_n = 1;
    for (int d = 0; d < bc->ndim; ++d) in_n *= bc->shape[d];
    if (bc->ndim == 0) {
      if (in_n > 0 && out_n > 0) acc[0] = load(pin, 0);
    } else if (in_n > 0) {
      const int last = bc->ndim - 1;
      const int64_t inner = bc->shape[last];
      const int64_t is = bc->astride[last], os = bc->bstride[last];
      int64_t idx[kMaxDims] = {};
      int64_t ioff = 0, ooff = 0;
      for (int64_t done = 0; done < in_n; done += inner) {
        for (int64_t j = 0; j < inner; ++j) acc[ooff + j * os] += static_cast<double>(load(pin, ioff + j * is));
        for (int d = last - 1; d >= 0; --d) {
          ioff += bc->astride[d];
          ooff += bc->bstride[d];
          if (++idx[d] < bc->shape[d]) break;
          ioff -= bc->astride[d] * bc->shape[d];
          ooff -= bc->bstride[d] * bc->shape[d];
          idx[d] = 0;
        }
      }
    }
    for (int64_t i = 0; i < out_n; ++i) store(po, i, static_cast<C>(acc[i]));
  });
}

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
