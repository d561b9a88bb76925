// Error types and check macros for the whole engine.
//
// Every C++ exception thrown here maps to one Python exception type in the bindings
// (csrc/python/module.cpp): ValueError, TypeError, IndexError, RuntimeError and
// xtrain.OutOfMemoryError. Messages name the argument and the shapes/dtypes/devices seen.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace xt {

struct ValueError : std::runtime_error { using std::runtime_error::runtime_error; };
struct TypeError : std::runtime_error { using std::runtime_error::runtime_error; };
struct IndexError : std::runtime_error { using std::runtime_error::runtime_error; };
struct RuntimeError : std::runtime_error { using std::runtime_error::runtime_error; };
// Also a MemoryError on the Python side; the allocator throws it with the full picture.
struct OutOfMemoryError : std::runtime_error { using std::runtime_error::runtime_error; };

namespace detail {
inline void str_into(std::ostringstream&) {}
template <typename T, typename... Rest>
void str_into(std::ostringstream& os, const T& v, const Rest&... rest) {
  os << v;
  str_into(os, rest...);
}
}  // namespace detail

// Concatenate anything printable into one string.
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  detail::str_into(os, args...);
  return os.str();
}

}  // namespace xt

// XT_CHECK(cond, ErrorType, message parts...): throw ErrorType(message) when cond is false.
#define XT_CHECK(cond, Err, ...)                         \
  do {                                                   \
    if (!(cond)) throw ::xt::Err(::xt::str(__VA_ARGS__)); \
  } while (0)

// Internal invariant: a failure is a bug in xtrain, not in the caller's input.
#define XT_ASSERT(cond, ...)                                                              \
  do {                                                                                    \
    if (!(cond))                                                                          \
      throw std::runtime_error(::xt::str("xtrain internal error at ", __FILE__, ":", __LINE__, \
                                         ": ", #cond, " ", ##__VA_ARGS__));               \
  } while (0)
