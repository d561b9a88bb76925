// The differentiable ops: what xtrain.ops.* binds. Each one calls ops:: for the forward and,
// when grad mode is on and an input requires grad, records a Node whose apply() is the backward.
// One file per family in tape/functions/, forward and backward side by side.
#pragma once
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "core/generator.h"
#include "core/tensor.h"

namespace xt {
namespace tape {

// elementwise (functions/elementwise.cpp); binary ops broadcast numpy-style
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add_scalar(const Tensor& x, double s);
Tensor mul_scalar(const Tensor& x, double s);  // "scale"
Tensor rsub_scalar(const Tensor& x, double s);  // s - x
Tensor div_scalar(const Tensor& x, double s);
Tensor rdiv_scalar(const Tensor& x, double s);  // s / x
Tensor pow_scalar(const Tensor& x, double s);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor silu(const Tensor& x);
Tensor swiglu(const Tensor& gate, const Tensor& up);
Tensor cast(const Tensor& x, DType dtype);  // backward returns the gradient in x's dtype
// cast on each tensor of a list with one fused forward (ops::cast_many); each output that needs
// grad gets its own CastBackward node, so each input's gradient is final on its own.
std::vector<Tensor> cast_many(const std::vector<Tensor>& xs, DType dtype);
// cast_many whose values are already known: out[i] has cached[i]'s values (its memory, no kernel)
// and the history of cast(xs[i], cached[i].dtype()) (a CastBackward to xs[i]). The caller
// guarantees cached[i] holds exactly that cast (data-parallel training gathers the bf16 copies of
// the weights the ranks cast after their update: xtrain.distributed.DataParallelAdamW).
std::vector<Tensor> cast_many_cached(const std::vector<Tensor>& xs, const std::vector<Tensor>& cached);
Tensor to(const Tensor& x, Device device, DType dtype);  // differentiable copy
Tensor dropout(const Tensor& x, double p, bool training, const std::shared_ptr<Generator>& gen);

// reductions (functions/reduce.cpp): dim = -1 (last) or all dims (all = true)
Tensor sum(const Tensor& x, bool all, bool keepdim);
Tensor mean(const Tensor& x, bool all, bool keepdim);

// shape (functions/layout.cpp)
Tensor reshape(const Tensor& x, const Shape& shape);  // shares storage; one -1 allowed
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);

// matmul (functions/matmul.cpp)
Tensor matmul(const Tensor& a, const Tensor& b);  // 2-D or batched 3-D
Tensor linear(const Tensor& x, const Tensor& w);  // x @ w^T

// model ops
Tensor embedding(const Tensor& table, const Tensor& ids);               // functions/embedding.cpp
Tensor rms_norm(const Tensor& x, const Tensor& w, double eps);          // functions/rmsnorm.cpp
Tensor rope(const Tensor& x, const Tensor& positions, double theta);    // functions/rope.cpp
Tensor sdpa(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale /* <=0: 1/sqrt(D) */);
Tensor softmax(const Tensor& x);                                        // functions/softmax.cpp
Tensor log_softmax(const Tensor& x);
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index);
// cross_entropy(linear(x, w), targets) fused (functions/cross_entropy.cpp): x [N, K], w [V, K];
// returns (loss, a detached [N, V] copy of the logits when return_logits, else undefined).
std::pair<Tensor, Tensor> linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& targets,
                                               int64_t ignore_index, bool return_logits);

// composites (functions/heads.cpp): compositions of the Functions above, recorded on the tape as
// those Functions' own nodes, so values and gradients are bit-identical to calling them one by one.
// to_heads: x [B*S, H*D] -> [B, H, S, D] = permute(rope(rms_norm(reshape(x, [B, S, H, D]), norm_weight, eps),
// theta = rope_theta), {0, 2, 1, 3}); the norm is skipped when norm_weight is undefined, rope when
// rope_theta is nullopt (positions 0..S-1 otherwise).
Tensor to_heads(const Tensor& x, int64_t seq, int64_t n_heads, const Tensor& norm_weight, double eps,
                std::optional<double> rope_theta);
// from_heads: x [B, H, S, D] -> [B*S, H*D] = reshape(permute(x, {0, 2, 1, 3}), [B*S, H*D]).
Tensor from_heads(const Tensor& x);

}  // namespace tape
}  // namespace xt
