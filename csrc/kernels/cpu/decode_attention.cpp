// Decode attention on the CPU, as plain loops: the reference the CUDA kernels are tested against
// (kernels/cuda/decode_attention.cu).
//
//  - kv_cache_write copies x [B, S, Hkv, D] into the cache [B, L, Hkv, D] at slots pos[b]..pos[b]+S-1
//    of each row (a row's S slots are contiguous: one copy per row).
//  - decode_attention, per (b, h): s_j = scale * q . k_j for j < len[b], m = max_j s_j,
//    p_j = exp(s_j - m), out = sum_j p_j v_j / sum_j p_j, in float32 (float64 for float64), rounded
//    once; the exps and sum_j p_j by vec_math.h's exp_row (flash attention's). Query head h reads kv head h / (H / Hkv).
//  - decode_prep is the composition it fuses on CUDA: rmsnorm_forward (when there are norm
//    weights) then rope at each row's position, through this backend's own kernels, then the
//    cache writes.
//  - decode_prep_attention: decode_prep into a scratch q, then decode_attention (what CUDA fuses).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"

#include "kernels/common.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/kernels.h"

namespace xt {
namespace kernels {
namespace cpu {

void kv_cache_write(DType dt, void* cache, const void* x, const int64_t* pos, int64_t B, int64_t L, int64_t S,
                    int64_t row, void* /*stream*/) {
  const size_t esize = dtype_size(dt);
  for (int64_t b = 0; b < B; ++b) {
    if (pos[b] < 0 || pos[b] > L - S) continue;
    std::memcpy(static_cast<char*>(cache) + static_cast<size_t>((b * L + pos[b]) * row) * esize,
                static_cast<const char*>(x) + static_cast<size_t>(b * S * row) * esize,
                static_cast<size_t>(S * row) * esize);
  }
}

void decode_attention(DType dt, const void* q_, const void* k_, const void* v_, const int64_t* len, void* out_,
                      int64_t B, int64_t L, int64_t H, int64_t Hkv, int64_t D, double scale, void* /*stream*/) {
  XT_DISPATCH_FLOAT(dt, "decode_attention", T, {
    using C = compute_t<T>;
    const T* q = static_cast<const T*>(q_);
    const T* k = static_cast<const T*>(k_);
    const T* v = static_cast<const T*>(v_);
    T* out = static_cast<T*>(out_);
    const int64_t rep = H / Hkv;
    const C sc = static_cast<C>(scale);
    std::vector<C> p(static_cast<size_t>(L)), acc(static_cast<size_t>(D));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t n = len[b] >= 0 && len[b] <= L ? len[b] : 0;
        const T* qh = q + (b * H + h) * D;
        const int64_t hk = h / rep;
        for (int64_t j = 0; j < n; ++j) {
          const T* kj = k + ((b * L + j) * Hkv + hk) * D;
          C s = 0;
          for (int64_t d = 0; d < D; ++d) s += load(qh, d) * load(kj, d);
          p[j] = s * sc;
        }
        C m;
        const C l = exp_row(p.data(), n, &m);
        std::fill(acc.begin(), acc.end(), C(0));
        for (int64_t j = 0; j < n; ++j) {
          const T* vj = v + ((b * L + j) * Hkv + hk) * D;
          for (int64_t d = 0; d < D; ++d) acc[d] += p[j] * load(vj, d);
        }
        const C inv = n > 0 ? C(1) / l : C(0);
        for (int64_t d = 0; d < D; ++d) store(out, (b * H + h) * D + d, acc[d] * inv);
      }
  });
}

void decode_prep(DType dt, DType w_dt, const void* q, const void* k, const void* v, const void* wq, const void* wk,
                 void* q_out, void* k_cache, void* v_cache, const int64_t* pos, int64_t B, int64_t L, int64_t H,
                 int64_t Hkv, int64_t D, float eps, const RopeFreqs& freqs, void* stream) {
  const size_t esize = dtype_size(dt);
  // One side (q or k, `heads` rows of D per token): normed (or the input) -> rope at pos -> out.
  // rope's layout is [B', S, H, D] with positions over S: the decode rows are its S axis.
  const auto side = [&](const void* x, const void* w, void* out, int64_t heads) {
    std::vector<unsigned char> normed;
    const void* src = x;
    if (w != nullptr) {
      normed.resize(static_cast<size_t>(B * heads * D) * esize);
      std::vector<float> rstd(static_cast<size_t>(B * heads));
      rmsnorm_forward(dt, w_dt, x, w, normed.data(), rstd.data(), B * heads, D, eps, stream);
      src = normed.data();
    }
    rope(dt, src, out, RopePositions{pos, 0}, 1, B, heads, D, freqs, /*inverse=*/false, stream);
  };
  side(q, wq, q_out, H);
  std::vector<unsigned char> k_out(static_cast<size_t>(B * Hkv * D) * esize);
  side(k, wk, k_out.data(), Hkv);
  kv_cache_write(dt, k_cache, k_out.data(), pos, B, L, 1, Hkv * D, stream);
  kv_cache_write(dt, v_cache, v, pos, B, L, 1, Hkv * D, stream);
}

void decode_prep_attention(DType dt, DType w_dt, const void* q, const void* k, const void* v, const void* wq,
                           const void* wk, void* k_cache, void* v_cache, const int64_t* pos, const int64_t* len,
                           void* out, int64_t B, int64_t L, int64_t H, int64_t Hkv, int64_t D, float eps,
                           const RopeFreqs& freqs, double scale, int /*n_pf*/, const void* const* /*pf*/,
                           const int64_t* /*pf_bytes*/, void* stream) {  // the L2 hint means nothing here
  std::vector<unsigned char> q_out(static_cast<size_t>(B * H * D) * dtype_size(dt));
  decode_prep(dt, w_dt, q, k, v, wq, wk, q_out.data(), k_cache, v_cache, pos, B, L, H, Hkv, D, eps, freqs, stream);
  decode_attention(dt, q_out.data(), k_cache, v_cache, len, out, B, L, H, Hkv, D, scale, stream);
}

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
