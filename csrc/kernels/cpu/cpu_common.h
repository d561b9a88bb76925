// Shared helpers for CPU kernels: typed loads/stores and dtype dispatch.
//
// Storage types: float, double, bf16 (core/bf16.h). Compute type: float for float/bf16,
// double for double. load() widens, store() rounds once (round-to-nearest-even for bf16).
#pragma once
#include <cstdint>

#include "core/bf16.h"
#include "core/dtype.h"
#include "core/error.h"

namespace xt {
namespace kernels {
namespace cpu {

template <typename T> struct Compute { using type = float; };
template <> struct Compute<double> { using type = double; };
template <typename T> using compute_t = typename Compute<T>::type;

inline float load(const float* p, int64_t i) { return p[i]; }
inline double load(const double* p, int64_t i) { return p[i]; }
inline float load(const bf16* p, int64_t i) { return bf16_to_float(p[i]); }
inline void store(float* p, int64_t i, float v) { p[i] = v; }
inline void store(double* p, int64_t i, double v) { p[i] = v; }
inline void store(bf16* p, int64_t i, float v) { p[i] = float_to_bf16(v); }

// Call fn with a null pointer of the storage type for floating dtype dt:
//   dispatch_float(dt, "op", [&](auto tag) { using T = std::remove_pointer_t<decltype(tag)>; ... });
template <typename Fn>
void dispatch_float(DType dt, const char* op, Fn&& fn) {
  switch (dt) {
    case DType::Float32: fn(static_cast<float*>(nullptr)); return;
    case DType::BFloat16: fn(static_cast<bf16*>(nullptr)); return;
    case DType::Float64: fn(static_cast<double*>(nullptr)); return;
    default: throw TypeError(str(op, ": unsupported dtype ", dtype_name(dt)));
  }
}

// Same, including the integer dtypes.
template <typename Fn>
void dispatch_all(DType dt, const char* op, Fn&& fn) {
  switch (dt) {
    case DType::Int32: fn(static_cast<int32_t*>(nullptr)); return;
    case DType::Int64: fn(static_cast<int64_t*>(nullptr)); return;
    default: dispatch_float(dt, op, fn);
  }
}

// Integer index loads (ids, targets).
inline int64_t load_index(DType id_dt, const void* ids, int64_t i) {
  return id_dt == DType::Int32 ? static_cast<const int32_t*>(ids)[i] : static_cast<const int64_t*>(ids)[i];
}

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
