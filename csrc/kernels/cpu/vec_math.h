// The CPU kernels' float32 exp, and the row loops built on it (kernels/cpu/vec_math.cpp).
//
// exp_f32 is xtrain's own exp, not the C library's: a Cody-Waite reduction x = n ln2 + r, a
// degree-7 polynomial for e^r and a scaling by 2^n in two exact halves (so results that are
// subnormal round once, and large n never overflows the exponent field), every step one IEEE
// multiply, add or subtract (no fused multiply-add), within 2 ulp of the true exp over the float
// range (tests/cpp/test_cpu_vec_math.cpp). Inputs above 89 give +inf, below -104 give 0, NaN stays
// NaN.
//
// The loops run 8 lanes at a time with AVX2 where the CPU has it (chosen once, at run time) and
// one element at a time otherwise; both evaluate the same operations in the same order, so they
// give the same bits, and so do a chunk of a row and the whole row. Every float32 exp of the CPU
// kernels goes through exp_f32 (cross-entropy, softmax, flash and decode attention, the exp, silu
// and swiglu elementwise ops): a composition and the fused op it is compared with use the same
// exp. float64 keeps the C library's exp.
//
// Sums (exp_shift_sum_f32's): element i goes into lane i % 8 of the first 8 * (n / 8) elements,
// the lanes are added as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), then the remaining
// elements one by one; a fixed order whatever the path or the thread count.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace xt {
namespace kernels {
namespace cpu {

namespace vexp {
constexpr float kLo = -104.0f;  // exp below: 0 (the smallest subnormal is e^-103.28)
constexpr float kHi = 89.0f;    // exp above: +inf (FLT_MAX is e^88.72)
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kRound = 12582912.0f;          // 1.5 * 2^23: adding it rounds to an integer
constexpr float kLn2Hi = 0.693145751953125f;   // ln 2, upper 15 bits: n * kLn2Hi is exact
constexpr float kLn2Lo = 1.42860682030941723e-6f;  // ln 2 - kLn2Hi
// e^r ~ 1 + r + r^2 (c2 + r (c3 + ... + r c7)) on |r| <= ln2 / 2: the Taylor coefficients 1/k!
// (the first term left out is below 6e-9 relative there).
constexpr float kC2 = 1.0f / 2.0f, kC3 = 1.0f / 6.0f, kC4 = 1.0f / 24.0f, kC5 = 1.0f / 120.0f,
                kC6 = 1.0f / 720.0f, kC7 = 1.0f / 5040.0f;

inline int32_t bits_of(float f) {
  int32_t i;
  std::memcpy(&i, &f, sizeof i);
  return i;
}
inline float float_of(int32_t i) {
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
}
}  // namespace vexp

// e^x in float32 (the header comment's contract); the scalar path of the vector loops.
inline float exp_f32(float x) {
  using namespace vexp;
  x = x < kLo ? kLo : x;  // NaN passes both clamps
  x = x > kHi ? kHi : x;
  const float t = x * kLog2e + kRound;
  const float nf = t - kRound;
  const int32_t n = bits_of(t) - bits_of(kRound);
  float r = x - nf * kLn2Hi;
  r = r - nf * kLn2Lo;
  const float r2 = r * r;
  float p = kC7;
  p = p * r + kC6;
  p = p * r + kC5;
  p = p * r + kC4;
  p = p * r + kC3;
  p = p * r + kC2;
  p = p * r2 + r;
  p = p + 1.0f;
  const int32_t n1 = n >> 1, n2 = n - n1;
  return (p * float_of((n1 + 127) << 23)) * float_of((n2 + 127) << 23);
}

// 1 / (1 + e^-x), the sigmoid silu and swiglu use.
inline float sigmoid_f32(float x) { return 1.0f / (1.0f + exp_f32(-x)); }

// y[i] = e^(x[i] - shift) for i < n when y is not null (y may be x), and the sum of those values
// in the header comment's order.
float exp_shift_sum_f32(const float* x, float shift, float* y, int64_t n);

// y[i] = sigmoid_f32(x[i]) (y may be x).
void sigmoid_rows_f32(const float* x, float* y, int64_t n);

// max(x[0..n)), NaN elements skipped, -inf for an empty or all-NaN range.
float max_f32(const float* x, int64_t n);

// The softmax rows of the kernels in their compute type. exp_row: p[j] = e^(p[j] - m) with
// m = max_j p[j] (*m_out), returning sum_j p[j]; exp_shift: p[j] = e^(p[j] - shift). float32 runs
// the loops above; float64 the C library's exp, summed in order.
inline float exp_row(float* p, int64_t n, float* m_out) {
  *m_out = max_f32(p, n);
  return exp_shift_sum_f32(p, *m_out, p, n);
}
inline double exp_row(double* p, int64_t n, double* m_out) {
  double m = -std::numeric_limits<double>::infinity(), l = 0;
  for (int64_t j = 0; j < n; ++j) m = p[j] > m ? p[j] : m;
  for (int64_t j = 0; j < n; ++j) {
    p[j] = std::exp(p[j] - m);
    l += p[j];
  }
  *m_out = m;
  return l;
}
inline void exp_shift(float* p, float shift, int64_t n) { exp_shift_sum_f32(p, shift, p, n); }
inline void exp_shift(double* p, double shift, int64_t n) {
  for (int64_t j = 0; j < n; ++j) p[j] = std::exp(p[j] - shift);
}

// The one-element-at-a-time paths of the loops above, whatever the CPU: the tests compare them
// with the vector paths bit for bit.
float exp_shift_sum_f32_scalar(const float* x, float shift, float* y, int64_t n);
void sigmoid_rows_f32_scalar(const float* x, float* y, int64_t n);

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
