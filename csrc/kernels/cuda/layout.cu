// CUDA layout kernels: permute (a copy into the permuted row-major layout).
//
// Output is written with `=`, as a gather: each thread owns output words (coalesced writes) and
// reads x through the permuted strides. The plan first merges output dimensions that stay
// adjacent in x (so [B, S, H, D] -> [B, H, S, D] is a 4-d move, [M, N] -> [M, N] a flat copy).
// When the innermost dimension does not move, each of its rows is a contiguous run in both
// tensors and moves in the widest word (up to 16 bytes) that divides the run and both pointers'
// alignment: the attention layout [32, 256, 24, 32] bf16 moves 4 x 16 bytes per row instead of
// 32 x 2. Index math is 32-bit when every offset fits (the common case: divisions by a
// runtime int64 cost several times a 32-bit one). Any dtype: elements move as raw bytes.
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace xt {
namespace kernels {
namespace cuda {

namespace {

template <typename I>
struct PermutePlan {
  int ndim = 0;
  I oshape[kMaxDims];  // out's shape, in words
  I ostep[kMaxDims];   // x's stride (in words) along out's dim i
};

template <typename W, typename I>
__global__ void permute_kernel(const W* __restrict__ x, W* __restrict__ out, I n, PermutePlan<I> plan) {
  for (I o = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; o < n;
       o += static_cast<I>(gridDim.x) * blockDim.x) {
    I rem = o, xoff = 0;
    for (int d = plan.ndim - 1; d > 0; --d) {
      const I q = rem / plan.oshape[d];
      xoff += (rem - q * plan.oshape[d]) * plan.ostep[d];
      rem = q;
    }
    xoff += rem * plan.ostep[0];
    out[o] = x[xoff];
  }
}

template <typename W, typename I>
void launch_permute(const void* x, void* out, int ndim, const int64_t* oshape, const int64_t* ostep, int64_t n,
                    cudaStream_t s) {
  PermutePlan<I> plan;
  plan.ndim = ndim;
  for (int i = 0; i < ndim; ++i) {
    plan.oshape[i] = static_cast<I>(oshape[i]);
    plan.ostep[i] = static_cast<I>(ostep[i]);
  }
  permute_kernel<W, I><<<grid_for(n), kThreads, 0, s>>>(static_cast<const W*>(x), static_cast<W*>(out),
                                                        static_cast<I>(n), plan);
}

template <typename W>
void launch_permute_words(const void* x, void* out, int ndim, const int64_t* oshape, const int64_t* ostep, int64_t n,
                          cudaStream_t s) {
  if (n < (int64_t(1) << 31) - kThreads * kMaxBlocks) launch_permute<W, uint32_t>(x, out, ndim, oshape, ostep, n, s);
  else launch_permute<W, int64_t>(x, out, ndim, oshape, ostep, n, s);
}

}  // namespace

void permute(DType dt, const void* x, void* out, int ndim, const int64_t* shape, const int* perm, void* stream) {
  XT_CHECK(ndim >= 0 && ndim <= kMaxDims, ValueError, "permute: at most ", kMaxDims, " dimensions, got ", ndim);
  const int64_t esize = static_cast<int64_t>(dtype_size(dt));
  XT_CHECK(esize == 2 || esize == 4 || esize == 8, TypeError, "permute: unsupported dtype ",
           dtype_name(dt));
  int64_t xstride[kMaxDims];
  int64_t s = 1, n = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    xstride[d] = s;
    s *= shape[d];
  }
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  if (n == 0) return;
  // Out's dims (size-1 dims dropped), merging i into i-1 when x holds them adjacent in the same order.
  int64_t oshape[kMaxDims], ostep[kMaxDims];
  int m = 0;
  for (int i = 0; i < ndim; ++i) {
    const int64_t len = shape[perm[i]], step = xstride[perm[i]];
    if (len == 1) continue;
    if (m > 0 && ostep[m - 1] == len * step) {
      oshape[m - 1] *= len;
      ostep[m - 1] = step;
    } else {
      oshape[m] = len;
      ostep[m] = step;
      ++m;
    }
  }
  if (m == 0) {  // every dim has size 1: one element
    oshape[0] = 1;
    ostep[0] = 1;
    m = 1;
  }
  // Bytes per word: the innermost run (contiguous in x when its step is 1), capped at 16 and at
  // both pointers' alignment.
  int64_t word = esize;
  if (ostep[m - 1] == 1) {
    const int64_t run = oshape[m - 1] * esize;
    const uintptr_t align = reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(out);
    for (int64_t w = 16; w > esize; w /= 2) {
      if (run % w == 0 && align % w == 0) {
        word = w;
        break;
      }
    }
  }
  const int64_t per = word / esize;  // elements per word
  for (int i = 0; i < m; ++i) ostep[i] = (i == m - 1 && ostep[i] == 1) ? 1 : ostep[i] / per;
  oshape[m - 1] /= per;
  // Non-innermost x steps are multiples of the innermost run (which per divides) when it moved whole.
  n /= per;
  OnStream on(stream);
  switch (word) {
    case 2: launch_permute_words<uint16_t>(x, out, m, oshape, ostep, n, on.s); break;
    case 4: launch_permute_words<uint32_t>(x, out, m, oshape, ostep, n, on.s); break;
    case 8: launch_permute_words<uint2>(x, out, m, oshape, ostep, n, on.s); break;
    default: launch_permute_words<uint4>(x, out, m, oshape, ostep, n, on.s); break;
  }
  XT_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
