// Shared helpers for the CUDA kernels (kernels/cuda/*.cu): typed loads/stores, dtype dispatch,
// fixed-order warp/block reductions, launch checks, scratch memory, and cuBLAS handles.
//
// Invariants every kernel file keeps:
//  - Storage types float, double, __nv_bfloat16; compute type float for float/bf16, double for
//    double. load() widens, store() rounds once (round-to-nearest-even for bf16), as on the CPU.
//  - Reductions are deterministic: a warp reduces with a xor butterfly (every lane ends with the
//    same bits), a block reduces its warps' results in warp order, and partial results across
//    blocks are combined by one more fixed-order pass. No floating-point atomics.
//  - A launcher makes the stream's device current (OnStream), launches on that stream, and
//    checks the launch (XT_LAUNCH_CHECK). Launch shapes depend only on problem sizes, never on
//    the GPU model, so the reduction order (and the bits) depends only on the inputs.
#pragma once
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/allocator.h"
#include "core/cuda/cuda_check.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/kernels.h"

// After every <<<...>>>: raises RuntimeError naming the CUDA error when the launch failed.
#define XT_LAUNCH_CHECK() XT_CUDA_CHECK(cudaGetLastError())

#define XT_CUBLAS_CHECK(expr)                                                                  \
  do {                                                                                         \
    const cublasStatus_t xt_st_ = (expr);                                                      \
    if (xt_st_ != CUBLAS_STATUS_SUCCESS)                                                       \
      throw ::xt::RuntimeError(::xt::str("cuBLAS error ", cublasGetStatusName(xt_st_), ": ",   \
                                         cublasGetStatusString(xt_st_), " (in ", #expr, " at ", \
                                         __FILE__, ":", __LINE__, ")"));                       \
  } while (0)

