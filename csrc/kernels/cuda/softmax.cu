// CUDA softmax over the last dim of [rows, cols]: softmax/log_softmax forward and backward.
//
//  - One warp per row when cols <= kWarpRowMax, one block per row otherwise. float32 compute
//    for float32/bfloat16 (float64 for float64), rounded once on store; same formulas as
//    kernels/cpu/softmax.cpp (max, then sum of exp(x - max), then the write pass).
//  - Every output is written with `=`.
#include "kernels/cuda/common.cuh"

namespace xt {
namespace kernels {
namespace cuda {

namespace {

constexpr int64_t kWarpRowMax = 1024;
constexpr int kBlockRowThreads = 512;
constexpr int kRowsPerBlock = kThreads / kWarp;

// A row is handled by a warp (kBlock false) or by the whole block (kBlock true).
template <bool kBlock>
struct Group {
  static __device__ __forceinline__ int rank() { return kBlock ? threadIdx.x : threadIdx.x % kWarp; }
  static __device__ __forceinline__ int size() { return kBlock ? blockDim.x : kWarp; }
  static __device__ __forceinline__ int64_t row() {
    return kBlock ? static_cast<int64_t>(blockIdx.x)
                  : static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  }
  template <typename C> static __device__ __forceinline__ C sum(C v) {
    if constexpr (kBlock) return block_sum(v);
    else return warp_sum(v);
  }
  template <typename C> static __device__ __forceinline__ C max(C v) {
    if constexpr (kBlock) return block_max(v);
    else return warp_max(v);
  }
};

// y[0..kept) = softmax (or log_softmax) of scale * x[0..kept); y[kept..total) = 0.
template <typename G, typename T>
__device__ void softmax_row(const T* xr, T* yr, int64_t kept, int64_t total, compute_t<T> scale, bool log) {
  using C = compute_t<T>;
  const int r = G::rank(), step = G::size();
  C mx = NegInf<C>::get();
  for (int64_t j = r; j < kept; j += step) mx = xmax(mx, load(xr, j) * scale);
  mx = G::max(mx);
  if (mx == NegInf<C>::get()) mx = 0;  // an all -inf row: avoid inf - inf
  C sum = 0;
  for (int64_t j = r; j < kept; j += step) sum += xexp(load(xr, j) * scale - mx);
  sum = G::sum(sum);
  if (log) {
    // (x - max) - log(sum), not x - (max + log(sum)): exact where |x| is large and the result is not
    const C log_sum = xlog(sum);
    for (int64_t j = r; j < kept; j += step) store(yr, j, (load(xr, j) * scale - mx) - log_sum);
  } else {
    const C inv = C(1) / sum;
    for (int64_t j = r; j < kept; j += step) store(yr, j, xexp(load(xr, j) * scale - mx) * inv);
  }
  for (int64_t j = kept + r; j < total; j += step) store(yr, j, C(0));
}

template <typename G, typename T>
__global__ void softmax_forward_kernel(const T* x, T* y, int64_t rows, int64_t cols, bool log) {
  const int64_t row = G::row();
  if (row >= rows) return;
  softmax_row<G>(x + row * cols, y + row * cols, cols, cols, compute_t<T>(1), log);
}

// softmax:     dx = y * (dy - sum(dy * y))
// log_softmax: dx = dy - exp(y) * sum(dy)
template <typename G, typename T>
__global__ void softmax_backward_kernel(const T* y, const T* dy, T* dx, int64_t rows, int64_t cols, bool log) {
  using C = compute_t<T>;
  const int64_t row = G::row();
  if (row >= rows) return;
  const int r = G::rank(), step = G::size();
  const T* yr = y + row * cols;
  const T* dyr = dy + row * cols;
  T* dxr = dx + row * cols;
  C s = 0;
  if (log) {
    for (int64_t j = r; j < cols; j += step) s += load(dyr, j);
    s = G::sum(s);
    for (int64_t j = r; j < cols; j += step) store(dxr, j, static_cast<C>(load(dyr, j) - xexp(load(yr, j)) * s));
  } else {
    for (int64_t j = r; j < cols; j += step) s += load(dyr, j) * load(yr, j);
    s = G::sum(s);
    for (int64_t j = r; j < cols; j += step) store(dxr, j, static_cast<C>(load(yr, j) * (load(dyr, j) - s)));
  }
}

// Launch `kernel<Group<...>, T>` with a warp or a block per row.
template <typename LaunchWarp, typename LaunchBlock>
void launch_rows(int64_t rows, int64_t cols, const OnStream& on, LaunchWarp&& warp_fn, LaunchBlock&& block_fn) {
  if (cols <= kWarpRowMax) {
    warp_fn(static_cast<unsigned>(ceil_div(rows, kRowsPerBlock)), kThreads);
  } else {
    XT_CHECK(rows <= INT32_MAX, ValueError, "softmax: too many rows for CUDA: ", rows);
    block_fn(static_cast<unsigned>(rows), kBlockRowThreads);
  }
  XT_LAUNCH_CHECK();
}

}  // namespace

void softmax_forward(DType dt, const void* x, void* y, int64_t rows, int64_t cols, bool log, void* stream) {
  if (rows == 0 || cols == 0) return;
  OnStream on(stream);
  XT_DISPATCH_FLOAT(dt, "softmax_forward", T, {
    const T* px = static_cast<const T*>(x);
    T* py = static_cast<T*>(y);
    launch_rows(
        rows, cols, on,
        [&](unsigned g, int b) { softmax_forward_kernel<Group<false>, T><<<g, b, 0, on.s>>>(px, py, rows, cols, log); },
        [&](unsigned g, int b) { softmax_forward_kernel<Group<true>, T><<<g, b, 0, on.s>>>(px, py, rows, cols, log); });
  });
}

void softmax_backward(DType dt, const void* y, const void* dy, void* dx, int64_t rows, int64_t cols, bool log,
                      void* stream) {
  if (rows == 0 || cols == 0) return;
  OnStream on(stream);
  XT_DISPATCH_FLOAT(dt, "softmax_backward", T, {
    const T* py = static_cast<const T*>(y);
    const T* pdy = static_cast<const T*>(dy);
    T* pdx = static_cast<T*>(dx);
    launch_rows(
        rows, cols, on,
        [&](unsigned g, int b) {
          softmax_backward_kernel<Group<false>, T><<<g, b, 0, on.s>>>(py, pdy, pdx, rows, cols, log);
        },
        [&](unsigned g, int b) {
          softmax_backward_kernel<Group<true>, T><<<g, b, 0, on.s>>>(py, pdy, pdx, rows, cols, log);
        });
  });
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
