// CUDA GEMMs with a fused epilogue through cuBLASLt (the biased linears of GPT-2 and its MLP):
// row-major C = epilogue(op(A) @ op(B)), C [M, N], as gemm.cu's GEMMs (the same column-major swap:
// cuBLASLt's A is our B, its B our A, m = N, n = M), with
//   Bias:        C = A @ B + bias[N]
//   GeluAuxBias: aux = A @ B + bias[N];  C = gelu_tanh(aux)     (aux [M, N], C's dtype and ld)
//   DGelu:       C = (A @ B) * gelu_tanh'(aux)                  (aux read: the forward's pre-activation)
// The bias is added to the float32 accumulator and C rounded once (the unfused forms round the GEMM
// output, then the sum, then GELU's output). bf16 inputs and outputs (float32 compute), or float32
// (true fp32, TF32 when allow_tf32()); bias in C's dtype. Bias also strided-batched (linear_multi_bias's
// q/k/v: one call for the three projections, the input shared with batch stride 0).
//
// Note [cuBLASLt epilogues: exact and deterministic]
// What cuBLAS documents, and how this file keeps to it:
//  - Reproducibility: cuBLAS's routines give the same bits run after run on GPUs of the same
//    architecture and SM count with one toolkit version, for a given algorithm; with concurrent
//    streams that holds for cublasLtMatmul given a workspace of the caller's own (the workspace
//    here is the thread's cuBLAS workspace on its stream, gemm.cu). So the algorithm must be a
//    function of the call: it is the first result of cublasLtMatmulAlgoGetHeuristic for the query
//    (types, transposes, sizes, batch strides, epilogue, workspace limit, and the operands'
//    alignments, capped at 256 bytes and taken over a batch's every entry: the allocator's blocks
//    and the store's views are aligned alike in every run, so the same program asks the same
//    query), cached per query for the process. Never a timed search.
//  - Split-K: the reduction scheme mask allows only CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE, whose
//    partial products are float32 in the workspace, reduced in a separate step in a fixed order
//    (no atomics). Not INPLACE and not OUTPUT_TYPE: both add partial sums in C's type (bf16),
//    which the cublasGemmEx path forbids too (CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION).
//  - The epilogues used are pointwise on the accumulator tile (BIAS, GELU_AUX_BIAS, DGELU), so they
//    add no reduction of their own. The bias-gradient epilogues (BGRADA/B, DGELU_BGRAD) reduce
//    across the rows of a tile grid in an order cuBLAS does not document; the ops compute bias
//    gradients with their own ordered column sums (ops::sum_to) instead (as llm.c does too).
//  - GELU is the tanh form (cuBLASLt's GELU epilogue; GPT-2's gelu_new) on the float32
//    accumulator, but cuBLAS does not document how it evaluates tanh (a hardware approximation
//    would be ~5e-4 relative): close to ops::gelu's formula within bf16's rounding, not
//    necessarily float32's. So the GELU epilogues run for bf16 only (false for float32, whose ops
//    then take the engine's GELU kernels between BIAS GEMMs), and a model uses the fused op on the
//    recompute and the plain path alike.
// When cuBLASLt has no algorithm for a query (an aux ld not a multiple of 8, an unsupported type)
// or refuses the call as not supported, gemm_epilogue returns false having launched nothing, and
// the op composes the unfused kernels: a choice that depends only on the query (remembered with
// it), so it repeats too.
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include <cublasLt.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/lt.cuh"

