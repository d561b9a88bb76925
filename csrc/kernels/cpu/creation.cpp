// CPU creation kernels: fill, cast, cast_many, random_fill, arange. All write their output with `=`.
// cast_many is cast applied tensor by tensor (the same loops, so the same bits); a CPU gains
// nothing from fusing the list, only the CUDA side does (one launch instead of one per tensor).
// random_fill: element i draws from philox(seed, offset + i), the same values the CUDA kernel
// produces (normal: Box-Muller on the first two 32-bit words of that draw).
#include <cmath>
#include <type_traits>

#include "core/philox.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/kernels.h"

namespace xt {
namespace kernels {
namespace cpu {

namespace {

template <typename T>
void store_any(T* p, int64_t i, double v) {
  if constexpr (std::is_same_v<T, bf16>) p[i] = float_to_bf16(static_cast<float>(v));
  else p[i] = static_cast<T>(v);
}

template <typename T>
double load_any(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, bf16>) return bf16_to_float(p[i]);
  else return static_cast<double>(p[i]);
}

}  // namespace

void fill(DType dt, void* out, int64_t n, double value, void*) {
  dispatch_all(dt, "fill", [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* o = static_cast<T*>(out);
    T v;
    store_any(&v, 0, value);
    for (int64_t i = 0; i < n; ++i) o[i] = v;
  });
}

void cast(DType src_dt, const void* src, DType dst_dt, void* dst, int64_t n, void*) {
  dispatch_all(src_dt, "cast", [&](auto stag) {
    using S = std::remove_pointer_t<decltype(stag)>;
    dispatch_all(dst_dt, "cast", [&](auto dtag) {
      using D = std::remove_pointer_t<decltype(dtag)>;
      const S* s = static_cast<const S*>(src);
      D* d = static_cast<D*>(dst);
      if constexpr (std::is_same_v<S, bf16> && std::is_same_v<D, float>) {
        for (int64_t i = 0; i < n; ++i) d[i] = bf16_to_float(s[i]);
      } else if constexpr (std::is_same_v<S, float> && std::is_same_v<D, bf16>) {
        for (int64_t i = 0; i < n; ++i) d[i] = float_to_bf16(s[i]);
      } else {
        for (int64_t i = 0; i < n; ++i) store_any(d, i, load_any(s, i));
      }
    });
  });
}

void cast_many(int n_tensors, DType src_dt, const void* const* src, DType dst_dt, void* const* dst,
               const int64_t* sizes, void* stream) {
  for (int t = 0; t < n_tensors; ++t) cast(src_dt, src[t], dst_dt, dst[t], sizes[t], stream);
}

void random_fill(RandomKind kind, DType dt, void* out, int64_t n, uint64_t seed, uint64_t offset, void*) {
  dispatch_float(dt, "random_fill", [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* o = static_cast<T*>(out);
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t counter = offset + static_cast<uint64_t>(i);
      float v;
      if (kind == RandomKind::Uniform) {
        v = philox_uniform(seed, counter);
      } else {
        Philox4 r = philox4x32_10(seed, counter);
        // u1 in (0, 1] keeps log() finite; u2 in [0, 1).
        float u1 = static_cast<float>((r.v[0] >> 8) + 1) * (1.0f / 16777216.0f);
        float u2 = static_cast<float>(r.v[1] >> 8) * (1.0f / 16777216.0f);
        v = std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853071795864769f * u2);
      }
      store_any(o, i, static_cast<double>(v));
    }
  });
}

void arange(DType dt, void* out, int64_t n, double start, double step, void*) {
  dispatch_all(dt, "arange", [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* o = static_cast<T*>(out);
    for (int64_t i = 0; i < n; ++i) store_any(o, i, start + step * static_cast<double>(i));
  });
}

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
