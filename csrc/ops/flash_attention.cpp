// Flash attention on tensors in the (B, S, heads, D) layout that the projection GEMMs write (rows
// of a [B*S, heads*D] matrix, no permutes): argument checks, dispatch to
// kernels/{cpu,cuda}/flash_attention, the backward node and the differentiable op.
//
//  - flash_attention(q, k, v) on q [B, S, H, D], k/v [B, S, Hkv, D] (grouped-query attention when
//    Hkv < H) returns out [B, S, H, D] and the row log-sum-exp lse [B, H, S] (not differentiable).
//    The node saves q, k, v, out and lse: memory linear in S, no [S, S] probabilities. Backward
//    recomputes P (deterministic kernels: no atomics) and returns dq, dk, dv, freshly written.
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

DType stat_dtype(DType dt) { return dt == DType::Float64 ? DType::Float64 : DType::Float32; }

double resolve_scale(double scale, int64_t D, const char* op) {
  XT_CHECK(std::isfinite(scale), ValueError, op, ": scale must be finite, got ", scale);
  return scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(D));
}

}  // namespace

std::pair<Tensor, Tensor> flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                                  double scale) {
  const AttnShape n = check_attention(q, k, v, "flash_attention");
  const double sc = resolve_scale(scale, n.D, "flash_attention");
  Tensor out = Tensor::empty(q.shape(), q.dtype(), q.device());
  Tensor lse = Tensor::empty({n.B, n.H, n.S}, stat_dtype(q.dtype()), q.device());
  if (n.B * n.S == 0) return {out, lse};
  XT_KERNEL(q.device(), flash_attention_forward, q.dtype(), q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
            lse.data_ptr(), n.B, n.S, n.H, n.Hkv, n.D, sc, causal, stream_for(q.device()));
  return {out, lse};
}

std::vector<Tensor> flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                             const Tensor& lse, const Tensor& dout, bool causal, double scale) {
  const char* op = "flash_attention_backward";
  const AttnShape n = check_attention(q, k, v, op);
  const double sc = resolve_scale(scale, n.D, op);
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
            sc, causal, stream_for(q.device()));
  return {dq, dk, dv};
}

namespace {

class FlashAttentionBackward : public NodeWithSaved<5> {
 public:
  FlashAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                         bool causal, double scale)
      : NodeWithSaved({SavedTensor("q", q), SavedTensor("k", k), SavedTensor("v", v), SavedTensor("out", out),
                       SavedTensor("lse", lse)}),
        causal_(causal), scale_(scale) {}
  const char* name() const override { return "FlashAttentionBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!grads[0].defined()) return {Tensor(), Tensor(), Tensor()};
    const auto [q, k, v, out, lse] = unpack();
    return flash_attention_backward(q, k, v, out, lse, grads[0], causal_, scale_);
  }

 private:
  bool causal_;
  double scale_;  // as given: <= 0 selects 1/sqrt(D), forward and backward alike
};

}  // namespace

std::pair<Tensor, Tensor> flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                          double scale) {
  auto [out, lse] = flash_attention_forward(q, k, v, causal, scale);
  if (needs_grad({&q, &k, &v}))
    set_history(out, make_node<FlashAttentionBackward>({q, k, v}, q, k, v, out, lse, causal, scale));
  return {out, lse};
}

}  // namespace ops
}  // namespace xt
