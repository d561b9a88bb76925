// FP8 numerics shared by the CPU and CUDA kernels (XT_HD); the FP8 kernels' contract is in
// kernels/kernels.h.
//
// Formats (OCP FP8, as CUDA's cuda_fp8.h and torch's float8_e4m3fn / float8_e5m2):
//   E4M3: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities, S.1111.111 is NaN;
//         largest finite 448, smallest subnormal 2^-9.
//   E5M2: 1 sign, 5 exponent (bias 15), 2 mantissa bits; IEEE-like (infinities, NaNs);
//         largest finite 57344, smallest subnormal 2^-16.
// fp8_encode is CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, fmt) (the cvt.rn.satfinite
// instruction on sm_89+): round to nearest, ties to even, at the format's precision (subnormals
// included); a magnitude beyond the largest finite (infinity too) saturates to it with its sign;
// NaN gives the canonical 0x7F in both formats (sign dropped); signed zero keeps its sign.
// tests/emu/fp8_emu.cpp checks it against NVIDIA's own host emulation for every float32.
//
// Per-tensor current scaling with power-of-two scales (Note [FP8 scaling], docs/fp8.md):
// scale = 2^k, k the largest integer with amax * 2^k <= the format's largest finite, from amax
// = max |x| over the tensor (NaN ignored, as fmaxf does). A power of two makes x * scale and the
// dequantization code * 2^-k exact, so the GEMM's scaled product of codes and the CPU reference's
// matmul of dequantized values are the same real numbers: only the accumulation order differs.
#pragma once
#include <cstdint>
#include <cstring>

#include "kernels/common.h"

namespace xt {
namespace kernels {

enum class Fp8Format : int { E4M3 = 0, E5M2 = 1 };

inline const char* fp8_format_name(Fp8Format f) { return f == Fp8Format::E4M3 ? "e4m3" : "e5m2"; }

XT_HD uint32_t fp8_float_bits(float v) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(v);
#else
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  return u;
#endif
}

XT_HD float fp8_bits_float(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float v;
  std::memcpy(&v, &u, sizeof(v));
  return v;
#endif
}

// The format's constants: mantissa bits, exponent bias, the code of the largest finite value,
// its float32 value.
XT_HD int fp8_man_bits(Fp8Format f) { return f == Fp8Format::E4M3 ? 3 : 2; }
XT_HD int fp8_bias(Fp8Format f) { return f == Fp8Format::E4M3 ? 7 : 15; }
XT_HD uint32_t fp8_max_code(Fp8Format f) { return f == Fp8Format::E4M3 ? 0x7Eu : 0x7Bu; }
XT_HD float fp8_max_value(Fp8Format f) { return f == Fp8Format::E4M3 ? 448.0f : 57344.0f; }

// float32 -> FP8 code, round to nearest even, saturating to the largest finite (see the header).
XT_HD uint8_t fp8_encode(float x, Fp8Format f) {
  const uint32_t bits = fp8_float_bits(x);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t mag = bits & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) return 0x7F;  // NaN: canonical, sign dropped
  const uint32_t max_code = fp8_max_code(f);
  if (mag >= 0x7F800000u) return static_cast<uint8_t>(sign | max_code);  // infinity saturates
  const int man = fp8_man_bits(f);
  const int e = static_cast<int>(mag >> 23) - 127;  // unbiased exponent (float subnormals: -127)
  const int min_normal_exp = 1 - fp8_bias(f);
  uint32_t code, rem, half;
  if (e >= min_normal_exp) {
    // normal in FP8: keep `man` of the 23 mantissa bits; the carry of the rounding may step the
    // exponent (and past the largest finite, caught below)
    const int drop = 23 - man;
    code = (static_cast<uint32_t>(e + fp8_bias(f)) << man) | ((mag & 0x7FFFFFu) >> drop);
    rem = mag & ((1u << drop) - 1u);
    half = 1u << (drop - 1);
  } else {
    // subnormal in FP8: the value in units of the smallest subnormal 2^(min_normal_exp - man),
    // the implicit bit included; float subnormals (e = -127) are far below half a unit
    if (e == -127) return static_cast<uint8_t>(sign);
    const uint32_t m = (mag & 0x7FFFFFu) | 0x800000u;
    const int drop = 23 - man + (min_normal_exp - e);  // >= 24 - man
    if (drop > 24) return static_cast<uint8_t>(sign);  // below half the smallest subnormal
    code = m >> drop;
    rem = m & ((1u << drop) - 1u);
    half = 1u << (drop - 1);
  }
  if (rem > half || (rem == half && (code & 1u))) ++code;
  if (code > max_code) code = max_code;
  return static_cast<uint8_t>(sign | code);
}

