// The ops: every op of the engine, one file per family (ops/<family>.cpp) holding the argument
// checks, the dispatch to a CPU or CUDA kernel (csrc/kernels/kernels.h), the backward Node and
// the differentiable function, side by side.
//
// Naming:
//  - ops::<name> is the differentiable op, bound as xtrain._C.ops.<name>: it computes, and when
//    grad mode is on and an input requires grad, records a Node whose apply() is the backward.
//  - ops::<name>_forward / ops::<name>_backward are its raw compute: checks + kernels, no tape
//    (the backward Node calls <name>_backward). Other raw helpers (binary, unary, scalar_op,
//    sum_all, matmul_out_dtype, creation, optimizer steps) have no differentiable twin of the
//    same name and never record history.
//  - A name ending in `_` writes into its first argument in place and bumps that storage's
//    version (core/tensor.h), which the tape checks for every tensor a Node saved.
// Every function validates what it is given (shape, dtype, device, index range where cheap) and
// raises ValueError/TypeError/IndexError naming the argument and what it saw. Results are new
// tensors on the inputs' device.
#pragma once
#include <array>
#include <memory>
#include <optional>
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
// A per-head RMSNorm weight (qk_norm_rope, decode_prep_attention): [D] on q's device, float32 or q's dtype.
void check_head_norm_weight(const Tensor& w, const Tensor& q, int64_t D, const char* op, const char* name);
// ws non-empty, each a defined [out, in] weight of x's dtype and device whose in_features are x's
// last dimension (linear_multi, linear_rows).
void check_linear_weights(const Tensor& x, const std::vector<Tensor>& ws, const char* op);
void* stream_for(Device d);  // this thread's stream on d (nullptr for the CPU)

// ---- creation and copies (ops/creation.cpp); no history
Tensor empty(const Shape& shape, DType dtype, Device device);
Tensor full(const Shape& shape, double value, DType dtype, Device device);
inline Tensor zeros(const Shape& s, DType dt, Device d) { return full(s, 0.0, dt, d); }
Tensor arange(double start, double end, double step, DType dtype, Device device);
Tensor random(const Shape& shape, kernels::RandomKind kind, DType dtype, Device device,
              const std::shared_ptr<Generator>& gen /* nullptr: device default */);
void fill_(Tensor& t, double value);
void zero_(Tensor& t);
// dst <- src (same numel; dtype and device may differ).
void copy_(Tensor& dst, const Tensor& src);
// Copy with a device and/or dtype change; always a new tensor (the raw half of ops::to).
Tensor to_forward(const Tensor& x, Device device, DType dtype);
Tensor clone(const Tensor& x);

// ---- elementwise (ops/elementwise.cpp); binary ops broadcast numpy-style
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add_scalar(const Tensor& x, double s);
Tensor mul_scalar(const Tensor& x, double s);
Tensor rsub_scalar(const Tensor& x, double s);  // s - x
Tensor div_scalar(const Tensor& x, double s);
Tensor rdiv_scalar(const Tensor& x, double s);  // s / x
Tensor pow_scalar(const Tensor& x, double s);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor silu(const Tensor& x);
Tensor gelu(const Tensor& x);  // tanh approximation (GPT-2's; torch's approximate="tanh")
Tensor swiglu(const Tensor& gate, const Tensor& up);  // silu(gate) * up, fused
// The differentiable unary op `op` (its formula and gradient: kernels/common.h); neg ... gelu
// above are this with their UnaryOp.
Tensor unary_fn(kernels::UnaryOp op, const Tensor& x);
// The unary ops bound as xtrain.ops.<name>, one row each: the kernel table's op, the op's name,
// its backward node's name (the grad_fn) and a one-line doc. csrc/python/ops/elementwise.cpp
// binds every row, so a new unary op is a row here plus its formula in kernels/common.h.
struct UnaryOpInfo {
  kernels::UnaryOp op;
  const char* name;
  const char* backward;
  const char* doc;
};
const std::vector<UnaryOpInfo>& unary_ops();
// raw helpers
Shape broadcast_shape(const Shape& a, const Shape& b, const char* op);  // numpy rules
Tensor binary(kernels::BinaryOp op, const Tensor& a, const Tensor& b);
Tensor scalar_op(kernels::ScalarOp op, const Tensor& x, double s);
Tensor unary(kernels::UnaryOp op, const Tensor& x);
Tensor unary_backward(kernels::UnaryOp op, const Tensor& x, const Tensor& dy);  // dy * op'(x)
void accumulate_(Tensor& a, const Tensor& b, double alpha = 1.0);  // a += alpha*b (same shape)
Tensor sum_to(const Tensor& g, const Shape& shape);  // undo a broadcast: sum over expanded dims
// The amax pointers (nullable, device floats the caller zeroed): raised to each output's max |value|,
// the FP8 casts' amax taken by the kernel that writes the operand (mlp_fp8).
Tensor swiglu_forward(const Tensor& gate, const Tensor& up, float* out_amax = nullptr);
std::pair<Tensor, Tensor> swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout,
                                          float* dgate_amax = nullptr, float* dup_amax = nullptr);

