// CPU GEMM through OpenBLAS (the scipy-openblas32 wheel: symbols carry a `scipy_` prefix).
//
// C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b], row-major, one BLAS call per batch entry.
// float32 runs sgemm, float64 runs dgemm. bfloat16 inputs are widened to float32, multiplied by
// sgemm with float32 accumulation, and rounded to C's dtype once. C's dtype may differ from the
// inputs' (a bf16 weight-gradient GEMM writing float32). With beta != 0, C is read (`+=`-style
// accumulation is the caller's choice); with beta == 0 it is written with `=` and never read.
// OpenBLAS splits work over output tiles, never over K, so results are deterministic.
#include <cblas.h>

#include <type_traits>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/kernels.h"

namespace xt {
namespace kernels {
namespace cpu {

namespace {

// One GEMM in the compute type F (float or double) on contiguous F buffers.
template <typename F>
void blas_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, F alpha, const F* A, const F* B, F beta, F* C) {
  const blasint lda = static_cast<blasint>(ta ? M : K), ldb = static_cast<blasint>(tb ? K : N);
  const blasint ldc = static_cast<blasint>(N);
  const CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
  const blasint m = static_cast<blasint>(M), n = static_cast<blasint>(N), k = static_cast<blasint>(K);
  if constexpr (std::is_same_v<F, float>) {
    scipy_cblas_sgemm(CblasRowMajor, opa, opb, m, n, k, alpha, A, lda > 0 ? lda : 1, B, ldb > 0 ? ldb : 1, beta, C,
                      ldc > 0 ? ldc : 1);
  } else {
    scipy_cblas_dgemm(CblasRowMajor, opa, opb, m, n, k, alpha, A, lda > 0 ? lda : 1, B, ldb > 0 ? ldb : 1, beta, C,
                      ldc > 0 ? ldc : 1);
  }
}

// View `n` elements of `src` (dtype dt) as F: the pointer itself when dt already is F,
// otherwise a widened copy in `buf`.
template <typename F>
const F* as_compute(DType dt, const void* src, int64_t n, std::vector<F>& buf) {
  const bool same = std::is_same_v<F, float> ? dt == DType::Float32 : dt == DType::Float64;
  if (same) return static_cast<const F*>(src);
  buf.resize(static_cast<size_t>(n));
  dispatch_float(dt, "gemm", [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* p = static_cast<const T*>(src);
    for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<F>(load(p, i));
  });
  return buf.data();
}

template <typename F>
void gemm_impl(DType ab_dt, DType c_dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
               const void* A, const void* B, float beta, void* C, int64_t batch, int64_t strideA, int64_t strideB,
               int64_t strideC) {
  const size_t ab = dtype_size(ab_dt), cb = dtype_size(c_dt);
  const bool c_native = std::is_same_v<F, float> ? c_dt == DType::Float32 : c_dt == DType::Float64;
  std::vector<F> abuf, bbuf, cbuf;
  for (int64_t b = 0; b < batch; ++b) {
    const F* a = as_compute<F>(ab_dt, static_cast<const char*>(A) + b * strideA * ab, M * K, abuf);
    const F* bm = as_compute<F>(ab_dt, static_cast<const char*>(B) + b * strideB * ab, K * N, bbuf);
    void* cptr = static_cast<char*>(C) + b * strideC * cb;
    if (c_native) {
      blas_gemm<F>(ta, tb, M, N, K, alpha, a, bm, beta, static_cast<F*>(cptr));
      continue;
    }
    // C in another dtype: compute into an F buffer (reading C only when beta != 0), round once.
    if (beta != 0.0f) {
      as_compute<F>(c_dt, cptr, M * N, cbuf);
    } else {
      cbuf.assign(static_cast<size_t>(M * N), F(0));
    }
    blas_gemm<F>(ta, tb, M, N, K, alpha, a, bm, beta, cbuf.data());
    dispatch_float(c_dt, "gemm", [&](auto tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      T* p = static_cast<T*>(cptr);
      for (int64_t i = 0; i < M * N; ++i) store(p, i, static_cast<compute_t<T>>(cbuf[i]));
    });
  }
}

// K == 0: op(A) @ op(B) is all zeros, so C = beta * C (BLAS would not be called with K = 0).
void scale_c(DType c_dt, float beta, void* C, int64_t M, int64_t N, int64_t batch, int64_t strideC) {
  dispatch_float(c_dt, "gemm", [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using Cm = compute_t<T>;
    for (int64_t b = 0; b < batch; ++b) {
      T* p = static_cast<T*>(C) + b * strideC;
      for (int64_t i = 0; i < M * N; ++i) store(p, i, beta == 0.0f ? Cm(0) : static_cast<Cm>(beta) * load(p, i));
    }
  });
}

}  // namespace

void gemm(DType ab_dt, DType c_dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
          const void* B, float beta, void* C, int64_t batch, int64_t strideA, int64_t strideB, int64_t strideC,
          void*) {
  XT_CHECK(is_floating(ab_dt) && is_floating(c_dt), TypeError, "gemm: floating dtypes required, got ",
           dtype_name(ab_dt), " inputs and ", dtype_name(c_dt), " output");
  constexpr int64_t kBlasMax = 0x7fffffff;  // blasint is 32-bit in scipy-openblas32
  XT_CHECK(M <= kBlasMax && N <= kBlasMax && K <= kBlasMax, ValueError, "gemm: dimensions M=", M, " N=", N, " K=",
           K, " exceed the 32-bit BLAS limit");
  if (M == 0 || N == 0 || batch == 0) return;
  if (K == 0) {
    scale_c(c_dt, beta, C, M, N, batch, strideC);
    return;
  }
  if (ab_dt == DType::Float64) {
    gemm_impl<double>(ab_dt, c_dt, ta, tb, M, N, K, alpha, A, B, beta, C, batch, strideA, strideB, strideC);
  } else {
    gemm_impl<float>(ab_dt, c_dt, ta, tb, M, N, K, alpha, A, B, beta, C, batch, strideA, strideB, strideC);
  }
}

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
