// CUDA GEMM: row-major C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b] through cuBLAS.
//
// cuBLAS is column-major. A row-major MxN matrix is the column-major NxM matrix C^T, and
// C^T = op(B)^T op(A)^T, so we call cuBLAS with the operands swapped (B first), m = N, n = M.
// A row-major matrix with row stride ld is the column-major transpose with leading dimension ld,
// so gemm_ld passes lda/ldb/ldc through unchanged; gemm is gemm_ld with packed strides. An ld
// whose byte size is a multiple of 16 (with 16-byte aligned base pointers) lets cuBLAS pick its
// fast aligned/TMA kernels: the fused linear_cross_entropy pads the logits' row stride for that.
// Precision: float32 uses CUBLAS_COMPUTE_32F (true fp32) unless allow_tf32() is on; bf16 inputs
// use CUBLAS_COMPUTE_32F with bf16 or float32 output and reductions kept in fp32
// (CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION); float64 uses CUBLAS_COMPUTE_64F.
// Determinism: one handle per (thread, device) with its own workspace, atomics not allowed
// (cuBLAS's default), so the same shapes give the same algorithm and the same bits. The GEMMs with
// fused epilogues (gemm_lt.cu, cuBLASLt) share the handle's workspace on its stream.
#include <atomic>
#include <climits>

#include "kernels/cuda/common.cuh"

