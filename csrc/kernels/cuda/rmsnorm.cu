// CUDA RMSNorm over the last dim of [rows, dim]: y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps).
//
//  - One warp per row for the forward and for dx; float32 compute for float32/bfloat16 (float64
//    for float64), rounded once on store; rstd is saved as float32 (the contract). Same formulas
//    as kernels/cpu/rmsnorm.cpp. w is x's dtype or float32.
//  - dx and dw are written with `=`. dw[j] = sum over rows of dy * x * rstd, deterministic:
//    row chunks (a count that depends only on the shape) each sum their rows in increasing order
//    into a float scratch row, then one pass adds the chunk rows in chunk order.
#include "kernels/cuda/common.cuh"

namespace xt {
namespace kernels {
namespace cuda {

namespace {

constexpr int kRowsPerBlock = kThreads / kWarp;  // one warp per row

template <typename T, typename W>
__global__ void rmsnorm_forward_kernel(const T* x, const W* w, T* y, float* rstd, int64_t rows, int64_t dim,
                                       float eps) {
  using C = compute_t<T>;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (r >= rows) return;
  const int lane = threadIdx.x % kWarp;
  const T* xr = x + r * dim;
  T* yr = y + r * dim;
  C ss = 0;
  for (int64_t j = lane; j < dim; j += kWarp) {
    const C v = load(xr, j);
    ss += v * v;
  }
  ss = warp_sum(ss);
  const C inv = C(1) / xsqrt(ss / static_cast<C>(dim) + static_cast<C>(eps));
  if (lane == 0) rstd[r] = static_cast<float>(inv);
  for (int64_t j = lane; j < dim; j += kWarp) store(yr, j, static_cast<C>(load(xr, j) * inv * static_cast<C>(load(w, j))));
}

// With xhat = x * rstd and g = dy * w:  dx = rstd * (g - xhat * mean(g * xhat)).
template <typename T, typename W>
__global__ void rmsnorm_dx_kernel(const T* x, const W* w, const float* rstd, const T* dy, T* dx, int64_t rows,
                                  int64_t dim) {
  using C = compute_t<T>;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (r >= rows) return;
  const int lane = threadIdx.x % kWarp;
  const T* xr = x + r * dim;
  const T* dyr = dy + r * dim;
  T* dxr = dx + r * dim;
  const C inv = static_cast<C>(rstd[r]);
  C dot = 0;
  for (int64_t j = lane; j < dim; j += kWarp) dot += load(dyr, j) * static_cast<C>(load(w, j)) * (load(xr, j) * inv);
  dot = warp_sum(dot);
  const C mean_dot = dot / static_cast<C>(dim);
  for (int64_t j = lane; j < dim; j += kWarp) {
    const C xhat = load(xr, j) * inv;
    const C g = load(dyr, j) * static_cast<C>(load(w, j));
    store(dxr, j, static_cast<C>(inv * (g - xhat * mean_dot)));
  }
}

// Thread = column j, blockIdx.y = row chunk: sums dy * xhat over the chunk's rows in order.
// With one chunk it writes dw directly; otherwise a partial row at [chunk, j].
template <typename T, typename W>
__global__ void rmsnorm_dw_partial_kernel(const T* x, const float* rstd, const T* dy, W* dw,
                                          compute_t<T>* partial, int64_t rows, int64_t dim, int64_t rows_per_chunk) {
  using C = compute_t<T>;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= dim) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = min(rows, r0 + rows_per_chunk);
  C acc = 0;
  for (int64_t r = r0; r < r1; ++r) acc += load(dy, r * dim + j) * (load(x, r * dim + j) * static_cast<C>(rstd[r]));
  if (gridDim.y == 1) store(dw, j, static_cast<compute_t<W>>(acc));
  else partial[static_cast<int64_t>(blockIdx.y) * dim + j] = acc;
}

template <typename C, typename W>
__global__ void rmsnorm_dw_final_kernel(const C* partial, int nchunks, W* dw, int64_t dim) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= dim) return;
  C acc = 0;
  for (int k = 0; k < nchunks; ++k) acc += partial[static_cast<int64_t>(k) * dim + j];
  store(dw, j, static_cast<compute_t<W>>(acc));
}

// Row chunks for dw: enough (column blocks x chunks) to fill the GPU, >= 16 rows per chunk.
constexpr int64_t kDwTargetBlocks = 1024;
constexpr int64_t kDwMinRows = 16;

template <typename T, typename W>
void backward_typed(const T* x, const W* w, const float* rstd, const T* dy, T* dx, W* dw, int64_t rows, int64_t dim,
                    const OnStream& on) {
  using C = compute_t<T>;
  rmsnorm_dx_kernel<T, W><<<static_cast<unsigned>(ceil_div(rows, kRowsPerBlock)), kThreads, 0, on.s>>>(
      x, w, rstd, dy, dx, rows, dim);
  XT_LAUNCH_CHECK();
  const int64_t col_blocks = ceil_div(dim, kThreads);
  int64_t nchunks = ceil_div(kDwTargetBlocks, col_blocks);
  const int64_t by_rows = ceil_div(rows, kDwMinRows);
  if (nchunks > by_rows) nchunks = by_rows;
  if (nchunks > 65535) nchunks = 65535;
  if (nchunks < 1) nchunks = 1;
  const int64_t rows_per_chunk = ceil_div(rows, nchunks);
  nchunks = ceil_div(rows, rows_per_chunk);
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(nchunks));
  if (nchunks == 1) {
    rmsnorm_dw_partial_kernel<T, W><<<grid, kThreads, 0, on.s>>>(x, rstd, dy, dw, nullptr, rows, dim, rows_per_chunk);
    XT_LAUNCH_CHECK();
    return;
  }
  Scratch partial(sizeof(C) * static_cast<size_t>(nchunks * dim), on);
  rmsnorm_dw_partial_kernel<T, W><<<grid, kThreads, 0, on.s>>>(x, rstd, dy, dw, partial.as<C>(), rows, dim,
                                                               rows_per_chunk);
  XT_LAUNCH_CHECK();
  rmsnorm_dw_final_kernel<C, W><<<grid.x, kThreads, 0, on.s>>>(partial.as<C>(), static_cast<int>(nchunks), dw, dim);
  XT_LAUNCH_CHECK();
}

}  // namespace

