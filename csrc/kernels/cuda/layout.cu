// CUDA layout kernels: permute (a copy into the permuted row-major layout).
//
// Output is written with `=`, as a gather: each thread owns output elements (coalesced writes)
// and reads x through the permuted strides. Works for every dtype: elements move as raw
// 2/4/8-byte words.
#include "kernels/cuda/common.cuh"

namespace xt {
namespace kernels {
namespace cuda {

namespace {

struct PermutePlan {
  int ndim = 0;
  int64_t oshape[kMaxDims];  // out's shape
  int64_t ostep[kMaxDims];   // x's stride along out's dim i (x stride of dim perm[i])
};

template <typename W>
__global__ void permute_kernel(const W* x, W* out, int64_t n, PermutePlan plan) {
  XT_GRID_STRIDE(o, n) {
    int64_t rem = o, xoff = 0;
    for (int d = plan.ndim - 1; d >= 0; --d) {
      xoff += (rem % plan.oshape[d]) * plan.ostep[d];
      rem /= plan.oshape[d];
    }
    out[o] = x[xoff];
  }
}

}  // namespace

void permute(DType dt, const void* x, void* out, int ndim, const int64_t* shape, const int* perm, void* stream) {
  XT_CHECK(ndim >= 0 && ndim <= kMaxDims, ValueError, "permute: at most ", kMaxDims, " dimensions, got ", ndim);
  PermutePlan plan;
  plan.ndim = ndim;
  int64_t xstride[kMaxDims];
  int64_t s = 1, n = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    xstride[d] = s;
    s *= shape[d];
  }
  for (int i = 0; i < ndim; ++i) {
    plan.oshape[i] = shape[perm[i]];
    plan.ostep[i] = xstride[perm[i]];
    n *= plan.oshape[i];
  }
  if (n == 0) return;
  OnStream on(stream);
  switch (dtype_size(dt)) {
    case 2:
      permute_kernel<<<grid_for(n), kThreads, 0, on.s>>>(static_cast<const uint16_t*>(x), static_cast<uint16_t*>(out),
                                                         n, plan);
      break;
    case 4:
      permute_kernel<<<grid_for(n), kThreads, 0, on.s>>>(static_cast<const uint32_t*>(x), static_cast<uint32_t*>(out),
                                                         n, plan);
      break;
    case 8:
      permute_kernel<<<grid_for(n), kThreads, 0, on.s>>>(static_cast<const uint64_t*>(x), static_cast<uint64_t*>(out),
                                                         n, plan);
      break;
    default: throw TypeError(str("permute: unsupported dtype ", dtype_name(dt)));
  }
  XT_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
