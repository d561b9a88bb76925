// CPU GEMM through OpenBLAS (the scipy-openblas32 wheel: symbols carry a `scipy_` prefix).
//
// C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b], row-major, one BLAS call per batch entry.
// float32 runs sgemm, float64 runs dgemm. bfloat16 inputs are widened to float32, multiplied by
// sgemm with float32 accumulation, and rounded to C's dtype once. C's dtype may differ from the
// inputs' (a bf16 weight-gradient GEMM writing float32). With beta != 0, C is read (`+=`-style
// accumulation is the caller's choice); with beta == 0 it is written with `=` and never read.
// OpenBLAS splits work over output tiles, never over K, so results are deterministic.
// Leading dimensions (gemm_ld): a float32/float64 operand goes to BLAS in place with its ld; a
// widened operand (bf16) or a C of another dtype is packed into a contiguous buffer first, so a
// strided call makes exactly the BLAS call the packed one makes (same bits).
#include <cblas.h>

#include <type_traits>
#include <vector>

#include "kernels/common.h"
#include "kernels/kernels.h"

namespace xt {
namespace kernels {
namespace cpu {

namespace {

// One GEMM in the compute type F (float or double) on F buffers with row strides lda/ldb/ldc.
template <typename F>
void blas_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, F alpha, const F* A, int64_t lda, const F* B,
               int64_t ldb, F beta, F* C, int64_t ldc) {
  const blasint la = static_cast<blasint>(lda), lb = static_cast<blasint>(ldb), lc = static_cast<blasint>(ldc);
  const CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
  const blasint m = static_cast<blasint>(M), n = static_cast<blasint>(N), k = static_cast<blasint>(K);
  if constexpr (std::is_same_v<F, float>) {
    scipy_cblas_sgemm(CblasRowMajor, opa, opb, m, n, k, alpha, A, la > 0 ? la : 1, B, lb > 0 ? lb : 1, beta, C,
                      lc > 0 ? lc : 1);
  } else {
    scipy_cblas_dgemm(CblasRowMajor, opa, opb, m, n, k, alpha, A, la > 0 ? la : 1, B, lb > 0 ? lb : 1, beta, C,
                      lc > 0 ? lc : 1);
  }
}

// An operand as BLAS sees it: a pointer and its row stride.
template <typename F>
struct Operand {
  const F* p;
  int64_t ld;
};

// View the rows x cols matrix `src` (dtype dt, row stride ld) as F: the pointer itself with its
// ld when dt already is F, otherwise a widened packed copy in `buf` (row stride cols).
template <typename F>
Operand<F> as_compute(DType dt, const void* src, int64_t rows, int64_t cols, int64_t ld, std::vector<F>& buf) {
  const bool same = std::is_same_v<F, float> ? dt == DType::Float32 : dt == DType::Float64;
  if (same) return {static_cast<const F*>(src), ld};
  buf.resize(static_cast<size_t>(rows * cols));
  XT_DISPATCH_FLOAT(dt, "gemm", T, {
    const T* p = static_cast<const T*>(src);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) buf[r * cols + c] = static_cast<F>(load(p, r * ld + c));
  });
  return {buf.data(), cols};
}

template <typename F>
void gemm_impl(DType ab_dt, DType c_dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
               const void* A, int64_t lda, const void* B, int64_t ldb, float beta, void* C, int64_t ldc,
               int64_t batch, int64_t strideA, int64_t strideB, int64_t strideC) {
  const size_t ab = dtype_size(ab_dt), cb = dtype_size(c_dt);
  const bool c_native = std::is_same_v<F, float> ? c_dt == DType::Float32 : c_dt == DType::Float64;
  const int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
  std::vector<F> abuf, bbuf, cbuf;
  for (int64_t b = 0; b < batch; ++b) {
    const Operand<F> a =
        as_compute<F>(ab_dt, static_cast<const char*>(A) + b * strideA * ab, a_rows, a_cols, lda, abuf);
    const Operand<F> bm =
        as_compute<F>(ab_dt, static_cast<const char*>(B) + b * strideB * ab, b_rows, b_cols, ldb, bbuf);
    void* cptr = static_cast<char*>(C) + b * strideC * cb;
    if (c_native) {
      blas_gemm<F>(ta, tb, M, N, K, alpha, a.p, a.ld, bm.p, bm.ld, beta, static_cast<F*>(cptr), ldc);
      continue;
    }
    // C in another dtype: compute into a packed F buffer (reading C only when beta != 0), round once.
    if (beta != 0.0f) {
      as_compute<F>(c_dt, cptr, M, N, ldc, cbuf);  // c_dt is not F: a packed widened copy in cbuf
    } else {
      cbuf.assign(static_cast<size_t>(M * N), F(0));
    }
    blas_gemm<F>(ta, tb, M, N, K, alpha, a.p, a.ld, bm.p, bm.ld, beta, cbuf.data(), N);
    XT_DISPATCH_FLOAT(c_dt, "gemm", T, {
      T* p = static_cast<T*>(cptr);
      for (int64_t r = 0; r < M; ++r)
        for (int64_t c = 0; c < N; ++c) store(p, r * ldc + c, static_cast<compute_t<T>>(cbuf[r * N + c]));
    });
  }
}

// K == 0: op(A) @ op(B) is all zeros, so C = beta * C (BLAS would not be called with K = 0).
void scale_c(DType c_dt, float beta, void* C, int64_t M, int64_t N, int64_t ldc, int64_t batch, int64_t strideC) {
  XT_DISPATCH_FLOAT(c_dt, "gemm", T, {
    using Cm = compute_t<T>;
    for (int64_t b = 0; b < batch; ++b) {
      T* p = static_cast<T*>(C) + b * strideC;
      for (int64_t r = 0; r < M; ++r)
        for (int64_t c = 0; c < N; ++c) {
          const int64_t i = r * ldc + c;
          store(p, i, beta == 0.0f ? Cm(0) : static_cast<Cm>(beta) * load(p, i));
        }
    }
  });
}

}  // namespace

void gemm_ld(DType ab_dt, DType c_dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
             int64_t lda, const void* B, int64_t ldb, float beta, void* C, int64_t ldc, int64_t batch,
             int64_t strideA, int64_t strideB, int64_t strideC, void*) {
  XT_CHECK(is_floating(ab_dt) && is_floating(c_dt), TypeError, "gemm: floating dtypes required, got ",
           dtype_name(ab_dt), " inputs and ", dtype_name(c_dt), " output");
  constexpr int64_t kBlasMax = 0x7fffffff;  // blasint is 32-bit in scipy-openblas32
  XT_CHECK(M <= kBlasMax && N <= kBlasMax && K <= kBlasMax && lda <= kBlasMax && ldb <= kBlasMax &&
               ldc <= kBlasMax,
           ValueError, "gemm: dimensions M=", M, " N=", N, " K=", K, " (lda=", lda, " ldb=", ldb, " ldc=", ldc,
           ") exceed the 32-bit BLAS limit");
  XT_CHECK(lda >= (ta ? M : K) && ldb >= (tb ? K : N) && ldc >= N, ValueError, "gemm: leading dimensions lda=", lda,
           " ldb=", ldb, " ldc=", ldc, " are smaller than the stored widths ", (ta ? M : K), ", ", (tb ? K : N),
           ", ", N, " (M=", M, " N=", N, " K=", K, ")");
  if (M == 0 || N == 0 || batch == 0) return;
  if (K == 0) {
    scale_c(c_dt, beta, C, M, N, ldc, batch, strideC);
    return;
  }
  if (ab_dt == DType::Float64) {
    gemm_impl<double>(ab_dt, c_dt, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, batch, strideA, strideB,
                      strideC);
  } else {
    gemm_impl<float>(ab_dt, c_dt, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, batch, strideA, strideB,
                     strideC);
  }
}

void gemm(DType ab_dt, DType c_dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
          const void* B, float beta, void* C, int64_t batch, int64_t strideA, int64_t strideB, int64_t strideC,
          void* stream) {
  gemm_ld(ab_dt, c_dt, ta, tb, M, N, K, alpha, A, ta ? M : K, B, tb ? K : N, beta, C, N, batch, strideA,
          strideB, strideC, stream);
}

int num_threads() { return scipy_openblas_get_num_threads(); }

void set_num_threads(int n) { scipy_openblas_set_num_threads(n); }

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
