// Attention with the flash contract on the CPU, as plain loops: the reference the CUDA kernels are
// tested against (kernels/cuda/flash_attention.cu).
//
//  - flash_attention_forward: per (b, h, i), the scores s_j = scale * q_i . k_j (j <= i when causal),
//    m = max_j s_j, p_j = exp(s_j - m), l = sum_j p_j, out_i = sum_j p_j v_j / l, lse_i = m + log l.
//    Computed in float32 for float32/bfloat16 (float64 for float64), rounded once on store.
//  - flash_attention_backward recomputes p_ij = exp(s_ij - lse_i) and, with delta_i = dO_i . O_i,
//    dS_ij = p_ij (dO_i . v_j - delta_i):  dq_i = scale sum_j dS_ij k_j,  dk_j = scale sum_i dS_ij q_i,
//    dv_j = sum_i p_ij dO_i. dk/dv accumulate over (query head of the group, i) in increasing order
//    in the compute type and are rounded once; every gradient is written with `=`.
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

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
