// Attention's head layout as composites: to_heads ([B*S, H*D] -> [B, H, S, D], with the per-head
// q/k RMSNorm and RoPE on the way) and from_heads (back). Each one only calls the differentiable
// ops reshape, rms_norm, rope and permute in the order the Python model did, so the graph, the
// kernels and every value and gradient bit are theirs; what it saves is the Python-level calls
// (and the GIL hand-overs) per op. to_heads checks what it needs to derive the shapes (x 2-D, seq and
// n_heads positive and dividing it); the norm weight, eps and theta are checked by rms_norm and
// rope themselves, as they would be when called one by one.
#include "core/error.h"
#include "ops/ops.h"

namespace xt {
namespace ops {

namespace {

const std::vector<int64_t> kHeadsSwap = {0, 2, 1, 3};  // [B, S, H, D] <-> [B, H, S, D]

}  // namespace

Tensor to_heads(const Tensor& x, int64_t seq, int64_t n_heads, const Tensor& norm_weight, double eps,
                std::optional<double> rope_theta) {
  check_floating(x, "to_heads", "x");
  XT_CHECK(x.dim() == 2, ValueError, "to_heads: x must be [B*S, H*D] (2 dimensions), got ", x.describe());
  XT_CHECK(seq > 0, ValueError, "to_heads: seq must be > 0, got ", seq);
  XT_CHECK(n_heads > 0, ValueError, "to_heads: n_heads must be > 0, got ", n_heads);
  const int64_t rows = x.size(0), cols = x.size(1);
  XT_CHECK(rows % seq == 0, ValueError, "to_heads: the rows of x (B*S = ", rows, ") must be divisible by seq = ", seq,
           ", got x ", x.describe());
  XT_CHECK(cols % n_heads == 0, ValueError, "to_heads: the columns of x (H*D = ", cols,
           ") must be divisible by n_heads = ", n_heads, ", got x ", x.describe());
  const int64_t B = rows / seq, D = cols / n_heads;
  Tensor h = reshape(x, {B, seq, n_heads, D});         // (B, S, H, D), shares x's storage
  if (norm_weight.defined()) h = rms_norm(h, norm_weight, eps);
  if (rope_theta) h = rope(h, Tensor(), *rope_theta);  // positions 0..S-1
  return permute(h, kHeadsSwap);                       // (B, H, S, D)
}

Tensor from_heads(const Tensor& x) {
  check_floating(x, "from_heads", "x");
  XT_CHECK(x.dim() == 4, ValueError, "from_heads: x must be [B, H, S, D] (4 dimensions), got ", x.describe());
  const int64_t B = x.size(0), H = x.size(1), S = x.size(2), D = x.size(3);
  return reshape(permute(x, kHeadsSwap), {B * S, H * D});  // (B, S, H, D) -> (B*S, H*D)
}

}  // namespace ops
}  // namespace xt