// FP8 code -> its exact float32 value (NaN for NaN codes, +-inf for E5M2's infinities).
XT_HD float fp8_decode(uint8_t code, Fp8Format f) {
  const int man = fp8_man_bits(f);
  const uint32_t sign = static_cast<uint32_t>(code & 0x80u) << 24;
  const uint32_t exp = (code & 0x7Fu) >> man;
  const uint32_t mant = code & ((1u << man) - 1u);
  if (f == Fp8Format::E4M3 && (code & 0x7Fu) == 0x7Fu) return fp8_bits_float(0x7FC00000u);
  if (f == Fp8Format::E5M2 && exp == 31u) return fp8_bits_float(sign | (mant ? 0x7FC00000u : 0x7F800000u));
  if (exp == 0) {
    // subnormal: mant * 2^(1 - bias - man), exact in float32
    const float unit = fp8_bits_float(static_cast<uint32_t>(127 + 1 - fp8_bias(f) - man) << 23);
    const float v = static_cast<float>(mant) * unit;
    return sign ? -v : v;
  }
  return fp8_bits_float(sign | ((exp - fp8_bias(f) + 127u) << 23) | (mant << (23 - man)));
}

// Note [FP8 scaling]
// The scale's exponent k from amax: the largest integer with amax * 2^k <= max_value(f), clamped
// to [-126, 126] so that 2^k and 2^-k are normal floats. amax = 0 (or a float subnormal: nothing
// to scale) and a non-finite amax (an infinity in the tensor: it saturates either way) give k = 0.
// Integer arithmetic on the exponent and mantissa bits: the same k on every backend.
XT_HD int fp8_scale_exponent(float amax, Fp8Format f) {
  const uint32_t bits = fp8_float_bits(amax) & 0x7FFFFFFFu;
  if (bits < 0x00800000u || bits >= 0x7F800000u) return 0;
  const int ea = static_cast<int>(bits >> 23) - 127;
  const uint32_t fmax_bits = fp8_float_bits(fp8_max_value(f));
  const int emax = static_cast<int>(fmax_bits >> 23) - 127;
  // amax = ma * 2^ea, max = mm * 2^emax (ma, mm in [1, 2)): amax * 2^k <= max iff k <= emax - ea,
  // minus one when ma > mm
  int k = emax - ea - ((bits & 0x7FFFFFu) > (fmax_bits & 0x7FFFFFu) ? 1 : 0);
  if (k > 126) k = 126;
  if (k < -126) k = -126;
  return k;
}

// 2^k as a float, |k| <= 126.
XT_HD float fp8_pow2(int k) { return fp8_bits_float(static_cast<uint32_t>(k + 127) << 23); }

// A tensor's quantisation record, 2 floats in the tensor's device memory: [kFp8MetaScale] the
// dequantisation factor 2^-k (written by fp8_cast, read by the GEMM as cuBLASLt's A/B scale),
// [kFp8MetaAmax] amax = max |x| (written by fp8_amax). The scale comes first: cuBLASLt refuses a
// scale pointer that is not 16-byte aligned (CUBLAS_STATUS_NOT_SUPPORTED from cublasLtMatmul after
// its heuristic accepted the call; measured on the H200 with cuBLASLt 13.1 by dev/fp8_lt_probe.cu:
// every variant with the scale at a 4-byte offset refused, every one at the record's start ran),
// and the record is a tensor of its own, so its start has the allocator's alignment.
constexpr int kFp8MetaScale = 0;
constexpr int kFp8MetaAmax = 1;
constexpr int kFp8MetaFloats = 2;

}  // namespace kernels
}  // namespace xt
