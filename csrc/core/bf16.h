// bfloat16 storage type for host code: the upper 16 bits of an IEEE float32.
//
// Conversion float -> bf16 rounds to nearest, ties to even, and keeps NaN a (quiet) NaN;
// bf16 -> float is exact. CUDA code uses __nv_bfloat16, which has the same bit layout.
#pragma once
#include <cstdint>
#include <cstring>

namespace xt {

struct bf16 {
  uint16_t bits;
};

inline float bf16_to_float(bf16 v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) {
    return bf16{static_cast<uint16_t>((u >> 16) | 0x0040u)};  // NaN stays NaN (quiet)
  }
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;  // round to nearest, ties to even
  return bf16{static_cast<uint16_t>(u >> 16)};
}

}  // namespace xt
