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

#include <type_traits>

#include "kernels/cuda/static_switch.h"

namespace xt {
namespace kernels {
namespace cuda {

namespace {

template <bool kVec, bool kSmemX, typename T>
void launch_rows(const T* x, const rows::Weights& ws, T* out, int M, int64_t K, const OnStream& on) {
  const int64_t total = ws.col0[ws.n];
  const size_t smem = kSmemX ? static_cast<size_t>(M) * static_cast<size_t>(K) * sizeof(T) : 0;
  const auto blocks = static_cast<unsigned>(ceil_div(total, rows::kRowsWarps));
  launch_early(M == 1 ? rows::linear_rows_kernel<kVec, kSmemX, 1, T> : rows::linear_rows_kernel<kVec, kSmemX, rows::kMaxRows, T>,
               blocks, rows::kRowsThreads, smem, on, x, ws, out, M, K);
}

template <bool kVec, bool kGlu, typename T>
void launch_norm_rows(const T* x, const rows::RowsNorm& nm, const rows::Weights& ws, T* out, int M, int64_t K,
                      const OnStream& on) {
  const int64_t cols = kGlu ? ws.col0[1] : ws.col0[ws.n];
  const size_t smem = norm_rows_smem_bytes(sizeof(T), sizeof(compute_t<T>), M, K);
  // one block even without columns: block 0 writes h
  const auto blocks = static_cast<unsigned>(cols > 0 ? ceil_div(cols, rows::kRowsWarps) : 1);
  launch_early(M == 1 ? rows::norm_linear_rows_kernel<kVec, kGlu, 1, T> : rows::norm_linear_rows_kernel<kVec, kGlu, rows::kMaxRows, T>,
               blocks, rows::kRowsThreads, smem, on, x, nm, ws, out, M, K);
}

// Note [A lone row's norm in registers] (linear_rows.cuh): M = 1, a wide bf16 row, the 16-byte
// path. Returns false (nothing launched) where it does not apply.
template <bool kGlu, typename T>
bool launch_norm_row_in_registers(const T* x, const rows::RowsNorm& nm, const rows::Weights& ws, T* out, int M,
                                  int64_t K, const OnStream& on) {
  if constexpr (!std::is_same_v<T, bf16_t>) {
    return false;
  } else {
    const int nc = M == 1 ? rmsnorm::wide_forward_chunks<bf16_t>(K) : 0;  // K = 256 * nc
    if (nc == 0 || nc > rmsnorm::kWideFwdRegisterChunks || nm.G != kWarp || !aligned_to(nm.w, 16)) return false;
    const int64_t cols = kGlu ? ws.col0[1] : ws.col0[ws.n];
    const auto blocks = static_cast<unsigned>(cols > 0 ? ceil_div(cols, rows::kRowsWarps) : 1);
    XT_INT_SWITCH(nc, NC, (1, 2, 3, 4), [&] {
      XT_BOOL_SWITCH(nm.w_f32, kWF32, [&] {
        XT_BOOL_SWITCH(nm.res != nullptr, kRes, [&] {
          using W = std::conditional_t<kWF32, float, bf16_t>;
          launch_early(rows::norm_linear_row_kernel<NC, kGlu, kRes, W>, blocks, rows::kRowsThreads, 0, on, x, nm, ws,
                       out);
        });
      });
    });
    return true;
  }
}

}  // namespace

// The norm fused into the products (Note [The decode step's norm fused into its matrix-vector
// product], linear_rows.cuh). The 16-byte path needs K % V == 0 and x, res, h and the weights at
// 16-byte boundaries; like linear_rows' paths it changes no bit. A list of more than
// kRowsMaxWeights weights runs as several launches that each redo the norm (only the first
// writes h).
void rms_norm_linear_rows(DType dt, DType w_dt, const void* x, const void* res, const void* norm_w, void* h,
                          float eps, int64_t M, int64_t K, int n_w, const void* const* w, const int64_t* N, bool glu,
                          void* out, void* stream) {
  XT_CHECK(M >= 1 && M <= kLinearRowsMaxRows, ValueError, "rms_norm_linear_rows: M must be in 1..",
           kLinearRowsMaxRows, ", got ", M);
  XT_CHECK(w_dt == dt || w_dt == DType::Float32, TypeError,
           "rms_norm_linear_rows: the norm weight must be float32 or x's dtype");
  XT_CHECK(!glu || (n_w == 2 && N[0] == N[1]), ValueError,
           "rms_norm_linear_rows: swiglu takes two weights of one shape (gate, up)");
  const OnStream on(stream);
  XT_DISPATCH_FLOAT(dt, "rms_norm_linear_rows", T, {
    constexpr int V = rows::chunk_elems<T>();
    XT_CHECK(norm_rows_smem_bytes(sizeof(T), sizeof(compute_t<T>), M, K) <= kNormRowsSmemMax, ValueError,
             "rms_norm_linear_rows: ", M, " rows of ", K, " elements exceed the kernel's shared memory");
    const bool io_vec = K % V == 0 && aligned_to(x, 16) && (res == nullptr || (aligned_to(res, 16) && aligned_to(h, 16)));
    rows::RowsNorm nm{res, norm_w, nullptr, eps, lanes_for(K), w_dt == DType::Float32};
    T* o = static_cast<T*>(out);
    for (int i0 = 0; i0 < n_w; i0 += rows::kRowsMaxWeights) {
      rows::Weights ws{};
      ws.n = n_w - i0 < rows::kRowsMaxWeights ? n_w - i0 : rows::kRowsMaxWeights;
      bool vec = io_vec;
      for (int j = 0; j < ws.n; ++j) {
        ws.w[j] = w[i0 + j];
        ws.col0[j + 1] = ws.col0[j] + N[i0 + j];
        vec = vec && aligned_to(w[i0 + j], 16);
      }
      nm.h = i0 == 0 && res != nullptr ? h : nullptr;
      const int64_t cols = glu ? ws.col0[1] : ws.col0[ws.n];
      if (cols > 0 || nm.h != nullptr) {
        const T* xt = static_cast<const T*>(x);
        const int m = static_cast<int>(M);
        XT_BOOL_SWITCH(glu, kGlu, [&] {
          if (vec && launch_norm_row_in_registers<kGlu>(xt, nm, ws, o, m, K, on)) return;  // the lone row's norm
          XT_BOOL_SWITCH(vec, kVec, [&] { launch_norm_rows<kVec, kGlu>(xt, nm, ws, o, m, K, on); });
        });
      }
      o += M * cols;
    }
  });
}

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
        XT_BOOL_SWITCH(vec, kVec, [&] {
          XT_BOOL_SWITCH(smem_x, kSmemX, [&] { launch_rows<kVec, kSmemX>(xt, ws, o, m, K, on); });
        });
      }
      o += M * total;
    }
  });
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
