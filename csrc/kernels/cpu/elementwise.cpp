// CPU elementwise kernels: binary (with broadcasting), accumulate, scalar ops, unary ops, SiLU
// and SwiGLU backward, dropout. (fill/cast/cast_many/random_fill/arange live in creation.cpp.)
//
// Every output and gradient is written with `=`, except accumulate, which is `a += alpha * b`.
// Each element is computed in float32 (float64 for float64) and rounded to the storage type
// once. Dropout's mask depends only on (seed, offset + i), so the backward (and a recompute)
// rebuilds the exact same mask.
#include <cmath>
#include <type_traits>

#include "core/philox.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/kernels.h"

namespace xt {
namespace kernels {
namespace cpu {

namespace {

template <typename C>
C apply_binary(BinaryOp op, C a, C b) {
  switch (op) {
    case BinaryOp::Add: return a + b;
    case BinaryOp::Sub: return a - b;
    case BinaryOp::Mul: return a * b;
    case BinaryOp::Div: return a / b;
  }
  return C(0);
}

template <typename C>
C apply_scalar(ScalarOp op, C x, C s) {
  switch (op) {
    case ScalarOp::Add: return x + s;
    case ScalarOp::Mul: return x * s;
    case ScalarOp::RSub: return s - x;
    case ScalarOp::Div: return x / s;
    case ScalarOp::RDiv: return s / x;
    case ScalarOp::Pow: return std::pow(x, s);
  }
  return C(0);
}

template <typename C>
C sigmoid(C x) {
  return C(1) / (C(1) + std::exp(-x));
}

template <typename C>
C apply_unary(UnaryOp op, C x) {
  switch (op) {
    case UnaryOp::Neg: return -x;
    case UnaryOp::Exp: return std::exp(x);
    case UnaryOp::Log: return std::log(x);
    case UnaryOp::Sqrt: return std::sqrt(x);
    case UnaryOp::Silu: return x * sigmoid(x);
    case UnaryOp::Square: return x * x;
    case UnaryOp::Abs: return std::abs(x);
  }
  return C(0);
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

}  // namespace

void binary(BinaryOp op, DType dt, const void* a, const void* b, void* out, int64_t n, const Broadcast* bc,
            void*) {
  dispatch_float(dt, "binary", [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
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
  dispatch_float(dt, "accumulate", [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using C = compute_t<T>;
    T* pa = static_cast<T*>(a);
    const T* pb = static_cast<const T*>(b);
    const C al = static_cast<C>(alpha);
    if (alpha == 1.0) {
      for (int64_t i = 0; i < n; ++i) store(pa, i, load(pa, i) + load(pb, i));
    } else {
      for (int64_t i = 0; i < n; ++i) store(pa, i, load(pa, i) + al * load(pb, i));
    }
  });
}

void scalar_op(ScalarOp op, DType dt, const void* x, void* out, int64_t n, double s, void*) {
  dispatch_float(dt, "scalar_op", [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using C = compute_t<T>;
    const T* px = static_cast<const T*>(x);
    T* po = static_cast<T*>(out);
    const C cs = static_cast<C>(s);
    for (int64_t i = 0; i < n; ++i) store(po, i, apply_scalar<C>(op, load(px, i), cs));
  });
}

void unary(UnaryOp op, DType dt, const void* x, void* out, int64_t n, void*) {
  dispatch_float(dt, "unary", [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using C = compute_t<T>;
    const T* px = static_cast<const T*>(x);
    T* po = static_cast<T*>(out);
    for (int64_t i = 0; i < n; ++i) store(po, i, apply_unary<C>(op, load(px, i)));
  });
}

// silu'(x) = s + x * s * (1 - s) with s = sigmoid(x).
void silu_backward(DType dt, const void* x, const void* dy, void* dx, int64_t n, void*) {
  dispatch_float(dt, "silu_backward", [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using C = compute_t<T>;
    const T* px = static_cast<const T*>(x);
    const T* pdy = static_cast<const T*>(dy);
    T* pdx = static_cast<T*>(dx);
    for (int64_t i = 0; i < n; ++i) {
      const C v = load(px, i);
      const C s = sigmoid(v);
      store(pdx, i, load(pdy, i) * s * (C(1) + v * (C(1) - s)));
    }
  });
}

void swiglu_forward(DType dt, const void* gate, const void* up, void* out, int64_t n, void*) {
  dispatch_float(dt, "swiglu_forward", [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using C = compute_t<T>;
    const T* pg = static_cast<const T*>(gate);
    const T* pu = static_cast<const T*>(up);
    T* po = static_cast<T*>(out);
    for (int64_t i = 0; i < n; ++i) {
      const C g = load(pg, i);
      store(po, i, g * sigmoid(g) * load(pu, i));
    }
  });
}

// dgate = dout * up * silu'(gate), dup = dout * silu(gate); both written with `=`.
void swiglu_backward(DType dt, const void* gate, const void* up, const void* dout, void* dgate, void* dup,
                     int64_t n, void*) {
  dispatch_float(dt, "swiglu_backward", [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using C = compute_t<T>;
    const T* pg = static_cast<const T*>(gate);
    const T* pu = static_cast<const T*>(up);
    const T* pd = static_cast<const T*>(dout);
    T* pdg = static_cast<T*>(dgate);
    T* pdu = static_cast<T*>(dup);
    for (int64_t i = 0; i < n; ++i) {
      const C g = load(pg, i), u = load(pu, i), d = load(pd, i);
      const C s = sigmoid(g);
      store(pdg, i, d * u * s * (C(1) + g * (C(1) - s)));
      store(pdu, i, d * g * s);
    }
  });
}

// Element i is dropped when philox_uniform(seed, offset + i) < p; kept ones are scaled by 1/(1-p).
void dropout(DType dt, const void* x, void* out, int64_t n, float p, uint64_t seed, uint64_t offset, void*) {
  dispatch_float(dt, "dropout", [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using C = compute_t<T>;
    const T* px = static_cast<const T*>(x);
    T* po = static_cast<T*>(out);
    const C scale = C(1) / (C(1) - static_cast<C>(p));
    for (int64_t i = 0; i < n; ++i) {
      const bool dropped = philox_uniform(seed, offset + static_cast<uint64_t>(i)) < p;
      store(po, i, dropped ? C(0) : load(px, i) * scale);
    }
  });
}

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