// ---- casts and device moves (ops/cast.cpp); the gradient comes back in the input's dtype/device
Tensor cast(const Tensor& x, DType dtype);  // x itself when it already has dtype (like torch's .to)
Tensor to(const Tensor& x, Device device, DType dtype);  // x itself when nothing changes
// cast on each tensor of a list with one fused forward; each output that needs grad gets its own
// CastBackward node, so each input's gradient is final on its own. recast_saved: an op that saves
// an output for backward keeps its source instead and casts it again then (Note [Casts saved as
// their source], ops/cast.cpp): the casts' memory lives only while the forward uses them.
std::vector<Tensor> cast_many(const std::vector<Tensor>& xs, DType dtype, bool recast_saved = false);
// cast_many whose values are already known: out[i] has cached[i]'s values (its memory, no kernel)
// and the history of cast(xs[i], cached[i].dtype()) (a CastBackward to xs[i]). The caller
// guarantees cached[i] holds exactly that cast (data-parallel training gathers the bf16 copies of
// the weights the ranks cast after their update: xtrain.launch.distributed.DataParallelAdamW).
std::vector<Tensor> cast_many_cached(const std::vector<Tensor>& xs, const std::vector<Tensor>& cached);
// raw: always new tensors; cast_many_forward returns an input already of dtype as itself and runs
// one kernel call per source dtype (CUDA: one launch for up to 512 tensors), the bits of cast.
Tensor cast_forward(const Tensor& x, DType dtype);
std::vector<Tensor> cast_many_forward(const std::vector<Tensor>& xs, DType dtype);
// dst[i] = cast(src[i]) into existing tensors (same element count, one device, floating dtypes),
// one cast_many kernel call per (source, destination) dtype pair: the bits of copy_(dst[i], src[i]).
// Raw (no version bump, no history): the tape's batched gradient casts (tape/engine.cpp).
void cast_many_into(const std::vector<Tensor>& src, const std::vector<Tensor>& dst);

// ---- dropout (ops/dropout.cpp): the mask comes from (seed, offset) and is recomputed in
// backward, never stored. The differentiable op draws (seed, offset) from gen (nullptr: the
// device's default generator); x itself when not training or p == 0.
Tensor dropout(const Tensor& x, double p, bool training, const std::shared_ptr<Generator>& gen);
Tensor dropout_forward(const Tensor& x, float p, uint64_t seed, uint64_t offset, const uint64_t* base = nullptr);

// ---- reductions (ops/reduce.cpp): dim = -1 (last) or all dims (all = true)
Tensor sum(const Tensor& x, bool all, bool keepdim);
Tensor mean(const Tensor& x, bool all, bool keepdim);
// raw
Tensor sum_all(const Tensor& x);                     // shape []
Tensor sum_lastdim(const Tensor& x, bool keepdim);   // [..., D] -> [...] or [..., 1]

// ---- layout (ops/layout.cpp)
Tensor reshape(const Tensor& x, const Shape& shape);  // shares storage; one -1 allowed
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);  // a copy
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);  // a copy
// raw
Tensor permute_forward(const Tensor& x, const std::vector<int64_t>& dims);
// The permutation that swaps dims d0 and d1 of x (negative counts from the end); IndexError if out of range.
std::vector<int64_t> transpose_dims(const Tensor& x, int64_t d0, int64_t d1);

