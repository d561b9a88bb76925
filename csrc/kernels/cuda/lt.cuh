// What a cuBLASLt call needs on every path (gemm_lt.cu: the epilogue GEMMs; fp8_gemm.cu: the FP8
// GEMM): the descriptors of one call, destroyed on every exit; the attribute setters, which throw
// on a refused attribute; and an operand's alignment for the heuristic query (part of the query,
// so the algorithm is a function of the call: Note [cuBLASLt epilogues: exact and deterministic]).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>

#include <cublasLt.h>

#include "kernels/cuda/common.cuh"

namespace xt {
namespace kernels {
namespace cuda {

// The largest power of two (at most 256) that divides p's address and, in a batch, every entry's
// (p + b * stride elements of `elem` bytes).
inline uint32_t lt_alignment(const void* p, int64_t stride = 0, int64_t batch = 1, size_t elem = 1) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t step = batch > 1 ? static_cast<uintptr_t>(stride) * elem : 0;
  uint32_t al = 256;
  while (al > 1 && (a % al || step % al)) al /= 2;
  return al;
}

// The descriptors of one cublasLtMatmul call: the operation, the layouts of A, B and C (= D), the
// heuristic preference.
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  LtDescs() = default;
  LtDescs(const LtDescs&) = delete;
  LtDescs& operator=(const LtDescs&) = delete;
  ~LtDescs() {  // status ignored: nothing to do about a failed destroy
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// A query's algorithm, cached per process (found: false when cuBLASLt has none for it).
struct LtChoice {
  bool found = false;
  cublasLtMatmulAlgo_t algo;
};

template <typename V>
void lt_set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const V& v) {
  XT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
}

template <typename V>
void lt_set(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const V& v) {
  XT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof(v)));
}

// The algorithm of a call: the choice cached for `query`, else the first answer of
// cublasLtMatmulAlgoGetHeuristic for the call's descriptors `d` (a fixed query, never a timed
// search; split-K only with the float32 workspace reduction), cached with its query, a "none"
// too (NOT_SUPPORTED or INVALID_VALUE: no algorithm for the combination). al_a, al_b, al_c:
// the alignments of cuBLASLt's A, B and C (= D) operands.
template <typename Query>
LtChoice lt_choose(std::map<Query, LtChoice>& cache, std::mutex& mutex, const Query& query, LtDescs& d,
                   const LtWorkspace& ws, uint32_t al_a, uint32_t al_b, uint32_t al_c) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(query);
    if (it != cache.end()) return it->second;
  }
  XT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&d.pref));
  lt_set(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(ws.bytes));
  lt_set(d.pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
         static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE));
  lt_set(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al_a);
  lt_set(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al_b);
  lt_set(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al_c);
  lt_set(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al_c);
  cublasLtMatmulHeuristicResult_t result;
  std::memset(&result, 0, sizeof(result));
  int returned = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(ws.handle, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &result, &returned);
  if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED && st != CUBLAS_STATUS_INVALID_VALUE)
    XT_CUBLAS_CHECK(st);
  LtChoice choice;
  choice.found = st == CUBLAS_STATUS_SUCCESS && returned > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  if (choice.found) choice.algo = result.algo;
  std::lock_guard<std::mutex> lock(mutex);
  cache.emplace(query, choice);
  return choice;
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
