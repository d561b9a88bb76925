// Decode attention: the ops of generation with a KV cache (python/xtrain/models/generate.py),
// argument checks and dispatch to kernels/{cpu,cuda}/decode_attention. Inference only: no op here
// records history (their inputs are activations under no_grad).
//
//  - kv_cache_write_(cache, x, positions) writes x [B, S, Hkv, D] into the preallocated cache
//    [B, L, Hkv, D] at slots positions[b]..positions[b]+S-1 of each row, in place (the cache's
//    version is bumped). Prefill writes S prompt slots at 0, a decode step 1 slot at each row's
//    length, so rows of different lengths advance independently.
//  - decode_attention(q, k_cache, v_cache, lengths) is one query row per (b, h) against the first
//    lengths[b] slots of its row: no causal mask is needed (the query is the newest position).
//  - decode_prep_attention(q, k, v, k_cache, v_cache, positions, lengths, wq, wk) is a decode
//    step's head preparation (q's and k's rms_norm when wq, wk are given, and rope at each row's
//    position, with Llama 3's frequency scaling when given; k and v written into their cache
//    slots) then decode_attention of that q over lengths, bitwise those ops; on CUDA one kernel where the one-pass attention applies (the
//    batch-1 decode step: one launch per layer fewer).
// Positions and lengths are checked on the CPU before the kernel runs and by the kernel on CUDA
// (Note [Device-side index checks], core/cuda/cuda_check.h: a host check would sync every step).
#include <cmath>
#include <utility>

#include "core/error.h"
#include "ops/dispatch.h"

