// CUDA elementwise kernels: fill, cast, binary (with broadcast), accumulate, scalar ops, unary,
// SiLU backward, SwiGLU forward/backward, dropout, random_fill, arange.
//
// Every output is written with `=`, except accumulate (`a += alpha * b`). Each element is
// computed in float32 (float64 for float64) and rounded once, with the same formulas as
// kernels/cpu/{elementwise,creation}.cpp. Random numbers: element i uses philox(seed, offset + i)
// (core/philox.h), so dropout masks and uniform draws equal the CPU's bit for bit, for any
// launch shape; normal draws use the same Box-Muller formula (equal up to libm rounding).
#include "core/philox.h"
#include "kernels/cuda/common.cuh"

namespace xt {
namespace kernels {
namespace cuda {

namespace {

template <typename C>
__device__ __forceinline__ C apply_binary(BinaryOp op, C a, C b) {
  switch (op) {
    case BinaryOp::Add: return a + b;
    case BinaryOp::Sub: return a - b;
    case BinaryOp::Mul: return a * b;
    case BinaryOp::Div: return a / b;
  }
  return C(0);
}

template <typename C>
__device__ __forceinline__ C apply_scalar(ScalarOp op, C x, C s) {
  switch (op) {
    case ScalarOp::Add: return x + s;
    case ScalarOp::Mul: return x * s;
    case ScalarOp::RSub: return s - x;
    case ScalarOp::Div: return x / s;
    case ScalarOp::RDiv: return s / x;
    case ScalarOp::Pow: return xpow(x, s);
  }
  return C(0);
}

template <typename C>
__device__ __forceinline__ C apply_unary(UnaryOp op, C x) {
  switch (op) {
    case UnaryOp::Neg: return -x;
    case UnaryOp::Exp: return xexp(x);
    case UnaryOp::Log: return xlog(x);
    case UnaryOp::Sqrt: return xsqrt(x);
    case UnaryOp::Silu: return x * xsigmoid(x);
    case UnaryOp::Square: return x * x;
    case UnaryOp::Abs: return xabs(x);
  }
  return C(0);
}

// ------------------------------------------------------------------ kernels

template <typename T>
__global__ void fill_kernel(T* out, int64_t n, T value) {
  XT_GRID_STRIDE(i, n) out[i] = value;
}

template <typename S, typename D>
__global__ void cast_kernel(const S* src, D* dst, int64_t n) {
  XT_GRID_STRIDE(i, n) {
    if constexpr (std::is_same_v<S, D>) dst[i] = src[i];
    else if constexpr (std::is_same_v<S, bf16_t> && std::is_same_v<D, float>) dst[i] = __bfloat162float(src[i]);
    else if constexpr (std::is_same_v<S, float> && std::is_same_v<D, bf16_t>) dst[i] = __float2bfloat16_rn(src[i]);
    else store_any(dst, i, load_any(src, i));
  }
}

template <typename T>
__global__ void binary_kernel(BinaryOp op, const T* a, const T* b, T* out, int64_t n) {
  using C = compute_t<T>;
  XT_GRID_STRIDE(i, n) store(out, i, apply_binary<C>(op, load(a, i), load(b, i)));
}

// Broadcast: unravel the output index over bc.shape (last dim fastest) into a/b offsets.
template <typename T>
__global__ void binary_broadcast_kernel(BinaryOp op, const T* a, const T* b, T* out, int64_t n, Broadcast bc) {
  using C = compute_t<T>;
  XT_GRID_STRIDE(i, n) {
    int64_t rem = i, aoff = 0, boff = 0;
    for (int d = bc.ndim - 1; d >= 0; --d) {
      const int64_t c = rem % bc.shape[d];
      rem /= bc.shape[d];
      aoff += c * bc.astride[d];
      boff += c * bc.bstride[d];
    }
    store(out, i, apply_binary<C>(op, load(a, aoff), load(b, boff)));
  }
}

template <typename T>
__global__ void accumulate_kernel(T* a, const T* b, int64_t n, compute_t<T> alpha, bool alpha_is_one) {
  XT_GRID_STRIDE(i, n) {
    if (alpha_is_one) store(a, i, load(a, i) + load(b, i));
    else store(a, i, load(a, i) + alpha * load(b, i));
  }
}

template <typename T>
__global__ void scalar_kernel(ScalarOp op, const T* x, T* out, int64_t n, compute_t<T> s) {
  XT_GRID_STRIDE(i, n) store(out, i, apply_scalar(op, load(x, i), s));
}

template <typename T>
__global__ void unary_kernel(UnaryOp op, const T* x, T* out, int64_t n) {
  using C = compute_t<T>;
  XT_GRID_STRIDE(i, n) store(out, i, apply_unary<C>(op, load(x, i)));
}

// silu'(x) = s + x * s * (1 - s) with s = sigmoid(x), written as s * (1 + x * (1 - s)).
template <typename T>
__global__ void silu_backward_kernel(const T* x, const T* dy, T* dx, int64_t n) {
  using C = compute_t<T>;
  XT_GRID_STRIDE(i, n) {
    const C v = load(x, i);
    const C s = xsigmoid(v);
    store(dx, i, load(dy, i) * s * (C(1) + v * (C(1) - s)));
  }
}

template <typename T>
__global__ void swiglu_forward_kernel(const T* gate, const T* up, T* out, int64_t n) {
  using C = compute_t<T>;
  XT_GRID_STRIDE(i, n) {
    const C g = load(gate, i);
    store(out, i, g * xsigmoid(g) * load(up, i));
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(const T* gate, const T* up, const T* dout, T* dgate, T* dup, int64_t n) {
  using C = compute_t<T>;
  XT_GRID_STRIDE(i, n) {
    const C g = load(gate, i), u = load(up, i), d = load(dout, i);
    const C s = xsigmoid(g);
    store(dgate, i, d * u * s * (C(1) + g * (C(1) - s)));
    store(dup, i, d * g * s);
  }
}

// Element i is dropped when philox_uniform(seed, offset + i) < p (as on the CPU).
template <typename T>
__global__ void dropout_kernel(const T* x, T* out, int64_t n, float p, compute_t<T> scale, uint64_t seed,
                               uint64_t offset) {
  using C = compute_t<T>;
  XT_GRID_STRIDE(i, n) {
    const bool dropped = philox_uniform(seed, offset + static_cast<uint64_t>(i)) < p;
    store(out, i, dropped ? C(0) : load(x, i) * scale);
  }
}

template <typename T>
__global__ void random_fill_kernel(bool normal, T* out, int64_t n, uint64_t seed, uint64_t offset) {
  XT_GRID_STRIDE(i, n) {
    const uint64_t counter = offset + static_cast<uint64_t>(i);
    float v;
    if (!normal) {
      v = philox_uniform(seed, counter);
    } else {
      const Philox4 r = philox4x32_10(seed, counter);
      // u1 in (0, 1] keeps log() finite; u2 in [0, 1). Same formula as the CPU kernel.
      const float u1 = static_cast<float>((r.v[0] >> 8) + 1) * (1.0f / 16777216.0f);
      const float u2 = static_cast<float>(r.v[1] >> 8) * (1.0f / 16777216.0f);
      v = sqrtf(-2.0f * logf(u1)) * cosf(6.2831853071795864769f * u2);
    }
    store_any(out, i, static_cast<double>(v));
  }
}

template <typename T>
__global__ void arange_kernel(T* out, int64_t n, double start, double step) {
  XT_GRID_STRIDE(i, n) store_any(out, i, start + step * static_cast<double>(i));
}

template <typename T>
T host_value(double v) {
  if constexpr (std::is_same_v<T, bf16_t>) return __float2bfloat16_rn(static_cast<float>(v));
  else return static_cast<T>(v);
}

}  // namespace

// ------------------------------------------------------------------ launchers

void fill(DType dt, void* out, int64_t n, double value, void* stream) {
  if (n == 0) return;
  OnStream on(stream);
  dispatch_all(dt, "fill", [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    fill_kernel<T><<<grid_for(n), kThreads, 0, on.s>>>(static_cast<T*>(out), n, host_value<T>(value));
    XT_LAUNCH_CHECK();
  });
}

void cast(DType src_dt, const void* src, DType dst_dt, void* dst, int64_t n, void* stream) {
  if (n == 0) return;
  OnStream on(stream);
  dispatch_all(src_dt, "cast", [&](auto stag) {
    using S = std::remove_pointer_t<decltype(stag)>;
    dispatch_all(dst_dt, "cast", [&](auto dtag) {
      using D = std::remove_pointer_t<decltype(dtag)>;
      cast_kernel<S, D><<<grid_for(n), kThreads, 0, on.s>>>(static_cast<const S*>(src), static_cast<D*>(dst), n);
      XT_LAUNCH_CHECK();
    });
  });
}

void binary(BinaryOp op, DType dt, const void* a, const void* b, void* out, int64_t n, const Broadcast* bc,
            void* stream) {
  if (n == 0) return;
  OnStream on(stream);
  dispatch_float(dt, "binary", [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    T* po = static_cast<T*>(out);
    if (bc) {
      binary_broadcast_kernel<T><<<grid_for(n), kThreads, 0, on.s>>>(op, pa, pb, po, n, *bc);
    } else {
      binary_kernel<T><<<grid_for(n), kThreads, 0, on.s>>>(op, pa, pb, po, n);
    }
    XT_LAUNCH_CHECK();
  });
}

void accumulate(DType dt, void* a, const void* b, int64_t n, double alpha, void* stream) {
  if (n == 0) return;
  OnStream on(stream);
  dispatch_float(dt, "accumulate", [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    accumulate_kernel<T><<<grid_for(n), kThreads, 0, on.s>>>(static_cast<T*>(a), static_cast<const T*>(b), n,
                                                              static_cast<compute_t<T>>(alpha), alpha == 1.0);
    XT_LAUNCH_CHECK();
  });
}

void scalar_op(ScalarOp op, DType dt, const void* x, void* out, int64_t n, double s, void* stream) {
  if (n == 0) return;
  OnStream on(stream);
  dispatch_float(dt, "scalar_op", [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    scalar_kernel<T><<<grid_for(n), kThreads, 0, on.s>>>(op, static_cast<const T*>(x), static_cast<T*>(out), n,
                                                          static_cast<compute_t<T>>(s));
    XT_LAUNCH_CHECK();
  });
}

void unary(UnaryOp op, DType dt, const void* x, void* out, int64_t n, void* stream) {
  if (n == 0) return;
  OnStream on(stream);
  dispatch_float(dt, "unary", [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    unary_kernel<T><<<grid_for(n), kThreads, 0, on.s>>>(op, static_cast<const T*>(x), static_cast<T*>(out), n);
    XT_LAUNCH_CHECK();
  });
}

void silu_backward(DType dt, const void* x, const void* dy, void* dx, int64_t n, void* stream) {
  if (n == 0) return;
  OnStream on(stream);
  dispatch_float(dt, "silu_backward", [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    silu_backward_kernel<T><<<grid_for(n), kThreads, 0, on.s>>>(static_cast<const T*>(x), static_cast<const T*>(dy),
                                                                 static_cast<T*>(dx), n);
    XT_LAUNCH_CHECK();
  });
}

void swiglu_forward(DType dt, const void* gate, const void* up, void* out, int64_t n, void* stream) {
  if (n == 0) return;
  OnStream on(stream);
  dispatch_float(dt, "swiglu_forward", [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    swiglu_forward_kernel<T><<<grid_for(n), kThreads, 0, on.s>>>(static_cast<const T*>(gate),
                                                                  static_cast<const T*>(up), static_cast<T*>(out), n);
    XT_LAUNCH_CHECK();
  });
}

void swiglu_backward(DType dt, const void* gate, const void* up, const void* dout, void* dgate, void* dup, int64_t n,
                     void* stream) {
  if (n == 0) return;
  OnStream on(stream);
  dispatch_float(dt, "swiglu_backward", [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    swiglu_backward_kernel<T><<<grid_for(n), kThreads, 0, on.s>>>(
        static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<const T*>(dout), static_cast<T*>(dgate),
        static_cast<T*>(dup), n);
    XT_LAUNCH_CHECK();
  });
}

void dropout(DType dt, const void* x, void* out, int64_t n, float p, uint64_t seed, uint64_t offset, void* stream) {
  if (n == 0) return;
  OnStream on(stream);
  dispatch_float(dt, "dropout", [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using C = compute_t<T>;
    const C scale = C(1) / (C(1) - static_cast<C>(p));
    dropout_kernel<T><<<grid_for(n), kThreads, 0, on.s>>>(static_cast<const T*>(x), static_cast<T*>(out), n, p,
                                                           scale, seed, offset);
    XT_LAUNCH_CHECK();
  });
}

void random_fill(RandomKind kind, DType dt, void* out, int64_t n, uint64_t seed, uint64_t offset, void* stream) {
  if (n == 0) return;
  OnStream on(stream);
  dispatch_float(dt, "random_fill", [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    random_fill_kernel<T><<<grid_for(n), kThreads, 0, on.s>>>(kind == RandomKind::Normal, static_cast<T*>(out), n,
                                                               seed, offset);
    XT_LAUNCH_CHECK();
  });
}

void arange(DType dt, void* out, int64_t n, double start, double step, void* stream) {
  if (n == 0) return;
  OnStream on(stream);
  dispatch_all(dt, "arange", [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    arange_kernel<T><<<grid_for(n), kThreads, 0, on.s>>>(static_cast<T*>(out), n, start, step);
    XT_LAUNCH_CHECK();
  });
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
