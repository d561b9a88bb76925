// Attention with the flash contract on the CPU, as plain loops: the reference the CUDA kernels are
// tested against (kernels/cuda/flash_attention.cu), and the fused q/k head preparation.
//
//  - flash_attention_forward: per (b, h, i), the scores s_j = scale * q_i . k_j (j <= i when causal),
//    m = max_j s_j, p_j = exp(s_j - m), l = sum_j p_j, out_i = sum_j p_j v_j / l, lse_i = m + log l.
//    Computed in float32 for float32/bfloat16 (float64 for float64), rounded once on store.
//  - flash_attention_backward recomputes p_ij = exp(s_ij - lse_i) and, with delta_i = dO_i . O_i,
//    dS_ij = p_ij (dO_i . v_j - delta_i):  dq_i = scale sum_j dS_ij k_j,  dk_j = scale sum_i dS_ij q_i,
//    dv_j = sum_i p_ij dO_i. dk/dv accumulate over (query head of the group, i) in increasing order
//    in the compute type and are rounded once; every gradient is written with `=`.
//  - qk_norm_rope_*: rmsnorm_forward then rope (and their backwards) with the row math of
//    kernels/common.h that kernels/cpu/rmsnorm.cpp and kernels/cpu/rope.cpp use and their rounding
//    points, so the fused op is bitwise equal to the composition (tests/test_flash_attention.py).
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/common.h"
#include "kernels/kernels.h"

