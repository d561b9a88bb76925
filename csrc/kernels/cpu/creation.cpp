// CPU creation kernels: fill, cast, cast_many, random_fill, arange. All write their output with `=`.
// cast_many is cast applied tensor by tensor (the same loops, so the same bits); a CPU gains
// nothing from fusing the list, only the CUDA side does (one launch instead of one per tensor).
// random_fill: element i draws from philox(seed, offset + i) by random_value (kernels/common.h),
// the draws the CUDA kernel makes. Element i's value depends on i alone, so random_fill and
// arange split their range over the CPU threads (parallel_for) with the same bits at any count:
// a 1.7B-parameter model's initial weights are drawn in seconds instead of a minute.
#include "kernels/common.h"
#include "kernels/cpu/parallel.h"
#include "kernels/kernels.h"

namespace xt {
namespace kernels {
namespace cpu {

constexpr int64_t kDrawGrain = 1 << 14;  // elements per thread at the least (a draw is ~25 ns)

void fill(DType dt, void* out, int64_t n, double value, void*) {
  XT_DISPATCH_ALL(dt, "fill", T, {
    T* o = static_cast<T*>(out);
    T v;
    store_any(&v, 0, value);
    for (int64_t i = 0; i < n; ++i) o[i] = v;
  });
}

void cast(DType src_dt, const void* src, DType dst_dt, void* dst, int64_t n, void*) {
  XT_DISPATCH_ALL(src_dt, "cast", S, {
    XT_DISPATCH_ALL(dst_dt, "cast", D, {
      const S* s = static_cast<const S*>(src);
      D* d = static_cast<D*>(dst);
      if constexpr (std::is_same_v<S, bf16_t> && std::is_same_v<D, float>) {
        for (int64_t i = 0; i < n; ++i) d[i] = bf16_load(s[i]);
      } else if constexpr (std::is_same_v<S, float> && std::is_same_v<D, bf16_t>) {
        for (int64_t i = 0; i < n; ++i) d[i] = bf16_round(s[i]);
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
  XT_DISPATCH_FLOAT(dt, "random_fill", T, {
    T* o = static_cast<T*>(out);
    const bool normal = kind == RandomKind::Normal;
    parallel_for(n, kDrawGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i)
        store_any(o, i, static_cast<double>(random_value(normal, seed, offset + static_cast<uint64_t>(i))));
    });
  });
}

void arange(DType dt, void* out, int64_t n, double start, double step, void*) {
  XT_DISPATCH_ALL(dt, "arange", T, {
    T* o = static_cast<T*>(out);
    parallel_for(n, kDrawGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) store_any(o, i, start + step * static_cast<double>(i));
    });
  });
}

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
