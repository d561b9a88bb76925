// Attention with the flash contract on the CPU: the reference the CUDA kernels are tested against
// (kernels/cuda/flash_attention.cu).
//
//  - flash_attention_forward: per (b, h, i), the scores s_j = scale * q_i . k_j (j <= i when causal),
//    m = max_j s_j, p_j = exp(s_j - m), l = sum_j p_j, out_i = sum_j p_j v_j / l, lse_i = m + log l.
//    Computed in float32 for float32/bfloat16 (float64 for float64), rounded once on store.
//  - flash_attention_backward recomputes p_ij = exp(s_ij - lse_i) and, with delta_i = dO_i . O_i,
//    dS_ij = p_ij (dO_i . v_j - delta_i):  dq_i = scale sum_j dS_ij k_j,  dk_j = scale sum_i dS_ij q_i,
//    dv_j = sum_i p_ij dO_i. dk/dv accumulate over the query heads of the group in increasing order
//    in the compute type and are rounded once; every gradient is written with `=`.
//  - The matrix products (q k^T, p v, dO v^T, ds k, ds^T q, p^T dO) run per (b, head) through the
//  - Within documents (doc_start given): query i's keys start at doc_start[b, i]; the scores of
//    keys before it are computed by the block GEMMs and then set to zero probability, so a row
//    without a document boundary gives the same bits as plain causal attention.
//    CPU GEMM (OpenBLAS: deterministic, it never splits K), in blocks of kBlock query rows that
//    stop at the causal diagonal's block; the softmax rows between them are plain loops, their
//    float32 exps and sums through vec_math.h (float64: the C library's exp). One
//    head's S x S scores live in one buffer per thread, nothing is allocated per row. The
//    (b, head) pairs (backward: (b, kv head) groups) split over the CPU backend's threads
//    (parallel.h); the GEMMs of one head are small enough that OpenBLAS runs them on the thread
//    that calls it.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/common.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/kernels.h"

