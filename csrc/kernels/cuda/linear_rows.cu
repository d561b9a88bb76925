// CUDA linear_rows: the decode step's matrix-vector products, one warp per output column, every
// weight row read once (the kernel and Note [Matrix-vector products of the decode step] are in
// kernels/cuda/linear_rows.cuh).
//
//  - The launcher picks the 16-byte path when K is a multiple of 16 / sizeof(T) and x and every
//    weight start 16-byte aligned, and stages x in shared memory when M * K elements fit 48 KB;
//    neither choice changes a bit of the result (the kernel's note says why).
//  - Up to kRowsMaxWeights weights per launch; a longer list runs as several launches, each
//    writing its own blocks of out. Launch shapes depend only on M, K, the N's and the dtype.
#include "kernels/cuda/linear_rows.cuh"

namespace xt {
namespace kernels {
namespace cuda {

namespace {

template <bool kVec, bool kSmemX, typename T>
void launch_rows(const T* x, const rows::Weights& ws, T* out, int M, int64_t K, const OnStream& on) {
  const int64_t total = ws.col0[ws.n];
  const size_t smem = kSmemX ? static_cast<size_t>(M) * static_cast<size_t>(K) * sizeof(T) : 0;
  const auto blocks = static_cast<unsigned>(ceil_div(total, rows::kRowsWarps));
  rows::linear_rows_kernel<kVec, kSmemX, T><<<blocks, rows::kRowsThreads, smem, on.s>>>(x, ws, out, M, K);
  XT_LAUNCH_CHECK();
}

}  // namespace

void linear_rows(DType dt, const void* x, int64_t M, int64_t K, int n_w, const void* const* w, const int64_t* N,
                 void* out, void* stream) {
  XT_CHECK(M >= 1 && M <= kLinearRowsMaxRows, ValueError, "linear_rows: M must be in 1..", kLinearRowsMaxRows,
           ", got ", M);
  const OnStream on(stream);
  XT_DISPATCH_FLOAT(dt, "linear_rows", T, {
    constexpr int V = rows::chunk_elems<T>();
    const bool smem_x = static_cast<size_t>(M * K) * sizeof(T) <= rows::kRowsSmemBytes;
    T* o = static_cast<T*>(out);
    for (int i0 = 0; i0 < n_w; i0 += rows::kRowsMaxWeights) {
      rows::Weights ws{};
      ws.n = n_w - i0 < rows::kRowsMaxWeights ? n_w - i0 : rows::kRowsMaxWeights;
      bool vec = K % V == 0 && aligned_to(x, 16);
      for (int j = 0; j < ws.n; ++j) {
        ws.w[j] = w[i0 + j];
        ws.col0[j + 1] = ws.col0[j] + N[i0 + j];
        vec = vec && aligned_to(w[i0 + j], 16);
      }
      const int64_t total = ws.col0[ws.n];
      if (total > 0) {
        const T* xt = static_cast<const T*>(x);
        const int m = static_cast<int>(M);
        if (vec && smem_x) launch_rows<true, true>(xt, ws, o, m, K, on);
        else if (vec) launch_rows<true, false>(xt, ws, o, m, K, on);
        else if (smem_x) launch_rows<false, true>(xt, ws, o, m, K, on);
        else launch_rows<false, false>(xt, ws, o, m, K, on);
      }
      o += M * total;
    }
  });
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
