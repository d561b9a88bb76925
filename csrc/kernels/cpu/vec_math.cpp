// The CPU kernels' float32 exp loops (vec_math.h): an AVX2 path of 8 lanes, chosen once at run
// time, and the one-element path it must match bit for bit. The AVX2 functions are compiled for
// AVX2 alone (no FMA), so the compiler cannot fuse their multiplies and adds either.
#include "kernels/cpu/vec_math.h"

#include <cmath>
#include <limits>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define XT_VEC_MATH_AVX2 1
#endif

namespace xt {
namespace kernels {
namespace cpu {

namespace {

float add_lanes(const float* l) { return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])); }

// exp_shift_sum_f32's elements [from, n) after the lanes: stored, and added to sum one by one.
float exp_tail(const float* x, float shift, float* y, int64_t from, int64_t n, float sum) {
  for (int64_t i = from; i < n; ++i) {
    const float v = exp_f32(x[i] - shift);
    if (y) y[i] = v;
    sum += v;
  }
  return sum;
}

#ifdef XT_VEC_MATH_AVX2

bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}

// exp_f32 of 8 lanes: the same operations, in the same order.
__attribute__((target("avx2"))) __m256 exp8(__m256 x) {
  using namespace vexp;
  x = _mm256_max_ps(_mm256_set1_ps(kLo), x);  // kLo > x ? kLo : x (NaN stays)
  x = _mm256_min_ps(_mm256_set1_ps(kHi), x);  // kHi < x ? kHi : x
  const __m256 round = _mm256_set1_ps(kRound);
  const __m256 t = _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), round);
  const __m256 nf = _mm256_sub_ps(t, round);
  const __m256i n = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(bits_of(kRound)));
  __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(nf, _mm256_set1_ps(kLn2Hi)));
  r = _mm256_sub_ps(r, _mm256_mul_ps(nf, _mm256_set1_ps(kLn2Lo)));
  const __m256 r2 = _mm256_mul_ps(r, r);
  __m256 p = _mm256_set1_ps(kC7);
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kC6));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kC5));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kC4));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kC3));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kC2));
  p = _mm256_add_ps(_mm256_mul_ps(p, r2), r);
  p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
  const __m256i n1 = _mm256_srai_epi32(n, 1), n2 = _mm256_sub_epi32(n, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

__attribute__((target("avx2"))) float exp_shift_sum_avx2(const float* x, float shift, float* y, int64_t n) {
  const int64_t n8 = n & ~int64_t(7);
  const __m256 sh = _mm256_set1_ps(shift);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n8; i += 8) {
    const __m256 v = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), sh));
    if (y) _mm256_storeu_ps(y + i, v);
    acc = _mm256_add_ps(acc, v);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  return exp_tail(x, shift, y, n8, n, add_lanes(lanes));
}

__attribute__((target("avx2"))) void sigmoid_rows_avx2(const float* x, float* y, int64_t n) {
  const int64_t n8 = n & ~int64_t(7);
  const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
  for (int64_t i = 0; i < n8; i += 8) {
    const __m256 e = exp8(_mm256_xor_ps(_mm256_loadu_ps(x + i), sign));  // e^-x
    _mm256_storeu_ps(y + i, _mm256_div_ps(one, _mm256_add_ps(one, e)));
  }
  for (int64_t i = n8; i < n; ++i) y[i] = sigmoid_f32(x[i]);
}

__attribute__((target("avx2"))) float max_avx2(const float* x, int64_t n) {
  const int64_t n8 = n & ~int64_t(7);
  __m256 m = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < n8; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + i), m);  // v > m ? v : m
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float mx = -std::numeric_limits<float>::infinity();
  for (float v : lanes) mx = v > mx ? v : mx;
  for (int64_t i = n8; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  return mx;
}

#endif  // XT_VEC_MATH_AVX2

}  // namespace

float exp_shift_sum_f32_scalar(const float* x, float shift, float* y, int64_t n) {
  const int64_t n8 = n & ~int64_t(7);
  float lanes[8] = {};
  for (int64_t i = 0; i < n8; ++i) {
    const float v = exp_f32(x[i] - shift);
    if (y) y[i] = v;
    lanes[i & 7] += v;
  }
  return exp_tail(x, shift, y, n8, n, add_lanes(lanes));
}

void sigmoid_rows_f32_scalar(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = sigmoid_f32(x[i]);
}

float exp_shift_sum_f32(const float* x, float shift, float* y, int64_t n) {
#ifdef XT_VEC_MATH_AVX2
  if (has_avx2()) return exp_shift_sum_avx2(x, shift, y, n);
#endif
  return exp_shift_sum_f32_scalar(x, shift, y, n);
}

void sigmoid_rows_f32(const float* x, float* y, int64_t n) {
#ifdef XT_VEC_MATH_AVX2
  if (has_avx2()) return sigmoid_rows_avx2(x, y, n);
#endif
  sigmoid_rows_f32_scalar(x, y, n);
}

float max_f32(const float* x, int64_t n) {
#ifdef XT_VEC_MATH_AVX2
  if (has_avx2()) return max_avx2(x, n);
#endif
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  return mx;
}

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
