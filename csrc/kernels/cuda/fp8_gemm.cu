// The FP8 GEMM through cuBLASLt: row-major C [M, N] = (A [M, K] * a_scale) . (B [N, K] * b_scale)^T,
// A and B FP8 codes (E4M3 or E5M2, not both E5M2), both K-major, C bf16 or float32.
//
// cuBLASLt is column-major: C^T (N x M, ld N) = B'^T . A', with B' the row-major B read as the
// column-major K x N matrix (ld K) and A' likewise K x M. So cuBLASLt's A is our B (TRANSA = T)
// and its B our A (TRANSB = N): the "TN" layout Hopper's FP8 kernels require. The dequantisation
// factors are cuBLASLt's A/B scale pointers (device floats: the cast kernels wrote them, no host
// sync), applied to the float32 accumulator: D = scale_a * scale_b * (A . B), rounded once to C's
// dtype. Powers of two (Note [FP8 scaling]), so the scaling itself is exact. With accumulate, C is
// also cuBLASLt's C (beta = 1): D = scale_a * scale_b * (A . B) + C, rounded once.
//
// Accumulation: the forward GEMM runs with CUBLASLT_MATMUL_DESC_FAST_ACCUM on (TransformerEngine's
// and torchao's forward default: the tensor cores' own accumulator, not promoted to float32 every
// few k-steps), the gradient GEMMs with it off (promoted: the more accurate form for the long
// reductions of dgrad and wgrad), as both libraries do.
// Determinism, as gemm_lt.cu's Note [cuBLASLt epilogues: exact and deterministic]: the algorithm
// is the first answer of cublasLtMatmulAlgoGetHeuristic for the query (types, sizes, fast
// accumulation, workspace, alignments), cached per query for the process, never a timed search;
// split-K only with the float32 workspace reduction (CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
// the thread's cuBLAS workspace on its stream (gemm.cu's cublaslt_workspace).
#include <map>
#include <mutex>
#include <tuple>

#include <cublasLt.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/lt.cuh"
#include "kernels/fp8_math.h"

namespace xt {
namespace kernels {
namespace cuda {

namespace {

using Fp8Query = std::tuple<int, int, int, int64_t, int64_t, int64_t, int, bool, size_t, uint32_t, uint32_t, uint32_t>;

std::mutex g_fp8_cache_mutex;
std::map<Fp8Query, LtChoice>& fp8_cache() {
  static std::map<Fp8Query, LtChoice> cache;
  return cache;
}

cudaDataType_t fp8_type(Fp8Format f) { return f == Fp8Format::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }

}  // namespace

void fp8_gemm(Fp8Format fa, Fp8Format fb, int64_t M, int64_t N, int64_t K, const uint8_t* A, const float* a_meta,
              const uint8_t* B, const float* b_meta, DType c_dt, void* C, bool accumulate, bool fast_accum,
              void* stream) {
  XT_CHECK(!(fa == Fp8Format::E5M2 && fb == Fp8Format::E5M2), ValueError,
           "fp8_gemm: cuBLASLt has no E5M2 x E5M2 GEMM");
  XT_CHECK(M > 0 && N > 0 && K > 0 && M % 16 == 0 && N % 16 == 0 && K % 16 == 0, ValueError,
           "fp8_gemm: M, N, K must be positive multiples of 16, got M=", M, " N=", N, " K=", K);
  XT_CHECK(M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX, ValueError, "fp8_gemm: sizes must fit in int32");
  // cuBLASLt runs FP8 only with 16-byte aligned scale pointers (Note at kFp8MetaScale, fp8_math.h)
  XT_CHECK(aligned_to(a_meta + kFp8MetaScale, 16) && aligned_to(b_meta + kFp8MetaScale, 16), ValueError,
           "fp8_gemm: the operands' scales must be 16-byte aligned");
  cudaDataType_t c_type;
  if (c_dt == DType::BFloat16) c_type = CUDA_R_16BF;
  else if (c_dt == DType::Float32) c_type = CUDA_R_32F;
  else throw TypeError(str("fp8_gemm: the output must be bfloat16 or float32, got ", dtype_name(c_dt)));

  OnStream on(stream);
  const LtWorkspace ws = cublaslt_workspace(on);
  const uint32_t al_a = lt_alignment(A), al_b = lt_alignment(B), al_c = lt_alignment(C);
  const Fp8Query query{on.device, static_cast<int>(fa), static_cast<int>(fb), M, N, K, static_cast<int>(c_dt),
                       fast_accum, ws.bytes, al_a, al_b, al_c};

  LtDescs d;
  XT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  lt_set(d.op, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  lt_set(d.op, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  lt_set(d.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, static_cast<int8_t>(fast_accum ? 1 : 0));
  // cuBLASLt's A is our B, its B our A (see the header)
  lt_set(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, b_meta + kFp8MetaScale);
  lt_set(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, a_meta + kFp8MetaScale);
  XT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, fp8_type(fb), K, N, K));
  XT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.b, fp8_type(fa), K, M, K));
  XT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, c_type, N, M, N));

  // cuBLASLt's A is our B, its B our A
  const LtChoice choice = lt_choose(fp8_cache(), g_fp8_cache_mutex, query, d, ws, al_b, al_a, al_c);
  XT_CHECK(choice.found, RuntimeError, "fp8_gemm: cuBLASLt has no FP8 algorithm for M=", M, " N=", N, " K=", K,
           " (", fp8_format_name(fa), " x ", fp8_format_name(fb), " -> ", dtype_name(c_dt),
           "); FP8 GEMMs need an sm_89+ GPU");
  // accumulate: D = product + C in the float32 epilogue, rounded once, C == D in place (the same
  // algorithm as with beta = 0: the heuristic's query does not include beta)
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  XT_CUBLAS_CHECK(cublasLtMatmul(ws.handle, d.op, &alpha, B, d.a, A, d.b, &beta, C, d.c, C, d.c, &choice.algo, ws.ptr,
                                 ws.bytes, on.s));
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
