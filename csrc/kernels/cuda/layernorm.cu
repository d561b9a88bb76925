// CUDA LayerNorm over the last dim of [rows, dim]: y = (x - mean) * rstd * w + b,
// rstd = 1/sqrt(var + eps) (biased variance).
//
//  - Forward: G lanes per row (lanes_for(dim): 32 for dim >= 128), float32 compute for
//    float32/bfloat16 (float64 for float64), rounded once on store. The statistics are two sums
//    over the row (the mean, then the squared deviations; lane-strided partial sums then
//    group_sum, an order fixed by dim), saved in the compute type. The element formulas are
//    kernels/layernorm_math.h's, as on the CPU. With res (add_layer_norm) h = x + res is rounded,
//    stored, and the row is normed from the rounded values (bitwise add then layer_norm).
//  - Backward: dx by G lanes per row (the two row sums, then dx; with dres, dx = round(dx) + dres
//    in the same kernel), then dw and db as deterministic column sums (column_sum_plan: row chunks
//    each summed in increasing row order, then the chunks in chunk order). No float atomics.
//  - The row loops are unrolled and the pointers __restrict__ (Note [Latency of a lone row],
//    common.cuh); the sums keep their order.
#include "kernels/cuda/common.cuh"
#include "kernels/layernorm_math.h"

namespace xt {
namespace kernels {
namespace cuda {

namespace {

template <int G, typename T, typename W>
__global__ void __launch_bounds__(kThreads)
layernorm_forward_kernel(const T* __restrict__ x, const T* __restrict__ res, const W* __restrict__ w,
                         const W* __restrict__ b, T* __restrict__ h, T* __restrict__ y,
                         compute_t<T>* __restrict__ mean, compute_t<T>* __restrict__ rstd, int64_t rows,
                         int64_t dim, float eps) {
  using C = compute_t<T>;
  const int64_t r = group_row<G>();
  const bool valid = r < rows;  // every lane takes part in the shuffles
  const int lane = threadIdx.x % G;
  const int64_t rr = valid ? r : 0;
  const T* xr = x + rr * dim;
  C sum = 0;
  if (res != nullptr) {  // h = x + res as stored; this lane reads back only what it wrote
    const T* resr = res + rr * dim;
    T* hr = h + rr * dim;
    if (valid)
#pragma unroll 8
      for (int64_t j = lane; j < dim; j += G) {
        const T v = from_compute<T>(apply_binary(BinaryOp::Add, load(xr, j), load(resr, j)));
        hr[j] = v;
        sum += to_compute(v);
      }
    xr = hr;
  } else if (valid) {
#pragma unroll 8
    for (int64_t j = lane; j < dim; j += G) sum += load(xr, j);
  }
  const C mu = group_sum<G>(sum) / static_cast<C>(dim);
  C sq = 0;
  if (valid)
#pragma unroll 8
    for (int64_t j = lane; j < dim; j += G) {
      const C d = load(xr, j) - mu;
      sq += d * d;
    }
  const C inv = layernorm_rstd(group_sum<G>(sq), dim, eps);
  if (!valid) return;
  if (lane == 0) {
    mean[r] = mu;
    rstd[r] = inv;
  }
  T* yr = y + r * dim;
#pragma unroll 8
  for (int64_t j = lane; j < dim; j += G) store(yr, j, layernorm_scaled(xr, w, b, j, mu, inv));
}

// With xhat = (x - mean) * rstd and g = dy * w:  dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
template <int G, typename T, typename W>
__global__ void __launch_bounds__(kThreads)
layernorm_dx_kernel(const T* __restrict__ x, const W* __restrict__ w, const compute_t<T>* __restrict__ mean,
                    const compute_t<T>* __restrict__ rstd, const T* __restrict__ dy, const T* __restrict__ dres,
                    T* __restrict__ dx, int64_t rows, int64_t dim) {
  using C = compute_t<T>;
  const int64_t r = group_row<G>();
  const bool valid = r < rows;
  const int lane = threadIdx.x % G;
  const int64_t rr = valid ? r : 0;
  const T* xr = x + rr * dim;
  const T* dyr = dy + rr * dim;
  const C mu = mean[rr], inv = rstd[rr];
  C sum_g = 0, sum_gx = 0;
  if (valid)
#pragma unroll 8
    for (int64_t j = lane; j < dim; j += G) {
      const C g = load(dyr, j) * static_cast<C>(load(w, j));
      sum_g += g;
      sum_gx += g * ((load(xr, j) - mu) * inv);
    }
  sum_g = group_sum<G>(sum_g);
  sum_gx = group_sum<G>(sum_gx);
  if (!valid) return;
  const C mean_g = sum_g / static_cast<C>(dim), mean_gx = sum_gx / static_cast<C>(dim);
  T* dxr = dx + r * dim;
#pragma unroll 8
  for (int64_t j = lane; j < dim; j += G) {
    const C xhat = (load(xr, j) - mu) * inv;
    const C g = load(dyr, j) * static_cast<C>(load(w, j));
    C v = layernorm_dx(g, mean_g, xhat, mean_gx, inv);
    if (dres != nullptr) v = rounded<T>(v) + load(dres + r * dim, j);
    store(dxr, j, v);
  }
}

// Thread = column j, blockIdx.y = row chunk: sums dy * xhat and dy over the chunk's rows in order.
// With one chunk it writes dw and db directly; otherwise partial rows at [chunk, j] of each.
template <typename T, typename W>
__global__ void layernorm_dwdb_partial_kernel(const T* __restrict__ x, const compute_t<T>* __restrict__ mean,
                                              const compute_t<T>* __restrict__ rstd, const T* __restrict__ dy,
                                              W* __restrict__ dw, W* __restrict__ db,
                                              compute_t<T>* __restrict__ partial, int64_t rows, int64_t dim,
                                              int64_t rows_per_chunk) {
  using C = compute_t<T>;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= dim) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = min(rows, r0 + rows_per_chunk);
  C acc_w = 0, acc_b = 0;
  for (int64_t r = r0; r < r1; ++r) {
    const C d = load(dy, r * dim + j);
    acc_w += d * ((load(x, r * dim + j) - mean[r]) * rstd[r]);
    acc_b += d;
  }
  if (gridDim.y == 1) {
    store(dw, j, static_cast<compute_t<W>>(acc_w));
    store(db, j, static_cast<compute_t<W>>(acc_b));
  } else {
    const int64_t nchunks = gridDim.y;
    partial[static_cast<int64_t>(blockIdx.y) * dim + j] = acc_w;
    partial[(nchunks + blockIdx.y) * dim + j] = acc_b;
  }
}

template <typename C, typename W>
__global__ void layernorm_dwdb_final_kernel(const C* __restrict__ partial, int nchunks, W* __restrict__ dw,
                                            W* __restrict__ db, int64_t dim) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= dim) return;
  C acc_w = 0, acc_b = 0;
  for (int k = 0; k < nchunks; ++k) {
    acc_w += partial[static_cast<int64_t>(k) * dim + j];
    acc_b += partial[static_cast<int64_t>(nchunks + k) * dim + j];
  }
  store(dw, j, static_cast<compute_t<W>>(acc_w));
  store(db, j, static_cast<compute_t<W>>(acc_b));
}

template <typename T, typename W>
void backward_typed(const T* x, const W* w, const compute_t<T>* mean, const compute_t<T>* rstd, const T* dy,
                    const T* dres, T* dx, W* dw, W* db, int64_t rows, int64_t dim, const OnStream& on) {
  using C = compute_t<T>;
  with_lanes(dim, [&](auto g) {
    constexpr int G = decltype(g)::value;
    layernorm_dx_kernel<G, T, W><<<static_cast<unsigned>(ceil_div(rows, rows_per_block<G>())), kThreads, 0, on.s>>>(
        x, w, mean, rstd, dy, dres, dx, rows, dim);
    XT_LAUNCH_CHECK();
  });
  const ColumnSumPlan plan = column_sum_plan(rows, dim);
  const dim3 grid(static_cast<unsigned>(plan.col_blocks), static_cast<unsigned>(plan.nchunks));
  if (plan.nchunks == 1) {
    layernorm_dwdb_partial_kernel<T, W><<<grid, plan.threads, 0, on.s>>>(x, mean, rstd, dy, dw, db, nullptr, rows,
                                                                         dim, plan.rows_per_chunk);
    XT_LAUNCH_CHECK();
    return;
  }
  Scratch partial(sizeof(C) * static_cast<size_t>(2 * plan.nchunks * dim), on);
  layernorm_dwdb_partial_kernel<T, W><<<grid, plan.threads, 0, on.s>>>(x, mean, rstd, dy, dw, db, partial.as<C>(),
                                                                       rows, dim, plan.rows_per_chunk);
  XT_LAUNCH_CHECK();
  layernorm_dwdb_final_kernel<C, W><<<grid.x, plan.threads, 0, on.s>>>(partial.as<C>(), static_cast<int>(plan.nchunks),
                                                                       dw, db, dim);
  XT_LAUNCH_CHECK();
}

}  // namespace

