// The ops layer: argument checks + dispatch to a CPU or CUDA kernel. No autograd here.
//
// Every function validates what it is given (shape, dtype, device, index range where cheap)
// and raises ValueError/TypeError/IndexError naming the argument and what it saw, then calls
// kernels::cpu::* or kernels::cuda::* (csrc/kernels/kernels.h). Results are new tensors on
// the inputs' device; functions ending in `_` write into their first argument.
// The tape (csrc/tape/) builds the differentiable ops on top of these.
#pragma once
#include <memory>
#include <utility>
#include <vector>

#include "core/generator.h"
#include "core/tensor.h"
#include "kernels/kernels.h"

namespace xt {
namespace ops {

// ---- checks shared by every op family (ops/checks.cpp)
void check_defined(const Tensor& t, const char* name);
void check_floating(const Tensor& t, const char* op, const char* name);
void check_same_device(const Tensor& a, const Tensor& b, const char* op, const char* an, const char* bn);
void check_same_dtype(const Tensor& a, const Tensor& b, const char* op, const char* an, const char* bn);
void check_dim(const Tensor& t, int64_t dim, const char* op, const char* name);
void* stream_for(Device d);  // this thread's stream on d (nullptr for the CPU)

// ---- creation and copies (ops/creation.cpp)
Tensor empty(const Shape& shape, DType dtype, Device device);
Tensor full(const Shape& shape, double value, DType dtype, Device device);
inline Tensor zeros(const Shape& s, DType dt, Device d) { return full(s, 0.0, dt, d); }
Tensor arange(double start, double end, double step, DType dtype, Device device);
Tensor random(const Shape& shape, kernels::RandomKind kind, DType dtype, Device device,
              const std::shared_ptr<Generator>& gen /* nullptr: device default */);
void fill_(Tensor& t, double value);
void zero_(Tensor& t);
// Copy with a device and/or dtype change; always a new tensor.
Tensor to(const Tensor& x, Device device, DType dtype);
Tensor clone(const Tensor& x);
// dst <- src (same numel; dtype and device may differ).
void copy_(Tensor& dst, const Tensor& src);

// ---- elementwise (ops/elementwise.cpp)
Shape broadcast_shape(const Shape& a, const Shape& b, const char* op);  // numpy rules
Tensor binary(kernels::BinaryOp op, const Tensor& a, const Tensor& b);
Tensor scalar_op(kernels::ScalarOp op, const Tensor& x, double s);
Tensor unary(kernels::UnaryOp op, const Tensor& x);
void accumulate_(Tensor& a, const Tensor& b, double alpha = 1.0);  // a += alpha*b (same shape)
Tensor sum_to(const Tensor& g, const Shape& shape);  // undo a broadcast: sum over expanded dims
Tensor silu_backward(const Tensor& x, const Tensor& dy);
Tensor swiglu(const Tensor& gate, const Tensor& up);
std::pair<Tensor, Tensor> swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout);
Tensor cast(const Tensor& x, DType dtype);
// cast over a list on one device, one kernel call per source dtype (CUDA: one launch for up to
// 512 tensors). Output i has the bits ops::cast(xs[i], dtype) has; unlike cast, an input already
// of `dtype` is returned as itself, not copied.
std::vector<Tensor> cast_many(const std::vector<Tensor>& xs, DType dtype);
// Dropout's mask comes from (seed, offset) and is recomputed in backward, never stored.
Tensor dropout(const Tensor& x, float p, uint64_t seed, uint64_t offset);

// ---- reductions (ops/reduce.cpp)
Tensor sum_all(const Tensor& x);                     // shape []
Tensor sum_lastdim(const Tensor& x, bool keepdim);   // [..., D] -> [...] or [..., 1]

// ---- layout (ops/layout.cpp)
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
// The permutation that swaps dims d0 and d1 of x (negative counts from the end); IndexError if out of range.
std::vector<int64_t> transpose_dims(const Tensor& x, int64_t d0, int64_t d1);

// ---- matmul (ops/matmul.cpp): float32 compute; bf16 inputs accumulate in fp32 and round once
// a [M, K] @ b [K, N], or batched [Bt, M, K] @ [Bt, K, N]; ta/tb read a/b transposed.
Tensor matmul(const Tensor& a, const Tensor& b, bool ta = false, bool tb = false);
Tensor linear(const Tensor& x, const Tensor& w);  // x [..., K], w [N, K] -> [..., N]
// out_dtype lets weight-gradient GEMMs write float32 directly from bf16 inputs.
Tensor matmul_out_dtype(const Tensor& a, const Tensor& b, bool ta, bool tb, DType out_dtype);
// Use TF32 tensor cores for float32 GEMMs on CUDA (off by default: true fp32).
void set_allow_tf32(bool allow);
bool allow_tf32();

// ---- embedding (ops/embedding.cpp): ids int32/int64 in [0, vocab), checked
Tensor embedding(const Tensor& table, const Tensor& ids);
Tensor embedding_backward(const Tensor& ids, const Tensor& dout, int64_t vocab, DType table_dtype);

// ---- rms_norm (ops/rmsnorm.cpp): over the last dim; w may be x's dtype or float32
// Returns y (x's dtype and shape) and rstd (float32, one per row).
std::pair<Tensor, Tensor> rms_norm(const Tensor& x, const Tensor& w, double eps);
std::pair<Tensor, Tensor> rms_norm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd,
                                            const Tensor& dy);  // (dx, dw)

