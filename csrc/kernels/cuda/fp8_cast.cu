// FP8 operands on CUDA: the amax pass and the cast(+transpose) pass (kernels in fp8_cast.cuh).
// Launch shapes depend only on the sizes; both kernels run on the given stream with no host sync
// (the scale is computed on the device from the amax), so a CUDA graph captures them.
#include "kernels/cuda/fp8_cast.cuh"

namespace xt {
namespace kernels {
namespace cuda {

void fp8_amax(DType dt, const void* x, int64_t n, float* meta, void* stream) {
  OnStream on(stream);
  XT_CHECK(reinterpret_cast<uintptr_t>(x) % 16 == 0, ValueError, "fp8_amax: x must be 16-byte aligned");
  XT_CUDA_CHECK(cudaMemsetAsync(meta + kFp8MetaAmax, 0, sizeof(float), on.s));  // amax starts at 0 (= +0.0f's bits)
  if (n == 0) return;
  const unsigned blocks =
      static_cast<unsigned>(std::min<int64_t>(fp8::kAmaxMaxBlocks, ceil_div(ceil_div(n, 8), fp8::kAmaxThreads)));
  if (dt == DType::BFloat16) {
    fp8::amax_kernel<bf16_t><<<blocks, fp8::kAmaxThreads, 0, on.s>>>(static_cast<const bf16_t*>(x), n, meta);
  } else if (dt == DType::Float32) {
    fp8::amax_kernel<float><<<blocks, fp8::kAmaxThreads, 0, on.s>>>(static_cast<const float*>(x), n, meta);
  } else {
    throw TypeError(str("fp8_amax: float32 or bfloat16 only, got ", dtype_name(dt)));
  }
  XT_LAUNCH_CHECK();
}

void fp8_cast(DType dt, Fp8Format f, const void* x, int64_t rows, int64_t cols, float* meta, uint8_t* out,
              uint8_t* out_t, void* stream) {
  OnStream on(stream);
  XT_CHECK(rows % fp8::kChunk == 0 && cols % fp8::kChunk == 0, ValueError, "fp8_cast: rows (", rows,
           ") and cols (", cols, ") must be multiples of ", fp8::kChunk);
  XT_CHECK(reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0 &&
               reinterpret_cast<uintptr_t>(out_t) % 16 == 0,
           ValueError, "fp8_cast: x, out and out_t must be 16-byte aligned");
  if (rows == 0 || cols == 0) return;
  XT_CHECK(ceil_div(rows, fp8::kTile) <= 65535, ValueError, "fp8_cast: too many rows (", rows, ")");
  const dim3 grid(static_cast<unsigned>(ceil_div(cols, fp8::kTile)), static_cast<unsigned>(ceil_div(rows, fp8::kTile)));
  if (dt == DType::BFloat16) {
    fp8::cast_kernel<bf16_t><<<grid, fp8::kCastThreads, 0, on.s>>>(static_cast<const bf16_t*>(x), rows, cols, f, meta,
                                                                 out, out_t);
  } else if (dt == DType::Float32) {
    fp8::cast_kernel<float><<<grid, fp8::kCastThreads, 0, on.s>>>(static_cast<const float*>(x), rows, cols, f, meta,
                                                                out, out_t);
  } else {
    throw TypeError(str("fp8_cast: float32 or bfloat16 only, got ", dtype_name(dt)));
  }
  XT_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
