// Flash attention on tensors in the (B, S, heads, D) layout that the projection GEMMs write (rows
// of a [B*S, heads*D] matrix, no permutes): argument checks, dispatch to
// kernels/{cpu,cuda}/flash_attention, the backward node and the differentiable op.
//
//  - flash_attention(q, k, v) on q [B, S, H, D], k/v [B, S, Hkv, D] (grouped-query attention when
//    Hkv < H) returns out [B, S, H, D] and the row log-sum-exp lse [B, H, S] (not differentiable).
//    The node saves q, k, v, out and lse: memory linear in S, no [S, S] probabilities. Backward
//    recomputes P (deterministic kernels: no atomics) and returns dq, dk, dv, freshly written.
//  - Attention within documents: doc_start (int32 [B, S], causal only) gives each token's
//    document start; query s sees keys doc_start[b, s] .. s. document_starts(ids, sep) makes it
//    from token ids (a separator ends its document). On the CPU a given doc_start is checked
//    (0 <= d[s] <= s, d[s] either d[s - 1] or s); on CUDA it is not read on the host (the kernels
//    clamp what they read, so a malformed one gives wrong attention, never a bad memory access):
//    make it with document_starts.
#include <cmath>

#include "core/error.h"
#include "ops/dispatch.h"
#include "tape/node.h"

namespace xt {
namespace ops {

namespace {

// Largest head dimension the kernels take (the CUDA fallback keeps a row in registers).
constexpr int64_t kMaxHeadDim = 256;

struct AttnShape {
  int64_t B, S, H, Hkv, D;
};

AttnShape check_attention(const Tensor& q, const Tensor& k, const Tensor& v, const char* op) {
  check_floating(q, op, "q");
  check_floating(k, op, "k");
  check_floating(v, op, "v");
  XT_CHECK(q.dim() == 4, ValueError, op, ": q must be [B, S, H, D] (4 dimensions), got ", q.describe());
  XT_CHECK(k.dim() == 4, ValueError, op, ": k must be [B, S, H_kv, D] (4 dimensions), got ", k.describe());
  XT_CHECK(v.shape() == k.shape(), ValueError, op, ": v must have k's shape [B, S, H_kv, D], got k ", k.describe(),
           ", v ", v.describe());
  XT_CHECK(k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == q.size(3), ValueError, op,
           ": q [B, S, H, D] and k, v [B, S, H_kv, D] must agree in B, S and D, got q ", q.describe(), ", k ",
           k.describe());
  check_same_dtype(q, k, op, "q", "k");
  check_same_dtype(q, v, op, "q", "v");
  check_same_device(q, k, op, "q", "k");
  check_same_device(q, v, op, "q", "v");
  const AttnShape n{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3)};
  XT_CHECK(n.H >= 1 && n.Hkv >= 1 && n.H % n.Hkv == 0, ValueError, op,
           ": the query heads H must be a positive multiple of the kv heads H_kv, got H = ", n.H, " (q ",
           q.describe(), "), H_kv = ", n.Hkv, " (k ", k.describe(), ")");
  XT_CHECK(n.D >= 1 && n.D <= kMaxHeadDim, ValueError, op, ": the head dimension D must be in 1..", kMaxHeadDim,
           ", got q ", q.describe());
  return n;
}

// doc_start for q [B, S, ...]: undefined (none), or int32 [B, S] on q's device with causal; on the
// CPU its values are checked.
void check_doc_start(const Tensor& doc, const Tensor& q, bool causal, const char* op) {
  if (!doc.defined()) return;
  XT_CHECK(causal, ValueError, op, ": doc_start (attention within documents) needs causal=True");
  XT_CHECK(doc.dtype() == DType::Int32 && doc.dim() == 2 && doc.size(0) == q.size(0) && doc.size(1) == q.size(1),
           ValueError, op, ": doc_start must be int32 [B, S] = [", q.size(0), ", ", q.size(1), "], got ",
           doc.describe());
  check_same_device(q, doc, op, "q", "doc_start");
  if (!doc.device().is_cpu()) return;
  const int32_t* d = doc.data<int32_t>();
  const int64_t B = doc.size(0), S = doc.size(1);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) {
      const int64_t v = d[b * S + s], prev = s ? d[b * S + s - 1] : 0;
      XT_CHECK(v == s || (s > 0 && v == prev), ValueError, op, ": doc_start[", b, ", ", s, "] = ", v,
               " is not a document start (each entry is its position, where a document begins, or the entry "
               "before it); make doc_start with document_starts(ids, sep)");
    }
}

const int32_t* doc_ptr(const Tensor& doc) { return doc.defined() ? doc.data<int32_t>() : nullptr; }

DType stat_dtype(DType dt) { return dt == DType::Float64 ? DType::Float64 : DType::Float32; }

double resolve_scale(double scale, int64_t D, const char* op) {
  XT_CHECK(std::isfinite(scale), ValueError, op, ": scale must be finite, got ", scale);
  return scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(D));
}

}  // namespace