namespace xt {
namespace kernels {
namespace cuda {

namespace {

std::atomic<bool> g_allow_tf32{false};

// cuBLAS's recommended workspace on Hopper; held by the handle for the thread's lifetime.
constexpr size_t kCublasWorkspace = size_t(32) << 20;

struct HandleEntry {
  cublasHandle_t handle = nullptr;
  cublasLtHandle_t lt = nullptr;  // gemm_lt.cu's, created on first use
  cudaStream_t stream = nullptr;
  Block workspace;
};

// This thread's handles, one per device; destroyed (workspace returned to the cache) at exit.
struct ThreadHandles {
  HandleEntry entry[kMaxDevices];
  ~ThreadHandles() {
    for (int d = 0; d < kMaxDevices; ++d) {
      HandleEntry& e = entry[d];
      if (!e.handle) continue;
      if (cudaSetDevice(d) == cudaSuccess) {  // errors ignored at exit
        cublasDestroy(e.handle);
        if (e.lt) cublasLtDestroy(e.lt);
      }
      cudaGetLastError();
      if (e.workspace.ptr) Allocator::get().free(e.workspace);
    }
  }
};
thread_local ThreadHandles tl_handles;

}  // namespace

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow); }
bool allow_tf32() { return g_allow_tf32.load(); }

cublasHandle_t cublas_handle(const OnStream& on) {
  XT_ASSERT(on.device >= 0 && on.device < kMaxDevices);
  HandleEntry& e = tl_handles.entry[on.device];
  if (!e.handle) {
    XT_CUBLAS_CHECK(cublasCreate(&e.handle));
    XT_CUBLAS_CHECK(cublasSetMathMode(
        e.handle, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    XT_CUBLAS_CHECK(cublasSetAtomicsMode(e.handle, CUBLAS_ATOMICS_NOT_ALLOWED));
    XT_CUBLAS_CHECK(cublasSetPointerMode(e.handle, CUBLAS_POINTER_MODE_HOST));
  }
  if (e.stream != on.s) {
    // cublasSetStream resets the workspace to cuBLAS's own pool: set ours again after it.
    XT_CUBLAS_CHECK(cublasSetStream(e.handle, on.s));
    if (e.workspace.ptr) Allocator::get().free(e.workspace);
    e.workspace = Allocator::get().allocate(Device::cuda(on.device), kCublasWorkspace, on.s);
    XT_CUBLAS_CHECK(cublasSetWorkspace(e.handle, e.workspace.ptr, kCublasWorkspace));
    e.stream = on.s;
  }
  return e.handle;
}

LtWorkspace cublaslt_workspace(const OnStream& on) {
  cublas_handle(on);  // binds the workspace to on.s
  HandleEntry& e = tl_handles.entry[on.device];
  if (!e.lt) XT_CUBLAS_CHECK(cublasLtCreate(&e.lt));
  return {e.lt, e.workspace.ptr, e.workspace.ptr ? kCublasWorkspace : 0};
}

void gemm_ld(DType ab_dt, DType c_dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
             int64_t lda, const void* B, int64_t ldb, float beta, void* C, int64_t ldc, int64_t batch,
             int64_t strideA, int64_t strideB, int64_t strideC, void* stream) {
  XT_CHECK(lda >= (ta ? M : K) && ldb >= (tb ? K : N) && ldc >= N, ValueError, "gemm: leading dimensions lda=", lda,
           " ldb=", ldb, " ldc=", ldc, " are smaller than the stored widths ", (ta ? M : K), ", ", (tb ? K : N),
           ", ", N, " (M=", M, " N=", N, " K=", K, ")");
  if (M == 0 || N == 0 || batch == 0) return;
  XT_CHECK(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX && batch <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX &&
               ldc <= INT_MAX,
           ValueError, "gemm: dimensions must fit in int32 for cuBLAS, got M=", M, " N=", N, " K=", K,
           " batch=", batch, " lda=", lda, " ldb=", ldb, " ldc=", ldc);
  cudaDataType_t ab_type, c_type;
  cublasComputeType_t compute;
  if (ab_dt == DType::Float32 && c_dt == DType::Float32) {
    ab_type = c_type = CUDA_R_32F;
    compute = allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  } else if (ab_dt == DType::BFloat16 && (c_dt == DType::BFloat16 || c_dt == DType::Float32)) {
    ab_type = CUDA_R_16BF;
    c_type = c_dt == DType::BFloat16 ? CUDA_R_16BF : CUDA_R_32F;
    compute = CUBLAS_COMPUTE_32F;
  } else if (ab_dt == DType::Float64 && c_dt == DType::Float64) {
    ab_type = c_type = CUDA_R_64F;
    compute = CUBLAS_COMPUTE_64F;
  } else {
    throw TypeError(str("gemm: unsupported dtypes on CUDA: inputs ", dtype_name(ab_dt), ", output ",
                        dtype_name(c_dt), " (supported: float32->float32, bfloat16->bfloat16/float32, "
                        "float64->float64)"));
  }
  OnStream on(stream);
  cublasHandle_t h = cublas_handle(on);
  // Column-major view (see the header): C^T (NxM, ld ldc) = op(B)^T (NxK) * op(A)^T (KxM).
  const cublasOperation_t opB = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opA = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int m = static_cast<int>(N), n = static_cast<int>(M), k = static_cast<int>(K);
  const int ldb_ = static_cast<int>(ldb);
  const int lda_ = static_cast<int>(lda);
  const int ldc_ = static_cast<int>(ldc);
  const double alpha64 = alpha, beta64 = beta;
  const void* pa = compute == CUBLAS_COMPUTE_64F ? static_cast<const void*>(&alpha64) : static_cast<const void*>(&alpha);
  const void* pb = compute == CUBLAS_COMPUTE_64F ? static_cast<const void*>(&beta64) : static_cast<const void*>(&beta);
  // ld must be >= 1 even for empty K.
  XT_CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, opB, opA, m, n, k, pa, B, ab_type, ldb_ > 0 ? ldb_ : 1, strideB, A,
                                             ab_type, lda_ > 0 ? lda_ : 1, strideA, pb, C, c_type, ldc_, strideC,
                                             static_cast<int>(batch), compute, CUBLAS_GEMM_DEFAULT));
}

void gemm(DType ab_dt, DType c_dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
          const void* B, float beta, void* C, int64_t batch, int64_t strideA, int64_t strideB, int64_t strideC,
          void* stream) {
  gemm_ld(ab_dt, c_dt, ta, tb, M, N, K, alpha, A, ta ? M : K, B, tb ? K : N, beta, C, N, batch, strideA, strideB,
          strideC, stream);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