void rmsnorm_forward(DType dt, DType w_dt, const void* x, const void* w, void* y, float* rstd, int64_t rows,
                     int64_t dim, float eps, void* stream) {
  XT_ASSERT(w_dt == dt || w_dt == DType::Float32, "rmsnorm_forward: w dtype ", dtype_name(w_dt));
  if (rows == 0) return;
  OnStream on(stream);
  const unsigned blocks = static_cast<unsigned>(ceil_div(rows, kRowsPerBlock));
  dispatch_float(dt, "rmsnorm_forward", [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (w_dt == DType::Float32)
      rmsnorm_forward_kernel<T, float><<<blocks, kThreads, 0, on.s>>>(
          static_cast<const T*>(x), static_cast<const float*>(w), static_cast<T*>(y), rstd, rows, dim, eps);
    else
      rmsnorm_forward_kernel<T, T><<<blocks, kThreads, 0, on.s>>>(static_cast<const T*>(x), static_cast<const T*>(w),
                                                                 static_cast<T*>(y), rstd, rows, dim, eps);
    XT_LAUNCH_CHECK();
  });
}

void rmsnorm_backward(DType dt, DType w_dt, const void* x, const void* w, const float* rstd, const void* dy, void* dx,
                      void* dw, int64_t rows, int64_t dim, void* stream) {
  XT_ASSERT(w_dt == dt || w_dt == DType::Float32, "rmsnorm_backward: w dtype ", dtype_name(w_dt));
  if (dim == 0) return;
  OnStream on(stream);
  if (rows == 0) {  // dw is an empty sum
    XT_CUDA_CHECK(cudaMemsetAsync(dw, 0, static_cast<size_t>(dim) * dtype_size(w_dt), on.s));
    return;
  }
  dispatch_float(dt, "rmsnorm_backward", [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (w_dt == DType::Float32)
      backward_typed(static_cast<const T*>(x), static_cast<const float*>(w), rstd, static_cast<const T*>(dy),
                     static_cast<T*>(dx), static_cast<float*>(dw), rows, dim, on);
    else
      backward_typed(static_cast<const T*>(x), static_cast<const T*>(w), rstd, static_cast<const T*>(dy),
                     static_cast<T*>(dx), static_cast<T*>(dw), rows, dim, on);
  });
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