// ---- rope (ops/rope.cpp): x [B, S, H, D], D even; positions int64 [S] (undefined: 0..S-1)
Tensor rope(const Tensor& x, const Tensor& positions, double theta, bool inverse);

// ---- softmax (ops/softmax.cpp), last dim
Tensor softmax(const Tensor& x, bool log);
Tensor softmax_backward(const Tensor& y, const Tensor& dy, bool log);

// ---- attention (ops/attention.cpp): q, k, v [B, H, S, D]
// Returns (out [B, H, S, D], probs [B, H, S, S]) ; probs is what backward needs.
std::pair<Tensor, Tensor> sdpa(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale);
// Returns dq, dk, dv.
std::vector<Tensor> sdpa_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& probs,
                                  const Tensor& dout, double scale);

// ---- cross entropy (ops/cross_entropy.cpp): logits [N, V], targets int [N]
// Returns (loss float32 [] mean over non-ignored, lse float32 [N], count float32 [1]).
std::vector<Tensor> cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index);
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& lse, const Tensor& targets,
                              const Tensor& dloss, const Tensor& count, int64_t ignore_index);

// ---- fused linear + cross entropy (ops/cross_entropy.cpp): x [N, K], w [V, K] (same floating
// dtype), targets int [N]. The logits live in a buffer [N, ld], ld = logits_ld(V): V rounded up
// to a multiple of kLogitsLdMultiple elements, so ld * itemsize is a multiple of 16 bytes (every
// row 16-byte aligned: cuBLAS's fast aligned/TMA GEMMs apply even for an odd vocabulary such as
// GPT-2's 50257 -> 50304). On CUDA the GEMMs also cover ld classes (w padded with zero rows, the
// padding columns exactly 0), since cuBLAS needs the contiguous extent aligned too; on the CPU
// they cover V, and the padding columns are only ever zeroed (by the backward).
constexpr int64_t kLogitsLdMultiple = 64;
inline int64_t logits_ld(int64_t vocab) {
  return (vocab + kLogitsLdMultiple - 1) / kLogitsLdMultiple * kLogitsLdMultiple;
}
// Returns (loss float32 [], lse float32 [N], count float32 [1], logits buffer [N, ld] in x's dtype,
// the weight the GEMMs used: w, or on CUDA w padded to [ld, K] with zero rows; the backward takes it).
std::vector<Tensor> linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& targets,
                                         int64_t ignore_index);
// A contiguous [N, vocab] copy of the first vocab columns of a buffer [N, ld].
Tensor logits_from_buffer(const Tensor& buf, int64_t vocab);
// Writes dlogits IN PLACE over buf (its logits are gone afterwards; padding columns 0), then
// returns (dx = dlogits @ w in buf's dtype when w is defined — w [V, K] or padded [ld, K] —,
// dw = dlogits^T @ x [V, K] in x's dtype when x is defined; undefined otherwise), one GEMM each
// with leading dimension ld.
std::pair<Tensor, Tensor> linear_cross_entropy_backward(const Tensor& buf, int64_t vocab, const Tensor& x,
                                                        const Tensor& w, const Tensor& lse, const Tensor& targets,
                                                        const Tensor& dloss, const Tensor& count,
                                                        int64_t ignore_index);

// ---- optimizer (ops/optim.cpp): float32 tensors on one device
void adamw_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step);
Tensor global_norm(const std::vector<Tensor>& tensors);  // float32 [] on the tensors' device
void clip_by_norm_(const std::vector<Tensor>& tensors, const Tensor& norm, double max_norm);

}  // namespace ops
}  // namespace xt
