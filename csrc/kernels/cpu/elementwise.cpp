// CPU elementwise kernels: binary (with broadcasting), accumulate, scalar ops, unary ops and their
// gradients, SwiGLU, dropout. (fill/cast/cast_many/random_fill/arange live in creation.cpp.)
//
// Every output and gradient is written with `=`, except accumulate, which is `a += alpha * b`.
// Each element is computed in float32 (float64 for float64) by the formulas of
// kernels/common.h, the ones the CUDA kernels use, and rounded to the storage type once.
// Dropout's mask depends only on (seed, offset + i), so the backward (and a recompute) rebuilds
// the exact same mask. SwiGLU splits its elements over the CPU backend's threads (parallel.h).
// In float32/bfloat16, exp, silu (and its gradient) and SwiGLU take their exp from vec_math.h
// (xtrain's exp_f32, the one every CPU kernel uses) with kernels/common.h's expressions around
// it; float64 and the other ops use kernels/common.h as it is.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/common.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/kernels.h"

namespace xt {
namespace kernels {
namespace cpu {

namespace {

constexpr int64_t kElementGrain = 1 << 15;  // elements per thread at the least

// *amax = max(*amax, max |p[i]|) over the n stored values (NaN ignored, as fp8_amax): the amax an
// FP8 cast of this output needs (the swiglu kernels' optional amax pointers). A maximum, so the
// order does not matter; a pass of its own here (the CUDA kernels fold it into the write).
template <typename T>
void raise_amax(const T* p, int64_t n, float* amax) {
  if (amax == nullptr) return;
  float m = *amax;
  for (int64_t i = 0; i < n; ++i) m = std::fmax(m, std::fabs(static_cast<float>(load(p, i))));
  *amax = m;
}

// Broadcast walk: the innermost dimension runs as a strided loop, the outer ones as a counter.
template <typename T>
void binary_broadcast(BinaryOp op, const T* a, const T* b, T* out, int64_t n, const Broadcast& bc) {
  using C = compute_t<T>;
  if (bc.ndim == 0) {
    if (n > 0) store(out, 0, apply_binary<C>(op, load(a, 0), load(b, 0)));
    return;
  }
  const int last = bc.ndim - 1;
  const int64_t inner = bc.shape[last];
  const int64_t as = bc.astride[last], bs = bc.bstride[last];
  int64_t idx[kMaxDims] = {};
  int64_t aoff = 0, boff = 0;
  for (int64_t o = 0; o < n; o += inner) {
    for (int64_t j = 0; j < inner; ++j)
      store(out, o + j, apply_binary<C>(op, load(a, aoff + j * as), load(b, boff + j * bs)));
    for (int d = last - 1; d >= 0; --d) {  // advance the outer counter
      aoff += bc.astride[d];
      boff += bc.bstride[d];
      if (++idx[d] < bc.shape[d]) break;
      aoff -= bc.astride[d] * bc.shape[d];
      boff -= bc.bstride[d] * bc.shape[d];
      idx[d] = 0;
    }
  }
}

// f(c0, m, xf, s) over [lo, hi) in chunks of kChunk: xf holds x[c0, c0 + m) as float32 (x itself
// when T is float), s is kChunk floats of scratch.
constexpr int64_t kChunk = 512;
template <typename T, typename F>
void float_chunks(const T* x, int64_t lo, int64_t hi, F&& f) {
  float xbuf[kChunk], s[kChunk];
  for (int64_t c0 = lo; c0 < hi; c0 += kChunk) {
    const int64_t m = std::min(kChunk, hi - c0);
    const float* xf = xbuf;
    if constexpr (std::is_same_v<T, float>) {
      xf = x + c0;
    } else {
      for (int64_t i = 0; i < m; ++i) xbuf[i] = load(x, c0 + i);
    }
    f(c0, m, xf, s);
  }
}

}  // namespace

void binary(BinaryOp op, DType dt, const void* a, const void* b, void* out, int64_t n, const Broadcast* bc,
            void*) {
  XT_DISPATCH_FLOAT(dt, "binary", T, {
    using C = compute_t<T>;
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    T* po = static_cast<T*>(out);
    if (bc) {
      binary_broadcast(op, pa, pb, po, n, *bc);
      return;
    }
    for (int64_t i = 0; i < n; ++i) store(po, i, apply_binary<C>(op, load(pa, i), load(pb, i)));
  });
}

void accumulate(DType dt, void* a, const void* b, int64_t n, double alpha, void*) {
  XT_DISPATCH_FLOAT(dt, "accumulate", T, {
    T* pa = static_cast<T*>(a);
    const T* pb = static_cast<const T*>(b);
    for (int64_t i = 0; i < n; ++i) store(pa, i, accumulate_value(load(pa, i), load(pb, i), alpha));
  });
}

void scalar_op(ScalarOp op, DType dt, const void* x, void* out, int64_t n, double s, void*) {
  XT_DISPATCH_FLOAT(dt, "scalar_op", T, {
    using C = compute_t<T>;
    const T* px = static_cast<const T*>(x);
    T* po = static_cast<T*>(out);
    const C cs = static_cast<C>(s);
    for (int64_t i = 0; i < n; ++i) store(po, i, apply_scalar<C>(op, load(px, i), cs));
  });
}

void unary(UnaryOp op, DType dt, const void* x, void* out, int64_t n, void*) {
  XT_DISPATCH_FLOAT(dt, "unary", T, {
    using C = compute_t<T>;
    const T* px = static_cast<const T*>(x);
    T* po = static_cast<T*>(out);
    if constexpr (std::is_same_v<C, float>) {
      if (op == UnaryOp::Exp || op == UnaryOp::Silu) {  // vec_math.h's exp
        float_chunks(px, 0, n, [&](int64_t c0, int64_t m, const float* xf, float* s) {
          if (op == UnaryOp::Exp) {
            exp_shift_sum_f32(xf, 0.0f, s, m);  // x - 0 is x
            for (int64_t i = 0; i < m; ++i) store(po, c0 + i, s[i]);
          } else {
            sigmoid_rows_f32(xf, s, m);
            for (int64_t i = 0; i < m; ++i) store(po, c0 + i, xf[i] * s[i]);
          }
        });
        return;
      }
    }
    for (int64_t i = 0; i < n; ++i) store(po, i, apply_unary<C>(op, load(px, i)));
  });
}

void unary_backward(UnaryOp op, DType dt, const void* x, const void* dy, void* dx, int64_t n, void*) {
  XT_DISPATCH_FLOAT(dt, "unary_backward", T, {
    using C = compute_t<T>;
    const T* px = static_cast<const T*>(x);
    const T* pdy = static_cast<const T*>(dy);
    T* pdx = static_cast<T*>(dx);
    if constexpr (std::is_same_v<C, float>) {
      if (op == UnaryOp::Silu) {  // silu'(x) = s + x * s * (1 - s), s = sigmoid_f32(x)
        float_chunks(px, 0, n, [&](int64_t c0, int64_t m, const float* xf, float* s) {
          sigmoid_rows_f32(xf, s, m);
          for (int64_t i = 0; i < m; ++i)
            store(pdx, c0 + i, load(pdy, c0 + i) * s[i] * (1.0f + xf[i] * (1.0f - s[i])));
        });
        return;
      }
    }
    for (int64_t i = 0; i < n; ++i) store(pdx, i, apply_unary_grad<C>(op, load(px, i), load(pdy, i)));
  });
}

void swiglu_forward(DType dt, const void* gate, const void* up, void* out, int64_t n, float* out_amax, void*) {
  XT_DISPATCH_FLOAT(dt, "swiglu_forward", T, {
    const T* pg = static_cast<const T*>(gate);
    const T* pu = static_cast<const T*>(up);
    T* po = static_cast<T*>(out);
    parallel_for(n, kElementGrain, [&](int64_t lo, int64_t hi) {
      if constexpr (std::is_same_v<compute_t<T>, float>) {
        float_chunks(pg, lo, hi, [&](int64_t c0, int64_t m, const float* g, float* s) {
          sigmoid_rows_f32(g, s, m);
          for (int64_t i = 0; i < m; ++i) store(po, c0 + i, g[i] * s[i] * load(pu, c0 + i));
        });
      } else {
        for (int64_t i = lo; i < hi; ++i) store(po, i, swiglu_value(load(pg, i), load(pu, i)));
      }
    });
    raise_amax(po, n, out_amax);
  });
}

// dgate = dout * up * silu'(gate), dup = dout * silu(gate); both written with `=`.
void swiglu_backward(DType dt, const void* gate, const void* up, const void* dout, void* dgate, void* dup,
                     int64_t n, float* dgate_amax, float* dup_amax, void*) {
  XT_DISPATCH_FLOAT(dt, "swiglu_backward", T, {
    using C = compute_t<T>;
    const T* pg = static_cast<const T*>(gate);
    const T* pu = static_cast<const T*>(up);
    const T* pd = static_cast<const T*>(dout);
    T* pdg = static_cast<T*>(dgate);
    T* pdu = static_cast<T*>(dup);
    parallel_for(n, kElementGrain, [&](int64_t lo, int64_t hi) {
      if constexpr (std::is_same_v<C, float>) {  // swiglu_grads' expressions with sigmoid_f32
        float_chunks(pg, lo, hi, [&](int64_t c0, int64_t m, const float* g, float* s) {
          sigmoid_rows_f32(g, s, m);
          for (int64_t i = 0; i < m; ++i) {
            const float u = load(pu, c0 + i), d = load(pd, c0 + i);
            store(pdg, c0 + i, d * u * s[i] * (1.0f + g[i] * (1.0f - s[i])));
            store(pdu, c0 + i, d * g[i] * s[i]);
          }
        });
      } else {
        for (int64_t i = lo; i < hi; ++i) {
          C dg, du;
          swiglu_grads<C>(load(pg, i), load(pu, i), load(pd, i), &dg, &du);
          store(pdg, i, dg);
          store(pdu, i, du);
        }
      }
    });
    raise_amax(pdg, n, dgate_amax);
    raise_amax(pdu, n, dup_amax);
  });
}

void dropout(DType dt, const void* x, void* out, int64_t n, float p, uint64_t seed, uint64_t offset,
             const uint64_t* base, void*) {
  if (base != nullptr) {  // Note [Random draws in captured graphs] (core/generator.h)
    seed = base[0];
    offset += base[1];
  }
  XT_DISPATCH_FLOAT(dt, "dropout", T, {
    const T* px = static_cast<const T*>(x);
    T* po = static_cast<T*>(out);
    for (int64_t i = 0; i < n; ++i)
      store(po, i, dropout_value(load(px, i), p, seed, offset + static_cast<uint64_t>(i)));
  });
}

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