// ---- matmul (ops/matmul.cpp): float32 compute; bf16 inputs accumulate in fp32 and round once
Tensor matmul(const Tensor& a, const Tensor& b);  // 2-D, batched 3-D, or [..., K] @ [K, N]
Tensor linear(const Tensor& x, const Tensor& w);  // x [..., K] @ w[N, K]^T -> [..., N]
// linear(swiglu(gate, up), w), bitwise; keeps gate, up and w and recomputes swiglu(gate, up) in
// backward (Note [SwiGLU recomputed for the down projection] in ops/matmul.cpp).
Tensor swiglu_linear(const Tensor& gate, const Tensor& up, const Tensor& w);
// [linear(x, w0), linear(x, w1), ...] as views of one buffer (block after block), one batched GEMM
// per run of weights of one shape (Note [Merged projections] in ops/matmul.cpp).
std::vector<Tensor> linear_multi(const Tensor& x, const std::vector<Tensor>& ws);
std::vector<Tensor> linear_multi_forward(const Tensor& x, const std::vector<Tensor>& ws);
// (h, ys) = (x + residual, linear_multi(rms_norm(h, norm_weight, eps), ws)), or without residual
// (x, linear_multi(rms_norm(x, ...), ws)): bitwise add_rms_norm (rms_norm) then linear_multi,
// forward and backward, keeping h, not the normed input, which backward recomputes (Note [Normed
// input recomputed for the projections] in ops/matmul.cpp).
std::pair<Tensor, std::vector<Tensor>> rms_norm_linear_multi(const Tensor& x, const std::vector<Tensor>& ws,
                                                             const Tensor& norm_weight, double eps,
                                                             const Tensor& residual = Tensor());
// [linear(x, wi) + bi] as linear_multi's views; on CUDA the biases in the batched GEMM's epilogue
// (cuBLASLt), on the CPU linear_multi then add, bitwise (ops/matmul.cpp).
std::vector<Tensor> linear_multi_bias(const Tensor& x, const std::vector<Tensor>& ws, const std::vector<Tensor>& bs);
// -> {dx, dw0, dw1, ...}; x is needed for the dws, ws for dx (undefined entries otherwise).
std::vector<Tensor> linear_multi_backward(const Tensor& x, const std::vector<Tensor>& ws,
                                          const std::vector<Shape>& w_shapes, const std::vector<Tensor>& grads,
                                          bool want_dx, const std::vector<bool>& want_dw);
// ---- biased linears with fused epilogues (ops/linear_bias.cpp): on CUDA the bias (and GELU) in
// the GEMM's epilogue (cuBLASLt), bias gradients by sum_to; on the CPU (and float64) the unfused
// ops' composition, bitwise. x [..., K]; weights [out, in]; biases [out]; one dtype.
Tensor linear_bias(const Tensor& x, const Tensor& w, const Tensor& b);  // x @ w^T + b
// gelu_tanh(x @ w_fc^T + b_fc) @ w_pr^T + b_pr (GPT-2's MLP), one node: its backward applies GELU's
// derivative in the epilogue of the GEMM that makes the hidden gradient.
Tensor gelu_mlp(const Tensor& x, const Tensor& w_fc, const Tensor& b_fc, const Tensor& w_pr, const Tensor& b_pr);
// raw: a [M, K] @ b [K, N], or batched [Bt, M, K] @ [Bt, K, N]; ta/tb read a/b transposed.
Tensor matmul_forward(const Tensor& a, const Tensor& b, bool ta = false, bool tb = false);
// out_dtype lets weight-gradient GEMMs write float32 directly from bf16 inputs.
Tensor matmul_out_dtype(const Tensor& a, const Tensor& b, bool ta, bool tb, DType out_dtype);
Tensor linear_forward(const Tensor& x, const Tensor& w);
// Use TF32 tensor cores for float32 GEMMs on CUDA (off by default: true fp32).
void set_allow_tf32(bool allow);
bool allow_tf32();
// ---- fp8 (ops/fp8.cpp): linear_fp8 = x @ w^T with x and w in FP8 E4M3 (per-tensor current
// scaling, power-of-two scales), the backward's dy in E5M2, float32 accumulation, output and
// gradients in x's dtype (float32 or bf16); the CPU emulates the CUDA GEMM exactly up to the
// summation order. docs/fp8.md.
Tensor linear_fp8(const Tensor& x, const Tensor& w);
// [linear_fp8(x, w) for w in ws] with x quantised once (one amax pass, one cast, one saved copy of
// its codes) for all of them: the outputs and the weight gradients are linear_fp8's bits; dx is
// the weights' dgrad GEMMs accumulated in ws' order (dx = round(G_i + dx), in each GEMM's epilogue). linear_fp8 is its one-weight case.
std::vector<Tensor> linear_fp8_multi(const Tensor& x, const std::vector<Tensor>& ws);
// linear_fp8(swiglu(*linear_fp8_multi(x, [w_gate, w_up])), w_down) as one op, bitwise: the swiglu
// kernels take the amax of h (forward) and of dgate, dup (backward) as they write them, instead of
// an amax pass each (Note [The FP8 MLP in one op], ops/fp8.cpp).
Tensor mlp_fp8(const Tensor& x, const Tensor& w_gate, const Tensor& w_up, const Tensor& w_down);

