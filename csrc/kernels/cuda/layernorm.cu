// CUDA LayerNorm over the last dim of [rows, dim]: y = (x - mean) * rstd * w + b,
// rstd = 1/sqrt(var + eps) (biased variance).
//
//  - Forward: G lanes per row (lanes_for(dim): 32 for dim >= 128), float32 compute for
//    float32/bfloat16 (float64 for float64), rounded once on store. The statistics are two sums
//    over the row (the mean, then the squared deviations; lane-strided partial sums then
//    group_sum, an order fixed by dim), saved in the compute type. The element formulas are
//    kernels/layernorm_math.h's, as on the CPU. With res (add_layer_norm) h = x + res is rounded,
//    stored, and the row is normed from the rounded values (bitwise add then layer_norm).
//  - Backward: one pass over x and dy writes dx and dw, db (Note [One-pass LayerNorm backward]),
//    for bf16 rows of 256, 512 or 768 in 16-byte packs (layernorm_backward_wide_kernel, as
//    RMSNorm's wide backward: the lane-strided 2-byte accesses of RMSNorm's kept ~50% of HBM
//    bandwidth at this shape, its wide kernel ~3.6 TB/s); rows too long for its shared memory take
//    two: dx by G lanes per row (the two row sums, then
//    dx; with dres, dx = round(dx) + dres in the same kernel), then dw and db as deterministic
//    column sums (column_sum_plan: row chunks each summed in increasing row order, then the chunks
//    in chunk order). No float atomics either way.
//  - The row loops are unrolled and the pointers __restrict__ (Note [Latency of a lone row],
//    common.cuh); the sums keep their order.
//  - The kernels are in layernorm.cuh (tests/emu/layernorm_emu.cpp runs them on the CPU); this
//    file holds the launchers.
//
// Note [One-pass LayerNorm backward]
// As RMSNorm's (Note [One-pass RMSNorm weight gradient], rmsnorm.cu): each block takes a fixed range
// of rows (the count depends only on rows and dim); each group of G lanes walks its rows in order,
// writes dx (the two-pass dx kernel's sums and expressions, in its order) and adds dy * xhat
// and dy of its columns into its own two rows of shared memory; the block adds its groups' rows in
// group order into its partial rows, and the final tree adds the blocks' partial rows in block
// order, dw's then db's. x and dy are read once where the two-pass form read them twice (the
// column sums re-read both and recomputed xhat): at GPT-2 d12, b32 x seq 1024 in bf16 that is 100
// MB less per LayerNorm backward (x and dy, 50 MB each), 25 of them per step. Float atomics: none.
// Shared memory: 2 x (256 / G) x dim compute-type elements (48 KiB at dim 768 in float32, G = 32).
#include <type_traits>

#include "kernels/cuda/layernorm.cuh"
#include "kernels/cuda/static_switch.h"

namespace xt {
namespace kernels {
namespace cuda {

using namespace layernorm;

namespace {

// dw's and db's partial rows (one per block, dw's then db's) added in block order by the tree.
template <typename C, typename W>
void layernorm_trees(const C* partial, int64_t nblocks, W* dw, W* db, int64_t dim, const OnStream& on) {
  const unsigned tree_blocks = static_cast<unsigned>(ceil_div(dim, rmsnorm::kFinalCols));
  for (int k = 0; k < 2; ++k) {
    rmsnorm::rmsnorm_dw_tree_kernel<C, W><<<tree_blocks, rmsnorm::kTreeThreads, rmsnorm::tree_smem<C>(), on.s>>>(
        partial + k * nblocks * dim, nblocks, k == 0 ? dw : db, dim);
    XT_LAUNCH_CHECK();
  }
}

// The wide one-pass backward (layernorm_backward_wide_kernel) for bf16 rows of 256, 512 or 768
// whose x, dy, dres and dx start at 16-byte boundaries; false (nothing launched) otherwise.
template <typename W>
bool backward_wide(const bf16_t* x, const W* w, const float* mean, const float* rstd, const bf16_t* dy,
                   const bf16_t* dres, bf16_t* dx, W* dw, W* db, int64_t rows, int64_t dim, const OnStream& on) {
  const int nc = rmsnorm::wide_chunks(dim);
  if (nc == 0 || !aligned_to(x, 16) || !aligned_to(dy, 16) || !aligned_to(dx, 16) ||
      (dres != nullptr && !aligned_to(dres, 16)))
    return false;
  const rmsnorm::OnePassPlan plan = onepass_plan<kWarp, float>(rows, dim);
  if (plan.smem == 0) return false;
  Scratch partial(plan.nblocks > 1 ? sizeof(float) * static_cast<size_t>(2 * plan.nblocks * dim) : 1, on);
  float* part = plan.nblocks > 1 ? partial.as<float>() : nullptr;
  XT_INT_SWITCH(nc, NC, (1, 2, 3), [&] {
    layernorm_backward_wide_kernel<NC, W><<<static_cast<unsigned>(plan.nblocks), kThreads, plan.smem, on.s>>>(
        x, w, mean, rstd, dy, dres, dx, dw, db, part, rows, plan.rows_per_block);
  });
  XT_LAUNCH_CHECK();
  if (plan.nblocks > 1) layernorm_trees(part, plan.nblocks, dw, db, dim, on);
  return true;
}

template <typename T, typename W>
void backward_typed(const T* x, const W* w, const compute_t<T>* mean, const compute_t<T>* rstd, const T* dy,
                    const T* dres, T* dx, W* dw, W* db, int64_t rows, int64_t dim, const OnStream& on) {
  using C = compute_t<T>;
  if constexpr (std::is_same_v<T, bf16_t>) {  // 16-byte packs where the row allows
    if (backward_wide(x, w, mean, rstd, dy, dres, dx, dw, db, rows, dim, on)) return;
  }
  bool done = false;
  with_lanes(dim, [&](auto g) {  // Note [One-pass LayerNorm backward]
    constexpr int G = decltype(g)::value;
    const rmsnorm::OnePassPlan plan = onepass_plan<G, C>(rows, dim);
    if (plan.smem == 0) return;
    const unsigned blocks = static_cast<unsigned>(plan.nblocks);
    if (plan.nblocks == 1) {
      layernorm_backward_onepass_kernel<G, T, W><<<blocks, kThreads, plan.smem, on.s>>>(
          x, w, mean, rstd, dy, dres, dx, dw, db, nullptr, rows, dim, plan.rows_per_block);
      XT_LAUNCH_CHECK();
    } else {
      Scratch partial(sizeof(C) * static_cast<size_t>(2 * plan.nblocks * dim), on);  // dw's rows, then db's
      layernorm_backward_onepass_kernel<G, T, W><<<blocks, kThreads, plan.smem, on.s>>>(
          x, w, mean, rstd, dy, dres, dx, dw, db, partial.as<C>(), rows, dim, plan.rows_per_block);
      XT_LAUNCH_CHECK();
      layernorm_trees(partial.as<C>(), plan.nblocks, dw, db, dim, on);
    }
    done = true;
  });
  if (done) return;
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
