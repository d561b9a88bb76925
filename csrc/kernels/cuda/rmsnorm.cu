// CUDA RMSNorm over the last dim of [rows, dim]: y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps).
//
//  - G lanes per row (G = 32 for dim >= 128, fewer for short rows) for the forward and for dx; float32 compute for float32/bfloat16 (float64
//    for float64), rounded once on store; rstd is saved as float32 (the contract). Same formulas
//    as kernels/cpu/rmsnorm.cpp. w is x's dtype or float32.
//  - dx and dw are written with `=`. dw[j] = sum over rows of dy * x * rstd, deterministic:
//    row chunks (a count that depends only on the shape) each sum their rows in increasing order
//    into a float scratch row, then one pass adds the chunk rows in chunk order.
#include <type_traits>

#include "kernels/cuda/common.cuh"

namespace xt {
namespace kernels {
namespace cuda {

namespace {

template <int G, typename T, typename W>
__global__ void rmsnorm_forward_kernel(const T* x, const W* w, T* y, float* rstd, int64_t rows, int64_t dim,
                                       float eps) {
  using C = compute_t<T>;
  const int64_t r = group_row<G>();
  const bool valid = r < rows;  // every lane takes part in the shuffles
  const int lane = threadIdx.x % G;
  const T* xr = x + (valid ? r : 0) * dim;
  const C ss = group_sum_sq<G>(xr, dim, lane, valid);
  if (!valid) return;
  T* yr = y + r * dim;
  const C inv = rms_rstd(ss, dim, eps);
  if (lane == 0) rstd[r] = static_cast<float>(inv);
  for (int64_t j = lane; j < dim; j += G) store(yr, j, rms_scaled(xr, w, j, inv));
}

// With xhat = x * rstd and g = dy * w:  dx = rstd * (g - xhat * mean(g * xhat)).
template <int G, typename T, typename W>
__global__ void rmsnorm_dx_kernel(const T* x, const W* w, const float* rstd, const T* dy, T* dx, int64_t rows,
                                  int64_t dim) {
  using C = compute_t<T>;
  const int64_t r = group_row<G>();
  const bool valid = r < rows;
  const int lane = threadIdx.x % G;
  const int64_t rr = valid ? r : 0;
  const T* xr = x + rr * dim;
  const T* dyr = dy + rr * dim;
  const C inv = static_cast<C>(rstd[rr]);
  C dot = 0;
  if (valid)
    for (int64_t j = lane; j < dim; j += G) dot += load(dyr, j) * static_cast<C>(load(w, j)) * (load(xr, j) * inv);
  dot = group_sum<G>(dot);
  if (!valid) return;
  T* dxr = dx + r * dim;
  const C mean_dot = dot / static_cast<C>(dim);
  for (int64_t j = lane; j < dim; j += G) {
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

template <typename T, typename W>
void backward_typed(const T* x, const W* w, const float* rstd, const T* dy, T* dx, W* dw, int64_t rows, int64_t dim,
                    const OnStream& on) {
  using C = compute_t<T>;
  with_lanes(dim, [&](auto g) {
    constexpr int G = decltype(g)::value;
    rmsnorm_dx_kernel<G, T, W><<<static_cast<unsigned>(ceil_div(rows, rows_per_block<G>())), kThreads, 0, on.s>>>(
        x, w, rstd, dy, dx, rows, dim);
    XT_LAUNCH_CHECK();
  });
  // dw: one thread per column; row chunks summed in order, then the chunks in order.
  const ColumnSumPlan plan = column_sum_plan(rows, dim);
  const int64_t nchunks = plan.nchunks, rows_per_chunk = plan.rows_per_chunk;
  const int dw_threads = plan.threads;
  const dim3 grid(static_cast<unsigned>(plan.col_blocks), static_cast<unsigned>(nchunks));
  if (nchunks == 1) {
    rmsnorm_dw_partial_kernel<T, W><<<grid, dw_threads, 0, on.s>>>(x, rstd, dy, dw, nullptr, rows, dim, rows_per_chunk);
    XT_LAUNCH_CHECK();
    return;
  }
  Scratch partial(sizeof(C) * static_cast<size_t>(nchunks * dim), on);
  rmsnorm_dw_partial_kernel<T, W><<<grid, dw_threads, 0, on.s>>>(x, rstd, dy, dw, partial.as<C>(), rows, dim,
                                                                 rows_per_chunk);
  XT_LAUNCH_CHECK();
  rmsnorm_dw_final_kernel<C, W><<<grid.x, dw_threads, 0, on.s>>>(partial.as<C>(), static_cast<int>(nchunks), dw, dim);
  XT_LAUNCH_CHECK();
}

}  // namespace

void rmsnorm_forward(DType dt, DType w_dt, const void* x, const void* w, void* y, float* rstd, int64_t rows,
                     int64_t dim, float eps, void* stream) {
  XT_ASSERT(w_dt == dt || w_dt == DType::Float32, "rmsnorm_forward: w dtype ", dtype_name(w_dt));
  if (rows == 0) return;
  OnStream on(stream);
  XT_DISPATCH_FLOAT(dt, "rmsnorm_forward", T, {
    with_lanes(dim, [&](auto g) {
      constexpr int G = decltype(g)::value;
      const unsigned blocks = static_cast<unsigned>(ceil_div(rows, rows_per_block<G>()));
      if (w_dt == DType::Float32)
        rmsnorm_forward_kernel<G, T, float><<<blocks, kThreads, 0, on.s>>>(
            static_cast<const T*>(x), static_cast<const float*>(w), static_cast<T*>(y), rstd, rows, dim, eps);
      else
        rmsnorm_forward_kernel<G, T, T><<<blocks, kThreads, 0, on.s>>>(
            static_cast<const T*>(x), static_cast<const T*>(w), static_cast<T*>(y), rstd, rows, dim, eps);
      XT_LAUNCH_CHECK();
    });
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
  XT_DISPATCH_FLOAT(dt, "rmsnorm_backward", T, {
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