namespace xt {
namespace ops {

namespace {

constexpr int64_t kMaxHeadDim = 256;  // the flash_attention limit, for the same models

void check_cache(const Tensor& cache, const char* op, const char* name) {
  check_floating(cache, op, name);
  XT_CHECK(cache.dim() == 4, ValueError, op, ": ", name, " must be [B, L, H_kv, D] (4 dimensions), got ",
           cache.describe());
  XT_CHECK(cache.size(3) >= 1 && cache.size(3) <= kMaxHeadDim, ValueError, op, ": the head dimension D must be in 1..",
           kMaxHeadDim, ", got ", name, " ", cache.describe());
}

// Per-row int64 [B] on `like`'s device; on the CPU each value is checked against [lo, hi].
void check_rows(const Tensor& t, const Tensor& like, int64_t B, int64_t lo, int64_t hi, const char* op,
                const char* name) {
  check_defined(t, name);
  XT_CHECK(t.dtype() == DType::Int64, TypeError, op, ": ", name, " must be int64, got ", t.describe());
  XT_CHECK(t.dim() == 1 && t.size(0) == B, ValueError, op, ": ", name, " must have shape [", B, "] (one per row), got ",
           t.describe());
  check_same_device(like, t, op, "the cache", name);
  if (t.device().is_cuda()) return;
  const int64_t* p = t.data<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    XT_CHECK(p[b] >= lo && p[b] <= hi, IndexError, op, ": ", name, "[", b, "] = ", p[b], " is out of range [", lo,
             ", ", hi, "] for ", like.describe());
}

// The query heads H of q [B, H, D] against a cache of H_kv heads: a positive multiple of H_kv.
int64_t check_query_heads(const Tensor& q, const Tensor& k_cache, const char* op) {
  const int64_t H = q.size(1), Hkv = k_cache.size(2);
  XT_CHECK(H >= 1 && H % Hkv == 0, ValueError, op, ": the query heads H must be a positive multiple of the kv heads H_kv, got q ",
           q.describe(), ", k_cache ", k_cache.describe());
  return H;
}

// The attention's scale: finite; <= 0 selects 1/sqrt(D).
double attention_scale(double scale, int64_t D, const char* op) {
  XT_CHECK(std::isfinite(scale), ValueError, op, ": scale must be finite, got ", scale);
  return scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(D));
}

}  // namespace

void kv_cache_write_(const Tensor& cache, const Tensor& x, const Tensor& positions) {
  const char* op = "kv_cache_write_";
  check_cache(cache, op, "cache");
  check_floating(x, op, "x");
  XT_CHECK(x.dim() == 4 && x.size(0) == cache.size(0) && x.size(2) == cache.size(2) && x.size(3) == cache.size(3),
           ValueError, op, ": x must be [B, S, H_kv, D] with the cache's B, H_kv and D, got x ", x.describe(),
           " for cache ", cache.describe());
  check_same_dtype(cache, x, op, "cache", "x");
  check_same_device(cache, x, op, "cache", "x");
  const int64_t B = cache.size(0), L = cache.size(1), S = x.size(1);
  XT_CHECK(S <= L, ValueError, op, ": x has ", S, " positions, more than the cache's ", L, " slots (x ", x.describe(),
           ", cache ", cache.describe(), ")");
  check_rows(positions, cache, B, 0, L - S, op, "positions");
  cache.bump_version();
  if (x.numel() == 0) return;
  XT_KERNEL(cache.device(), kv_cache_write, cache.dtype(), cache.data_ptr(), x.data_ptr(), positions.data<int64_t>(),
            B, L, S, cache.size(2) * cache.size(3), stream_for(cache.device()));
}

Tensor decode_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& lengths,
                        double scale) {
  const char* op = "decode_attention";
  check_cache(k_cache, op, "k_cache");
  check_floating(q, op, "q");
  check_floating(v_cache, op, "v_cache");
  XT_CHECK(v_cache.shape() == k_cache.shape(), ValueError, op, ": v_cache must have k_cache's shape, got k_cache ",
           k_cache.describe(), ", v_cache ", v_cache.describe());
  const int64_t B = k_cache.size(0), L = k_cache.size(1), Hkv = k_cache.size(2), D = k_cache.size(3);
  XT_CHECK(q.dim() == 3 && q.size(0) == B && q.size(2) == D, ValueError, op,
           ": q must be [B, H, D] with the cache's B and D, got q ", q.describe(), " for k_cache ", k_cache.describe());
  const int64_t H = check_query_heads(q, k_cache, op);
  check_same_dtype(q, k_cache, op, "q", "k_cache");
  check_same_dtype(q, v_cache, op, "q", "v_cache");
  check_same_device(q, k_cache, op, "q", "k_cache");
  check_same_device(q, v_cache, op, "q", "v_cache");
  check_rows(lengths, k_cache, B, 0, L, op, "lengths");
  const double sc = attention_scale(scale, D, op);
  Tensor out = Tensor::empty(q.shape(), q.dtype(), q.device());
  if (out.numel() == 0) return out;
  XT_KERNEL(q.device(), decode_attention, q.dtype(), q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
            lengths.data<int64_t>(), out.data_ptr(), B, L, H, Hkv, D, sc, stream_for(q.device()));
  return out;
}

