// The CPU kernels' own float32 exp (kernels/cpu/vec_math.h): within 2 ulp of the true exp over
// the float range, the edge values (overflow, underflow into subnormals and to 0, infinities,
// NaN), and the vector loops bit for bit their one-element paths (every length mod 8, sums
// included), chunked or whole.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/vec_math.h"

namespace xt {
namespace {

using kernels::cpu::exp_f32;

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Distance in units in the last place between exp_f32(x) and e^x rounded from double.
double ulp_error(float x) {
  const double want = std::exp(static_cast<double>(x));
  const float got = exp_f32(x);
  const float wf = static_cast<float>(want);
  if (std::isinf(wf) || wf == 0.0f) return got == wf ? 0.0 : 1e9;
  const float ulp = std::nextafter(std::fabs(wf), std::numeric_limits<float>::infinity()) - std::fabs(wf);
  return std::fabs(static_cast<double>(got) - want) / ulp;
}

TEST(CpuVecMath, ExpWithinTwoUlpOverTheRange) {
  double worst = 0;
  for (float x = -103.0f; x < 88.7f; x += 0.0007f) worst = std::max(worst, ulp_error(x));
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> small(-1.0f, 1.0f);
  for (int i = 0; i < 200000; ++i) worst = std::max(worst, ulp_error(small(gen)));
  EXPECT_LE(worst, 2.0);
}

TEST(CpuVecMath, ExpEdgeValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(exp_f32(0.0f), 1.0f);
  EXPECT_EQ(exp_f32(-0.0f), 1.0f);
  EXPECT_EQ(exp_f32(inf), inf);
  EXPECT_EQ(exp_f32(89.0f), inf);
  EXPECT_EQ(exp_f32(1e30f), inf);
  EXPECT_EQ(exp_f32(-inf), 0.0f);
  EXPECT_EQ(exp_f32(-104.0f), 0.0f);
  EXPECT_EQ(exp_f32(-1e30f), 0.0f);
  EXPECT_TRUE(std::isnan(exp_f32(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isfinite(exp_f32(88.7f)));
  const float sub = exp_f32(-100.0f);  // a subnormal result, rounded once
  EXPECT_GT(sub, 0.0f);
  EXPECT_LT(sub, std::numeric_limits<float>::min());
  EXPECT_NEAR(sub, std::exp(-100.0), 2 * std::numeric_limits<float>::denorm_min());
}

std::vector<float> inputs(int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 6.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(gen);
  if (n > 3) {
    v[1] = std::numeric_limits<float>::quiet_NaN();
    v[2] = -std::numeric_limits<float>::infinity();
    v[3] = 95.0f;
  }
  return v;
}

TEST(CpuVecMath, VectorLoopsAreTheirScalarPathsBitwise) {
  using namespace kernels::cpu;
  for (int64_t n : {0, 1, 5, 8, 9, 15, 16, 33, 4096, 4099}) {
    const std::vector<float> x = inputs(n, static_cast<unsigned>(n) + 1);
    std::vector<float> y(x.size()), ys(x.size());
    const float sum = exp_shift_sum_f32(x.data(), 1.25f, y.data(), n);
    const float sums = exp_shift_sum_f32_scalar(x.data(), 1.25f, ys.data(), n);
    EXPECT_EQ(bits(sum), bits(sums)) << "n " << n;
    EXPECT_EQ(std::memcmp(y.data(), ys.data(), y.size() * sizeof(float)), 0) << "n " << n;
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(bits(ys[i]), bits(exp_f32(x[i] - 1.25f))) << i;
    EXPECT_EQ(bits(exp_shift_sum_f32(x.data(), 1.25f, nullptr, n)), bits(sum)) << "n " << n;

    sigmoid_rows_f32(x.data(), y.data(), n);
    sigmoid_rows_f32_scalar(x.data(), ys.data(), n);
    EXPECT_EQ(std::memcmp(y.data(), ys.data(), y.size() * sizeof(float)), 0) << "n " << n;
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(bits(ys[i]), bits(sigmoid_f32(x[i]))) << i;
    std::vector<float> chunked(x.size());  // chunk boundaries at multiples of 8 change nothing
    for (int64_t lo = 0; lo < n; lo += 24) sigmoid_rows_f32(x.data() + lo, chunked.data() + lo, std::min<int64_t>(24, n - lo));
    EXPECT_EQ(std::memcmp(chunked.data(), ys.data(), y.size() * sizeof(float)), 0) << "n " << n;
  }
}

TEST(CpuVecMath, MaxSkipsNaN) {
  using kernels::cpu::max_f32;
  std::vector<float> x = inputs(4099, 3);
  float want = -std::numeric_limits<float>::infinity();
  for (float v : x) want = v > want ? v : want;
  EXPECT_EQ(max_f32(x.data(), 4099), want);
  EXPECT_EQ(max_f32(x.data(), 0), -std::numeric_limits<float>::infinity());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> nans(11, nan);
  EXPECT_EQ(max_f32(nans.data(), 11), -std::numeric_limits<float>::infinity());
}

}  // namespace
}  // namespace xt