void layernorm_forward(DType dt, DType w_dt, const void* x, const void* res, const void* w, const void* b, void* h,
                       void* y, void* mean, void* rstd, int64_t rows, int64_t dim, float eps, void* stream) {
  if (rows == 0) return;
  OnStream on(stream);
  dispatch_float_weight(dt, w_dt, "layernorm_forward", [&](auto t, auto wt) {
    using T = typename decltype(t)::type;
    using W = typename decltype(wt)::type;
    with_lanes(dim, [&](auto g) {
      constexpr int G = decltype(g)::value;
      layernorm_forward_kernel<G, T, W>
          <<<static_cast<unsigned>(ceil_div(rows, rows_per_block<G>())), kThreads, 0, on.s>>>(
              static_cast<const T*>(x), static_cast<const T*>(res), static_cast<const W*>(w),
              static_cast<const W*>(b), static_cast<T*>(h), static_cast<T*>(y), static_cast<compute_t<T>*>(mean),
              static_cast<compute_t<T>*>(rstd), rows, dim, eps);
      XT_LAUNCH_CHECK();
    });
  });
}

void layernorm_backward(DType dt, DType w_dt, const void* x, const void* w, const void* mean, const void* rstd,
                        const void* dy, const void* dres, void* dx, void* dw, void* db, int64_t rows, int64_t dim,
                        void* stream) {
  if (dim == 0) return;
  OnStream on(stream);
  if (rows == 0) {  // dw, db: empty sums
    XT_CUDA_CHECK(cudaMemsetAsync(dw, 0, static_cast<size_t>(dim) * dtype_size(w_dt), on.s));
    XT_CUDA_CHECK(cudaMemsetAsync(db, 0, static_cast<size_t>(dim) * dtype_size(w_dt), on.s));
    return;
  }
  dispatch_float_weight(dt, w_dt, "layernorm_backward", [&](auto t, auto wt) {
    using T = typename decltype(t)::type;
    using W = typename decltype(wt)::type;
    backward_typed(static_cast<const T*>(x), static_cast<const W*>(w), static_cast<const compute_t<T>*>(mean),
                   static_cast<const compute_t<T>*>(rstd), static_cast<const T*>(dy), static_cast<const T*>(dres),
                   static_cast<T*>(dx), static_cast<W*>(dw), static_cast<W*>(db), rows, dim, on);
  });
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