std::pair<Tensor, Tensor> flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                                  double scale, const Tensor& doc_start) {
  const AttnShape n = check_attention(q, k, v, "flash_attention");
  const double sc = resolve_scale(scale, n.D, "flash_attention");
  check_doc_start(doc_start, q, causal, "flash_attention");
  Tensor out = Tensor::empty(q.shape(), q.dtype(), q.device());
  Tensor lse = Tensor::empty({n.B, n.H, n.S}, stat_dtype(q.dtype()), q.device());
  if (n.B * n.S == 0) return {out, lse};
  XT_KERNEL(q.device(), flash_attention_forward, q.dtype(), q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
            lse.data_ptr(), n.B, n.S, n.H, n.Hkv, n.D, sc, causal, doc_ptr(doc_start), stream_for(q.device()));
  return {out, lse};
}

std::vector<Tensor> flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                             const Tensor& lse, const Tensor& dout, bool causal, double scale,
                                             const Tensor& doc_start) {
  const char* op = "flash_attention_backward";
  const AttnShape n = check_attention(q, k, v, op);
  const double sc = resolve_scale(scale, n.D, op);
  check_doc_start(doc_start, q, causal, op);
  check_defined(out, "out");
  check_defined(lse, "lse");
  check_defined(dout, "dout");
  XT_CHECK(out.shape() == q.shape() && out.dtype() == q.dtype() && out.device() == q.device(), ValueError, op,
           ": out must match q, got out ", out.describe(), " for q ", q.describe());
  XT_CHECK(dout.shape() == q.shape() && dout.dtype() == q.dtype() && dout.device() == q.device(), ValueError, op,
           ": dout must match q, got dout ", dout.describe(), " for q ", q.describe());
  XT_CHECK(lse.shape() == Shape({n.B, n.H, n.S}) && lse.dtype() == stat_dtype(q.dtype()) && lse.device() == q.device(),
           ValueError, op, ": lse must be ", dtype_name(stat_dtype(q.dtype())), "[", n.B, ", ", n.H, ", ", n.S,
           "] on ", q.device().str(), ", got ", lse.describe());
  Tensor dq = Tensor::empty(q.shape(), q.dtype(), q.device());
  Tensor dk = Tensor::empty(k.shape(), k.dtype(), k.device());
  Tensor dv = Tensor::empty(v.shape(), v.dtype(), v.device());
  if (n.B * n.S == 0) return {dq, dk, dv};
  XT_KERNEL(q.device(), flash_attention_backward, q.dtype(), q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
            dout.data_ptr(), lse.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), n.B, n.S, n.H, n.Hkv, n.D,
            sc, causal, doc_ptr(doc_start), stream_for(q.device()));
  return {dq, dk, dv};
}

namespace {

class FlashAttentionBackward : public NodeWithSaved<6> {
 public:
  FlashAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                         bool causal, double scale, const Tensor& doc_start)
      : NodeWithSaved({SavedTensor("q", q), SavedTensor("k", k), SavedTensor("v", v), SavedTensor("out", out),
                       SavedTensor("lse", lse), SavedTensor("doc_start", doc_start)}),
        causal_(causal), scale_(scale) {}
  const char* name() const override { return "FlashAttentionBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!grads[0].defined()) return {Tensor(), Tensor(), Tensor()};
    const auto [q, k, v, out, lse, doc_start] = unpack();
    return flash_attention_backward(q, k, v, out, lse, grads[0], causal_, scale_, doc_start);
  }

 private:
  bool causal_;
  double scale_;  // as given: <= 0 selects 1/sqrt(D), forward and backward alike
};

}  // namespace

std::pair<Tensor, Tensor> flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                          double scale, const Tensor& doc_start) {
  auto [out, lse] = flash_attention_forward(q, k, v, causal, scale, doc_start);
  if (needs_grad({&q, &k, &v}))
    set_history(out, make_node<FlashAttentionBackward>({q, k, v}, q, k, v, out, lse, causal, scale, doc_start));
  return {out, lse};
}

Tensor document_starts(const Tensor& ids, int64_t sep) {
  check_defined(ids, "ids");
  XT_CHECK(is_integral(ids.dtype()) && ids.dim() == 2, TypeError,
           "document_starts: ids must be int32 or int64 [B, S], got ", ids.describe());
  Tensor out = Tensor::empty(ids.shape(), DType::Int32, ids.device());
  if (ids.numel() == 0) return out;
  XT_KERNEL(ids.device(), document_starts, ids.dtype(), ids.data_ptr(), out.data<int32_t>(), ids.size(0), ids.size(1),
            sep, stream_for(ids.device()));
  return out;
}

}  // namespace ops
}  // namespace xt
