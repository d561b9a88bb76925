// CUDA RMSNorm over the last dim of [rows, dim]: y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps).
//
//  - G lanes per row (G = 32 for dim >= 128, fewer for short rows) for the forward and for dx; float32 compute for float32/bfloat16 (float64
//    for float64), rounded once on store; rstd is saved as float32 (the contract). Same formulas
//    as kernels/cpu/rmsnorm.cpp. w is x's dtype or float32.
//  - dx and dw are written with `=`. dw[j] = sum over rows of dy * x * rstd, deterministic, in one
//    pass over x and dy (Note [One-pass RMSNorm weight gradient]); rows too long for it use the
//    dx kernel plus column sums (row chunks summed in order into a scratch row, then the chunks in
//    chunk order).
//  - Forward with a few rows (a decode step): a block per row, all loads of a row in one memory
//    round trip, the same sums in the same order (Note [Few rows: a block per row], rmsnorm.cuh):
//    the same bits as the G-lanes-per-row kernels, which take more rows.
//  - add_rmsnorm_forward: h = x + r rounded to x's dtype, then y = rmsnorm(h) from the rounded h:
//    bitwise add + rms_norm. The backward's residual form adds dres to dx after rounding dx once,
//    in the same kernel: bitwise rms_norm's dx followed by the engine's gradient add.
//
// Note [One-pass RMSNorm weight gradient]
// The backward kernel gives each block a fixed range of rows (the count depends only on rows and
// dim); each group of G lanes walks its rows in increasing order, writes dx, and adds dy * xhat of
// its columns into its own row of shared memory; then the block adds its groups' rows in group
// order into one partial row, and a small final kernel adds the blocks' partial rows in block
// order (32 columns x 8 slices per block, slices combined in order). x and dy are read once
// (before: once for dx and once more for dw). Float atomics: none.
#include <type_traits>

#include "kernels/cuda/rmsnorm.cuh"
#include "kernels/cuda/static_switch.h"