// ---- embedding (ops/embedding.cpp): ids int32/int64 in [0, vocab)
Tensor embedding(const Tensor& table, const Tensor& ids);
Tensor embedding_forward(const Tensor& table, const Tensor& ids);
Tensor embedding_backward(const Tensor& ids, const Tensor& dout, int64_t vocab, DType table_dtype);

// ---- rms_norm (ops/rmsnorm.cpp): over the last dim; w [D] in x's dtype or float32
Tensor rms_norm(const Tensor& x, const Tensor& w, double eps);
// raw: (y in x's dtype and shape, rstd float32 [rows]) and (dx, dw in w's dtype)
std::pair<Tensor, Tensor> rms_norm_forward(const Tensor& x, const Tensor& w, double eps);
// dres (optional): dx = round(dx) + dres (the gradient add after a fused residual add); dw_into
// (optional): where dw is written (a claimed gradient slot, claim_grad_buffer).
std::pair<Tensor, Tensor> rms_norm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                                            const Tensor& dres = Tensor(), const Tensor& dw_into = Tensor());
// add_rms_norm: (h = x + r, rms_norm(h, w, eps)) in one kernel; bitwise add then rms_norm, forward
// and backward. r must match x. rstd_out (raw form): the float32 rstd of h's rows.
std::pair<Tensor, Tensor> add_rms_norm(const Tensor& x, const Tensor& r, const Tensor& w, double eps);
std::pair<Tensor, Tensor> add_rms_norm_forward(const Tensor& x, const Tensor& r, const Tensor& w, double eps,
                                               Tensor* rstd_out = nullptr);

// ---- layer_norm (ops/layernorm.cpp): over the last dim, biased variance; w, b [D], both in x's
// dtype or both float32. Raw forms: (y, mean, rstd) with the statistics [rows] in float32
// (float64 for float64 x); backward (dx, dw, db), dres (optional): dx = round(dx) + dres.
Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps);
std::vector<Tensor> layer_norm_forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps);
std::vector<Tensor> layer_norm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                                        const Tensor& dy, const Tensor& dres = Tensor());
// add_layer_norm: (h = x + r, layer_norm(h, w, b, eps)) in one kernel; bitwise add then layer_norm,
// forward and backward. r must match x. Raw form: (h, y, mean, rstd).
std::pair<Tensor, Tensor> add_layer_norm(const Tensor& x, const Tensor& r, const Tensor& w, const Tensor& b,
                                         double eps);
std::vector<Tensor> add_layer_norm_forward(const Tensor& x, const Tensor& r, const Tensor& w, const Tensor& b,
                                           double eps);

// ---- rope (ops/rope.cpp): x [B, S, H, D], D even; positions int64 [S] or [B, S] (each row its
// own: RoPE positions restarting per document), undefined: 0..S-1; theta > 0 and finite.
// llama3: Llama 3's rescaling of the frequencies (transformers' rope_type "llama3"; factor >= 1,
// 0 < low_freq_factor < high_freq_factor, original_max_positions >= 1, all finite), none: plain RoPE.
// (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings), transformers'
// rope_scaling fields in that order (a Python 4-tuple).
using RopeScaling = std::optional<std::array<double, 4>>;
// The kernels' frequencies of theta and llama3, checked (ValueError naming op).
kernels::RopeFreqs rope_freqs(double theta, const RopeScaling& llama3, const char* op);
// The kernels' view of positions for x [B, S, ...] (x's device), checked; undefined: null.
kernels::RopePositions rope_positions(const Tensor& positions, const Tensor& x, const char* op);
Tensor rope(const Tensor& x, const Tensor& positions, double theta, const RopeScaling& llama3 = std::nullopt);
// raw; inverse rotates back (the backward)
Tensor rope_forward(const Tensor& x, const Tensor& positions, const kernels::RopeFreqs& freqs, bool inverse);
// flash_attention(rope(q, ...), rope(k, ...), v, causal, scale, doc_start).first, bitwise, keeping q
// and k unrotated; backward rotates them again (Note [Attention's rotated q and k recomputed] in
// ops/rope.cpp). scale <= 0: 1/sqrt(D). Returns out [B, S, H, D].
Tensor rope_attention(const Tensor& q, const Tensor& k, const Tensor& v, double theta, const Tensor& positions,
                      const RopeScaling& llama3, bool causal, double scale, const Tensor& doc_start);
