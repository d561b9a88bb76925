// The kernel contract: raw compute on pointers and sizes, identical for both backends.
//
// Every function below exists twice, as xt::kernels::cpu::NAME (kernels/cpu/*.cpp) and
// xt::kernels::cuda::NAME (kernels/cuda/*.cu), with the same arguments. Kernels know nothing
// of tensors or the tape: the ops layer (csrc/ops/) checks shapes/dtypes/devices and picks
// the backend. `stream` is this thread's cudaStream_t on the CUDA side and nullptr on the CPU.
// Every kernel is deterministic: no floating-point atomics, fixed reduction orders. What both
// backends share (dtype dispatch, loads/stores, the elementwise formulas) is kernels/common.h.
//
// Conventions:
//  - `dt` is the element type of the floating tensors named x/y/dx/dy...; computations run
//    in float32 for float32/bfloat16 and in float64 for float64.
//  - Row-major, contiguous. "rows x cols" means a [rows, cols] matrix.
//  - Gradients are written with `=` unless the name says accumulate.
//  - Temporary device memory comes from the caching allocator (core/allocator.h).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/common.h"  // BinaryOp, ScalarOp, UnaryOp and their formulas
#include "kernels/fp8_math.h"  // Fp8Format, kFp8MetaFloats

namespace xt {
namespace kernels {

// Broadcast description for binary ops: out has `ndim` dims of `shape`; a/b strides are in
// elements, 0 along broadcast dimensions. ndim <= kMaxDims.
constexpr int kMaxDims = 8;
struct Broadcast {
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t astride[kMaxDims] = {};
  int64_t bstride[kMaxDims] = {};
};

enum class RandomKind : int { Uniform, Normal };

// linear_rows takes at most this many rows (the decode step's batch at which it replaces GEMMs).
constexpr int64_t kLinearRowsMaxRows = 8;
// decode_prep_attention's L2 hint: at most this many byte ranges.
constexpr int kMaxL2Prefetch = 8;

// rms_norm_linear_rows' CUDA kernel keeps M rows of K elements, normed, in one block's shared
// memory (Note [The decode step's norm fused into its matrix-vector product],
// kernels/cuda/linear_rows.cuh): the bytes it needs for elements of elem bytes computed in
// compute bytes. Above kNormRowsSmemMax the op composes add_rms_norm, linear_rows and swiglu
// instead (the same bits).
constexpr size_t kNormRowsSmemMax = 48 * 1024;  // the default dynamic shared memory limit
constexpr size_t norm_rows_smem_bytes(size_t elem, size_t compute, int64_t M, int64_t K) {
  // y [M, K] (elem), padded to 16 bytes; then the rows and the norm weight (compute) and M rstds
  return (static_cast<size_t>(M * K) * elem + 15) / 16 * 16 + static_cast<size_t>(M * K + K + M) * compute;
}

struct AdamWParams {
  float lr, beta1, beta2, eps, weight_decay;
  float bias_correction1;  // 1 - beta1^step
  float bias_correction2;  // 1 - beta2^step
  // nullptr, or 3 floats in the device's memory holding adamw_step_consts of this step's lr and
  // step, read by the kernel instead of the values above (a CUDA graph replays its kernel
  // arguments unchanged: the training loop writes them there before each replay).
  const float* hyper = nullptr;
};

// The update's per-step constants, computed on the host in float from hp:
//   p = p * decay - step_size * m / (sqrt(v) / bc2_sqrt + eps)
// Both backends launch with these; ops::adamw_consts returns them for a device copy (`hyper`).
struct AdamWStepConsts {
  float decay, step_size, bc2_sqrt;
};
inline AdamWStepConsts adamw_step_consts(const AdamWParams& hp) {
  AdamWStepConsts c;
  c.decay = 1.0f - hp.lr * hp.weight_decay;
  c.step_size = hp.lr / hp.bias_correction1;
  c.bc2_sqrt = std::sqrt(hp.bias_correction2);
  return c;
}
// The decay constant of a tensor without weight decay: adamw_step_consts's decay at weight_decay 0,
// 1 - lr * 0 = 1 for every finite lr, so it holds for every step (also when hp.hyper holds them).
inline float adamw_no_decay(const AdamWParams& hp) { return 1.0f - hp.lr * 0.0f; }

// Muon's per-step values (kernels/{cpu,cuda}/muon, the shared element formulas in
// kernels/muon_math.h). The host rounds each from its double, as torch.optim.Muon's scalars are.
struct MuonParams {
  float momentum;            // mu: the Nesterov mix's lerp weight
  float one_minus_momentum;  // 1 - mu: the momentum buffer's lerp weight
  bool nesterov;
  float lr;     // this step's learning rate (each matrix scales it by its adjust_lr ratio)
  float decay;  // 1 - lr * weight_decay
  // nullptr, or 2 floats in the device's memory holding [decay, lr] of this step, read by
  // muon_apply instead of the two above (CUDA graphs replay kernel arguments unchanged).
  const float* hyper = nullptr;
};

#define XT_KERNEL_DECLS                                                                                 \
  /* ---- elementwise (kernels/{cpu,cuda}/elementwise) */                                                       \
  void fill(DType dt, void* out, int64_t n, double value, void* stream);                                \
  void cast(DType src_dt, const void* src, DType dst_dt, void* dst, int64_t n, void* stream);           \
  /* cast over a list: dst[t][i] = src[t][i] converted exactly as cast converts it, i < sizes[t], */    \
  /* t < n_tensors, every tensor src_dt -> dst_dt. Floating pairs are fused (CUDA: one launch per */    \
  /* 512 tensors); pairs involving an integer dtype run tensor by tensor through cast. */               \
  void cast_many(int n_tensors, DType src_dt, const void* const* src, DType dst_dt, void* const* dst,   \
                 const int64_t* sizes, void* stream);                                                   \
  void binary(BinaryOp op, DType dt, const void* a, const void* b, void* out, int64_t n,                \
              const Broadcast* bc /* nullptr: same shape */, void* stream);                             \
  /* a += alpha * b, same shape (gradient accumulation) */                                              \
  void accumulate(DType dt, void* a, const void* b, int64_t n, double alpha, void* stream);             \
  void scalar_op(ScalarOp op, DType dt, const void* x, void* out, int64_t n, double s, void* stream);   \
  void unary(UnaryOp op, DType dt, const void* x, void* out, int64_t n, void* stream);                  \
  /* dx = dy * op'(x) for an op with unary_has_grad_kernel(op) (kernels/common.h) */                  \
  void unary_backward(UnaryOp op, DType dt, const void* x, const void* dy, void* dx, int64_t n,         \
                      void* stream);                                                                    \
  /* out = silu(gate) * up. An amax pointer (nullable; float32, dt float32 or bf16) is raised to  */  \
  /* max(*amax, max |output| as stored), NaN ignored: an FP8 operand's amax (fp8_amax) taken by   */   \
  /* the kernel that writes it; the caller zeroes it first.                                      */    \
  void swiglu_forward(DType dt, const void* gate, const void* up, void* out, int64_t n,                 \
                      float* out_amax, void* stream);                                                   \
  void swiglu_backward(DType dt, const void* gate, const void* up, const void* dout, void* dgate,       \
                       void* dup, int64_t n, float* dgate_amax, float* dup_amax, void* stream);         \
  /* keep with prob 1-p, scale kept by 1/(1-p); mask from philox(seed, offset + i), where base      */ \
  /* (device words [seed, offset] or nullptr) replaces seed and adds its offset: captured graphs    */ \
  void dropout(DType dt, const void* x, void* out, int64_t n, float p, uint64_t seed, uint64_t offset,  \
               const uint64_t* base, void* stream);                                                     \
  void random_fill(RandomKind kind, DType dt, void* out, int64_t n, uint64_t seed, uint64_t offset,     \
                   void* stream);                                                                       \
  /* out[i] = i*step + start */                                                                         \
  void arange(DType dt, void* out, int64_t n, double start, double step, void* stream);                 \
  /* ---- reductions (kernels/{cpu,cuda}/reduce): deterministic, fixed order */                                 \
  /* out (1 element, dtype dt) = sum of n elements; accumulates in fp32/fp64 */                         \
  void sum_all(DType dt, const void* x, void* out, int64_t n, void* stream);                            \
  /* out[r] = sum_c x[r, c] */                                                                          \
  void sum_lastdim(DType dt, const void* x, void* out, int64_t rows, int64_t cols, void* stream);       \
  /* reduce a broadcast: out (small) = sum of in (big) over the dims where bc->bstride is 0.        */ \
  /* bc->shape is in's shape, bc->astride in's strides, bc->bstride out's strides (0 = reduced) */     \
  void sum_to(DType dt, const void* in, void* out, int64_t out_n, const Broadcast* bc, void* stream);   \
  /* ---- layout (kernels/{cpu,cuda}/layout) */                                                                 \
  /* out = x permuted: out dim i is x dim perm[i]; shape is x's shape */                               \
  void permute(DType dt, const void* x, void* out, int ndim, const int64_t* shape, const int* perm,     \
               void* stream);                                                                           \
  /* ---- matmul (kernels/{cpu,cuda}/gemm): row-major C[b] = alpha*op(A[b])@op(B[b]) + beta*C[b] */            \
  /* op(A) is MxK, op(B) is KxN; ta/tb: A is stored KxM / B is stored NxK. float32 compute. */         \
  void gemm(DType ab_dt, DType c_dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,    \
            const void* A, const void* B, float beta, void* C, int64_t batch, int64_t strideA,          \
            int64_t strideB, int64_t strideC, void* stream);                                            \
  /* gemm with explicit leading dimensions: lda/ldb/ldc are the row strides (elements) of A, B, C  */ \
  /* as stored, at least their stored widths (A: ta ? M : K, B: tb ? K : N, C: N). Only the first */  \
  /* N columns of each row of C are written (or read, beta != 0). gemm is gemm_ld with packed ld. */   \
  void gemm_ld(DType ab_dt, DType c_dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, \
               const void* A, int64_t lda, const void* B, int64_t ldb, float beta, void* C, int64_t ldc, \
               int64_t batch, int64_t strideA, int64_t strideB, int64_t strideC, void* stream);         \
  /* ---- linear_rows (kernels/{cpu,cuda}/linear_rows): a few rows times several weights, the */      \
  /* decode step's matrix-vector products. x [M, K] (dt), weights w[i] [N[i], K] (dt), i < n_w; */    \
  /* out holds the blocks out_i = x @ w[i]^T [M, N[i]] one after another (block i starts at */        \
  /* element M * (N[0] + ... + N[i-1])). Compute type float32 (float64 for float64), each */          \
  /* output rounded once; a fixed summation order (CUDA's: kernels/cuda/linear_rows.cuh). */          \
  /* 1 <= M <= kLinearRowsMaxRows; w and N are host arrays (of device pointers on CUDA). */           \
  void linear_rows(DType dt, const void* x, int64_t M, int64_t K, int n_w, const void* const* w,      \
                   const int64_t* N, void* out, void* stream);                                        \
  /* rms_norm_linear_rows: h = x + res (rounded to dt, written to h; res null: h = x, not written), */ \
  /* y = rmsnorm(h) with w_dt weight norm_w [K] (rounded to dt), then linear_rows(y, w...) into out; */  \
  /* glu (n_w == 2, N[0] == N[1]): out = swiglu(y @ w[0]^T, y @ w[1]^T) [M, N[0]], each product */     \
  /* rounded to dt first. Bitwise add_rmsnorm_forward (or rmsnorm_forward), linear_rows and */        \
  /* swiglu_forward. CUDA: only where norm_rows_smem_bytes fits kNormRowsSmemMax (the op checks). */   \
  void rms_norm_linear_rows(DType dt, DType w_dt, const void* x, const void* res, const void* norm_w,    \
                            void* h, float eps, int64_t M, int64_t K, int n_w, const void* const* w,    \
                            const int64_t* N, bool glu, void* out, void* stream);                       \
  /* ---- embedding (kernels/{cpu,cuda}/embedding); ids are int32 or int64 (id_dt). An id outside */    \
  /* [0, vocab) reads nothing: a zero output row, its dout row skipped; CUDA also reports it (Note */   \
  /* [Device-side index checks], core/cuda/cuda_check.h); the CPU's ops check ids before the call. */   \
  void embedding_forward(DType dt, const void* table, DType id_dt, const void* ids, void* out,          \
                         int64_t n_ids, int64_t vocab, int64_t dim, void* stream);                      \
  /* dtable = scatter-add of dout rows, written with = (zeros where no id); deterministic order. */  \
  /* accumulate (float32/float64 only): dtable += each row's sum, made from zero as without it. */    \
  void embedding_backward(DType dt, DType id_dt, const void* ids, const void* dout, void* dtable,       \
                          int64_t n_ids, int64_t vocab, int64_t dim, bool accumulate, void* stream);    \
  /* ---- rms_norm (kernels/{cpu,cuda}/rmsnorm): y = x * rstd * w, rstd = 1/sqrt(mean(x^2)+eps) (float32) */   \
  void rmsnorm_forward(DType dt, DType w_dt, const void* x, const void* w, void* y, float* rstd,        \
                       int64_t rows, int64_t dim, float eps, void* stream);                             \
  /* dx written (dt); dw written (w_dt) = sum over rows, deterministic */                               \
  void rmsnorm_backward(DType dt, DType w_dt, const void* x, const void* w, const float* rstd,          \
                        const void* dy, void* dx, void* dw, int64_t rows, int64_t dim, void* stream);   \
  /* rmsnorm_backward of h, then dx = round(dx) + dres rounded again (add_rms_norm's backward: the   */ \
  /* gradient add of the unfused graph); dw bitwise rmsnorm_backward's                              */ \
  void add_rmsnorm_backward(DType dt, DType w_dt, const void* h, const void* w, const float* rstd,      \
                            const void* dy, const void* dres, void* dx, void* dw, int64_t rows,         \
                            int64_t dim, void* stream);                                                 \
  /* h = x + res (rounded to dt), y = rmsnorm(h): bitwise add then rmsnorm_forward */                   \
  void add_rmsnorm_forward(DType dt, DType w_dt, const void* x, const void* res, const void* w, void* h, \
                           void* y, float* rstd, int64_t rows, int64_t dim, float eps, void* stream);   \
  /* ---- layer_norm (kernels/{cpu,cuda}/layernorm): y = (x - mean) * rstd * w + b, rstd = */         \
  /* 1/sqrt(var + eps); w, b [dim] in w_dt (dt or float32); mean, rstd [rows] in the compute type */   \
  /* (float32; float64 for float64). res (nullable): h = x + res rounded to dt is written to h and */  \
  /* normed (add_layer_norm: bitwise add then layer_norm) */                                            \
  void layernorm_forward(DType dt, DType w_dt, const void* x, const void* res, const void* w,          \
                         const void* b, void* h, void* y, void* mean, void* rstd, int64_t rows,         \
                         int64_t dim, float eps, void* stream);                                         \
  /* dx written (dt); dw, db written (w_dt) = sums over rows, deterministic. dres (nullable): */        \
  /* dx = round(dx) + dres rounded again (add_layer_norm's backward) */                                 \
  void layernorm_backward(DType dt, DType w_dt, const void* x, const void* w, const void* mean,         \
                          const void* rstd, const void* dy, const void* dres, void* dx, void* dw,       \
                          void* db, int64_t rows, int64_t dim, void* stream);                           \
  /* ---- rope (kernels/{cpu,cuda}/rope): rotate-half on x [B, S, H, D] at positions pos (common.h's */ \
  /* RopePositions: [S], [B, S] or 0..S-1); inverse rotates by -angle (the backward). inv_freq[i] = */   \
  /* rope_inv_freq(freqs, i, D) and the angles computed in float32. */                                  \
  void rope(DType dt, const void* x, void* out, RopePositions pos, int64_t B, int64_t S, int64_t H,     \
            int64_t D, const RopeFreqs& freqs, bool inverse, void* stream);                             \
  /* document_positions: pos [B, S] int64 = s - doc_start[b, s] (doc_start int32 [B, S]) */            \
  void document_positions(const int32_t* doc_start, int64_t* pos, int64_t B, int64_t S, void* stream);  \
  /* ---- softmax (kernels/{cpu,cuda}/softmax) over the last dim; log selects log_softmax */                    \
  void softmax_forward(DType dt, const void* x, void* y, int64_t rows, int64_t cols, bool log,          \
                       void* stream);                                                                   \
  void softmax_backward(DType dt, const void* y, const void* dy, void* dx, int64_t rows, int64_t cols,  \
                        bool log, void* stream);                                                        \
  /* ---- flash attention (kernels/{cpu,cuda}/flash_attention): out = softmax(scale q k^T [+ causal */  \
  /* mask]) v per (b, query head h), on q, out [B, S, H, D] and k, v [B, S, Hkv, D] (H % Hkv == 0; */   \
  /* query head h reads kv head h / (H / Hkv)). lse [B, H, S] = the rows' log-sum-exp of the scaled */ \
  /* scores (natural log) in the compute type (float32; float64 for float64). Backward recomputes */   \
  /* P from lse and writes dq, dk, dv with `=`, deterministic (a kv head sums its query heads in */     \
  /* head order). 1 <= D <= 256. */                                                                     \
  /* doc_start (nullptr: none; needs causal): int32 [B, S], the position where the document of */      \
  /* token (b, s) begins (0 <= doc_start <= s, equal to the one before it or to s): query s sees */      \
  /* keys doc_start[b, s] .. s only (attention within documents; key tiles before a block's first */    \
  /* document are skipped). document_starts writes it from token ids and a separator id. */             \
  void flash_attention_forward(DType dt, const void* q, const void* k, const void* v, void* out,        \
                               void* lse, int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t D,      \
                               double scale, bool causal, const int32_t* doc_start, void* stream);      \
  void flash_attention_backward(DType dt, const void* q, const void* k, const void* v, const void* out, \
                                const void* dout, const void* lse, void* dq, void* dk, void* dv,        \
                                int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t D, double scale,  \
                                bool causal, const int32_t* doc_start, void* stream);                   \
  /* doc_start [B, S] of int ids [B, S] (id_dt int32 or int64): a document begins at position 0 and */ \
  /* after every token equal to sep (the separator ends its document). */                               \
  void document_starts(DType id_dt, const void* ids, int32_t* doc_start, int64_t B, int64_t S,          \
                       int64_t sep, void* stream);                                                      \
  /* ---- fused q/k head preparation (kernels/{cpu,cuda}/qk_norm_rope): rms_norm over D (weights */    \
  /* wq, wk [D] of w_dt = dt or float32, eps) then rope (positions pos, freqs) on q [B, S, H, D] and */ \
  /* k [B, S, Hkv, D], with the arithmetic and rounding points of rmsnorm_forward + rope (bitwise */    \
  /* equal on the same backend). rstd_q [B*S*H], rstd_k [B*S*Hkv] float32. H or Hkv may be 0 (that */   \
  /* side skipped, its pointers unused). Backward: dq, dk written (dt); dwq, dwk written (w_dt), the */ \
  /* sums over rows in rmsnorm_backward's order. */                                                     \
  void qk_norm_rope_forward(DType dt, DType w_dt, const void* q, const void* k, const void* wq,          \
                            const void* wk, void* q_out, void* k_out, float* rstd_q, float* rstd_k,     \
                            int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t D, float eps,         \
                            const RopeFreqs& freqs, RopePositions pos, void* stream);                   \
  void qk_norm_rope_backward(DType dt, DType w_dt, const void* q, const void* k, const void* wq,        \
                             const void* wk, const float* rstd_q, const float* rstd_k,                  \
                             const void* dq_out, const void* dk_out, void* dq, void* dk, void* dwq,     \
                             void* dwk, int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t D,        \
                             const RopeFreqs& freqs, RopePositions pos, void* stream);                  \
  /* ---- decode attention (kernels/{cpu,cuda}/decode_attention): one new query per row against a */   \
  /* KV cache [B, L, Hkv, D] (L slots per row). kv_cache_write: cache[b, pos[b] + s] = x[b, s] for */   \
  /* x [B, S, Hkv, D], pos int64 [B]; a row with pos[b] outside [0, L - S] writes nothing. */           \
  /* decode_attention: out[b, h] = sum_j p_j v[b, j, h / (H / Hkv)] over j < len[b], p = softmax_j */   \
  /* of scale q[b, h] . k[b, j, h / (H / Hkv)], on q, out [B, H, D], len int64 [B]; a row with */       \
  /* len[b] = 0 gets zeros, one with len[b] outside [0, L] gets zeros. Compute type float32 */          \
  /* (float64 for float64), rounded once; fixed summation order (deterministic). CUDA reports a */     \
  /* bad pos/len as for embedding; the CPU's ops check them before the call. 1 <= D <= 256. */         \
  void kv_cache_write(DType dt, void* cache, const void* x, const int64_t* pos, int64_t B, int64_t L,   \
                      int64_t S, int64_t row, void* stream);                                            \
  void decode_attention(DType dt, const void* q, const void* k_cache, const void* v_cache,              \
                        const int64_t* len, void* out, int64_t B, int64_t L, int64_t H, int64_t Hkv,    \
                        int64_t D, double scale, void* stream);                                         \
  /* decode_prep: a decode step's head preparation for row b at slot p = pos[b]: with wq, wk (both */  \
  /* or neither) q_out[b, h] = rope(rms_norm(q[b, h], wq, eps)) and k_cache[b, p, h] = */             \
  /* rope(rms_norm(k[b, h], wk, eps)), without them rope alone, at position p; v_cache[b, p] = */      \
  /* v[b]. q, q_out [B, H, D], k, v [B, Hkv, D], caches [B, L, Hkv, D]; bitwise rms_norm (rounded */  \
  /* to dt) then rope. A row with p outside [0, L) writes no cache slot (CUDA reports it). */          \
  void decode_prep(DType dt, DType w_dt, const void* q, const void* k, const void* v, const void* wq,  \
                   const void* wk, void* q_out, void* k_cache, void* v_cache, const int64_t* pos,       \
                   int64_t B, int64_t L, int64_t H, int64_t Hkv, int64_t D, float eps,                  \
                   const RopeFreqs& freqs, void* stream);                                               \
  /* decode_prep_attention: decode_prep (q_out kept internal) then decode_attention(q_out, the */    \
  /* caches, len, scale) -> out [B, H, D], bitwise that composition; CUDA runs both in one kernel */  \
  /* where decode_attention's one-pass kernel applies (Note [Decode attention in one pass]). The */   \
  /* n_pf byte ranges (pf[i], pf_bytes[i]) are a hint: CUDA's fused kernel asks L2 for them on */     \
  /* SMs the attention leaves idle (Note [The next matrices into L2 during the decode attention]). */ \
  void decode_prep_attention(DType dt, DType w_dt, const void* q, const void* k, const void* v,         \
                             const void* wq, const void* wk, void* k_cache, void* v_cache,              \
                             const int64_t* pos, const int64_t* len, void* out, int64_t B, int64_t L,   \
                             int64_t H, int64_t Hkv, int64_t D, float eps, const RopeFreqs& freqs,      \
                             double scale,                                                              \
                             int n_pf, const void* const* pf, const int64_t* pf_bytes, void* stream);   \
  /* ---- greedy pick (kernels/{cpu,cuda}/greedy_next): per row b of logits [B, V] (dt), */             \
  /* tok = argmax (the first of equal maxima; NaN above every number, the first NaN). state int64 */    \
  /* [6, B] rows: 0 token, 1 position, 2 length, 3 limit, 4 done, 5 count. A row not done whose */      \
  /* position + 1 < limit takes tok: token = tok, position += 1, length = position + 1, done when */    \
  /* tok == stop (stop < 0: never); otherwise it is done and keeps its state. */                        \
  /* ring[(count % R) * B + b] = tok taken or -1; count += 1. */                                        \
  void greedy_next(DType dt, const void* logits, int64_t B, int64_t V, int64_t* state, int64_t* ring,  \
                   int64_t R, int64_t stop, void* stream);                                              \
  /* ---- cross entropy (kernels/{cpu,cuda}/cross_entropy): logits [rows, vocab] with row stride ld */     \
  /* (elements, ld >= vocab; columns vocab..ld-1 are never read), targets int32/int64 */              \
  /* losses[r] = lse_r - logit[r, t_r] (0 when t_r == ignore; NaN, and reported on CUDA as for */       \
  /* embedding, when t_r is outside [0, vocab)), lse float32 [rows] */                                  \
  void cross_entropy_forward(DType dt, const void* logits, DType t_dt, const void* targets,             \
                             float* losses, float* lse, int64_t rows, int64_t vocab, int64_t ld,        \
                             int64_t ignore_index, void* stream);                                       \
  /* loss (float32, 1 element) = sum(losses) / max(count of non-ignored, 1); count written too */      \
  void cross_entropy_reduce(const float* losses, DType t_dt, const void* targets, float* loss,          \
                            float* count, int64_t rows, int64_t ignore_index, void* stream);            \
  /* dlogits (row stride ld too) = (softmax - onehot) * dloss[0] / count[0]; rows with ignored */      \
  /* targets get 0. dlogits may be logits itself (in place: each element is read, then written, */    \
  /* by the same thread). Columns [vocab, ld) of dlogits are set to 0. */                               \
  void cross_entropy_backward(DType dt, const void* logits, const float* lse, DType t_dt,               \
                              const void* targets, const float* dloss, const float* count,              \
                              void* dlogits, int64_t rows, int64_t vocab, int64_t ld,                   \
                              int64_t ignore_index, void* stream);                                      \
  /* grad[i] = acc[i] * dloss[0] / max(count[0], 1), rounded once to dt; acc is float32 (float64 */    \
  /* for float64): the row-chunked head's unscaled gradients. grad may be acc (dt float32/float64). */ \
  void cross_entropy_scale_grad(DType dt, const void* acc, const float* dloss, const float* count,       \
                                void* grad, int64_t n, void* stream);                                   \
  /* ---- optimizer (kernels/{cpu,cuda}/optim): float32, fused over many tensors */                            \
  /* guard (nullable, one float on the device): when it is not finite, nothing is written (a */        \
  /* training step with a NaN/Inf loss or gradient norm is skipped without a host sync). */           \
  /* clip_norm (nullable, on the device): every gradient is read as g * min(1, max_norm /     */      \
  /* (clip_norm[0] + 1e-6)), clip_by_norm's factor, so clipping needs no pass of its own. decays */  \
  /* (nullable: all true): tensor t takes hp.weight_decay when decays[t], else none (the decay */      \
  /* constant of weight_decay 0), so both groups of a model update in one launch */                    \
  void adamw_step(int n_tensors, float* const* params, const float* const* grads, float* const* m,      \
                  float* const* v, const int64_t* sizes, const bool* decays, AdamWParams hp,            \
                  const float* guard, const float* clip_norm, float max_norm, void* stream);            \
  /* out (float32, 1 element) = sqrt(sum of squares over all tensors), fixed order */                  \
  void global_norm(int n_tensors, const float* const* tensors, const int64_t* sizes, float* out,        \
                   void* stream);                                                                       \
  /* clip: coef = min(1, max_norm / (norm[0] + 1e-6)); every tensor *= coef; no host sync */          \
  void clip_by_norm(int n_tensors, float* const* tensors, const int64_t* sizes, const float* norm,      \
                    float max_norm, void* stream);                                        \
  /* ---- Muon (kernels/{cpu,cuda}/muon): the elementwise parts of a Muon step over n_tensors  */  \
  /* float32 matrices of rows[t] x cols[t]; x[t] is its bf16 Newton-Schulz operand, stored      */  \
  /* [cols, rows] (transposed) when rows[t] > cols[t]. guard and clip_norm as adamw_step's.     */  \
  /* muon_momentum: g = grad (clipped); buf = lerp(buf, g, 1 - mu); x = bf16(nesterov ?         */  \
  /* lerp(g, buf, mu) : buf). Nothing is written when guard is not finite.                     */  \
  void muon_momentum(int n_tensors, const float* const* grads, float* const* bufs, void* const* x,     \
                     const int64_t* rows, const int64_t* cols, MuonParams hp, const float* guard,        \
                     const float* clip_norm, float max_norm, void* stream);                            \
  /* muon_normalize: x[t] = bf16(x[t] / d), d = bf16(max(bf16(||x[t]||_F), eps)) (the norm     */   \
  /* summed in float64 in a fixed order), in place; bf16 x[t] of sizes[t] elements            */    \
  void muon_normalize(int n_tensors, void* const* x, const int64_t* sizes, float eps, void* stream);   \
  /* muon_apply: p = p * decay - (lr * scales[t]) * x (x read in p's layout); nothing written  */   \
  /* when guard is not finite                                                                */     \
  void muon_apply(int n_tensors, float* const* params, const void* const* x, const int64_t* rows,      \
                  const int64_t* cols, const float* scales, MuonParams hp, const float* guard,          \
                  void* stream);

namespace cpu {
XT_KERNEL_DECLS
// The CPU backend's threads: OpenBLAS's pool, the only one (every other CPU kernel is a plain
// loop on the calling thread). A GEMM's bits may depend on the count (OpenBLAS picks its split by
// it), so results repeat bit for bit at a fixed count.
int num_threads();
void set_num_threads(int n);
}  // namespace cpu

namespace cuda {
XT_KERNEL_DECLS
}  // namespace cuda

// The FP8 kernels (kernels/cpu/fp8.cpp, kernels/cuda/fp8_cast.cu, kernels/cuda/fp8_gemm.cu).
// dt: float32 or bfloat16. Codes are bytes, row-major.
//  fp8_amax:  meta[kFp8MetaAmax] = max |x| over n elements (NaN ignored; 0 for n = 0).
//  fp8_cast:  k from meta[kFp8MetaAmax] (fp8_scale_exponent); out[r, c] = encode(x[r, c] * 2^k) for
//             the rows x cols matrix x; out_t (nullptr: not written) [c, r] the same codes
//             transposed; meta[kFp8MetaScale] = 2^-k. CUDA: rows and cols multiples of 16, x
//             16-byte aligned.
//  fp8_gemm:  C [M, N] = (decode(A) * a_meta[kFp8MetaScale]) @ (decode(B) * b_meta[kFp8MetaScale])^T,
//             A [M, K] codes of format fa, B [N, K] of fb (both K-major), float32 accumulation,
//             C rounded once to c_dt; accumulate: C = round(product + C), C read in c_dt and the
//             sum rounded once (else C is written, never read). fast_accum: CUDA's FP8 fast
//             accumulation (no effect on the CPU). CUDA: not both E5M2; M, N, K multiples of 16;
//             the metas 16-byte aligned.
#define XT_FP8_KERNEL_DECLS                                                                               \
  void fp8_amax(DType dt, const void* x, int64_t n, float* meta, void* stream);                           \
  void fp8_cast(DType dt, Fp8Format f, const void* x, int64_t rows, int64_t cols, float* meta,            \
                uint8_t* out, uint8_t* out_t, void* stream);                                               \
  void fp8_gemm(Fp8Format fa, Fp8Format fb, int64_t M, int64_t N, int64_t K, const uint8_t* A,            \
                const float* a_meta, const uint8_t* B, const float* b_meta, DType c_dt, void* C,          \
                bool accumulate, bool fast_accum, void* stream);

namespace cpu {
XT_FP8_KERNEL_DECLS
}  // namespace cpu
namespace cuda {
XT_FP8_KERNEL_DECLS
}  // namespace cuda

// A GEMM with a fused epilogue (kernels/cuda/gemm_lt.cu, cuBLASLt): CUDA only. Row-major
// C [M, N] = op(A) @ op(B) (ta/tb as gemm's, packed), then
//   Bias:        C = AB + bias[N]
//   GeluAuxBias: aux = AB + bias[N], C = gelu_tanh(aux)   (aux [M, N])
//   DGelu:       C = AB * gelu_tanh'(aux)                 (aux read)
// in float32 on the accumulator, rounded once to dt (bfloat16 or float32; bias, aux in dt; the
// GELU epilogues bfloat16 only: Note [cuBLASLt epilogues: exact and deterministic]).
// batch > 1 (Bias only): strided-batched as gemm's, A[b] at A + b * strideA (0: one A for all),
// likewise B, C, and bias[b] at bias + b * stride_bias (elements).
// Returns false, launching nothing, when it does not run the call (float64, GELU in float32, an
// N that is not a multiple of 8 with aux, no cuBLASLt algorithm); the ops then compose. The CPU
// has no twin: its ops compose gemm, the bias add and gelu, so the CPU results stay bitwise the
// unfused ops'.
enum class GemmEpilogue : int { Bias, GeluAuxBias, DGelu };
#ifdef XT_CUDA
namespace cuda {
bool gemm_epilogue(DType dt, GemmEpilogue ep, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A,
                   const void* B, void* C, const void* bias, void* aux, void* stream, int64_t batch = 1,
                   int64_t strideA = 0, int64_t strideB = 0, int64_t strideC = 0, int64_t stride_bias = 0);
}  // namespace cuda
#endif

}  // namespace kernels
}  // namespace xt