namespace xt {
namespace kernels {
namespace cpu {

namespace {

// ------------------------------------------------------------------ attention

struct AttnDims {
  int64_t B, S, H, Hkv, D;
  const int32_t* doc_start;  // [B, S] or nullptr
  // The first key query (b, i) sees: its document's start (0 without documents), kept in [0, i].
  int64_t first_key(int64_t b, int64_t i) const {
    return doc_start ? std::clamp<int64_t>(doc_start[b * S + i], 0, i) : 0;
  }
  // Element offset of row (b, s, head) in a [B, S, heads, D] tensor.
  int64_t row(int64_t b, int64_t s, int64_t head, int64_t heads) const { return ((b * S + s) * heads + head) * D; }
  int64_t stat(int64_t b, int64_t h, int64_t s) const { return (b * H + h) * S + s; }  // [B, H, S]
};

// Rows (queries) and columns (keys) go to BLAS in blocks of this many: with a causal mask, a block
// of rows only needs the keys up to its last row, which skips close to half of the score GEMMs.
constexpr int64_t kBlock = 32;

template <typename T, typename C = compute_t<T>>
C dot_rows(const T* a, const T* b, int64_t D) {
  C acc = 0;
  for (int64_t d = 0; d < D; ++d) acc += load(a, d) * load(b, d);
  return acc;
}

// C[M, N] (row stride ldc) = op(A) @ op(B) + beta * C on compute-type buffers (sgemm or dgemm).
template <typename C>
void gemm_c(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const C* A, int64_t lda, const C* B, int64_t ldb,
            float beta, C* out, int64_t ldc) {
  const DType dt = std::is_same_v<C, double> ? DType::Float64 : DType::Float32;
  gemm_ld(dt, dt, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, out, ldc, 1, 0, 0, 0, nullptr);
}

// One head's S x D rows as BLAS reads them: the tensor itself with its row stride `ld` when T is
// the compute type, otherwise widened into `buf` (row stride D).
template <typename T, typename C = compute_t<T>>
const C* head_rows(const T* p, int64_t S, int64_t D, int64_t ld, std::vector<C>& buf, int64_t& out_ld) {
  if constexpr (std::is_same_v<T, C>) {
    out_ld = ld;
    return p;
  } else {
    buf.resize(static_cast<size_t>(S * D));
    for (int64_t r = 0; r < S; ++r)
      for (int64_t d = 0; d < D; ++d) buf[r * D + d] = load(p, r * ld + d);
    out_ld = D;
    return buf.data();
  }
}

// sc[i, j] = a_i . b_j for the (block-causal) keys each query block needs; a, b are S x D.
template <typename C>
void block_scores(const C* a, int64_t lda, const C* b, int64_t ldb, C* sc, int64_t S, int64_t D, bool causal) {
  for (int64_t i0 = 0; i0 < S; i0 += kBlock) {
    const int64_t i1 = std::min(i0 + kBlock, S);
    gemm_c(false, true, i1 - i0, causal ? i1 : S, D, a + i0 * lda, lda, b, ldb, 0.0f, sc + i0 * S, S);
  }
}

// Keys j < block_cols(i) of query row i are in sc's block (written by block_scores).
inline int64_t block_cols(int64_t i, int64_t S, bool causal) {
  return causal ? std::min((i / kBlock + 1) * kBlock, S) : S;
}

// Heads per thread at the least (parallel.h): a thread's share is worth at least ~2^16 scores.
inline int64_t head_grain(int64_t S) { return std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, S * S)); }

template <typename T>
void attention_forward(const T* q, const T* k, const T* v, T* out, compute_t<T>* lse, const AttnDims& n,
                       compute_t<T> scale, bool causal) {
  using C = compute_t<T>;
  const int64_t S = n.S, D = n.D, rep = n.H / n.Hkv;
  parallel_for(n.B * n.H, head_grain(S), [&](int64_t lo, int64_t hi) {  // one (b, h) after another
    std::vector<C> sc(static_cast<size_t>(S * S)), o(static_cast<size_t>(S * D)), l(static_cast<size_t>(S));
    std::vector<C> qbuf, kbuf, vbuf;
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / n.H, h = bh % n.H, hk = h / rep;
      int64_t ldq, ldk, ldv;
      const C* qh = head_rows(q + n.row(b, 0, h, n.H), S, D, n.H * D, qbuf, ldq);
      const C* kh = head_rows(k + n.row(b, 0, hk, n.Hkv), S, D, n.Hkv * D, kbuf, ldk);
      const C* vh = head_rows(v + n.row(b, 0, hk, n.Hkv), S, D, n.Hkv * D, vbuf, ldv);
      block_scores(qh, ldq, kh, ldk, sc.data(), S, D, causal);
      for (int64_t i = 0; i < S; ++i) {  // p_ij = exp(scale s_ij - m_i), 0 beyond the mask
        C* p = sc.data() + i * S;
        const int64_t jend = causal ? i + 1 : S, jn = block_cols(i, S, causal), j0 = n.first_key(b, i);
        for (int64_t j = j0; j < jend; ++j) p[j] = p[j] * scale;
        C m;
        const C li = exp_row(p + j0, jend - j0, &m);
        std::fill(p, p + j0, C(0));
        std::fill(p + jend, p + jn, C(0));
        l[i] = li;
        lse[n.stat(b, h, i)] = m + std::log(li);
      }
      for (int64_t i0 = 0; i0 < S; i0 += kBlock) {  // o = p @ v, block by block of rows
        const int64_t i1 = std::min(i0 + kBlock, S);
        gemm_c(false, false, i1 - i0, D, block_cols(i0, S, causal), sc.data() + i0 * S, S, vh, ldv, 0.0f,
               o.data() + i0 * D, D);
      }
      for (int64_t i = 0; i < S; ++i) {
        T* oi = out + n.row(b, i, h, n.H);
        for (int64_t d = 0; d < D; ++d) store(oi, d, static_cast<C>(o[i * D + d] / l[i]));
      }
    }
  });
}

// dk/dv of one kv head accumulate over the query heads of its group, in increasing order, in
// the compute type (BLAS with beta = 1), and are rounded once.
template <typename T>
void attention_backward(const T* q, const T* k, const T* v, const T* out, const T* dout, const compute_t<T>* lse,
                        T* dq, T* dk, T* dv, const AttnDims& n, compute_t<T> scale, bool causal) {
  using C = compute_t<T>;
  const int64_t S = n.S, D = n.D, rep = n.H / n.Hkv;
  const size_t SS = static_cast<size_t>(S * S), SD = static_cast<size_t>(S * D);
  parallel_for(n.B * n.Hkv, std::max<int64_t>(1, head_grain(S) / rep), [&](int64_t lo, int64_t hi) {
    std::vector<C> pm(SS), ds(SS), dq_acc(SD), dk_acc(SD), dv_acc(SD);
    std::vector<C> qbuf, kbuf, vbuf, dobuf;
    for (int64_t bhk = lo; bhk < hi; ++bhk) {
      const int64_t b = bhk / n.Hkv, hk = bhk % n.Hkv;
      int64_t ldq, ldk, ldv, ldo;
      const C* kh = head_rows(k + n.row(b, 0, hk, n.Hkv), S, D, n.Hkv * D, kbuf, ldk);
      const C* vh = head_rows(v + n.row(b, 0, hk, n.Hkv), S, D, n.Hkv * D, vbuf, ldv);
      std::fill(dk_acc.begin(), dk_acc.end(), C(0));
      std::fill(dv_acc.begin(), dv_acc.end(), C(0));
      for (int64_t h = hk * rep; h < (hk + 1) * rep; ++h) {
        const C* qh = head_rows(q + n.row(b, 0, h, n.H), S, D, n.H * D, qbuf, ldq);
        const C* doh = head_rows(dout + n.row(b, 0, h, n.H), S, D, n.H * D, dobuf, ldo);
        block_scores(qh, ldq, kh, ldk, pm.data(), S, D, causal);   // s = q k^T
        block_scores(doh, ldo, vh, ldv, ds.data(), S, D, causal);  // dO v^T
        for (int64_t i = 0; i < S; ++i) {  // p = exp(scale s - lse), ds = p (dO.v - delta), 0 beyond the mask
          const C delta = dot_rows(dout + n.row(b, i, h, n.H), out + n.row(b, i, h, n.H), D);
          const C lse_i = lse[n.stat(b, h, i)];
          C* p = pm.data() + i * S;
          C* dsi = ds.data() + i * S;
          const int64_t jend = causal ? i + 1 : S, jn = block_cols(i, S, causal), j0 = n.first_key(b, i);
          for (int64_t j = j0; j < jend; ++j) p[j] = p[j] * scale;
          exp_shift(p + j0, lse_i, jend - j0);
          for (int64_t j = j0; j < jend; ++j) dsi[j] = p[j] * (dsi[j] - delta);
          std::fill(p, p + j0, C(0));
          std::fill(dsi, dsi + j0, C(0));
          std::fill(p + jend, p + jn, C(0));
          std::fill(dsi + jend, dsi + jn, C(0));
        }
        for (int64_t i0 = 0; i0 < S; i0 += kBlock) {  // dq = ds @ k (scaled on store)
          const int64_t i1 = std::min(i0 + kBlock, S);
          gemm_c(false, false, i1 - i0, D, block_cols(i0, S, causal), ds.data() + i0 * S, S, kh, ldk, 0.0f,
                 dq_acc.data() + i0 * D, D);
        }
        for (int64_t i = 0; i < S; ++i) {
          T* dqi = dq + n.row(b, i, h, n.H);
          for (int64_t d = 0; d < D; ++d) store(dqi, d, static_cast<C>(scale * dq_acc[i * D + d]));
        }
        for (int64_t j0 = 0; j0 < S; j0 += kBlock) {  // dk += ds^T @ q, dv += p^T @ dO over the queries i >= j0
          const int64_t j1 = std::min(j0 + kBlock, S), i0 = causal ? j0 : 0;
          gemm_c(true, false, j1 - j0, D, S - i0, ds.data() + i0 * S + j0, S, qh + i0 * ldq, ldq, 1.0f,
                 dk_acc.data() + j0 * D, D);
          gemm_c(true, false, j1 - j0, D, S - i0, pm.data() + i0 * S + j0, S, doh + i0 * ldo, ldo, 1.0f,
                 dv_acc.data() + j0 * D, D);
        }
      }
      for (int64_t j = 0; j < S; ++j) {
        T* dkj = dk + n.row(b, j, hk, n.Hkv);
        T* dvj = dv + n.row(b, j, hk, n.Hkv);
        for (int64_t d = 0; d < D; ++d) {
          store(dkj, d, static_cast<C>(scale * dk_acc[j * D + d]));
          store(dvj, d, dv_acc[j * D + d]);
        }
      }
    }
  });
}

}  // namespace