// document_positions: doc_start int32 [B, S] (document_starts) -> int64 [B, S], s - doc_start[b, s]:
// each token's distance from the start of its document, the positions of RoPE restarting per document.
Tensor document_positions(const Tensor& doc_start);

// ---- softmax (ops/softmax.cpp), last dim
Tensor softmax(const Tensor& x);
Tensor log_softmax(const Tensor& x);
// raw: log selects log_softmax; the backward takes the forward's output y
Tensor softmax_forward(const Tensor& x, bool log);
Tensor softmax_backward(const Tensor& y, const Tensor& dy, bool log);

// ---- flash attention (ops/flash_attention.cpp), on tensors in the (B, S, heads, D) layout the
// projection GEMMs write (a [B*S, heads*D] matrix reshaped).
// flash_attention: q [B, S, H, D], k and v [B, S, Hkv, D] with H % Hkv == 0 (query head h reads kv
// head h / (H / Hkv)), one floating dtype, 1 <= D <= 256; scale <= 0 selects 1/sqrt(D). Returns
// (out [B, S, H, D], lse [B, H, S]: float32, float64 for float64 inputs; lse is not differentiable).
// doc_start (int32 [B, S], causal only; undefined: none): attention within documents, query s
// seeing keys doc_start[b, s] .. s; document_starts(ids [B, S], sep) makes it (a document begins at
// 0 and after every separator).
std::pair<Tensor, Tensor> flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                          double scale, const Tensor& doc_start = Tensor());
// raw: the same pair; the backward returns (dq, dk, dv) from the forward's out and lse.
std::pair<Tensor, Tensor> flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                                  double scale, const Tensor& doc_start = Tensor());
std::vector<Tensor> flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                             const Tensor& lse, const Tensor& dout, bool causal, double scale,
                                             const Tensor& doc_start = Tensor());
Tensor document_starts(const Tensor& ids, int64_t sep);

// ---- the fused q/k head preparation (ops/qk_norm_rope.cpp), in the same layout.
// qk_norm_rope: rope(rms_norm(x, w, eps), theta) over D for x = q [B, S, H, D] and k [B, S, Hkv, D]
// (D even; the weights [D] in x's dtype or float32, one dtype for both), at positions (as rope's:
// [S], [B, S] or undefined for 0..S-1) with llama3's scaling, bitwise equal to ops::rms_norm
// followed by ops::rope on the same device. Returns (q_out, k_out).
std::pair<Tensor, Tensor> qk_norm_rope(const Tensor& q, const Tensor& k, const Tensor& wq, const Tensor& wk,
                                       double eps, double theta, const Tensor& positions = Tensor(),
                                       const RopeScaling& llama3 = std::nullopt);
// raw: (q_out, k_out, rstd_q [B*S*H], rstd_k [B*S*Hkv]) and (dq, dk, dwq, dwk); an undefined dq_out
// (dk_out) leaves dq and dwq (dk and dwk) undefined.
std::vector<Tensor> qk_norm_rope_forward(const Tensor& q, const Tensor& k, const Tensor& wq, const Tensor& wk,
                                         double eps, const kernels::RopeFreqs& freqs,
                                         const Tensor& positions = Tensor());
std::vector<Tensor> qk_norm_rope_backward(const Tensor& q, const Tensor& k, const Tensor& wq, const Tensor& wk,
                                          const Tensor& rstd_q, const Tensor& rstd_k, const Tensor& dq_out,
                                          const Tensor& dk_out, const kernels::RopeFreqs& freqs,
                                          const Tensor& positions = Tensor());
