// CPU layout kernels: permute (a copy into the permuted row-major layout).
//
// Output is written with `=`. Works for every dtype: elements are moved as raw 2/4/8-byte words.

#include "kernels/kernels.h"

namespace xt {
namespace kernels {
namespace cpu {

namespace {

// out is walked in row-major order; its dim i steps x by xstride[perm[i]].
template <typename W>
void permute_words(const W* x, W* out, int ndim, const int64_t* shape, const int* perm) {
  int64_t xstride[kMaxDims], oshape[kMaxDims], ostep[kMaxDims];
  int64_t s = 1, n = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    xstride[d] = s;
    s *= shape[d];
  }
  for (int i = 0; i < ndim; ++i) {
    oshape[i] = shape[perm[i]];
    ostep[i] = xstride[perm[i]];
    n *= oshape[i];
  }
  if (n == 0) return;
  if (ndim == 0) {
    out[0] = x[0];
    return;
  }
  const int last = ndim - 1;
  const int64_t inner = oshape[last], step = ostep[last];
  int64_t idx[kMaxDims] = {};
  int64_t xoff = 0;
  for (int64_t o = 0; o < n; o += inner) {
    for (int64_t j = 0; j < inner; ++j) out[o + j] = x[xoff + j * step];
    for (int d = last - 1; d >= 0; --d) {
      xoff += ostep[d];
      if (++idx[d] < oshape[d]) break;
      xoff -= ostep[d] * oshape[d];
      idx[d] = 0;
    }
  }
}

}  // namespace

void permute(DType dt, const void* x, void* out, int ndim, const int64_t* shape, const int* perm, void*) {
  XT_CHECK(ndim >= 0 && ndim <= kMaxDims, ValueError, "permute: at most ", kMaxDims, " dimensions, got ", ndim);
  switch (dtype_size(dt)) {
    case 2: permute_words(static_cast<const uint16_t*>(x), static_cast<uint16_t*>(out), ndim, shape, perm); break;
    case 4: permute_words(static_cast<const uint32_t*>(x), static_cast<uint32_t*>(out), ndim, shape, perm); break;
    case 8: permute_words(static_cast<const uint64_t*>(x), static_cast<uint64_t*>(out), ndim, shape, perm); break;
    default: throw TypeError(str("permute: unsupported dtype ", dtype_name(dt)));
  }
}

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
