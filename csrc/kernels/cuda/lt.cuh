// What a cuBLASLt call needs on every path (gemm_lt.cu: the epilogue GEMMs; fp8_gemm.cu: the FP8
// GEMM): the descriptors of one call, destroyed on every exit; the attribute setters, which throw
// on a refused attribute; and an operand's alignment for the heuristic query (part of the query,
// so the algorithm is a function of the call: Note [cuBLASLt epilogues: exact and deterministic]).
#pragma once

#include <cstddef>
#include <cstdint>

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

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
