// What the CPU and CUDA kernels share, compiled for the host and the device alike (XT_HD, as in
// core/philox.h): the storage and compute type of each dtype, loads and stores, the dtype
// dispatch macros, and the elementwise op tables (binary, scalar, unary and their gradients,
// SwiGLU, accumulate, dropout, random draws). A formula is written here once; both backends
// evaluate it on the same compute-type values.
//
// Invariants:
//  - Storage types float, double and bf16_t; compute type float for float/bf16, double for double.
//    load() widens, store() rounds once: round to nearest even for bf16, with each backend's own
//    conversion (core/bf16.h on the CPU, __nv_bfloat16's in CUDA files), so neither backend's
//    bits depend on this header being shared. bf16_t is xt::bf16 in C++ files and __nv_bfloat16
//    in CUDA files and the kernel emulator (tests/emu) (same 16 bits).
//  - Dispatch is one line per call site: XT_DISPATCH_FLOAT(dt, "op", T, { body using T; });
//    a dtype outside the list raises TypeError naming the op.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

// tests/emu compiles the CUDA kernels with a host compiler (XT_CUDA_EMULATION): bf16_t is CUDA's
// type there too, converted by cuda_bf16.h's host functions (the same round to nearest even).
#if defined(__CUDACC__) || defined(XT_CUDA_EMULATION)
#define XT_CUDA_BF16 1
#include <cuda_bf16.h>
#endif

#include "core/bf16.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/philox.h"  // XT_HD, and the counter-based draws of dropout and random_fill