// flash_attention(qk_norm_rope(q, k, ...), v, causal, scale, doc_start).first, bitwise, keeping q and
// k as they came rather than the normed, rotated pair, which backward recomputes (Note [Attention's
// q and k recomputed] in ops/qk_norm_rope.cpp). Returns out [B, S, H, D].
Tensor qk_norm_rope_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& wq, const Tensor& wk,
                              double eps, double theta, const Tensor& positions, const RopeScaling& llama3,
                              bool causal, double scale, const Tensor& doc_start);

// ---- decode attention (ops/decode_attention.cpp): generation with a KV cache, not differentiable.
// kv_cache_write_: cache [B, L, Hkv, D] (written in place), x [B, S, Hkv, D] of cache's dtype,
// positions int64 [B]: cache[b, positions[b] + s] = x[b, s], 0 <= positions[b] <= L - S.
// decode_attention: q [B, H, D] against k_cache, v_cache [B, L, Hkv, D] (H % Hkv == 0), lengths
// int64 [B] in [0, L]: row b attends to its first lengths[b] slots; scale <= 0 selects 1/sqrt(D).
// Returns out [B, H, D] (zeros for a row with length 0).
void kv_cache_write_(const Tensor& cache, const Tensor& x, const Tensor& positions);
Tensor decode_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& lengths,
                        double scale);
// decode_prep_attention: a decode step's head preparation then its attention. q [B, H, D], k, v
// [B, Hkv, D]; k and v are written into k_cache, v_cache [B, L, Hkv, D] at slot positions[b] (in
// [0, L)) of each row; with wq, wk [D] (both or neither) q and k get rms_norm(eps) then
// rope(theta, llama3) at the row's position, without them rope only; then decode_attention of that q over
// lengths (int64 [B] in [0, L]) with scale (<= 0: 1/sqrt(D)) -> out [B, H, D]. Bitwise those ops,
// in one kernel on CUDA where the one-pass attention applies.
// prefetch: up to kMaxL2Prefetch tensors on q's device that the ops after this one read (the
// decode step's next weight matrices); a hint, no value depends on it (CPU: ignored).
using kernels::kMaxL2Prefetch;
Tensor decode_prep_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_cache,
                             const Tensor& v_cache, const Tensor& positions, const Tensor& lengths, const Tensor& wq,
                             const Tensor& wk, double eps, double theta, double scale,
                             const std::vector<Tensor>& prefetch = {}, const RopeScaling& llama3 = std::nullopt);

// ---- the greedy pick of a decode step (ops/greedy_next.cpp), not differentiable.
// greedy_next_: logits [B, V]; state int64 [6, B] (token, position, length, limit, done, count per
// row; kernels.h's greedy_next has the rules); ring int64 [R, B]; stop < 0 means no stop token.
void greedy_next_(const Tensor& logits, const Tensor& state, const Tensor& ring, int64_t stop);

// ---- linear_rows (ops/linear_rows.cpp): the decode step's matrix-vector products, not
// differentiable. x [M, K] with 1 <= M <= 8, weights [N_i, K] of x's dtype -> [x @ w_i^T] as views
// of one buffer laid out as linear_multi's; one kernel reads each weight row once. Raises when an
// input requires grad while grad mode is on (inference only: call it under no_grad).
std::vector<Tensor> linear_rows(const Tensor& x, const std::vector<Tensor>& ws);
// rms_norm_linear_rows: (h, ys) = (x + residual, linear_rows(rms_norm(h, norm_weight, eps), ws)),
// residual optional (undefined: h is x); swiglu: two weights (gate, up) -> [swiglu(gate, up)].
// Bitwise add_rms_norm (rms_norm), linear_rows and swiglu; one kernel; not differentiable.
std::pair<Tensor, std::vector<Tensor>> rms_norm_linear_rows(const Tensor& x, const std::vector<Tensor>& ws,
                                                          const Tensor& norm_weight, double eps, const Tensor& residual,
                                                          bool swiglu);