namespace xt {
namespace kernels {
namespace cuda {

using bf16_t = __nv_bfloat16;

// ------------------------------------------------------------------ launch geometry

constexpr int kThreads = 256;    // default block size for elementwise work
constexpr int kWarp = 32;
// Cap for grid-stride launches: enough blocks to fill any current GPU many times over.
constexpr int64_t kMaxBlocks = 1 << 16;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  const int64_t b = ceil_div(n, threads);
  return static_cast<unsigned>(b < kMaxBlocks ? (b > 0 ? b : 1) : kMaxBlocks);
}

// The launcher's view of its stream: the stream itself, its device, made current for the scope.
struct OnStream {
  cudaStream_t s;
  int device;
  xt::cuda::DeviceGuard guard;
  explicit OnStream(void* stream)
      : s(static_cast<cudaStream_t>(stream)), device(xt::cuda::stream_device(stream)), guard(device) {}
};

#define XT_GRID_STRIDE(i, n)                                                              \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// ------------------------------------------------------------------ types

template <typename T> struct Compute { using type = float; };
template <> struct Compute<double> { using type = double; };
template <typename T> using compute_t = typename Compute<T>::type;

__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ double load(const double* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const bf16_t* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store(double* p, int64_t i, double v) { p[i] = v; }
__device__ __forceinline__ void store(bf16_t* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

// Any dtype through double (integers, casts), as the CPU's creation kernels do; bf16 is
// rounded from float so a double -> bf16 conversion rounds exactly like the CPU's.
template <typename T>
__device__ __forceinline__ double load_any(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, bf16_t>) return static_cast<double>(__bfloat162float(p[i]));
  else return static_cast<double>(p[i]);
}
template <typename T>
__device__ __forceinline__ void store_any(T* p, int64_t i, double v) {
  if constexpr (std::is_same_v<T, bf16_t>) p[i] = __float2bfloat16_rn(static_cast<float>(v));
  else p[i] = static_cast<T>(v);
}

// One element in the compute type, and back (the same conversions as load/store).
__device__ __forceinline__ float to_compute(float v) { return v; }
__device__ __forceinline__ double to_compute(double v) { return v; }
__device__ __forceinline__ float to_compute(bf16_t v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_compute(compute_t<T> v);
template <> __device__ __forceinline__ float from_compute<float>(float v) { return v; }
template <> __device__ __forceinline__ double from_compute<double>(double v) { return v; }
template <> __device__ __forceinline__ bf16_t from_compute<bf16_t>(float v) { return __float2bfloat16_rn(v); }

// N consecutive elements moved as one aligned load/store (16 bytes for the widest type of a
// kernel): what lets a thread saturate HBM with 2-byte bf16 elements.
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};
inline bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Index loads (ids, targets): int32 or int64.
__device__ __forceinline__ int64_t load_index(bool ids64, const void* ids, int64_t i) {
  return ids64 ? static_cast<const int64_t*>(ids)[i] : static_cast<const int32_t*>(ids)[i];
}

// Math in the compute type (float overloads are the accurate, non-intrinsic versions).
__device__ __forceinline__ float xexp(float x) { return expf(x); }
__device__ __forceinline__ double xexp(double x) { return exp(x); }
__device__ __forceinline__ float xlog(float x) { return logf(x); }
__device__ __forceinline__ double xlog(double x) { return log(x); }
__device__ __forceinline__ float xsqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double xsqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float xpow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double xpow(double x, double y) { return pow(x, y); }
__device__ __forceinline__ float xabs(float x) { return fabsf(x); }
__device__ __forceinline__ double xabs(double x) { return fabs(x); }
__device__ __forceinline__ float xmax(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double xmax(double a, double b) { return fmax(a, b); }
template <typename C>
__device__ __forceinline__ C xsigmoid(C x) { return C(1) / (C(1) + xexp(-x)); }

template <typename T> struct NegInf;
template <> struct NegInf<float> { static __device__ __forceinline__ float get() { return -INFINITY; } };
template <> struct NegInf<double> { static __device__ __forceinline__ double get() { return -HUGE_VAL; } };

// ------------------------------------------------------------------ dispatch

// Call fn with a null pointer of the storage type for dt, like the CPU's dispatch_float:
//   dispatch_float(dt, "op", [&](auto tag) { using T = std::remove_pointer_t<decltype(tag)>; ... });
template <typename Fn>
void dispatch_float(DType dt, const char* op, Fn&& fn) {
  switch (dt) {
    case DType::Float32: fn(static_cast<float*>(nullptr)); return;
    case DType::BFloat16: fn(static_cast<bf16_t*>(nullptr)); return;
    case DType::Float64: fn(static_cast<double*>(nullptr)); return;
    default: throw TypeError(str(op, ": unsupported dtype ", dtype_name(dt), " on CUDA"));
  }
}

template <typename Fn>
void dispatch_all(DType dt, const char* op, Fn&& fn) {
  switch (dt) {
    case DType::Int32: fn(static_cast<int32_t*>(nullptr)); return;
    case DType::Int64: fn(static_cast<int64_t*>(nullptr)); return;
    default: dispatch_float(dt, op, fn);
  }
}

inline bool index_is_64(DType id_dt, const char* op) {
  XT_CHECK(id_dt == DType::Int32 || id_dt == DType::Int64, TypeError, op, ": indices must be int32 or int64, got ",
           dtype_name(id_dt));
  return id_dt == DType::Int64;
}

// ------------------------------------------------------------------ reductions (fixed order)

template <typename C>
__device__ __forceinline__ C warp_sum(C v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <typename C>
__device__ __forceinline__ C warp_max(C v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v = xmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// Safe to call repeatedly: the leading barrier protects the shared slots of the previous call.
template <typename C>
__device__ C block_sum(C v) {
  __shared__ C partial[32];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, nwarps = blockDim.x / kWarp;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  C r = lane < nwarps ? partial[lane] : C(0);
  return warp_sum(r);
}

template <typename C>
__device__ C block_max(C v) {
  __shared__ C partial[32];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, nwarps = blockDim.x / kWarp;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  C r = lane < nwarps ? partial[lane] : NegInf<C>::get();
  return warp_max(r);
}

// ------------------------------------------------------------------ scratch memory

// Temporary device memory from the caching allocator, bound to the launch stream. Freed at
// scope exit: the block goes back to that stream's free list, so a later user is ordered after
// the kernels that use it here (no host sync needed).
class Scratch {
 public:
  Scratch(size_t nbytes, const OnStream& on)
      : block_(Allocator::get().allocate(Device::cuda(on.device), nbytes, on.s)) {}
  ~Scratch() { Allocator::get().free(block_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T> T* as() const { return static_cast<T*>(block_.ptr); }

 private:
  Block block_;
};

// ------------------------------------------------------------------ cuBLAS (gemm.cu)

// This thread's cuBLAS handle for `on`'s device, bound to on.s, with a workspace from the
// caching allocator. Handles live in a thread_local table: threads never share one.
cublasHandle_t cublas_handle(const OnStream& on);

// TF32 tensor cores for float32 GEMMs (off by default: true fp32). The ops layer's
// ops::set_allow_tf32 forwards here in CUDA builds.
void set_allow_tf32(bool allow);
bool allow_tf32();

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
