// What the emulation tests share: numbers to the kernels' storage types and back, and the two
// checks (close within a relative tolerance, or bitwise equal), each printing one line and
// counting its failures in emucheck::failures (the test's exit status).
#pragma once
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "core/bf16.h"
#include "kernels/common.h"

namespace emucheck {

inline int failures = 0;

template <typename T>
std::vector<T> as(const std::vector<float>& x) {
  std::vector<T> v(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    if constexpr (std::is_same_v<T, xt::kernels::bf16_t>) {
      const uint16_t bits = xt::float_to_bf16(x[i]).bits;
      std::memcpy(static_cast<void*>(&v[i]), &bits, 2);
    } else {
      v[i] = x[i];
    }
  }
  return v;
}

template <typename T>
std::vector<float> floats(const std::vector<T>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = xt::kernels::load(v.data(), static_cast<int64_t>(i));
  return f;
}

inline void expect_close(const std::string& what, const std::vector<float>& a, const std::vector<float>& b,
                         double tol) {
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(double(a[i]) - b[i]) / (1.0 + std::abs(double(b[i])));
    if (!(d <= worst)) worst = d, at = i;
  }
  const bool ok = a.size() == b.size() && worst <= tol;
  if (!ok) ++failures;
  std::printf("  %-28s %s (worst %.3g at %zu)\n", what.c_str(), ok ? "ok" : "FAIL", worst, at);
}

template <typename T>
void expect_bits(const std::string& what, const std::vector<T>& a, const std::vector<T>& b) {
  const bool ok = a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
  if (!ok) ++failures;
  std::printf("  %-28s %s\n", what.c_str(), ok ? "bitwise equal" : "FAIL (bits differ)");
}

}  // namespace emucheck
