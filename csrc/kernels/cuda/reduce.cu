// CUDA reductions: sum_all, sum_lastdim, sum_to (the reverse of a broadcast).
//
// Deterministic: every output is a fixed-order combination of fixed partial sums. The launch
// shape (blocks, chunks) is a function of the problem sizes only, each thread sums a fixed set
// of inputs in increasing order, warps/blocks combine in a fixed tree (common.cuh), and
// cross-block partials are combined by one more pass in index order. Accumulation runs in
// float32 (float64 for float64); outputs are written with `=`. sum_to over the leading dims of a
// contiguous input (a bias's gradient) takes the column sums of column_sum.cuh (Note [Column sums
// in packs]).
#include "kernels/cuda/column_sum.cuh"

namespace xt {
namespace kernels {
namespace cuda {

namespace {

// ------------------------------------------------------------------ sum_all

constexpr int kSumThreads = 512;
constexpr int kSumMaxBlocks = 1024;   // partials combined by one block of kSumThreads
constexpr int64_t kSumPerThread = 8;  // elements a thread sums before blocks multiply

template <typename T>
__global__ void sum_partials_kernel(const T* x, int64_t n, compute_t<T>* partial) {
  using C = compute_t<T>;
  C acc = 0;
  XT_GRID_STRIDE(i, n) acc += load(x, i);
  acc = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// One block: thread t sums partials t, t + blockDim, ... then the block tree.
template <typename T>
__global__ void sum_final_kernel(const compute_t<T>* partial, int nparts, T* out) {
  using C = compute_t<T>;
  C acc = 0;
  for (int i = threadIdx.x; i < nparts; i += blockDim.x) acc += partial[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) store(out, 0, acc);
}

// ------------------------------------------------------------------ sum_lastdim

// One warp per row (short rows).
template <typename T>
__global__ void sum_rows_warp_kernel(const T* x, T* out, int64_t rows, int64_t cols) {
  using C = compute_t<T>;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (r >= rows) return;
  const int lane = threadIdx.x % kWarp;
  const T* xr = x + r * cols;
  C acc = 0;
  for (int64_t c = lane; c < cols; c += kWarp) acc += load(xr, c);
  acc = warp_sum(acc);
  if (lane == 0) store(out, r, acc);
}

// One block per row (long rows).
template <typename T>
__global__ void sum_rows_block_kernel(const T* x, T* out, int64_t cols) {
  using C = compute_t<T>;
  const T* xr = x + static_cast<int64_t>(blockIdx.x) * cols;
  C acc = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) acc += load(xr, c);
  acc = block_sum(acc);
  if (threadIdx.x == 0) store(out, blockIdx.x, acc);
}

// ------------------------------------------------------------------ sum_to

// The broadcast split into kept dims (out's dims; out index o unravels over them) and reduced
// dims (bstride 0, size > 1; reduced index r unravels over them). Dims of size 1 are dropped.
struct SumToPlan {
  int nk = 0, nr = 0;
  int64_t kshape[kMaxDims], kin[kMaxDims], kout[kMaxDims];
  int64_t rshape[kMaxDims], rin[kMaxDims];
  int64_t out_n = 0, R = 1;  // outputs, inputs per output
  int64_t chunk = 1;         // reduced indices per partial
};

// Thread (o, chunk blockIdx.y) sums inputs r in [chunk*plan.chunk, ...) in increasing r. With
// one chunk it writes out directly; otherwise it writes a float partial at [chunk, o].
template <typename T>
__global__ void sum_to_partial_kernel(const T* in, T* out, compute_t<T>* partial, SumToPlan plan) {
  using C = compute_t<T>;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= plan.out_n) return;
  int64_t rem = o, base = 0, ooff = 0;
  for (int d = plan.nk - 1; d >= 0; --d) {
    const int64_t c = rem % plan.kshape[d];
    rem /= plan.kshape[d];
    base += c * plan.kin[d];
    ooff += c * plan.kout[d];
  }
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * plan.chunk;
  const int64_t r1 = min(plan.R, r0 + plan.chunk);
  // Odometer over the reduced dims, started at r0.
  int64_t idx[kMaxDims];
  int64_t off = 0;
  rem = r0;
  for (int d = plan.nr - 1; d >= 0; --d) {
    idx[d] = rem % plan.rshape[d];
    rem /= plan.rshape[d];
    off += idx[d] * plan.rin[d];
  }
  C acc = 0;
  for (int64_t r = r0; r < r1; ++r) {
    acc += load(in, base + off);
    for (int d = plan.nr - 1; d >= 0; --d) {
      off += plan.rin[d];
      if (++idx[d] < plan.rshape[d]) break;
      off -= plan.rin[d] * plan.rshape[d];
      idx[d] = 0;
    }
  }
  if (gridDim.y == 1) store(out, ooff, acc);
  else partial[static_cast<int64_t>(blockIdx.y) * plan.out_n + o] = acc;
}

// out[o] = partials [0, o] + [1, o] + ... in chunk order.
template <typename T>
__global__ void sum_to_final_kernel(const compute_t<T>* partial, int nchunks, T* out, SumToPlan plan) {
  using C = compute_t<T>;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= plan.out_n) return;
  int64_t rem = o, ooff = 0;
  for (int d = plan.nk - 1; d >= 0; --d) {
    const int64_t c = rem % plan.kshape[d];
    rem /= plan.kshape[d];
    ooff += c * plan.kout[d];
  }
  C acc = 0;
  for (int k = 0; k < nchunks; ++k) acc += partial[static_cast<int64_t>(k) * plan.out_n + o];
  store(out, ooff, acc);
}

// Enough partial chunks that ~64K threads work, each summing at least kMinChunk inputs.
constexpr int64_t kTargetThreads = 1 << 16;
constexpr int64_t kMinChunk = 32;
constexpr int64_t kMaxChunks = 1024;

// sum_to as column sums of a row-major [R, out_n]: true when, dims of size 1 aside, every reduced
// dim comes before every kept dim and the input's strides are the contiguous ones (then the
// kept dims' output strides are contiguous too: out has their shape).
bool leading_reduction(const Broadcast* bc) {
  int64_t want = 1;
  bool kept_seen = false;  // walking from the last dim, a kept dim after a reduced one breaks it
  bool reduced_seen = false;
  for (int d = bc->ndim - 1; d >= 0; --d) {
    if (bc->shape[d] == 1) continue;
    if (bc->astride[d] != want) return false;
    want *= bc->shape[d];
    if (bc->bstride[d] == 0) {
      reduced_seen = true;
    } else {
      if (reduced_seen) return false;
      kept_seen = true;
    }
  }
  return kept_seen && reduced_seen;
}

template <typename T>
void column_sum(const T* in, T* out, int64_t rows, int64_t cols, const OnStream& on) {
  using C = compute_t<T>;
  using namespace colsum;
  const PackedPlan plan = packed_plan<T>(rows, cols);
  XT_CHECK(plan.col_blocks <= INT32_MAX, ValueError, "sum_to: output too large for CUDA: ", cols);
  const dim3 grid(static_cast<unsigned>(plan.col_blocks), static_cast<unsigned>(plan.nchunks));
  const bool vec = cols % vec_of<T>() == 0 && aligned_to(in, 16);
  Scratch partial(plan.nchunks > 1 ? sizeof(C) * static_cast<size_t>(plan.nchunks * cols) : 1, on);
  C* part = plan.nchunks > 1 ? partial.as<C>() : nullptr;
  if (vec) column_sum_partial_kernel<T, true><<<grid, kColThreads, 0, on.s>>>(in, out, part, plan);
  else column_sum_partial_kernel<T, false><<<grid, kColThreads, 0, on.s>>>(in, out, part, plan);
  XT_LAUNCH_CHECK();
  if (plan.nchunks > 1) {
    column_sum_final_kernel<T><<<static_cast<unsigned>(ceil_div(cols, int64_t{kWarp})), kColThreads, 0, on.s>>>(
        part, out, plan);
    XT_LAUNCH_CHECK();
  }
}

}  // namespace

// ------------------------------------------------------------------ launchers

void sum_all(DType dt, const void* x, void* out, int64_t n, void* stream) {
  OnStream on(stream);
  XT_DISPATCH_FLOAT(dt, "sum_all", T, {
    using C = compute_t<T>;
    const int64_t want = ceil_div(n, kSumThreads * kSumPerThread);
    const int blocks = static_cast<int>(want < 1 ? 1 : (want > kSumMaxBlocks ? kSumMaxBlocks : want));
    Scratch partial(sizeof(C) * blocks, on);
    sum_partials_kernel<T><<<blocks, kSumThreads, 0, on.s>>>(static_cast<const T*>(x), n, partial.as<C>());
    XT_LAUNCH_CHECK();
    sum_final_kernel<T><<<1, kSumThreads, 0, on.s>>>(partial.as<C>(), blocks, static_cast<T*>(out));
    XT_LAUNCH_CHECK();
  });
}

void sum_lastdim(DType dt, const void* x, void* out, int64_t rows, int64_t cols, void* stream) {
  if (rows == 0) return;
  OnStream on(stream);
  XT_DISPATCH_FLOAT(dt, "sum_lastdim", T, {
    const T* px = static_cast<const T*>(x);
    T* po = static_cast<T*>(out);
    if (cols <= 1024) {
      const int rows_per_block = kThreads / kWarp;
      sum_rows_warp_kernel<T><<<static_cast<unsigned>(ceil_div(rows, rows_per_block)), kThreads, 0, on.s>>>(
          px, po, rows, cols);
    } else {
      XT_CHECK(rows <= INT32_MAX, ValueError, "sum_lastdim: too many rows for CUDA: ", rows);
      sum_rows_block_kernel<T><<<static_cast<unsigned>(rows), 512, 0, on.s>>>(px, po, cols);
    }
    XT_LAUNCH_CHECK();
  });
}

void sum_to(DType dt, const void* in, void* out, int64_t out_n, const Broadcast* bc, void* stream) {
  if (out_n == 0) return;
  SumToPlan plan;
  plan.out_n = out_n;
  for (int d = 0; d < bc->ndim; ++d) {
    if (bc->shape[d] == 1) continue;
    if (bc->bstride[d] == 0) {
      plan.rshape[plan.nr] = bc->shape[d];
      plan.rin[plan.nr] = bc->astride[d];
      plan.R *= bc->shape[d];
      plan.nr++;
    } else {
      plan.kshape[plan.nk] = bc->shape[d];
      plan.kin[plan.nk] = bc->astride[d];
      plan.kout[plan.nk] = bc->bstride[d];
      plan.nk++;
    }
  }
  OnStream on(stream);
  if (plan.R == 0) {  // an empty input: every sum is 0 (all-zero bits are 0 in every float type)
    XT_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<size_t>(out_n) * dtype_size(dt), on.s));
    return;
  }
  if (leading_reduction(bc)) {  // Note [Column sums in packs]
    XT_DISPATCH_FLOAT(dt, "sum_to", T, {
      column_sum(static_cast<const T*>(in), static_cast<T*>(out), plan.R, out_n, on);
    });
    return;
  }
  int64_t nchunks = 1;
  if (plan.R >= 2 * kMinChunk && out_n < kTargetThreads) {
    nchunks = ceil_div(kTargetThreads, out_n);
    const int64_t by_size = plan.R / kMinChunk;
    if (nchunks > by_size) nchunks = by_size;
    if (nchunks > kMaxChunks) nchunks = kMaxChunks;
    if (nchunks < 1) nchunks = 1;
  }
  plan.chunk = ceil_div(plan.R, nchunks);
  nchunks = ceil_div(plan.R, plan.chunk);  // no empty chunk
  XT_CHECK(ceil_div(out_n, kThreads) <= INT32_MAX, ValueError, "sum_to: output too large for CUDA: ", out_n);
  XT_DISPATCH_FLOAT(dt, "sum_to", T, {
    using C = compute_t<T>;
    const T* pin = static_cast<const T*>(in);
    T* po = static_cast<T*>(out);
    const dim3 grid(static_cast<unsigned>(ceil_div(out_n, kThreads)), static_cast<unsigned>(nchunks));
    if (nchunks == 1) {
      sum_to_partial_kernel<T><<<grid, kThreads, 0, on.s>>>(pin, po, nullptr, plan);
      XT_LAUNCH_CHECK();
      return;
    }
    Scratch partial(sizeof(C) * static_cast<size_t>(nchunks * out_n), on);
    sum_to_partial_kernel<T><<<grid, kThreads, 0, on.s>>>(pin, po, partial.as<C>(), plan);
    XT_LAUNCH_CHECK();
    sum_to_final_kernel<T><<<grid.x, kThreads, 0, on.s>>>(partial.as<C>(), static_cast<int>(nchunks), po, plan);
    XT_LAUNCH_CHECK();
  });
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
