// FP8 on the CPU: the reference the CUDA kernels are checked against (kernels/fp8_math.h).
//
//  - fp8_amax: max |x| (NaN ignored) in a plain loop; max is exact and order-independent, so any
//    split gives the same bits.
//  - fp8_cast: encode(x * 2^k) element by element (the product is exact: a power of two), the
//    transposed copy from the same codes.
//  - fp8_gemm: exactly quantize -> dequantize -> matmul: the codes decoded to float32 and scaled by
//    their 2^-k (exact), then one float32 GEMM (OpenBLAS through kernels::cpu::gemm, float32
//    accumulation), C rounded once to its dtype. The CUDA GEMM multiplies the codes and applies
//    the two factors to the float32 accumulator: the same products, another summation order.
//    accumulate: the GEMM's beta = 1 (C widened to float32, the product added, rounded once).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/common.h"
#include "kernels/cpu/parallel.h"
#include "kernels/fp8_math.h"
#include "kernels/kernels.h"

namespace xt {
namespace kernels {
namespace cpu {

namespace {
constexpr int64_t kFp8Grain = 1 << 15;  // elements per thread at the least
}  // namespace

void fp8_amax(DType dt, const void* x, int64_t n, float* meta, void* stream) {
  (void)stream;
  float amax = 0.0f;
  XT_DISPATCH_FLOAT(dt, "fp8_amax", T, {
    if constexpr (std::is_same_v<T, double>) {
      throw TypeError("fp8_amax: float32 or bfloat16 only");
    } else {
      const T* p = static_cast<const T*>(x);
      for (int64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(load(p, i)));
    }
  });
  meta[kFp8MetaAmax] = amax;
}

void fp8_cast(DType dt, Fp8Format f, const void* x, int64_t rows, int64_t cols, float* meta, uint8_t* out,
              uint8_t* out_t, void* stream) {
  (void)stream;
  const int k = fp8_scale_exponent(meta[kFp8MetaAmax], f);
  const float scale = fp8_pow2(k);
  XT_DISPATCH_FLOAT(dt, "fp8_cast", T, {
    if constexpr (std::is_same_v<T, double>) {
      throw TypeError("fp8_cast: float32 or bfloat16 only");
    } else {
      const T* p = static_cast<const T*>(x);
      parallel_for(rows, std::max<int64_t>(1, kFp8Grain / std::max<int64_t>(1, cols)), [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r)
          for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = fp8_encode(load(p, r * cols + c) * scale, f);
      });
    }
  });
  if (out_t) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) out_t[c * rows + r] = out[r * cols + c];
  }
  meta[kFp8MetaScale] = fp8_pow2(-k);
}

void fp8_gemm(Fp8Format fa, Fp8Format fb, int64_t M, int64_t N, int64_t K, const uint8_t* A, const float* a_meta,
              const uint8_t* B, const float* b_meta, DType c_dt, void* C, bool accumulate, bool fast_accum,
              void* stream) {
  (void)fast_accum;
  const auto dequantize = [](Fp8Format f, const uint8_t* codes, int64_t n, float factor) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = fp8_decode(codes[i], f) * factor;
    return v;
  };
  const std::vector<float> a = dequantize(fa, A, M * K, a_meta[kFp8MetaScale]);
  const std::vector<float> b = dequantize(fb, B, N * K, b_meta[kFp8MetaScale]);
  gemm(DType::Float32, c_dt, false, true, M, N, K, 1.0f, a.data(), b.data(), accumulate ? 1.0f : 0.0f, C, 1, M * K,
       N * K, M * N, stream);
}

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
