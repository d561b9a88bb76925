// Philox-4x32-10 counter-based random numbers, usable on host and device.
//
// Element i of a draw with (seed, offset) uses counter offset + i, so a value depends only
// on (seed, offset, i): the same on CPU and GPU and for any launch shape. That is what lets
// dropout recompute its mask instead of storing it, and checkpoint replay it exactly.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define XT_HD __host__ __device__ __forceinline__
#else
#define XT_HD inline
#endif

namespace xt {

struct Philox4 {
  uint32_t v[4];
};

XT_HD uint32_t philox_mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
}

XT_HD Philox4 philox4x32_10(uint64_t seed, uint64_t counter) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, hi1;
    uint32_t lo0 = philox_mulhilo(0xD2511F53u, c0, &hi0);
    uint32_t lo1 = philox_mulhilo(0xCD9E8D57u, c2, &hi1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// Uniform in [0, 1) with 24 random bits (exactly representable in float32).
XT_HD float philox_uniform(uint64_t seed, uint64_t counter) {
  return static_cast<float>(philox4x32_10(seed, counter).v[0] >> 8) * (1.0f / 16777216.0f);
}

}  // namespace xt