namespace xt {
namespace kernels {

// ------------------------------------------------------------------ types, loads, stores

#if defined(XT_CUDA_BF16)
using bf16_t = __nv_bfloat16;
XT_HD float bf16_load(bf16_t v) { return __bfloat162float(v); }
XT_HD bf16_t bf16_round(float v) { return __float2bfloat16_rn(v); }
#else
using bf16_t = bf16;
XT_HD float bf16_load(bf16_t v) { return bf16_to_float(v); }
XT_HD bf16_t bf16_round(float v) { return float_to_bf16(v); }
#endif

template <typename T> struct Compute { using type = float; };
template <> struct Compute<double> { using type = double; };
template <typename T> using compute_t = typename Compute<T>::type;

XT_HD float to_compute(float v) { return v; }
XT_HD double to_compute(double v) { return v; }
XT_HD float to_compute(bf16_t v) { return bf16_load(v); }
template <typename T> XT_HD T from_compute(compute_t<T> v) {
  if constexpr (std::is_same_v<T, bf16_t>) return bf16_round(v);
  else return v;
}

XT_HD float load(const float* p, int64_t i) { return p[i]; }
XT_HD double load(const double* p, int64_t i) { return p[i]; }
XT_HD float load(const bf16_t* p, int64_t i) { return bf16_load(p[i]); }
XT_HD void store(float* p, int64_t i, float v) { p[i] = v; }
XT_HD void store(double* p, int64_t i, double v) { p[i] = v; }
XT_HD void store(bf16_t* p, int64_t i, float v) { p[i] = bf16_round(v); }

// Any dtype through double (integers, casts that involve one); bf16 goes through float, so a
// double -> bf16 conversion rounds twice, the same way on both backends.
template <typename T> XT_HD double load_any(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, bf16_t>) return static_cast<double>(bf16_load(p[i]));
  else return static_cast<double>(p[i]);
}
template <typename T> XT_HD void store_any(T* p, int64_t i, double v) {
  if constexpr (std::is_same_v<T, bf16_t>) p[i] = bf16_round(static_cast<float>(v));
  else p[i] = static_cast<T>(v);
}

// Index loads (ids, targets): int32 or int64.
XT_HD int64_t load_index(bool ids64, const void* ids, int64_t i) {
  return ids64 ? static_cast<const int64_t*>(ids)[i] : static_cast<const int32_t*>(ids)[i];
}
inline bool index_is_64(DType id_dt, const char* op) {
  XT_CHECK(id_dt == DType::Int32 || id_dt == DType::Int64, TypeError, op, ": indices must be int32 or int64, got ",
           dtype_name(id_dt));
  return id_dt == DType::Int64;
}

// ------------------------------------------------------------------ dtype dispatch

[[noreturn]] inline void unsupported_dtype(DType dt, const char* op) {
  throw TypeError(str(op, ": unsupported dtype ", dtype_name(dt)));
}

// XT_DISPATCH_FLOAT(dt, op, T, { ... }) runs the block with `T` naming the storage type of the
// floating dtype dt; XT_DISPATCH_ALL also takes int32 and int64. The block is the body of a
// generic lambda capturing by reference, so `if constexpr` on T discards the branches that do
// not apply and `return;` leaves the block. Dispatches nest with distinct names (cast: S, then
// D); the lambda's parameter is named after T because nvcc's host-code pass resolves an outer
// alias's decltype(parameter) against an inner lambda's parameter of the same name.
template <typename T> struct TypeTag { using type = T; };

#define XT_DISPATCH_CASE_(enumerator, type_, T, ...)  \
  case ::xt::DType::enumerator:                       \
    [&](auto xt_tag_##T) {                            \
      using T = typename decltype(xt_tag_##T)::type;  \
      __VA_ARGS__                                     \
    }(::xt::kernels::TypeTag<type_>{});               \
    break;

#define XT_DISPATCH_FLOAT_CASES_(T, ...)                              \
  XT_DISPATCH_CASE_(Float32, float, T, __VA_ARGS__)                   \
  XT_DISPATCH_CASE_(BFloat16, ::xt::kernels::bf16_t, T, __VA_ARGS__)  \
  XT_DISPATCH_CASE_(Float64, double, T, __VA_ARGS__)

#define XT_DISPATCH_FLOAT(dt, op, T, ...)                 \
  do {                                                    \
    switch (dt) {                                         \
      XT_DISPATCH_FLOAT_CASES_(T, __VA_ARGS__)            \
      default: ::xt::kernels::unsupported_dtype(dt, op);  \
    }                                                     \
  } while (0)

#define XT_DISPATCH_ALL(dt, op, T, ...)                   \
  do {                                                    \
    switch (dt) {                                         \
      XT_DISPATCH_FLOAT_CASES_(T, __VA_ARGS__)            \
      XT_DISPATCH_CASE_(Int32, int32_t, T, __VA_ARGS__)   \
      XT_DISPATCH_CASE_(Int64, int64_t, T, __VA_ARGS__)   \
      default: ::xt::kernels::unsupported_dtype(dt, op);  \
    }                                                     \
  } while (0)

// Calls fn(TypeTag<T>{}, TypeTag<W>{}) with T the storage type of the floating dtype dt and W that
// of a weight whose dtype w_dt is dt or float32 (the norm weights of a bf16 model stay float32).
template <typename Fn>
void dispatch_float_weight(DType dt, DType w_dt, const char* op, Fn&& fn) {
  XT_ASSERT(w_dt == dt || w_dt == DType::Float32, op, ": w dtype ", dtype_name(w_dt));
  XT_DISPATCH_FLOAT(dt, op, T, {
    if (w_dt == DType::Float32) fn(TypeTag<T>{}, TypeTag<float>{});
    else fn(TypeTag<T>{}, TypeTag<T>{});
  });
}

// ------------------------------------------------------------------ math in the compute type

// The C library's functions (float overloads are the accurate, non-intrinsic versions on CUDA).
XT_HD float xexp(float x) { return expf(x); }
XT_HD double xexp(double x) { return exp(x); }
XT_HD float xlog(float x) { return logf(x); }
XT_HD double xlog(double x) { return log(x); }
XT_HD float xsqrt(float x) { return sqrtf(x); }
XT_HD double xsqrt(double x) { return sqrt(x); }
XT_HD float xpow(float x, float y) { return powf(x, y); }
XT_HD double xpow(double x, double y) { return pow(x, y); }
XT_HD float xmax(float a, float b) { return fmaxf(a, b); }
XT_HD double xmax(double a, double b) { return fmax(a, b); }
XT_HD float xtanh(float x) { return tanhf(x); }
XT_HD double xtanh(double x) { return tanh(x); }
template <typename C> XT_HD C sigmoid(C x) { return C(1) / (C(1) + xexp(-x)); }

template <typename T> struct NegInf;
template <> struct NegInf<float> { static XT_HD float get() { return -INFINITY; } };
template <> struct NegInf<double> { static XT_HD double get() { return -HUGE_VAL; } };

// ------------------------------------------------------------------ RMSNorm and RoPE row math

// What rms_norm, rope and the fused q/k head preparation (qk_norm_rope) compute per element,
// written once so the fused op is bitwise the composition on each backend. The sums of squares
// are each backend's own (the CPU in index order, CUDA in lane groups: kernels/cuda/common.cuh).

// rstd = 1/sqrt(mean(x^2) + eps) from the row's sum of squares ss over dim elements.
template <typename C> XT_HD C rms_rstd(C ss, int64_t dim, float eps) {
  return C(1) / xsqrt(ss / static_cast<C>(dim) + static_cast<C>(eps));
}

// RMSNorm's output element j, x_j * rstd * w_j, in the compute type before its rounding to T.
template <typename T, typename W> XT_HD compute_t<T> rms_scaled(const T* x, const W* w, int64_t j, compute_t<T> inv) {
  using C = compute_t<T>;
  return static_cast<C>(load(x, j) * inv * static_cast<C>(load(w, j)));
}

// v as a store to T and a load back give it: the value the next op of a composition reads.
template <typename T> XT_HD compute_t<T> rounded(compute_t<T> v) { return to_compute(from_compute<T>(v)); }

// RoPE's frequencies as the kernels take them: the base theta and, when llama3 is set, Llama 3's
// rescaling of the low frequencies (transformers' rope_type "llama3"). The scaling's constants are
// float32 as transformers' float32 tensor arithmetic uses them (each Python number rounded once),
// made on the host by rope_freqs_llama3 (ops/rope.cpp checks the parameters).
struct RopeFreqs {
  float theta = 10000.0f;
  bool llama3 = false;
  float factor = 1.0f;         // the long wavelengths' divisor
  float low_freq_factor = 1.0f;
  float smooth_den = 1.0f;     // high_freq_factor - low_freq_factor
  float old_context = 1.0f;    // original_max_position_embeddings
  float low_wavelen = 1.0f;    // old_context / low_freq_factor: longer wavelengths divide by factor
  float high_wavelen = 1.0f;   // old_context / high_freq_factor: shorter ones stay as they are
  float two_pi = 6.2831855f;   // 2 pi rounded to float32
};

// Plain RoPE at theta.
inline RopeFreqs rope_freqs(double theta) {
  RopeFreqs f;
  f.theta = static_cast<float>(theta);
  return f;
}

// RoPE at theta with Llama 3's scaling (factor, low_freq_factor, high_freq_factor,
// original_max_position_embeddings): the differences and quotients of the Python numbers in
// double, each rounded once to float32, as transformers' tensor arithmetic receives them.
inline RopeFreqs rope_freqs_llama3(double theta, double factor, double low_freq_factor, double high_freq_factor,
                                   double original_max_positions) {
  RopeFreqs f = rope_freqs(theta);
  f.llama3 = true;
  f.factor = static_cast<float>(factor);
  f.low_freq_factor = static_cast<float>(low_freq_factor);
  f.smooth_den = static_cast<float>(high_freq_factor - low_freq_factor);
  f.old_context = static_cast<float>(original_max_positions);
  f.low_wavelen = static_cast<float>(original_max_positions / low_freq_factor);
  f.high_wavelen = static_cast<float>(original_max_positions / high_freq_factor);
  f.two_pi = static_cast<float>(2.0 * 3.14159265358979323846);
  return f;
}

// float32 operations rounded once each: on the device as intrinsics nvcc never contracts into a
// multiply-add, so the llama3 frequencies below are the host's bits on both backends.
XT_HD float rope_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
XT_HD float rope_div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
XT_HD float rope_add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// RoPE's frequency i of D/2 (rotate-half): 1 / theta^(2i/D), the power in double rounded once to
// float32 (Hugging Face's float32 inv_freq, up to that one rounding). With llama3, transformers'
// _compute_llama3_parameters on that value, operation for operation in float32 (its `c / t` is
// reciprocal(t) * c, as torch evaluates a number divided by a tensor): wavelen = 2pi / f; wavelen
// above low_wavelen: f / factor; below high_wavelen: f; between: with smooth = (old_context /
// wavelen - low_freq_factor) / smooth_den, (1 - smooth) * f / factor + smooth * f.
// I: the caller's index type.
template <typename I> XT_HD float rope_inv_freq(const RopeFreqs& rf, I i, I D) {
  const float expo = static_cast<float>(2 * i) / static_cast<float>(D);
  const float p = static_cast<float>(pow(static_cast<double>(rf.theta), static_cast<double>(expo)));
  const float f = 1.0f / p;
  if (!rf.llama3) return f;
  const float wavelen = rope_mul(rope_div(1.0f, f), rf.two_pi);
  if (wavelen > rf.low_wavelen) return rope_div(f, rf.factor);
  if (wavelen < rf.high_wavelen) return f;
  const float smooth =
      rope_div(rope_add(rope_mul(rope_div(1.0f, wavelen), rf.old_context), -rf.low_freq_factor), rf.smooth_den);
  return rope_add(rope_div(rope_mul(rope_add(1.0f, -smooth), f), rf.factor), rope_mul(smooth, f));
}

// The RoPE positions of the tokens t = b * S + s of a [B, S, ...] tensor: pos[b * row_stride + s]
// (pos int64 [S] with row_stride 0, or [B, S] with row_stride S), or s when pos is null.
struct RopePositions {
  const int64_t* pos = nullptr;
  int64_t row_stride = 0;
  XT_HD float at(int64_t t, int64_t S) const {
    const int64_t s = t % S;
    return static_cast<float>(pos == nullptr ? s : pos[(t / S) * row_stride + s]);
  }
};

// cos and sin of a RoPE angle (float32) in the compute type: the C library's on the host, CUDA's
// sincos on the device.
template <typename C> XT_HD void rope_cos_sin(float angle, C* cs, C* sn) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<C, float>) sincosf(angle, sn, cs);
  else sincos(static_cast<double>(angle), sn, cs);
#else
  *cs = std::cos(static_cast<C>(angle));
  *sn = std::sin(static_cast<C>(angle));
#endif
}

