// CUDA elementwise kernels: fill, cast, cast_many, binary (with broadcast), accumulate, scalar ops,
// unary and its gradients, SwiGLU forward/backward, dropout, random_fill, arange.
//
// Every output is written with `=`, except accumulate (`a += alpha * b`). Each element is
// computed in float32 (float64 for float64) and rounded once, by the formulas of
// kernels/common.h that the CPU kernels use too. Random numbers: element i uses
// philox(seed, offset + i) (core/philox.h), so dropout masks and uniform draws equal the CPU's
// bit for bit, for any launch shape; normal draws use the same Box-Muller formula (equal up to
// libm rounding).
// Same-shape elementwise work runs through one map kernel (map_kernel) that moves 16-byte packs
// per thread; every element's value is the same as with one element per thread.
// cast_many converts a list of tensors in one launch (up to kCastManyMaxTensors; the list rides
// in the kernel parameters, no host sync): each tensor is cut into kCastChunk-element chunks, one
// block per chunk, so a block's elements are contiguous and pack-aligned whenever the tensor's
// pointers are. Each element goes through cast_one, i.e. CastF, so the bits equal cast's.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8_cast.cuh"  // fold_block_amax: the outputs' amax, as amax_kernel folds it

namespace xt {
namespace kernels {
namespace cuda {

namespace {

// ------------------------------------------------------------------ the elementwise map

// Pointers of one map launch: NI inputs of type TI, NO outputs of type TO.
template <typename TI, int NI, typename TO, int NO>
struct MapArgs {
  const TI* in[NI];
  TO* out[NO];
};

using fp8::fold_block_amax;  // the outputs' amax (OutAmax: the FP8 casts' amax taken by the producer)
using fp8::OutAmax;

// out_j[i] = f(i, in_0[i], ..., in_NI-1[i])_j. Each thread moves N consecutive elements per step
// as aligned packs; the < N leftover elements run one per thread. f sees compute-type values
// and the element index (dropout's counter), so the result never depends on N.
// kAmax: also each output's max |value| as stored, into am (OutAmax above); blockDim.x == kThreads.
template <int N, bool kAmax, typename TI, int NI, typename TO, int NO, typename F>
__global__ void map_kernel(MapArgs<TI, NI, TO, NO> a, int64_t n, F f, OutAmax<NO> am) {
  using CI = compute_t<TI>;
  using CO = compute_t<TO>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = n / N;
  float m[NO];
#pragma unroll
  for (int j = 0; j < NO; ++j) m[j] = 0.0f;
  for (int64_t v = tid; v < nv; v += stride) {
    const int64_t base = v * N;
    Pack<TI, N> pin[NI];
#pragma unroll
    for (int j = 0; j < NI; ++j) pin[j] = *reinterpret_cast<const Pack<TI, N>*>(a.in[j] + base);
    Pack<TO, N> pout[NO];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      CI x[NI];
      CO y[NO];
#pragma unroll
      for (int j = 0; j < NI; ++j) x[j] = to_compute(pin[j].v[k]);
      f(base + k, x, y);
#pragma unroll
      for (int j = 0; j < NO; ++j) {
        pout[j].v[k] = from_compute<TO>(y[j]);
        if constexpr (kAmax) m[j] = fmaxf(m[j], fabsf(static_cast<float>(to_compute(pout[j].v[k]))));
      }
    }
#pragma unroll
    for (int j = 0; j < NO; ++j) *reinterpret_cast<Pack<TO, N>*>(a.out[j] + base) = pout[j];
  }
  for (int64_t i = nv * N + tid; i < n; i += stride) {
    CI x[NI];
    CO y[NO];
#pragma unroll
    for (int j = 0; j < NI; ++j) x[j] = to_compute(a.in[j][i]);
    f(i, x, y);
#pragma unroll
    for (int j = 0; j < NO; ++j) {
      a.out[j][i] = from_compute<TO>(y[j]);
      if constexpr (kAmax) m[j] = fmaxf(m[j], fabsf(static_cast<float>(to_compute(a.out[j][i]))));
    }
  }
  if constexpr (kAmax) fold_block_amax<kThreads>(m, am);
}

// 16-byte packs when every pointer allows it (tensors from the allocator always do; views at
// odd offsets fall back to one element per step). am (optional): the outputs' amax (OutAmax).
template <typename TI, int NI, typename TO, int NO, typename F>
void launch_map(const OnStream& on, int64_t n, const MapArgs<TI, NI, TO, NO>& a, F f,
                const OutAmax<NO>* am = nullptr) {
  constexpr int N = 16 / (sizeof(TI) > sizeof(TO) ? sizeof(TI) : sizeof(TO));
  bool vec = n >= N;
  for (int j = 0; j < NI; ++j) vec = vec && aligned_to(a.in[j], sizeof(Pack<TI, N>));
  for (int j = 0; j < NO; ++j) vec = vec && aligned_to(a.out[j], sizeof(Pack<TO, N>));
  const unsigned grid = vec ? grid_for(n / N) : grid_for(n);
  if (am != nullptr) {
    if (vec) map_kernel<N, true><<<grid, kThreads, 0, on.s>>>(a, n, f, *am);
    else map_kernel<1, true><<<grid, kThreads, 0, on.s>>>(a, n, f, *am);
  } else {
    if (vec) map_kernel<N, false><<<grid, kThreads, 0, on.s>>>(a, n, f, OutAmax<NO>{});
    else map_kernel<1, false><<<grid, kThreads, 0, on.s>>>(a, n, f, OutAmax<NO>{});
  }
  XT_LAUNCH_CHECK();
}

// The element functions: the formulas of kernels/common.h, which the CPU kernels use too.
struct BinaryF {
  BinaryOp op;
  template <typename C> __device__ void operator()(int64_t, const C (&x)[2], C (&y)[1]) const {
    y[0] = apply_binary(op, x[0], x[1]);
  }
};

struct AccumulateF {
  double alpha;
  template <typename C> __device__ void operator()(int64_t, const C (&x)[2], C (&y)[1]) const {
    y[0] = accumulate_value(x[0], x[1], alpha);
  }
};

struct ScalarF {
  ScalarOp op;
  double s;
  template <typename C> __device__ void operator()(int64_t, const C (&x)[1], C (&y)[1]) const {
    y[0] = apply_scalar(op, x[0], static_cast<C>(s));
  }
};

struct UnaryF {
  UnaryOp op;
  template <typename C> __device__ void operator()(int64_t, const C (&x)[1], C (&y)[1]) const {
    y[0] = apply_unary(op, x[0]);
  }
};

// x = (x, dy) -> dx
struct UnaryGradF {
  UnaryOp op;
  template <typename C> __device__ void operator()(int64_t, const C (&x)[2], C (&y)[1]) const {
    y[0] = apply_unary_grad(op, x[0], x[1]);
  }
};

struct SwigluF {
  template <typename C> __device__ void operator()(int64_t, const C (&x)[2], C (&y)[1]) const {
    y[0] = swiglu_value(x[0], x[1]);
  }
};

// x = (gate, up, dout) -> y = (dgate, dup)
struct SwigluBackwardF {
  template <typename C> __device__ void operator()(int64_t, const C (&x)[3], C (&y)[2]) const {
    swiglu_grads(x[0], x[1], x[2], &y[0], &y[1]);
  }
};

struct DropoutF {
  float p;
  uint64_t seed, offset;
  const uint64_t* base;  // device words [seed, offset] of a captured graph, or nullptr
  template <typename C> __device__ void operator()(int64_t i, const C (&x)[1], C (&y)[1]) const {
    const uint64_t s = base != nullptr ? base[0] : seed, o = base != nullptr ? base[1] + offset : offset;
    y[0] = dropout_value(x[0], p, s, o + static_cast<uint64_t>(i));
  }
};

// Floating casts: through the wider compute type, rounding once (bf16 from float).
struct CastF {
  template <typename CI, typename CO> __device__ void operator()(int64_t, const CI (&x)[1], CO (&y)[1]) const {
    y[0] = static_cast<CO>(x[0]);
  }
};

// ------------------------------------------------------------------ cast_many (multi-tensor)

// One element converted exactly as cast's map_kernel<..., CastF> converts it.
template <typename D, typename S>
__device__ __forceinline__ D cast_one(S s) {
  compute_t<S> x[1] = {to_compute(s)};
  compute_t<D> y[1];
  CastF{}(0, x, y);
  return from_compute<D>(y[0]);
}

// 512 tensors: the model's 127 linear weights (and any list of a few hundred) in one launch, while
// the list (about 14 KiB for float32 -> bf16) stays within the 32 KiB kernel parameter space.
constexpr int kCastManyMaxTensors = 512;
constexpr int64_t kCastChunk = 16 * kThreads;  // elements per block: 4 16-byte packs per thread for float32
constexpr int64_t kMaxGridX = 0x7fffffff;     // blocks per launch (gridDim.x limit)

template <typename S, typename D>
struct CastList {
  int n = 0;
  int first_block[kCastManyMaxTensors + 1];  // tensor t owns blocks [first_block[t], first_block[t+1])
  int64_t size[kCastManyMaxTensors];
  const S* src[kCastManyMaxTensors];
  D* dst[kCastManyMaxTensors];
};
static_assert(sizeof(CastList<double, double>) < 32000, "CastList must fit in the kernel parameter space");

__device__ __forceinline__ bool device_aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Block b converts chunk (b - first_block[t]) of tensor t: N-element packs when both of t's
// pointers are pack-aligned (the branch is uniform over the block), one element per step otherwise.
template <int N, typename S, typename D>
__global__ void cast_many_kernel(CastList<S, D> L) {
  const int b = static_cast<int>(blockIdx.x);
  int lo = 0, hi = L.n - 1;  // the last t with first_block[t] <= b
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (L.first_block[mid] <= b) lo = mid;
    else hi = mid - 1;
  }
  const S* src = L.src[lo];
  D* dst = L.dst[lo];
  const int64_t c0 = static_cast<int64_t>(b - L.first_block[lo]) * kCastChunk;
  const int64_t c1 = min(L.size[lo], c0 + kCastChunk);
  int64_t tail = c0;
  if (device_aligned(src, sizeof(Pack<S, N>)) && device_aligned(dst, sizeof(Pack<D, N>))) {
    const int64_t nv = (c1 - c0) / N;
    for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) {
      const int64_t base = c0 + v * N;
      const Pack<S, N> in = *reinterpret_cast<const Pack<S, N>*>(src + base);
      Pack<D, N> out;
#pragma unroll
      for (int k = 0; k < N; ++k) out.v[k] = cast_one<D>(in.v[k]);
      *reinterpret_cast<Pack<D, N>*>(dst + base) = out;
    }
    tail = c0 + nv * N;
  }
  for (int64_t i = tail + threadIdx.x; i < c1; i += blockDim.x) dst[i] = cast_one<D>(src[i]);
}

// Packs the non-empty tensors into lists of at most kCastManyMaxTensors (and kMaxGridX blocks)
// and launches one kernel per list, in order.
template <typename S, typename D>
void launch_cast_many(const OnStream& on, int n_tensors, const void* const* src, void* const* dst,
                      const int64_t* sizes) {
  constexpr int N = 16 / (sizeof(S) > sizeof(D) ? sizeof(S) : sizeof(D));
  static_assert(kCastChunk % N == 0, "chunks must start pack-aligned");
  CastList<S, D> L;
  L.first_block[0] = 0;
  auto flush = [&] {
    if (L.n == 0) return;
    cast_many_kernel<N, S, D><<<static_cast<unsigned>(L.first_block[L.n]), kThreads, 0, on.s>>>(L);
    XT_LAUNCH_CHECK();
    L.n = 0;
  };
  for (int t = 0; t < n_tensors; ++t) {
    if (sizes[t] == 0) continue;
    const int64_t chunks = ceil_div(sizes[t], kCastChunk);
    XT_ASSERT(chunks <= kMaxGridX);
    if (L.first_block[L.n] + chunks > kMaxGridX) flush();
    L.src[L.n] = static_cast<const S*>(src[t]);
    L.dst[L.n] = static_cast<D*>(dst[t]);
    L.size[L.n] = sizes[t];
    L.first_block[L.n + 1] = static_cast<int>(L.first_block[L.n] + chunks);
    if (++L.n == kCastManyMaxTensors) flush();
  }
  flush();
}

// ------------------------------------------------------------------ other kernels

template <typename T>
__global__ void fill_kernel(T* out, int64_t n, T value) {
  XT_GRID_STRIDE(i, n) out[i] = value;
}

// Casts that involve an integer type (rare: index conversions), through double like the CPU.
template <typename S, typename D>
__global__ void cast_kernel(const S* src, D* dst, int64_t n) {
  XT_GRID_STRIDE(i, n) {
    if constexpr (std::is_same_v<S, D>) dst[i] = src[i];
    else store_any(dst, i, load_any(src, i));
  }
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
__global__ void random_fill_kernel(bool normal, T* out, int64_t n, uint64_t seed, uint64_t offset) {
  XT_GRID_STRIDE(i, n) {
    store_any(out, i, static_cast<double>(random_value(normal, seed, offset + static_cast<uint64_t>(i))));
  }
}

template <typename T>
__global__ void arange_kernel(T* out, int64_t n, double start, double step) {
  XT_GRID_STRIDE(i, n) store_any(out, i, start + step * static_cast<double>(i));
}

}  // namespace

// ------------------------------------------------------------------ launchers

void fill(DType dt, void* out, int64_t n, double value, void* stream) {
  if (n == 0) return;
  OnStream on(stream);
  XT_DISPATCH_ALL(dt, "fill", T, {
    T v;
    store_any(&v, 0, value);
    fill_kernel<T><<<grid_for(n), kThreads, 0, on.s>>>(static_cast<T*>(out), n, v);
    XT_LAUNCH_CHECK();
  });
}

void cast(DType src_dt, const void* src, DType dst_dt, void* dst, int64_t n, void* stream) {
  if (n == 0) return;
  OnStream on(stream);
  XT_DISPATCH_ALL(src_dt, "cast", S, {
    XT_DISPATCH_ALL(dst_dt, "cast", D, {
      if constexpr (std::is_integral_v<S> || std::is_integral_v<D>) {
        cast_kernel<S, D><<<grid_for(n), kThreads, 0, on.s>>>(static_cast<const S*>(src), static_cast<D*>(dst), n);
        XT_LAUNCH_CHECK();
      } else {
        launch_map(on, n, MapArgs<S, 1, D, 1>{{static_cast<const S*>(src)}, {static_cast<D*>(dst)}}, CastF{});
      }
    });
  });
}

void cast_many(int n_tensors, DType src_dt, const void* const* src, DType dst_dt, void* const* dst,
               const int64_t* sizes, void* stream) {
  if (!is_floating(src_dt) || !is_floating(dst_dt)) {  // index conversions: rare, per tensor
    for (int t = 0; t < n_tensors; ++t) cast(src_dt, src[t], dst_dt, dst[t], sizes[t], stream);
    return;
  }
  OnStream on(stream);
  XT_DISPATCH_FLOAT(src_dt, "cast_many", S, {
    XT_DISPATCH_FLOAT(dst_dt, "cast_many", D, {
      launch_cast_many<S, D>(on, n_tensors, src, dst, sizes);
    });
  });
}

void binary(BinaryOp op, DType dt, const void* a, const void* b, void* out, int64_t n, const Broadcast* bc,
            void* stream) {
  if (n == 0) return;
  OnStream on(stream);
  XT_DISPATCH_FLOAT(dt, "binary", T, {
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    T* po = static_cast<T*>(out);
    if (bc) {
      binary_broadcast_kernel<T><<<grid_for(n), kThreads, 0, on.s>>>(op, pa, pb, po, n, *bc);
      XT_LAUNCH_CHECK();
    } else {
      launch_map(on, n, MapArgs<T, 2, T, 1>{{pa, pb}, {po}}, BinaryF{op});
    }
  });
}

void accumulate(DType dt, void* a, const void* b, int64_t n, double alpha, void* stream) {
  if (n == 0) return;
  OnStream on(stream);
  XT_DISPATCH_FLOAT(dt, "accumulate", T, {
    T* pa = static_cast<T*>(a);
    launch_map(on, n, MapArgs<T, 2, T, 1>{{pa, static_cast<const T*>(b)}, {pa}}, AccumulateF{alpha});
  });
}

void scalar_op(ScalarOp op, DType dt, const void* x, void* out, int64_t n, double s, void* stream) {
  if (n == 0) return;
  OnStream on(stream);
  XT_DISPATCH_FLOAT(dt, "scalar_op", T, {
    launch_map(on, n, MapArgs<T, 1, T, 1>{{static_cast<const T*>(x)}, {static_cast<T*>(out)}}, ScalarF{op, s});
  });
}

void unary(UnaryOp op, DType dt, const void* x, void* out, int64_t n, void* stream) {
  if (n == 0) return;
  OnStream on(stream);
  XT_DISPATCH_FLOAT(dt, "unary", T, {
    launch_map(on, n, MapArgs<T, 1, T, 1>{{static_cast<const T*>(x)}, {static_cast<T*>(out)}}, UnaryF{op});
  });
}

void unary_backward(UnaryOp op, DType dt, const void* x, const void* dy, void* dx, int64_t n, void* stream) {
  if (n == 0) return;
  OnStream on(stream);
  XT_DISPATCH_FLOAT(dt, "unary_backward", T, {
    launch_map(on, n, MapArgs<T, 2, T, 1>{{static_cast<const T*>(x), static_cast<const T*>(dy)}, {static_cast<T*>(dx)}},
               UnaryGradF{op});
  });
}

void swiglu_forward(DType dt, const void* gate, const void* up, void* out, int64_t n, float* out_amax,
                    void* stream) {
  if (n == 0) return;
  OnStream on(stream);
  const OutAmax<1> am{{out_amax}};
  XT_DISPATCH_FLOAT(dt, "swiglu_forward", T, {
    launch_map(on, n,
               MapArgs<T, 2, T, 1>{{static_cast<const T*>(gate), static_cast<const T*>(up)}, {static_cast<T*>(out)}},
               SwigluF{}, out_amax ? &am : nullptr);
  });
}

void swiglu_backward(DType dt, const void* gate, const void* up, const void* dout, void* dgate, void* dup, int64_t n,
                     float* dgate_amax, float* dup_amax, void* stream) {
  if (n == 0) return;
  OnStream on(stream);
  const OutAmax<2> am{{dgate_amax, dup_amax}};
  XT_DISPATCH_FLOAT(dt, "swiglu_backward", T, {
    launch_map(on, n,
               MapArgs<T, 3, T, 2>{{static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<const T*>(dout)},
                                   {static_cast<T*>(dgate), static_cast<T*>(dup)}},
               SwigluBackwardF{}, dgate_amax || dup_amax ? &am : nullptr);
  });
}

void dropout(DType dt, const void* x, void* out, int64_t n, float p, uint64_t seed, uint64_t offset,
             const uint64_t* base, void* stream) {
  if (n == 0) return;
  OnStream on(stream);
  XT_DISPATCH_FLOAT(dt, "dropout", T, {
    launch_map(on, n, MapArgs<T, 1, T, 1>{{static_cast<const T*>(x)}, {static_cast<T*>(out)}},
               DropoutF{p, seed, offset, base});
  });
}

void random_fill(RandomKind kind, DType dt, void* out, int64_t n, uint64_t seed, uint64_t offset, void* stream) {
  if (n == 0) return;
  OnStream on(stream);
  XT_DISPATCH_FLOAT(dt, "random_fill", T, {
    random_fill_kernel<T><<<grid_for(n), kThreads, 0, on.s>>>(kind == RandomKind::Normal, static_cast<T*>(out), n,
                                                               seed, offset);
    XT_LAUNCH_CHECK();
  });
}

void arange(DType dt, void* out, int64_t n, double start, double step, void* stream) {
  if (n == 0) return;
  OnStream on(stream);
  XT_DISPATCH_ALL(dt, "arange", T, {
    arange_kernel<T><<<grid_for(n), kThreads, 0, on.s>>>(static_cast<T*>(out), n, start, step);
    XT_LAUNCH_CHECK();
  });
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
