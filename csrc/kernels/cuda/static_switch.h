// Compile-time switches for the kernel launchers: a runtime value bound to a constexpr of the same
// meaning in one line per call site, so that a launcher names a kernel template once instead of
// spelling out each instantiation in an if/else or switch ladder (flash-attention's
// static_switch.h has the idea).
//
//   XT_BOOL_SWITCH(vec, kVec, [&] { launch<kVec>(...); });
//       runs the lambda with `constexpr bool kVec` equal to vec;
//   XT_INT_SWITCH(D, kD, (32, 64, 128), [&] { launch<kD>(...); });
//       runs it with `constexpr int kD` equal to D, which must be one of the listed values: the
//       caller has chosen the path for which these are the values (any other is an internal
//       error, not a silent non-launch).
//
// The lambda is instantiated once per value; `return` inside it leaves the lambda. Host code only:
// each value instantiates exactly the kernel the spelled-out ladder named, so no kernel and no bit
// changes.
#pragma once
#include <cstdint>
#include <type_traits>

#include "core/error.h"

namespace xt {
namespace kernels {
namespace cuda {

// fn(std::integral_constant<int, V>{}) for the V of Vs equal to v; false (nothing called) when v is
// none of them.
template <int... Vs, typename Fn>
bool call_with_constant(int64_t v, Fn&& fn) {
  return ((v == Vs ? (fn(std::integral_constant<int, Vs>{}), true) : false) || ...);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt

#define XT_BOOL_SWITCH(COND, NAME, ...) \
  do {                                  \
    if (COND) {                         \
      constexpr bool NAME = true;       \
      (__VA_ARGS__)();                  \
    } else {                            \
      constexpr bool NAME = false;      \
      (__VA_ARGS__)();                  \
    }                                   \
  } while (0)

#define XT_SWITCH_VALUES(...) __VA_ARGS__
#define XT_INT_SWITCH(VALUE, NAME, VALUES, ...)                                                       \
  do {                                                                                               \
    const int64_t xt_switch_value = (VALUE);                                                         \
    const bool xt_switch_hit = ::xt::kernels::cuda::call_with_constant<XT_SWITCH_VALUES VALUES>(     \
        xt_switch_value, [&](auto xt_switch_constant) {                                              \
          constexpr int NAME = decltype(xt_switch_constant)::value;                                  \
          (__VA_ARGS__)();                                                                           \
        });                                                                                          \
    XT_ASSERT(xt_switch_hit, #VALUE " = ", xt_switch_value, " is not one of " #VALUES);              \
  } while (0)