namespace xt {
namespace kernels {
namespace cuda {

using namespace rmsnorm;

namespace {

// With xhat = x * rstd and g = dy * w:  dx = rstd * (g - xhat * mean(g * xhat)).
template <int G, typename T, typename W>
__global__ void rmsnorm_dx_kernel(const T* x, const W* w, const float* rstd, const T* dy, const T* dres, T* dx,
                                  int64_t rows, int64_t dim) {
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
    C v = rmsnorm::mul_rn(inv, g - xhat * mean_dot);
    if (dres != nullptr) v = to_compute(from_compute<T>(v)) + load(dres + r * dim, j);
    store(dxr, j, v);
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

// rms_norm (kAdd false: res and h null) and add_rms_norm forward: a block per row for a few rows
// (Note [Few rows: a block per row], rmsnorm.cuh), else a warp per wide bf16 row (Note [Wide
// RMSNorm forward]), else G lanes per row. All give the same bits for a given row.
template <bool kAdd, typename T, typename W>
void forward_typed(const T* x, const T* res, const W* w, T* h, T* y, float* rstd, int64_t rows, int64_t dim,
                   float eps, const OnStream& on) {
  const bool aligned16 =
      aligned_to(x, 16) && aligned_to(y, 16) && (!kAdd || (aligned_to(res, 16) && aligned_to(h, 16)));
  const FewRowsPlan plan = few_rows_plan<T>(rows, dim, aligned16);
  with_lanes(dim, [&](auto g) {
    constexpr int G = decltype(g)::value;
    if (plan.use) {
      const unsigned blocks = static_cast<unsigned>(rows);
      XT_BOOL_SWITCH(plan.vec, kVec, [&] {
        rmsnorm_rows_kernel<G, kAdd, kVec, T, W><<<blocks, plan.threads, plan.smem, on.s>>>(x, res, w, h, y, rstd,
                                                                                           dim, eps);
      });
    } else if (const int nc = wide_forward_chunks<T>(dim); nc > 0) {  // Note [Wide RMSNorm forward]
      if constexpr (std::is_same_v<T, bf16_t>) {
        const unsigned blocks = static_cast<unsigned>(ceil_div(rows, int64_t(kThreads / kWarp)));
        XT_INT_SWITCH(nc, NC, (1, 2, 3, 4, 8), [&] {
          XT_BOOL_SWITCH(aligned16, kAligned, [&] {
            rmsnorm_forward_wide_kernel<NC, kAdd, kAligned, W><<<blocks, kThreads, 0, on.s>>>(x, res, w, h, y, rstd,
                                                                                              rows, eps);
          });
        });
      }
    } else {
      const unsigned blocks = static_cast<unsigned>(ceil_div(rows, rows_per_block<G>()));
      if constexpr (kAdd)
        add_rmsnorm_forward_kernel<G, T, W><<<blocks, kThreads, 0, on.s>>>(x, res, w, h, y, rstd, rows, dim, eps);
      else
        rmsnorm_forward_kernel<G, T, W><<<blocks, kThreads, 0, on.s>>>(x, w, y, rstd, rows, dim, eps);
    }
    XT_LAUNCH_CHECK();
  });
}

// A one-pass backward over plan's blocks: launch(partial) runs the row kernel (partial null when
// one block writes dw itself), then with more than one block the dw tree sums the partial rows.
template <typename C, typename W, typename Launch>
void onepass_with_tree(const OnePassPlan& plan, W* dw, int64_t dim, const OnStream& on, Launch&& launch) {
  if (plan.nblocks == 1) {
    launch(static_cast<C*>(nullptr));
    return;
  }
  Scratch partial(sizeof(C) * static_cast<size_t>(plan.nblocks * dim), on);
  launch(partial.as<C>());
  rmsnorm_dw_tree_kernel<C, W><<<static_cast<unsigned>(ceil_div(dim, kFinalCols)), kTreeThreads, tree_smem<C>(), on.s>>>(
      partial.as<C>(), plan.nblocks, dw, dim);
  XT_LAUNCH_CHECK();
}

// The wide backward for bf16 rows of 256, 512 or 768 (Note [Wide RMSNorm backward]) or 1024 and
// 2048 (Note [Wide RMSNorm backward, long rows]) whose x, dy, dres and dx start at 16-byte
// boundaries; false (nothing launched) otherwise.
template <typename W>
bool backward_wide(const bf16_t* x, const W* w, const float* rstd, const bf16_t* dy, const bf16_t* dres, bf16_t* dx,
                   W* dw, int64_t rows, int64_t dim, const OnStream& on) {
  const int nc = wide_chunks(dim), nc_long = wide_long_chunks(dim);
  if ((nc == 0 && nc_long == 0) || !aligned_to(x, 16) || !aligned_to(dy, 16) || !aligned_to(dx, 16) ||
      (dres != nullptr && !aligned_to(dres, 16)))
    return false;
  if (nc_long > 0) {
    constexpr size_t kMaxSmem = wide_long_smem(kWideLongMaxChunks);
    const OnePassPlan plan = onepass_plan<kWarp, float>(rows, dim, kMaxSmem);
    const size_t smem = wide_long_smem(nc_long);
    onepass_with_tree<float>(plan, dw, dim, on, [&](float* part) {
      XT_INT_SWITCH(nc_long, NC, (4, 8), [&] {
        allow_smem<rmsnorm_backward_wide_long_kernel<NC, W>>(static_cast<int>(kMaxSmem), on.device);
        rmsnorm_backward_wide_long_kernel<NC, W><<<static_cast<unsigned>(plan.nblocks), kThreads, smem, on.s>>>(
            x, w, rstd, dy, dres, dx, dw, part, rows, plan.rows_per_block);
      });
      XT_LAUNCH_CHECK();
    });
    return true;
  }
  const OnePassPlan plan = onepass_plan<kWarp, float>(rows, dim);
  if (plan.smem == 0) return false;
  onepass_with_tree<float>(plan, dw, dim, on, [&](float* part) {
    XT_INT_SWITCH(nc, NC, (1, 2, 3), [&] {
      rmsnorm_backward_wide_kernel<NC, W><<<static_cast<unsigned>(plan.nblocks), kThreads, plan.smem, on.s>>>(
          x, w, rstd, dy, dres, dx, dw, part, rows, plan.rows_per_block);
    });
    XT_LAUNCH_CHECK();
  });
  return true;
}

template <typename T, typename W>
void backward_typed(const T* x, const W* w, const float* rstd, const T* dy, const T* dres, T* dx, W* dw, int64_t rows,
                    int64_t dim, const OnStream& on) {
  using C = compute_t<T>;
  if constexpr (std::is_same_v<T, bf16_t>) {  // Note [Wide RMSNorm backward] (rmsnorm.cuh)
    if (backward_wide(x, w, rstd, dy, dres, dx, dw, rows, dim, on)) return;
  }
  bool done = false;
  with_lanes(dim, [&](auto g) {
    constexpr int G = decltype(g)::value;
    const OnePassPlan plan = onepass_plan<G, C>(rows, dim);
    if (plan.smem == 0) return;
    onepass_with_tree<C>(plan, dw, dim, on, [&](C* partial) {
      rmsnorm_backward_onepass_kernel<G, T, W><<<static_cast<unsigned>(plan.nblocks), kThreads, plan.smem, on.s>>>(
          x, w, rstd, dy, dres, dx, dw, partial, rows, dim, plan.rows_per_block);
      XT_LAUNCH_CHECK();
    });
    done = true;
  });
  if (done) return;
  with_lanes(dim, [&](auto g) {
    constexpr int G = decltype(g)::value;
    rmsnorm_dx_kernel<G, T, W><<<static_cast<unsigned>(ceil_div(rows, rows_per_block<G>())), kThreads, 0, on.s>>>(
        x, w, rstd, dy, dres, dx, rows, dim);
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

// rmsnorm_forward and add_rmsnorm_forward (kAdd false: res and h null); op names the caller.
template <bool kAdd>
void forward_any(const char* op, DType dt, DType w_dt, const void* x, const void* res, const void* w, void* h,
                 void* y, float* rstd, int64_t rows, int64_t dim, float eps, void* stream) {
  XT_ASSERT(w_dt == dt || w_dt == DType::Float32, op, ": w dtype ", dtype_name(w_dt));
  if (rows == 0) return;
  OnStream on(stream);
  XT_DISPATCH_FLOAT(dt, op, T, {
    if (w_dt == DType::Float32)
      forward_typed<kAdd>(static_cast<const T*>(x), static_cast<const T*>(res), static_cast<const float*>(w),
                          static_cast<T*>(h), static_cast<T*>(y), rstd, rows, dim, eps, on);
    else
      forward_typed<kAdd>(static_cast<const T*>(x), static_cast<const T*>(res), static_cast<const T*>(w),
                          static_cast<T*>(h), static_cast<T*>(y), rstd, rows, dim, eps, on);
  });
}

}  // namespace

void rmsnorm_forward(DType dt, DType w_dt, const void* x, const void* w, void* y, float* rstd, int64_t rows,
                     int64_t dim, float eps, void* stream) {
  forward_any<false>("rmsnorm_forward", dt, w_dt, x, nullptr, w, nullptr, y, rstd, rows, dim, eps, stream);
}

namespace {

// rmsnorm_backward and add_rmsnorm_backward (dres null for the former).
void backward_any(DType dt, DType w_dt, const void* x, const void* w, const float* rstd, const void* dy,
                  const void* dres, void* dx, void* dw, int64_t rows, int64_t dim, void* stream) {
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
                     static_cast<const T*>(dres), static_cast<T*>(dx), static_cast<float*>(dw), rows, dim, on);
    else
      backward_typed(static_cast<const T*>(x), static_cast<const T*>(w), rstd, static_cast<const T*>(dy),
                     static_cast<const T*>(dres), static_cast<T*>(dx), static_cast<T*>(dw), rows, dim, on);
  });
}

}  // namespace

void rmsnorm_backward(DType dt, DType w_dt, const void* x, const void* w, const float* rstd, const void* dy, void* dx,
                      void* dw, int64_t rows, int64_t dim, void* stream) {
  backward_any(dt, w_dt, x, w, rstd, dy, nullptr, dx, dw, rows, dim, stream);
}

void add_rmsnorm_backward(DType dt, DType w_dt, const void* h, const void* w, const float* rstd, const void* dy,
                          const void* dres, void* dx, void* dw, int64_t rows, int64_t dim, void* stream) {
  XT_ASSERT(dres != nullptr, "add_rmsnorm_backward: dres is required");
  backward_any(dt, w_dt, h, w, rstd, dy, dres, dx, dw, rows, dim, stream);
}

void add_rmsnorm_forward(DType dt, DType w_dt, const void* x, const void* res, const void* w, void* h, void* y,
                         float* rstd, int64_t rows, int64_t dim, float eps, void* stream) {
  forward_any<true>("add_rmsnorm_forward", dt, w_dt, x, res, w, h, y, rstd, rows, dim, eps, stream);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