namespace xt {
namespace kernels {
namespace cpu {

namespace {

// ------------------------------------------------------------------ attention

struct AttnDims {
  int64_t B, S, H, Hkv, D;
  // Element offset of row (b, s, head) in a [B, S, heads, D] tensor.
  int64_t row(int64_t b, int64_t s, int64_t head, int64_t heads) const { return ((b * S + s) * heads + head) * D; }
  int64_t stat(int64_t b, int64_t h, int64_t s) const { return (b * H + h) * S + s; }  // [B, H, S]
};

template <typename T, typename C = compute_t<T>>
C dot_rows(const T* a, const T* b, int64_t D) {
  C acc = 0;
  for (int64_t d = 0; d < D; ++d) acc += load(a, d) * load(b, d);
  return acc;
}

template <typename T>
void attention_forward(const T* q, const T* k, const T* v, T* out, compute_t<T>* lse, const AttnDims& n,
                       compute_t<T> scale, bool causal) {
  using C = compute_t<T>;
  const int64_t rep = n.H / n.Hkv;
  std::vector<C> p(static_cast<size_t>(n.S)), acc(static_cast<size_t>(n.D));
  for (int64_t b = 0; b < n.B; ++b)
    for (int64_t h = 0; h < n.H; ++h)
      for (int64_t i = 0; i < n.S; ++i) {
        const int64_t hk = h / rep, jend = causal ? i + 1 : n.S;
        const T* qi = q + n.row(b, i, h, n.H);
        C m = -std::numeric_limits<C>::infinity();
        for (int64_t j = 0; j < jend; ++j) {
          p[j] = dot_rows(qi, k + n.row(b, j, hk, n.Hkv), n.D) * scale;
          m = std::max(m, p[j]);
        }
        C l = 0;
        for (int64_t j = 0; j < jend; ++j) {
          p[j] = std::exp(p[j] - m);
          l += p[j];
        }
        std::fill(acc.begin(), acc.end(), C(0));
        for (int64_t j = 0; j < jend; ++j) {
          const T* vj = v + n.row(b, j, hk, n.Hkv);
          for (int64_t d = 0; d < n.D; ++d) acc[d] += p[j] * load(vj, d);
        }
        T* oi = out + n.row(b, i, h, n.H);
        for (int64_t d = 0; d < n.D; ++d) store(oi, d, static_cast<C>(acc[d] / l));
        lse[n.stat(b, h, i)] = m + std::log(l);
      }
}

template <typename T>
void attention_backward(const T* q, const T* k, const T* v, const T* out, const T* dout, const compute_t<T>* lse,
                        T* dq, T* dk, T* dv, const AttnDims& n, compute_t<T> scale, bool causal) {
  using C = compute_t<T>;
  const int64_t rep = n.H / n.Hkv;
  const size_t kv_size = static_cast<size_t>(n.B * n.S * n.Hkv * n.D);
  std::vector<C> dk_acc(kv_size, C(0)), dv_acc(kv_size, C(0)), dq_acc(static_cast<size_t>(n.D));
  for (int64_t b = 0; b < n.B; ++b)
    for (int64_t h = 0; h < n.H; ++h)
      for (int64_t i = 0; i < n.S; ++i) {
        const int64_t hk = h / rep, jend = causal ? i + 1 : n.S;
        const T* qi = q + n.row(b, i, h, n.H);
        const T* doi = dout + n.row(b, i, h, n.H);
        const C delta = dot_rows(doi, out + n.row(b, i, h, n.H), n.D);
        const C lse_i = lse[n.stat(b, h, i)];
        std::fill(dq_acc.begin(), dq_acc.end(), C(0));
        for (int64_t j = 0; j < jend; ++j) {
          const int64_t kv = n.row(b, j, hk, n.Hkv);
          const C p = std::exp(dot_rows(qi, k + kv, n.D) * scale - lse_i);
          const C ds = p * (dot_rows(doi, v + kv, n.D) - delta);
          for (int64_t d = 0; d < n.D; ++d) {
            dq_acc[d] += ds * load(k + kv, d);
            dk_acc[kv + d] += ds * load(qi, d);
            dv_acc[kv + d] += p * load(doi, d);
          }
        }
        T* dqi = dq + n.row(b, i, h, n.H);
        for (int64_t d = 0; d < n.D; ++d) store(dqi, d, static_cast<C>(scale * dq_acc[d]));
      }
  for (size_t e = 0; e < kv_size; ++e) {
    store(dk, static_cast<int64_t>(e), static_cast<C>(scale * dk_acc[e]));
    store(dv, static_cast<int64_t>(e), dv_acc[e]);
  }
}

// ------------------------------------------------------------------ q/k head preparation

// cos/sin of position s (0..S-1) for the D/2 frequencies, as kernels/cpu/rope.cpp computes them;
// sin carries the sign (-1 for the inverse rotation, the backward).
template <typename C>
struct RopeTable {
  int64_t half;
  std::vector<C> cs, sn;  // [S][half]
  RopeTable(int64_t S, int64_t D, float theta, bool inverse) : half(D / 2) {
    std::vector<float> inv_freq(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i) inv_freq[i] = rope_inv_freq(theta, i, D);
    cs.resize(static_cast<size_t>(S * half));
    sn.resize(static_cast<size_t>(S * half));
    const C sign = inverse ? C(-1) : C(1);
    for (int64_t s = 0; s < S; ++s) {
      const float ps = static_cast<float>(s);
      for (int64_t i = 0; i < half; ++i) {
        rope_cos_sin(ps * inv_freq[i], &cs[s * half + i], &sn[s * half + i]);
        sn[s * half + i] *= sign;
      }
    }
  }
};

// rows of x [B, S, heads, D]: y = rope(rmsnorm(x, w)), rstd per row (float32).
template <typename T, typename W>
void norm_rope_forward(const T* x, const W* w, T* y, float* rstd, int64_t BS, int64_t S, int64_t heads, int64_t D,
                       float eps, const RopeTable<compute_t<T>>& tab) {
  using C = compute_t<T>;
  const int64_t half = D / 2;
  for (int64_t r = 0; r < BS * heads; ++r) {
    const int64_t s = (r / heads) % S;
    const T* xr = x + r * D;
    T* yr = y + r * D;
    const C inv = rms_rstd_in_order(xr, D, eps);
    rstd[r] = static_cast<float>(inv);
    const C* cs = &tab.cs[s * half];
    const C* sn = &tab.sn[s * half];
    for (int64_t i = 0; i < half; ++i) {
      C y1, y2;  // rope of the normed tensor as rope reads it: rounded to T
      rope_rotate(rounded<T>(rms_scaled(xr, w, i, inv)), rounded<T>(rms_scaled(xr, w, i + half, inv)), cs[i], sn[i],
                  &y1, &y2);
      store(yr, i, y1);
      store(yr, i + half, y2);
    }
  }
}

// dx = rmsnorm_backward(x, w, rstd, g) with g = rope^-1(dy) rounded to T (the composition's dy of
// the norm); dw = sum over rows in increasing order, rounded once.
template <typename T, typename W>
void norm_rope_backward(const T* x, const W* w, const float* rstd, const T* dy, T* dx, W* dw, int64_t BS, int64_t S,
                        int64_t heads, int64_t D, const RopeTable<compute_t<T>>& inv_tab) {
  using C = compute_t<T>;
  const int64_t half = D / 2;
  std::vector<C> dw_acc(static_cast<size_t>(D), C(0)), g(static_cast<size_t>(D));
  for (int64_t r = 0; r < BS * heads; ++r) {
    const int64_t s = (r / heads) % S;
    const T* xr = x + r * D;
    const T* dyr = dy + r * D;
    T* dxr = dx + r * D;
    const C* cs = &inv_tab.cs[s * half];
    const C* sn = &inv_tab.sn[s * half];
    for (int64_t i = 0; i < half; ++i) {
      rope_rotate(load(dyr, i), load(dyr, i + half), cs[i], sn[i], &g[i], &g[i + half]);
      g[i] = rounded<T>(g[i]);
      g[i + half] = rounded<T>(g[i + half]);
    }
    const C inv = static_cast<C>(rstd[r]);
    C dot = 0;
    for (int64_t j = 0; j < D; ++j) {
      const C xhat = load(xr, j) * inv;
      const C d = g[j];
      dot += d * static_cast<C>(load(w, j)) * xhat;
      dw_acc[j] += d * xhat;
    }
    const C mean_dot = dot / static_cast<C>(D);
    for (int64_t j = 0; j < D; ++j) {
      const C xhat = load(xr, j) * inv;
      const C gw = g[j] * static_cast<C>(load(w, j));
      store(dxr, j, static_cast<C>(inv * (gw - xhat * mean_dot)));
    }
  }
  for (int64_t j = 0; j < D; ++j) store(dw, j, static_cast<compute_t<W>>(dw_acc[j]));
}

}  // namespace

void flash_attention_forward(DType dt, const void* q, const void* k, const void* v, void* out, void* lse, int64_t B,
                             int64_t S, int64_t H, int64_t Hkv, int64_t D, double scale, bool causal, void*) {
  const AttnDims n{B, S, H, Hkv, D};
  XT_DISPATCH_FLOAT(dt, "flash_attention_forward", T, {
    using C = compute_t<T>;
    attention_forward(static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                      static_cast<T*>(out), static_cast<C*>(lse), n, static_cast<C>(scale), causal);
  });
}

void flash_attention_backward(DType dt, const void* q, const void* k, const void* v, const void* out,
                              const void* dout, const void* lse, void* dq, void* dk, void* dv, int64_t B, int64_t S,
                              int64_t H, int64_t Hkv, int64_t D, double scale, bool causal, void*) {
  const AttnDims n{B, S, H, Hkv, D};
  XT_DISPATCH_FLOAT(dt, "flash_attention_backward", T, {
    using C = compute_t<T>;
    attention_backward(static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                       static_cast<const T*>(out), static_cast<const T*>(dout), static_cast<const C*>(lse),
                       static_cast<T*>(dq), static_cast<T*>(dk), static_cast<T*>(dv), n, static_cast<C>(scale),
                       causal);
  });
}

void qk_norm_rope_forward(DType dt, DType w_dt, const void* q, const void* k, const void* wq, const void* wk,
                          void* q_out, void* k_out, float* rstd_q, float* rstd_k, int64_t B, int64_t S, int64_t H,
                          int64_t Hkv, int64_t D, float eps, float theta, void*) {
  XT_ASSERT(D % 2 == 0, "qk_norm_rope_forward: odd head dim ", D);
  dispatch_float_weight(dt, w_dt, "qk_norm_rope_forward", [&](auto xtag, auto wtag) {
    using T = typename decltype(xtag)::type;
    using W = typename decltype(wtag)::type;
    const RopeTable<compute_t<T>> tab(S, D, theta, /*inverse=*/false);
    norm_rope_forward(static_cast<const T*>(q), static_cast<const W*>(wq), static_cast<T*>(q_out), rstd_q, B * S, S,
                      H, D, eps, tab);
    norm_rope_forward(static_cast<const T*>(k), static_cast<const W*>(wk), static_cast<T*>(k_out), rstd_k, B * S, S,
                      Hkv, D, eps, tab);
  });
}

void qk_norm_rope_backward(DType dt, DType w_dt, const void* q, const void* k, const void* wq, const void* wk,
                           const float* rstd_q, const float* rstd_k, const void* dq_out, const void* dk_out, void* dq,
                           void* dk, void* dwq, void* dwk, int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t D,
                           float theta, void*) {
  XT_ASSERT(D % 2 == 0, "qk_norm_rope_backward: odd head dim ", D);
  dispatch_float_weight(dt, w_dt, "qk_norm_rope_backward", [&](auto xtag, auto wtag) {
    using T = typename decltype(xtag)::type;
    using W = typename decltype(wtag)::type;
    const RopeTable<compute_t<T>> tab(S, D, theta, /*inverse=*/true);
    if (H > 0)
      norm_rope_backward(static_cast<const T*>(q), static_cast<const W*>(wq), rstd_q, static_cast<const T*>(dq_out),
                         static_cast<T*>(dq), static_cast<W*>(dwq), B * S, S, H, D, tab);
    if (Hkv > 0)
      norm_rope_backward(static_cast<const T*>(k), static_cast<const W*>(wk), rstd_k, static_cast<const T*>(dk_out),
                         static_cast<T*>(dk), static_cast<W*>(dwk), B * S, S, Hkv, D, tab);
  });
}

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