// ---- cross entropy (ops/cross_entropy.cpp): logits [N, V], targets int [N]; the mean loss over
// targets that are not ignore_index, float32 []
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index);
// cross_entropy(linear(x, w), targets) fused: x [N, K], w [V, K]; returns (loss, a detached [N, V]
// copy of the logits when return_logits, else undefined). chunk_rows: rows per chunk of the
// row-chunked head (Note [Row-chunked head], ops/cross_entropy.cpp); 0 chooses it from the shapes
// (about 1 GiB of logits), and a call whose rows all fit one chunk runs unchunked.
std::pair<Tensor, Tensor> linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& targets,
                                               int64_t ignore_index, bool return_logits, int64_t chunk_rows = 0);
// Rows per chunk of linear_cross_entropy's head for N rows whose logits rows are ld elements of
// itemsize bytes (requested > 0: that many): N or more means one unchunked call (Note [Row-chunked
// head], ops/cross_entropy.cpp). A function of its arguments only.
int64_t head_chunk_rows(int64_t N, int64_t ld, size_t itemsize, int64_t requested = 0);
// raw: (loss, lse float32 [N], count float32 [1])
std::vector<Tensor> cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index);
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& lse, const Tensor& targets,
                              const Tensor& dloss, const Tensor& count, int64_t ignore_index);
// The fused head's logits live in a buffer [N, ld], ld = logits_ld(V): V rounded up to a
// multiple of kLogitsLdMultiple elements, so ld * itemsize is a multiple of 16 bytes (every row
// 16-byte aligned: cuBLAS's fast aligned/TMA GEMMs apply even for an odd vocabulary such as
// GPT-2's 50257 -> 50304). On CUDA the GEMMs also cover ld classes (w padded with zero rows, the
// padding columns exactly 0), since cuBLAS needs the contiguous extent aligned too; on the CPU
// they cover V, and the padding columns are only ever zeroed (by the backward).
constexpr int64_t kLogitsLdMultiple = 64;
inline int64_t logits_ld(int64_t vocab) {
  return (vocab + kLogitsLdMultiple - 1) / kLogitsLdMultiple * kLogitsLdMultiple;
}
// raw: (loss, lse, count, logits buffer [N, ld] in x's dtype, the weight the GEMMs used: w, or on
// CUDA w padded to [ld, K] with zero rows; the backward takes it).
std::vector<Tensor> linear_cross_entropy_forward(const Tensor& x, const Tensor& w, const Tensor& targets,
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

// ---- optimizer (ops/optim.cpp): float32 tensors on one device, updated in place; no history
void adamw_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step,
                const Tensor& guard = Tensor(),      // one float32 on the device: not finite -> no update
                const Tensor& clip_norm = Tensor(),  // one float32 on the device: gradients read clipped
                double max_norm = 0.0,
                const Tensor& hyper = Tensor(),      // 3 float32 on the device: adamw_consts of this
                                                     // step, read instead of lr/step (CUDA graphs)
                const std::vector<bool>& decays = {});  // per tensor: weight_decay applies (empty: all)
// The update's per-step constants (decay, step_size, bc2_sqrt) for lr and step, exactly as
// adamw_step computes them: what a `hyper` tensor holds.
std::vector<float> adamw_consts(double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step);
Tensor global_norm(const std::vector<Tensor>& tensors);  // float32 [] on the tensors' device
void clip_by_norm_(const std::vector<Tensor>& tensors, const Tensor& norm, double max_norm);

// ---- Muon (ops/muon.cpp): torch.optim.Muon's step over float32 2-D matrices on one device, in
// place; the Newton-Schulz iteration in bf16 on the engine's GEMMs, matrices of one shape batched.
// lr_ratios: each matrix's adjust_lr ratio (its learning rate is lr * ratio; decay is 1 - lr * wd).
void muon_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
               const std::vector<Tensor>& momentum_buffers, double lr, double weight_decay, double momentum,
               bool nesterov, const std::vector<double>& ns_coefficients, int64_t ns_steps, double eps,
               const std::vector<double>& lr_ratios,
               const Tensor& guard = Tensor(),      // one float32 on the device: not finite -> no update
               const Tensor& clip_norm = Tensor(),  // one float32 on the device: gradients read clipped
               double max_norm = 0.0,
               const Tensor& hyper = Tensor());     // 2 float32 on the device: muon_consts of this step
// [decay, lr] of a step as muon_step rounds them: what a `hyper` tensor holds.
std::vector<float> muon_consts(double lr, double weight_decay);

}  // namespace ops
}  // namespace xt