namespace xt {
namespace kernels {
namespace cuda {

namespace {

using LtQuery = std::tuple<int, int, int, bool, bool, int64_t, int64_t, int64_t, bool, size_t, uint32_t, uint32_t,
                           uint32_t, uint32_t, uint32_t, int64_t, int64_t, int64_t, int64_t, int64_t>;

std::mutex g_lt_cache_mutex;
std::map<LtQuery, LtChoice>& lt_cache() {
  static std::map<LtQuery, LtChoice> cache;
  return cache;
}

}  // namespace

bool gemm_epilogue(DType dt, GemmEpilogue ep, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A,
                   const void* B, void* C, const void* bias, void* aux, void* stream, int64_t batch, int64_t strideA,
                   int64_t strideB, int64_t strideC, int64_t stride_bias) {
  XT_CHECK(M > 0 && N > 0 && K > 0 && batch > 0, ValueError, "gemm_epilogue: sizes must be positive, got M=", M,
           " N=", N, " K=", K, " batch=", batch);
  XT_CHECK(batch == 1 || ep == GemmEpilogue::Bias, ValueError, "gemm_epilogue: batches take the Bias epilogue only");
  XT_CHECK(batch <= INT32_MAX, ValueError, "gemm_epilogue: batch ", batch, " does not fit in int32");
  XT_CHECK(ep == GemmEpilogue::DGelu ? bias == nullptr && aux != nullptr
                                     : bias != nullptr && (aux != nullptr) == (ep == GemmEpilogue::GeluAuxBias),
           ValueError, "gemm_epilogue: the epilogue's operands (bias, aux) do not match it");
  cudaDataType_t type;
  cublasComputeType_t compute;
  if (dt == DType::BFloat16) {
    type = CUDA_R_16BF;
    compute = CUBLAS_COMPUTE_32F;
  } else if (dt == DType::Float32) {
    type = CUDA_R_32F;
    compute = allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  } else {
    return false;  // float64: the op composes the unfused kernels
  }
  if (ep != GemmEpilogue::Bias && dt != DType::BFloat16) return false;  // GELU epilogues: bf16 only (above)
  const cublasLtEpilogue_t epilogue = ep == GemmEpilogue::Bias          ? CUBLASLT_EPILOGUE_BIAS
                                      : ep == GemmEpilogue::GeluAuxBias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                                        : CUBLASLT_EPILOGUE_DGELU;
  // cuBLASLt's view (column-major, see the header): A' = our B, B' = our A, D' = C^T (N x M).
  const int64_t m = N, n = M, k = K;
  const int64_t ld_b = tb ? K : N, ld_a = ta ? M : K, ld_c = N;
  if (ep != GemmEpilogue::Bias && ld_c % 8 != 0) return false;  // aux's ld: a multiple of 8 elements

  OnStream on(stream);
  const LtWorkspace ws = cublaslt_workspace(on);
  const size_t elem = dtype_size(dt);
  const uint32_t al_a = lt_alignment(A, strideA, batch, elem), al_b = lt_alignment(B, strideB, batch, elem),
                 al_c = lt_alignment(C, strideC, batch, elem);
  const uint32_t al_bias = bias ? lt_alignment(bias, stride_bias, batch, elem) : 256;
  const uint32_t al_aux = aux ? lt_alignment(aux) : 256;
  const LtQuery query{on.device, static_cast<int>(dt), static_cast<int>(ep), ta, tb, M, N, K,
                      compute == CUBLAS_COMPUTE_32F_FAST_TF32, ws.bytes, al_a, al_b, al_c, al_bias, al_aux,
                      batch, strideA, strideB, strideC, stride_bias};

  LtDescs d;
  XT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, compute, CUDA_R_32F));
  const cublasOperation_t op_a = tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  lt_set(d.op, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
  lt_set(d.op, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
  lt_set(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
  // The heuristic reads the bias pointer's value for its alignment only (it never dereferences it):
  // it is shown an address of exactly al_bias's alignment, which a batch's later biases share, and
  // the real pointer is set before the call.
  const void* bias_probe = reinterpret_cast<const void*>(static_cast<uintptr_t>(al_bias));
  if (bias != nullptr) {
    lt_set(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(type));
    lt_set(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_probe);
  }
  if (aux != nullptr) {
    lt_set(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
    lt_set(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, ld_c);  // its type: D's (the default)
  }
  // Stored shapes: A' is k x m (op T) or m x k; B' is n x k (op T) or k x n; D' m x n.
  XT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, type, tb ? k : m, tb ? m : k, ld_b));
  XT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.b, type, ta ? n : k, ta ? k : n, ld_a));
  XT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, type, m, n, ld_c));
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    const std::pair<cublasLtMatrixLayout_t, int64_t> layouts[] = {{d.a, strideB}, {d.b, strideA}, {d.c, strideC}};
    for (const auto& [layout, stride] : layouts) {
      XT_CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      XT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                       sizeof(stride)));
    }
    lt_set(d.op, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, stride_bias);
  }

  // cuBLASLt's A' is our B and its B' our A; C' and D' are our C.
  const LtChoice choice = lt_choose(lt_cache(), g_lt_cache_mutex, query, d, ws, al_b, al_a, al_c);
  if (!choice.found) return false;
  if (bias != nullptr) lt_set(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t st = cublasLtMatmul(ws.handle, d.op, &alpha, B, d.a, A, d.b, &beta, C, d.c, C, d.c,
                                           &choice.algo, ws.ptr, ws.bytes, on.s);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) {
    // Refused before any launch (a combination the heuristic offered but the call does not take):
    // remembered as "none", so this query composes from now on, the same way every time after.
    std::lock_guard<std::mutex> lock(g_lt_cache_mutex);
    lt_cache()[query].found = false;
    return false;
  }
  XT_CUBLAS_CHECK(st);
  return true;
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