namespace {

// decode_prep_attention's checks of the head preparation's arguments.
void check_prep(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_cache, const Tensor& v_cache,
                const Tensor& positions, const Tensor& wq, const Tensor& wk, double eps, const char* op) {
  check_cache(k_cache, op, "k_cache");
  check_floating(v_cache, op, "v_cache");
  XT_CHECK(v_cache.shape() == k_cache.shape(), ValueError, op, ": v_cache must have k_cache's shape, got k_cache ",
           k_cache.describe(), ", v_cache ", v_cache.describe());
  const int64_t B = k_cache.size(0), L = k_cache.size(1), Hkv = k_cache.size(2), D = k_cache.size(3);
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{q, "q"}, {k, "k"}, {v, "v"}}) {
    check_floating(t, op, name);
    check_same_dtype(t, k_cache, op, name, "k_cache");
    check_same_device(t, k_cache, op, name, "k_cache");
  }
  check_same_dtype(v_cache, k_cache, op, "v_cache", "k_cache");
  check_same_device(v_cache, k_cache, op, "v_cache", "k_cache");
  XT_CHECK(q.dim() == 3 && q.size(0) == B && q.size(2) == D, ValueError, op,
           ": q must be [B, H, D] with the cache's B and D, got q ", q.describe(), " for k_cache ", k_cache.describe());
  XT_CHECK((k.shape() == Shape{B, Hkv, D} && v.shape() == Shape{B, Hkv, D}), ValueError, op,
           ": k and v must be [B, H_kv, D] with the cache's sizes, got k ", k.describe(), ", v ", v.describe(),
           " for k_cache ", k_cache.describe());
  XT_CHECK(D % 2 == 0, ValueError, op, ": the head dimension D must be even (rotate-half pairs i with i + D/2), got ",
           k_cache.describe());
  XT_CHECK(wq.defined() == wk.defined(), ValueError, op,
           ": give both q_norm_weight and k_norm_weight (q/k RMSNorm) or neither (rope only)");
  if (wq.defined()) {
    check_head_norm_weight(wq, q, D, op, "q_norm_weight");
    check_head_norm_weight(wk, q, D, op, "k_norm_weight");
    check_same_dtype(wq, wk, op, "q_norm_weight", "k_norm_weight");
    XT_CHECK(std::isfinite(eps) && eps >= 0, ValueError, op, ": eps must be finite and >= 0, got ", eps);
  }
  check_rows(positions, k_cache, B, 0, L - 1, op, "positions");
}

}  // namespace

Tensor decode_prep_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_cache,
                             const Tensor& v_cache, const Tensor& positions, const Tensor& lengths, const Tensor& wq,
                             const Tensor& wk, double eps, double theta, double scale,
                             const std::vector<Tensor>& prefetch, const RopeScaling& llama3) {
  const char* op = "decode_prep_attention";
  check_prep(q, k, v, k_cache, v_cache, positions, wq, wk, eps, op);
  const kernels::RopeFreqs freqs = rope_freqs(theta, llama3, op);
  XT_CHECK(static_cast<int>(prefetch.size()) <= kMaxL2Prefetch, ValueError, op, ": at most ", kMaxL2Prefetch,
           " prefetch tensors, got ", prefetch.size());
  std::vector<const void*> pf;
  std::vector<int64_t> pf_bytes;
  for (size_t i = 0; i < prefetch.size(); ++i) {
    const Tensor& t = prefetch[i];
    XT_CHECK(t.defined(), ValueError, op, ": prefetch[", i, "] is undefined");
    XT_CHECK(t.device() == q.device(), ValueError, op, ": prefetch[", i, "] must be on q's device ",
             q.device().str(), ", got ", t.describe());
    pf.push_back(t.data_ptr());
    pf_bytes.push_back(t.nbytes());
  }
  const int64_t B = k_cache.size(0), L = k_cache.size(1), Hkv = k_cache.size(2), D = k_cache.size(3);
  const int64_t H = check_query_heads(q, k_cache, op);
  check_rows(lengths, k_cache, B, 0, L, op, "lengths");
  const double sc = attention_scale(scale, D, op);
  k_cache.bump_version();
  v_cache.bump_version();
  Tensor out = Tensor::empty(q.shape(), q.dtype(), q.device());
  if (out.numel() == 0) return out;
  XT_KERNEL(q.device(), decode_prep_attention, q.dtype(), wq.defined() ? wq.dtype() : q.dtype(), q.data_ptr(),
            k.data_ptr(), v.data_ptr(), wq.defined() ? wq.data_ptr() : nullptr, wk.defined() ? wk.data_ptr() : nullptr,
            k_cache.data_ptr(), v_cache.data_ptr(), positions.data<int64_t>(), lengths.data<int64_t>(), out.data_ptr(),
            B, L, H, Hkv, D, static_cast<float>(eps), freqs, sc, static_cast<int>(pf.size()),
            pf.data(), pf_bytes.data(), stream_for(q.device()));
  return out;
}

}  // namespace ops
}  // namespace xt