// RoPE's rotation of the pair (x1, x2) = (x[i], x[i + D/2]) by the angle with cosine cs and sine
// sn:  y1 = x1 cs - x2 sn,  y2 = x2 cs + x1 sn. On CUDA the fused multiply-adds are spelled out
// as nvcc 13 contracts rope's plain expressions (sm_90 SASS of rope_rows_kernel, every dtype), so
// every kernel that rotates a pair rounds alike whatever the compiler would do in its context; the
// host build (x86-64, no FMA) evaluates the expressions as written.
template <typename C> XT_HD void rope_rotate(C x1, C x2, C cs, C sn, C* y1, C* y2) {
#if defined(__CUDA_ARCH__)
  *y1 = fma(x1, cs, -(x2 * sn));
  *y2 = fma(sn, x1, cs * x2);
#else
  *y1 = x1 * cs - x2 * sn;
  *y2 = x2 * cs + x1 * sn;
#endif
}

// ------------------------------------------------------------------ elementwise op tables

enum class BinaryOp : int { Add, Sub, Mul, Div };
enum class ScalarOp : int { Add, Mul, RSub, Div, RDiv, Pow };  // x+s, x*s, s-x, x/s, s/x, x^s
enum class UnaryOp : int { Neg, Exp, Log, Sqrt, Silu, Gelu, Tanh };

