// Development probe, not part of the product: which settings of a cuBLASLt FP8 GEMM the GPU's
// cuBLASLt runs. kernels/cuda/fp8_gemm.cu's call (TN layout, E4M3 x E4M3, per-tensor scale pointers,
// fast accumulation in the forward, the heuristic preference of kernels/cuda/lt.cuh: split-K only
// with the compute-type reduction, the operands' alignments) got CUBLAS_STATUS_NOT_SUPPORTED from
// cublasLtMatmul on the H200 (cuBLAS 13.1) although the heuristic had answered. This tries each
// combination of the settings that call adds to NVIDIA's minimal FP8 GEMM and prints the
// heuristic's and the matmul's status and whether C holds the expected value.
//
//   nvcc -std=c++17 -arch=sm_90 dev/fp8_lt_probe.cu -lcublasLt -o /tmp/fp8_lt_probe && /tmp/fp8_lt_probe
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "check.cuh"

namespace {

struct Variant {
  bool fast_accum, reduction_mask, alignment_prefs, scale_at_4_bytes, f32_out, workspace;
};

// One GEMM C [M, N] = A [M, K] . B [N, K]^T as fp8_gemm.cu issues it (cuBLASLt's A is our B).
// Returns the heuristic's status and the matmul's (-1: not reached), and sets ok from C's value.
void run(cublasLtHandle_t lt, const Variant& v, int M, int N, int K, const uint8_t* A, const uint8_t* B,
         const float* scales, void* C, void* ws, size_t ws_bytes, int& st_h, int& st_m, bool& ok) {
  st_h = st_m = -1;
  ok = false;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t));
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof(n));
  if (v.fast_accum) {
    const int8_t one = 1;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &one, sizeof(one));
  }
  const float* sa = scales + (v.scale_at_4_bytes ? 1 : 0);
  const float* sb = scales + (v.scale_at_4_bytes ? 5 : 4);
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa));
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb));
  const cudaDataType_t ct = v.f32_out ? CUDA_R_32F : CUDA_R_16BF;
  cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, K, N, K);
  cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, K, M, K);
  cublasLtMatrixLayoutCreate(&lc, ct, N, M, N);
  cublasLtMatmulPreferenceCreate(&pref);
  const uint64_t wsb = v.workspace ? ws_bytes : 0;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb));
  if (v.reduction_mask) {
    const uint32_t mask = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof(mask));
  }
  if (v.alignment_prefs) {
    const uint32_t al = 256;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof(al));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof(al));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof(al));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof(al));
  }
  cublasLtMatmulHeuristicResult_t res;
  std::memset(&res, 0, sizeof(res));
  int got = 0;
  st_h = cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &res, &got);
  if (st_h == CUBLAS_STATUS_SUCCESS && got > 0) {
    const float alpha = 1.f, beta = 0.f;
    cudaMemset(C, 0, static_cast<size_t>(M) * N * 4);
    st_m = cublasLtMatmul(lt, op, &alpha, B, la, A, lb, &beta, C, lc, C, lc, &res.algo, wsb ? ws : nullptr, wsb, 0);
    if (st_m == CUBLAS_STATUS_SUCCESS && cudaDeviceSynchronize() == cudaSuccess) {
      // A and B hold 1.0 everywhere, the scales 0.5 and 0.25: every C is K / 8
      float c0 = 0;
      if (v.f32_out) {
        cudaMemcpy(&c0, C, 4, cudaMemcpyDeviceToHost);
      } else {
        __nv_bfloat16 h;
        cudaMemcpy(&h, C, 2, cudaMemcpyDeviceToHost);
        c0 = __bfloat162float(h);
      }
      ok = c0 == K / 8.0f;
    }
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatmulDescDestroy(op);
}

}  // namespace

int main() {
  int ver = 0;
  cublasLtHandle_t lt;
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) return 1;
  ver = static_cast<int>(cublasLtGetVersion());
  std::printf("cublasLt version %d\n", ver);
  const int sizes[][3] = {{16, 16, 16}, {4096, 2048, 2048}};
  const size_t max_elems = 4096 * 2048;
  uint8_t *A, *B;
  float* scales;
  void *C, *ws;
  const size_t ws_bytes = 32u << 20;
  CK(cudaMalloc(&A, max_elems));
  CK(cudaMalloc(&B, max_elems));
  CK(cudaMalloc(&C, max_elems * 4));
  CK(cudaMalloc(&ws, ws_bytes));
  CK(cudaMalloc(&scales, 16 * sizeof(float)));
  CK(cudaMemset(A, 0x38, max_elems));  // E4M3 1.0
  CK(cudaMemset(B, 0x38, max_elems));
  std::vector<float> s(16, 0.f);
  s[0] = s[1] = 0.5f;
  s[4] = s[5] = 0.25f;
  CK(cudaMemcpy(scales, s.data(), s.size() * 4, cudaMemcpyHostToDevice));
  std::printf("M N K | fast_accum reduction_mask alignment_prefs scale_at_4_bytes f32_out workspace | heuristic matmul value\n");
  for (const auto& sz : sizes)
    for (int bits = 0; bits < 64; ++bits) {
      const Variant v{bool(bits & 1), bool(bits & 2), bool(bits & 4), bool(bits & 8), bool(bits & 16), bool(bits & 32)};
      int st_h, st_m;
      bool ok;
      run(lt, v, sz[0], sz[1], sz[2], A, B, scales, C, ws, ws_bytes, st_h, st_m, ok);
      std::printf("%d %d %d | %d %d %d %d %d %d | %d %d %s\n", sz[0], sz[1], sz[2], v.fast_accum, v.reduction_mask,
                  v.alignment_prefs, v.scale_at_4_bytes, v.f32_out, v.workspace, st_h, st_m, ok ? "ok" : "-");
    }
  cublasLtDestroy(lt);
  return 0;
}