void flash_attention_forward(DType dt, const void* q, const void* k, const void* v, void* out, void* lse, int64_t B,
                             int64_t S, int64_t H, int64_t Hkv, int64_t D, double scale, bool causal,
                             const int32_t* doc_start, void*) {
  const AttnDims n{B, S, H, Hkv, D, doc_start};
  XT_DISPATCH_FLOAT(dt, "flash_attention_forward", T, {
    using C = compute_t<T>;
    attention_forward(static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                      static_cast<T*>(out), static_cast<C*>(lse), n, static_cast<C>(scale), causal);
  });
}

void flash_attention_backward(DType dt, const void* q, const void* k, const void* v, const void* out,
                              const void* dout, const void* lse, void* dq, void* dk, void* dv, int64_t B, int64_t S,
                              int64_t H, int64_t Hkv, int64_t D, double scale, bool causal,
                              const int32_t* doc_start, void*) {
  const AttnDims n{B, S, H, Hkv, D, doc_start};
  XT_DISPATCH_FLOAT(dt, "flash_attention_backward", T, {
    using C = compute_t<T>;
    attention_backward(static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                       static_cast<const T*>(out), static_cast<const T*>(dout), static_cast<const C*>(lse),
                       static_cast<T*>(dq), static_cast<T*>(dk), static_cast<T*>(dv), n, static_cast<C>(scale),
                       causal);
  });
}

void document_starts(DType id_dt, const void* ids, int32_t* doc_start, int64_t B, int64_t S, int64_t sep, void*) {
  XT_DISPATCH_ALL(id_dt, "document_starts", I, {
    if constexpr (std::is_integral_v<I>) {
      const I* x = static_cast<const I*>(ids);
      for (int64_t b = 0; b < B; ++b) {
        int32_t start = 0;
        for (int64_t s = 0; s < S; ++s) {
          if (s > 0 && static_cast<int64_t>(x[b * S + s - 1]) == sep) start = static_cast<int32_t>(s);
          doc_start[b * S + s] = start;
        }
      }
    }
  });
}

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
