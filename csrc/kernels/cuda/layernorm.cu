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
//  - The kernels are in layernorm.cuh (tests/emu/layernorm_emu.cpp runs them on the CPU); this
//    file holds the launchers.
#include "kernels/cuda/layernorm.cuh"

namespace xt {
namespace kernels {
namespace cuda {

using namespace layernorm;

namespace {

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