// GELU's tanh approximation (GPT-2; torch's approximate="tanh"): gelu(x) = x/2 (1 + tanh(u)),
// u = sqrt(2/pi) (x + 0.044715 x^3), and gelu'(x) = (1 + tanh(u))/2 + x/2 (1 - tanh(u)^2) du/dx.
constexpr double kGeluSqrt2OverPi = 0.79788456080286535588;  // sqrt(2/pi)
constexpr double kGeluCubic = 0.044715;
template <typename C> XT_HD C gelu_tanh_u(C x) {
  return static_cast<C>(kGeluSqrt2OverPi) * (x + static_cast<C>(kGeluCubic) * x * x * x);
}

template <typename C> XT_HD C apply_binary(BinaryOp op, C a, C b) {
  switch (op) {
    case BinaryOp::Add: return a + b;
    case BinaryOp::Sub: return a - b;
    case BinaryOp::Mul: return a * b;
    case BinaryOp::Div: return a / b;
  }
  return C(0);
}

template <typename C> XT_HD C apply_scalar(ScalarOp op, C x, C s) {
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

template <typename C> XT_HD C apply_unary(UnaryOp op, C x) {
  switch (op) {
    case UnaryOp::Neg: return -x;
    case UnaryOp::Exp: return xexp(x);
    case UnaryOp::Log: return xlog(x);
    case UnaryOp::Sqrt: return xsqrt(x);
    case UnaryOp::Silu: return x * sigmoid(x);
    case UnaryOp::Gelu: return C(0.5) * x * (C(1) + xtanh(gelu_tanh_u(x)));
    case UnaryOp::Tanh: return xtanh(x);
  }
  return C(0);
}

// dx = dy * op'(x), for the unary ops whose gradient is computed from x by one kernel
// (unary_has_grad_kernel); the others are composed from binary ops by the ops layer.
inline bool unary_has_grad_kernel(UnaryOp op) {
  return op == UnaryOp::Silu || op == UnaryOp::Gelu || op == UnaryOp::Tanh;
}
template <typename C> XT_HD C apply_unary_grad(UnaryOp op, C x, C dy) {
  switch (op) {
    case UnaryOp::Silu: {  // silu'(x) = s + x * s * (1 - s) with s = sigmoid(x)
      const C s = sigmoid(x);
      return dy * s * (C(1) + x * (C(1) - s));
    }
    case UnaryOp::Gelu: {
      const C t = xtanh(gelu_tanh_u(x));
      const C du = static_cast<C>(kGeluSqrt2OverPi) * (C(1) + static_cast<C>(3 * kGeluCubic) * x * x);
      return dy * (C(0.5) * (C(1) + t) + C(0.5) * x * (C(1) - t * t) * du);
    }
    case UnaryOp::Tanh: {  // tanh'(x) = 1 - tanh(x)^2
      const C t = xtanh(x);
      return dy * (C(1) - t * t);
    }
    default: return C(0);
  }
}

// a + alpha * b (a + b exactly when alpha is 1).
template <typename C> XT_HD C accumulate_value(C a, C b, double alpha) {
  return alpha == 1.0 ? a + b : a + static_cast<C>(alpha) * b;
}

// silu(gate) * up, and its gradients (dgate, dup).
template <typename C> XT_HD C swiglu_value(C g, C u) { return g * sigmoid(g) * u; }
template <typename C> XT_HD void swiglu_grads(C g, C u, C d, C* dg, C* du) {
  const C s = sigmoid(g);
  *dg = d * u * s * (C(1) + g * (C(1) - s));
  *du = d * g * s;
}

// Dropout of element i: dropped (0) when philox_uniform(seed, offset + i) < p, else x / (1 - p).
template <typename C> XT_HD C dropout_value(C x, float p, uint64_t seed, uint64_t counter) {
  const C scale = C(1) / (C(1) - static_cast<C>(p));
  return philox_uniform(seed, counter) < p ? C(0) : x * scale;
}

// One random_fill draw: uniform in [0, 1), or standard normal by Box-Muller on the first two
// 32-bit words of the draw (u1 in (0, 1] keeps the log finite).
XT_HD float random_value(bool normal, uint64_t seed, uint64_t counter) {
  if (!normal) return philox_uniform(seed, counter);
  const Philox4 r = philox4x32_10(seed, counter);
  const float u1 = static_cast<float>((r.v[0] >> 8) + 1) * (1.0f / 16777216.0f);
  const float u2 = static_cast<float>(r.v[1] >> 8) * (1.0f / 16777216.0f);
  return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853071795864769f * u2);
}

