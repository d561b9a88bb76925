// kernels/cuda/static_switch.h (host code, so it builds without CUDA): XT_BOOL_SWITCH binds the
// condition's value to a constexpr, XT_INT_SWITCH binds each listed value and raises an internal
// error for any other instead of running nothing; nested switches see every combination.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda/static_switch.h"

namespace {

template <bool B>
int as_template_arg() {
  return B ? 1 : 0;
}

template <int V>
int int_template_arg() {
  return V;
}

TEST(StaticSwitch, BoolBindsTheConditionAsAConstant) {
  for (const bool cond : {false, true}) {
    int got = -1;
    XT_BOOL_SWITCH(cond, kCond, [&] {
      static_assert(std::is_same_v<decltype(kCond), const bool>);
      got = as_template_arg<kCond>();
    });
    EXPECT_EQ(got, cond ? 1 : 0);
  }
}

TEST(StaticSwitch, IntBindsEachListedValue) {
  for (const int64_t v : {32, 64, 128}) {
    int got = -1, calls = 0;
    XT_INT_SWITCH(v, kV, (32, 64, 128), [&] {
      got = int_template_arg<kV>();
      ++calls;
    });
    EXPECT_EQ(got, v);
    EXPECT_EQ(calls, 1);
  }
}

TEST(StaticSwitch, IntRaisesForAValueOutsideTheList) {
  int calls = 0;
  try {
    XT_INT_SWITCH(96, kV, (32, 64, 128), [&] { calls += kV; });
    FAIL() << "no error for 96";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("96"), std::string::npos) << e.what();
  }
  EXPECT_EQ(calls, 0);
}

TEST(StaticSwitch, NestedSwitchesReachEveryCombination) {
  std::vector<int> seen;
  for (const int nc : {1, 2, 3})
    for (const bool a : {false, true})
      for (const bool b : {false, true}) {
        XT_INT_SWITCH(nc, NC, (1, 2, 3), [&] {
          XT_BOOL_SWITCH(a, kA, [&] {
            XT_BOOL_SWITCH(b, kB, [&] {
              if (!kA) return;  // leaves the innermost lambda only
              seen.push_back(NC * 4 + (kA ? 2 : 0) + (kB ? 1 : 0));
            });
          });
        });
      }
  EXPECT_EQ(seen, (std::vector<int>{6, 7, 10, 11, 14, 15}));
}

}  // namespace