// ------------------------------------------------------------------ greedy decoding (greedy_next)

// Whether logit a at index i beats b at index j: NaN above every number, then the larger value,
// then the lower index, so a scan or a reduction in any order finds the row's first maximum
// (numpy's argmax).
template <typename C> XT_HD bool greedy_beats(C a, int64_t i, C b, int64_t j) {
  const bool an = a != a, bn = b != b;
  if (an || bn) return an && (!bn || i < j);
  return a > b || (a == b && i < j);
}

// Row b of greedy_next's state int64 [6, B] (token, position, length, limit, done, count) after
// its pick tok (kernels.h): taken when the row is not done and position + 1 < limit, and then done
// at stop; ring[(count % R) * B + b] = tok taken or -1; count += 1.
XT_HD void greedy_take(int64_t* state, int64_t B, int64_t b, int64_t tok, int64_t* ring, int64_t R, int64_t stop) {
  int64_t *token = state, *position = state + B, *length = state + 2 * B, *limit = state + 3 * B,
          *done = state + 4 * B, *count = state + 5 * B;
  int64_t taken = -1;
  if (done[b] == 0) {
    if (position[b] + 1 < limit[b]) {
      taken = tok;
      token[b] = tok;
      position[b] += 1;
      length[b] = position[b] + 1;
      if (tok == stop) done[b] = 1;
    } else {
      done[b] = 1;
    }
  }
  ring[(count[b] % R) * B + b] = taken;
  count[b] += 1;
}

}  // namespace kernels
}  // namespace xt
