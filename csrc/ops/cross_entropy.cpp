// cross_entropy: logits [N, V] (float32/bfloat16/float64), targets int32/int64 [N]; the mean
// loss over non-ignored targets, float32 []. Also returns lse float32 [N] and count float32 [1]
// for the backward, which recomputes the softmax from logits and lse.
//
// Targets outside [0, V) that are not ignore_index raise IndexError. On the CPU the targets are
// scanned before the kernels run. On CUDA the forward kernel checks each row's target as it reads
// it (Note [Device-side index checks], core/cuda/cuda_check.h): a bad target reads nothing (a NaN
// loss, a zero gradient row) and the IndexError is raised at the next sync point (the loss's
// item(), numpy(), synchronize()), so no host sync is added. linear_cross_entropy reports its
// targets the same way, as cross_entropy.
//
// linear_cross_entropy fuses the language-model head: logits = x @ w^T go into a buffer
// [N, ld] with ld = logits_ld(V) (the row stride padded so every row starts 16-byte aligned and
// cuBLAS can use its aligned/TMA kernels; on CUDA the GEMMs also cover the padding, see below),
// then the same cross-entropy kernels run on the first V columns of rows of stride ld. Its
// backward writes dlogits in place over that buffer (padding columns 0) and runs dx = dlogits @ w
// and dw = dlogits^T @ x as one GEMM each with explicit leading dimensions.
//
// The nodes save the logits (or the buffer), the targets, lse and count; linear_cross_entropy's
// also keeps x when w needs grad and w when x does. Its backward overwrites the buffer with
// dlogits (the node runs once: the engine refuses a second backward through a released graph).
//
// When the logits of all N rows would take more than a chunk (Note [Row-chunked head]),
// linear_cross_entropy runs in row chunks instead and never holds [N, V]: its forward computes
// the gradients too, unscaled, and its backward only scales them by dloss / count.
#include <algorithm>

#include "core/cuda_api.h"
#include "core/error.h"
#include "ops/dispatch.h"
#include "tape/node.h"

namespace xt {
namespace ops {

namespace {

// CPU targets: IndexError for the first one outside [0, vocab) that is not ignore_index. (CUDA
// targets: the forward kernel checks them.)
void check_cpu_targets(const Tensor& targets, int64_t vocab, int64_t ignore_index) {
  if (!targets.device().is_cpu()) return;
  const bool i32 = targets.dtype() == DType::Int32;
  for (int64_t i = 0; i < targets.numel(); ++i) {
    const int64_t t = i32 ? static_cast<int64_t>(targets.data<int32_t>()[i]) : targets.data<int64_t>()[i];
    XT_CHECK(t == ignore_index || (t >= 0 && t < vocab), IndexError, "cross_entropy: target ", t, " at position ", i,
             " is out of range for ", vocab, " classes (expected 0 <= target < ", vocab, ", or ignore_index ",
             ignore_index, ")");
  }
}

void check_logits_targets(const Tensor& logits, const Tensor& targets, const char* op) {
  check_floating(logits, op, "logits");
  check_defined(targets, "targets");
  XT_CHECK(is_integral(targets.dtype()), TypeError, op, ": targets must be int32 or int64, got ", targets.describe());
  check_same_device(logits, targets, op, "logits", "targets");
  XT_CHECK(logits.dim() == 2, ValueError, op, ": logits must be [N, V] (2 dimensions), got ", logits.describe());
  XT_CHECK(targets.dim() == 1 && targets.numel() == logits.size(0), ValueError, op, ": targets must be [",
           logits.size(0), "] (one per row of logits), got targets ", targets.describe(), " for logits ",
           logits.describe());
  XT_CHECK(logits.size(1) >= 1, ValueError, op, ": logits must have at least one class, got ", logits.describe());
}

void check_backward_stats(const Tensor& lse, const Tensor& dloss, const Tensor& count, int64_t N, Device dev,
                          const char* op) {
  check_defined(lse, "lse");
  check_defined(dloss, "dloss");
  check_defined(count, "count");
  XT_CHECK(lse.dtype() == DType::Float32 && lse.numel() == N && lse.device() == dev, ValueError, op,
           ": lse must be float32 with ", N, " elements on ", dev.str(), ", got ", lse.describe());
  XT_CHECK(dloss.dtype() == DType::Float32 && dloss.numel() == 1 && dloss.device() == dev, ValueError, op,
           ": dloss must be a float32 scalar on ", dev.str(), ", got ", dloss.describe());
  XT_CHECK(count.dtype() == DType::Float32 && count.numel() == 1 && count.device() == dev, ValueError, op,
           ": count must be a float32 scalar on ", dev.str(), ", got ", count.describe());
}

// Per-row lse and losses of logits [N, V] with row stride ld, then the mean loss and the count.
std::vector<Tensor> forward_rows(const Tensor& logits, int64_t N, int64_t V, int64_t ld, const Tensor& targets,
                                 int64_t ignore_index) {
  const Device dev = logits.device();
  Tensor lse = Tensor::empty({N}, DType::Float32, dev);
  if (N == 0)  // the mean over no targets is 0 (the contract's max(count, 1))
    return {zeros({}, DType::Float32, dev), lse, zeros({1}, DType::Float32, dev)};
  Tensor loss = Tensor::empty({}, DType::Float32, dev);
  Tensor count = Tensor::empty({1}, DType::Float32, dev);
  Tensor losses = Tensor::empty({N}, DType::Float32, dev);
  void* stream = stream_for(dev);
  XT_KERNEL(dev, cross_entropy_forward, logits.dtype(), logits.data_ptr(), targets.dtype(), targets.data_ptr(),
            losses.data<float>(), lse.data<float>(), N, V, ld, ignore_index, stream);
  XT_KERNEL(dev, cross_entropy_reduce, losses.data<float>(), targets.dtype(), targets.data_ptr(), loss.data<float>(),
            count.data<float>(), N, ignore_index, stream);
  return {loss, lse, count};
}

}  // namespace

std::vector<Tensor> cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  check_logits_targets(logits, targets, "cross_entropy");
  const int64_t N = logits.size(0), V = logits.size(1);
  check_cpu_targets(targets, V, ignore_index);
  return forward_rows(logits, N, V, V, targets, ignore_index);
}

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& lse, const Tensor& targets, const Tensor& dloss,
                              const Tensor& count, int64_t ignore_index) {
  check_logits_targets(logits, targets, "cross_entropy_backward");
  const int64_t N = logits.size(0), V = logits.size(1);
  const Device dev = logits.device();
  check_backward_stats(lse, dloss, count, N, dev, "cross_entropy_backward");
  Tensor dlogits = Tensor::empty(logits.shape(), logits.dtype(), dev);
  if (N)
    XT_KERNEL(dev, cross_entropy_backward, logits.dtype(), logits.data_ptr(), lse.data<float>(), targets.dtype(),
              targets.data_ptr(), dloss.data<float>(), count.data<float>(), dlogits.data_ptr(), N, V, V, ignore_index,
              stream_for(dev));
  return dlogits;
}

// ---- linear_cross_entropy

namespace {

void check_linear_ce_inputs(const Tensor& x, const Tensor& w, const Tensor& targets) {
  constexpr const char* op = "linear_cross_entropy";
  check_floating(x, op, "x");
  check_floating(w, op, "w");
  check_same_device(x, w, op, "x", "w");
  check_same_dtype(x, w, op, "x", "w");
  XT_CHECK(x.dim() == 2, ValueError, op, ": x must be [N, K] (2 dimensions), got ", x.describe());
  XT_CHECK(w.dim() == 2, ValueError, op, ": w must be [V, K] (2 dimensions), got ", w.describe());
  XT_CHECK(x.size(1) == w.size(1), ValueError, op, ": x ", x.describe(), " must end in the weight's in_features ",
           w.size(1), " (w ", w.describe(), " is [V, K])");
  XT_CHECK(w.size(0) >= 1, ValueError, op, ": w must have at least one class (row), got ", w.describe());
  check_defined(targets, "targets");
  XT_CHECK(is_integral(targets.dtype()), TypeError, op, ": targets must be int32 or int64, got ", targets.describe());
  check_same_device(x, targets, op, "x", "targets");
  XT_CHECK(targets.dim() == 1 && targets.numel() == x.size(0), ValueError, op, ": targets must be [", x.size(0),
           "] (one per row of x), got targets ", targets.describe(), " for x ", x.describe());
}

// The weight the head's GEMMs use. On CUDA they run over ld classes, w padded with zero rows:
// cuBLAS keeps its aligned kernels only when the logits' contiguous extent (m of the forward, k of
// dx) is a multiple of 8 as well as their row stride (V = 50257: 6.6 and 8.2 ms with align1
// kernels, ~1 ms each padded). The padding columns of the logits are then exactly 0. On the CPU
// (where alignment does not matter) the GEMMs stay over V classes, the calls of linear +
// cross_entropy, bit for bit; the padding columns stay unwritten until the backward kernel zeroes
// them.
Tensor head_weight(const Tensor& w, int64_t ld) {
  const Device dev = w.device();
  const int64_t V = w.size(0), K = w.size(1);
  if (!dev.is_cuda() || ld == V) return w;
  Tensor wg = Tensor::empty({ld, K}, w.dtype(), dev);
  const size_t row = static_cast<size_t>(K) * w.itemsize();
  if (row) {
    cuda::copy_bytes(wg.data_ptr(), dev, w.data_ptr(), dev, static_cast<size_t>(V) * row);
    cuda::memset_zero(static_cast<char*>(wg.data_ptr()) + static_cast<size_t>(V) * row, dev,
                      static_cast<size_t>(ld - V) * row);
  }
  return wg;
}

// Copies rows x vocab logits of a buffer with row stride ld into out (contiguous rows of vocab):
// buf * 1 through the strided binary kernel (exact in every dtype, -0 and infinities included).
void copy_logits_rows(const void* buf, DType dt, int64_t rows, int64_t vocab, int64_t ld, void* out, Device dev) {
  if (rows * vocab == 0) return;
  Tensor one = full({}, 1.0, dt, dev);
  kernels::Broadcast bc;
  bc.ndim = 2;
  bc.shape[0] = rows;
  bc.shape[1] = vocab;
  bc.astride[0] = ld;
  bc.astride[1] = 1;
  bc.bstride[0] = 0;
  bc.bstride[1] = 0;
  XT_KERNEL(dev, binary, kernels::BinaryOp::Mul, dt, buf, one.data_ptr(), out, rows * vocab, &bc, stream_for(dev));
}

// Note [Row-chunked head]
// linear_cross_entropy over N rows holds their logits [N, ld]: at vocabulary 151936 and 16K
// tokens (batch 4 x seq 4096) that is 5 GB of bf16, more than a 0.6B model's weights, gradients
// and moments together, and it grows with the batch. Above a chunk's worth of rows it runs in
// row chunks of R rows instead, each through one buffer [R, ld]:
//   forward, per chunk: logits = x_c @ w^T (GEMM), lse and the row losses (the one-pass forward
//   kernel on whole rows, as unchunked: a row's lse and loss come from the same kernel on the
//   same logits), then, when a gradient is wanted, dlogits = softmax - onehot over the buffer
//   in place (the backward kernel with dloss = count = 1), dx_c = dlogits @ w into rows of a dx
//   accumulator (GEMM, rows of their own) and dw += dlogits^T @ x_c (GEMM with beta = 1 after
//   the first chunk). The accumulators are float32 (float64 for float64); then the mean loss
//   and the count.
//   backward: dx = dx_acc * dloss / max(count, 1) and dw likewise, rounded once to the input
//   dtype (one elementwise kernel each; in place when the dtype is the accumulator's).
// The gradients are computed in the forward, as Liger-Kernel's fused linear cross-entropy does,
// because the loss is a scalar and its gradient linear in dloss: the backward needs no logits,
// and the head runs its three GEMMs once (recomputing the logits in backward would add a fourth).
// Rows, not vocabulary columns: a whole row in one chunk keeps lse a single pass with no merge
// across chunks, and its gradient row needs no later chunk. What accumulates across chunks is dw
// only, in float32, in chunk order: deterministic, equal to the unchunked head to float rounding
// (the sum over tokens is split at chunk edges). Memory: the chunk [R, ld], the dw accumulator
// [V, K] (float32), dx [N, K] (float32); independent of the batch but for dx.
// R: above kChunkBytes of logits, the fewest chunks of at most kChunkRowsMax rows each, their rows
// balanced and rounded up to a multiple of kChunkRowMultiple (and each chunk's logits within
// kChunkBytes, for the widest rows). At vocabulary 151936 or 128256 in bf16, batch 4 x 4096 runs
// in 8 chunks of 2,048 rows, holding 0.58 / 0.49 GiB of logits. Each chunk after the first
// re-reads and re-writes the float32 dw (2 x 1.24 GB at qwen3-1.7b's K = 2048), which is what
// keeps R from being small: measured on the H200 (dev/head_chunks.py, the head's forward and
// backward at 16,384 rows) 2,048-row chunks ran qwen3-1.7b's head in 49.65 ms against 50.67 in 5
// chunks of 3,328 rows (0.36 GiB less at its peak) and llama3.2-1b's in 42.06 against 41.54 in 4
// of 4,096 (0.49 GiB less); 1,024-row chunks cost 3-4 ms more. The rule depends only on (N, ld,
// dtype), so a given call always chunks the same way; a call whose logits fit kChunkBytes runs
// unchunked (bit for bit the single-buffer path above), as do the small presets (dim768 at batch
// 32: 824 MB).
}  // namespace

constexpr int64_t kChunkBytes = int64_t{1} << 30;  // more logits than this (1 GiB): row chunks
constexpr int64_t kChunkRowsMax = 2048;            // rows a chunk at most
constexpr int64_t kChunkRowMultiple = 128;         // whole GEMM tiles in every chunk but the last

int64_t head_chunk_rows(int64_t N, int64_t ld, size_t itemsize, int64_t requested) {
  XT_CHECK(N >= 0 && ld > 0 && ld <= (int64_t{1} << 40), ValueError,
           "head_chunk_rows: rows must be >= 0 and the row stride in 1..2^40, got ", N, " and ", ld);
  if (requested > 0) return requested;
  int64_t fit = kChunkBytes / (ld * static_cast<int64_t>(itemsize));  // rows whose logits fit kChunkBytes
  if (N > fit) fit = std::min(fit, kChunkRowsMax);                    // chunked: at most kChunkRowsMax
  fit = std::max(fit / kChunkRowMultiple * kChunkRowMultiple, kChunkRowMultiple);
  const int64_t chunks = (N + fit - 1) / fit;  // >= 1 chunk, N >= 0
  const int64_t rows = chunks > 0 ? (N + chunks - 1) / chunks : 0;
  return (rows + kChunkRowMultiple - 1) / kChunkRowMultiple * kChunkRowMultiple;  // <= fit
}

namespace {

struct ChunkedHead {
  Tensor loss, count, dx_acc, dw_acc, logits;  // dx_acc / dw_acc undefined when not wanted
};

ChunkedHead linear_cross_entropy_chunked(const Tensor& x, const Tensor& w, const Tensor& targets,
                                         int64_t ignore_index, bool return_logits, int64_t R, bool want_dx,
                                         bool want_dw) {
  const int64_t N = x.size(0), K = x.size(1), V = w.size(0), ld = logits_ld(V);
  const Device dev = x.device();
  const DType dt = x.dtype(), acc_dt = dt == DType::BFloat16 ? DType::Float32 : dt;
  const Tensor wg = head_weight(w, ld);
  const int64_t M = wg.size(0);  // classes the GEMMs cover: ld on CUDA, V on the CPU
  void* stream = stream_for(dev);
  ChunkedHead h;
  Tensor buf = Tensor::empty({R < N ? R : N, ld}, dt, dev);
  Tensor lse = Tensor::empty({N}, DType::Float32, dev);
  Tensor losses = Tensor::empty({N}, DType::Float32, dev);
  Tensor one = full({1}, 1.0, DType::Float32, dev);  // dloss and count of the unscaled dlogits
  if (return_logits) h.logits = Tensor::empty({N, V}, dt, dev);
  if (want_dx) h.dx_acc = Tensor::empty({N, K}, acc_dt, dev);
  if (want_dw) h.dw_acc = Tensor::empty({M, K}, acc_dt, dev);
  const size_t xb = x.itemsize(), tb = targets.itemsize(), ab = dtype_size(acc_dt);
  const char* xp = static_cast<const char*>(x.data_ptr());
  const char* tp = static_cast<const char*>(targets.data_ptr());
  for (int64_t r0 = 0; r0 < N; r0 += R) {
    const int64_t n = R < N - r0 ? R : N - r0;
    const void* xc = xp + static_cast<size_t>(r0 * K) * xb;
    const void* tc = tp + static_cast<size_t>(r0) * tb;
    XT_KERNEL(dev, gemm_ld, dt, dt, false, true, n, M, K, 1.0f, xc, K, wg.data_ptr(), K, 0.0f, buf.data_ptr(), ld,
              1, n * K, M * K, n * ld, stream);
    XT_KERNEL(dev, cross_entropy_forward, dt, buf.data_ptr(), targets.dtype(), tc, losses.data<float>() + r0,
              lse.data<float>() + r0, n, V, ld, ignore_index, stream);
    if (return_logits)
      copy_logits_rows(buf.data_ptr(), dt, n, V, ld, static_cast<char*>(h.logits.data_ptr()) +
                                                         static_cast<size_t>(r0 * V) * h.logits.itemsize(), dev);
    if (!want_dx && !want_dw) continue;
    XT_KERNEL(dev, cross_entropy_backward, dt, buf.data_ptr(), lse.data<float>() + r0, targets.dtype(), tc,
              one.data<float>(), one.data<float>(), buf.data_ptr(), n, V, ld, ignore_index, stream);
    if (want_dx && K)  // dx rows [r0, r0 + n) = dlogits [n, M] (row stride ld) @ wg [M, K]
      XT_KERNEL(dev, gemm_ld, dt, acc_dt, false, false, n, K, M, 1.0f, buf.data_ptr(), ld, wg.data_ptr(), K, 0.0f,
                static_cast<char*>(h.dx_acc.data_ptr()) + static_cast<size_t>(r0 * K) * ab, K, 1, n * ld, M * K,
                n * K, stream);
    if (want_dw && K)  // dw [M, K] (+)= dlogits^T [M, n] @ x_c [n, K], chunks in order
      XT_KERNEL(dev, gemm_ld, dt, acc_dt, true, false, M, K, n, 1.0f, buf.data_ptr(), ld, xc, K,
                r0 == 0 ? 0.0f : 1.0f, h.dw_acc.data_ptr(), K, 1, n * ld, n * K, M * K, stream);
  }
  h.loss = Tensor::empty({}, DType::Float32, dev);
  h.count = Tensor::empty({1}, DType::Float32, dev);
  XT_KERNEL(dev, cross_entropy_reduce, losses.data<float>(), targets.dtype(), targets.data_ptr(),
            h.loss.data<float>(), h.count.data<float>(), N, ignore_index, stream);
  return h;
}

// The gradient [rows, K] in dt from the first rows of an accumulator: acc * dloss / max(count, 1),
// rounded once; in place when dt is the accumulator's dtype.
Tensor scaled_grad(const Tensor& acc, int64_t rows, DType dt, const Tensor& dloss, const Tensor& count) {
  const int64_t K = acc.size(1);
  Tensor out = acc.dtype() == dt ? (rows == acc.size(0) ? acc : acc.storage_view(0, {rows, K}))
                                 : Tensor::empty({rows, K}, dt, acc.device());
  if (out.numel())
    XT_KERNEL(acc.device(), cross_entropy_scale_grad, dt, acc.data_ptr(), dloss.data<float>(), count.data<float>(),
              out.data_ptr(), out.numel(), stream_for(acc.device()));
  return out;
}

}  // namespace

std::vector<Tensor> linear_cross_entropy_forward(const Tensor& x, const Tensor& w, const Tensor& targets,
                                                 int64_t ignore_index) {
  check_linear_ce_inputs(x, w, targets);
  const int64_t N = x.size(0), K = x.size(1), V = w.size(0), ld = logits_ld(V);
  check_cpu_targets(targets, V, ignore_index);
  const Device dev = x.device();
  Tensor buf = Tensor::empty({N, ld}, x.dtype(), dev);
  Tensor wg = head_weight(w, ld);
  const int64_t M = wg.size(0);  // classes the GEMMs cover: ld on CUDA, V on the CPU
  if (N)
    XT_KERNEL(dev, gemm_ld, x.dtype(), x.dtype(), false, true, N, M, K, 1.0f, x.data_ptr(), K, wg.data_ptr(), K,
              0.0f, buf.data_ptr(), ld, 1, N * K, M * K, N * ld, stream_for(dev));
  std::vector<Tensor> r = forward_rows(buf, N, V, ld, targets, ignore_index);
  r.push_back(buf);
  r.push_back(wg);
  return r;  // loss, lse, count, logits buffer, the weight the GEMMs used (w, or w padded to ld rows)
}

Tensor logits_from_buffer(const Tensor& buf, int64_t vocab) {
  check_floating(buf, "logits_from_buffer", "buf");
  XT_CHECK(buf.dim() == 2 && vocab >= 0 && vocab <= buf.size(1), ValueError,
           "logits_from_buffer: expected a buffer [N, ld] with ld >= ", vocab, ", got ", buf.describe());
  const int64_t N = buf.size(0), ld = buf.size(1);
  const Device dev = buf.device();
  Tensor out = Tensor::empty({N, vocab}, buf.dtype(), dev);
  copy_logits_rows(buf.data_ptr(), buf.dtype(), N, vocab, ld, out.data_ptr(), dev);
  return out;
}

std::pair<Tensor, Tensor> linear_cross_entropy_backward(const Tensor& buf, int64_t vocab, const Tensor& x,
                                                        const Tensor& w, const Tensor& lse, const Tensor& targets,
                                                        const Tensor& dloss, const Tensor& count,
                                                        int64_t ignore_index) {
  constexpr const char* op = "linear_cross_entropy_backward";
  check_floating(buf, op, "logits buffer");
  const Device dev = buf.device();
  XT_CHECK(buf.dim() == 2 && vocab >= 1 && buf.size(1) >= vocab, ValueError, op,
           ": expected a logits buffer [N, ld >= ", vocab, "], got ", buf.describe());
  const int64_t N = buf.size(0), V = vocab, ld = buf.size(1);
  check_defined(targets, "targets");
  XT_CHECK(is_integral(targets.dtype()) && targets.dim() == 1 && targets.numel() == N && targets.device() == dev,
           ValueError, op, ": targets must be int32/int64 [", N, "] on ", dev.str(), ", got ", targets.describe());
  check_backward_stats(lse, dloss, count, N, dev, op);
  for (const Tensor* t : {&x, &w}) {
    if (!t->defined()) continue;
    XT_CHECK(t->dim() == 2 && t->dtype() == buf.dtype() && t->device() == dev, ValueError, op, ": ",
             t == &x ? "x" : "w", " must be a 2-D ", dtype_name(buf.dtype()), " tensor on ", dev.str(), ", got ",
             t->describe());
  }
  XT_CHECK(!x.defined() || x.size(0) == N, ValueError, op, ": x ", x.describe(), " must have ", N, " rows");
  XT_CHECK(!w.defined() || w.size(0) == V || w.size(0) == ld, ValueError, op, ": w ", w.describe(), " must have ",
           V, " rows (or ", ld, ", padded with zero rows)");
  XT_CHECK(!x.defined() || !w.defined() || x.size(1) == w.size(1), ValueError, op, ": x ", x.describe(), " and w ",
           w.describe(), " differ in K");
  void* stream = stream_for(dev);
  // dlogits over the logits, in place: the buffer holds dlogits from here on.
  buf.bump_version();
  if (N)
    XT_KERNEL(dev, cross_entropy_backward, buf.dtype(), buf.data_ptr(), lse.data<float>(), targets.dtype(),
              targets.data_ptr(), dloss.data<float>(), count.data<float>(), buf.data_ptr(), N, V, ld, ignore_index,
              stream);
  Tensor dx, dw;
  if (w.defined()) {  // dx [N, K] = dlogits [N, M] (row stride ld) @ w [M, K], M = V or ld (zero padding)
    const int64_t K = w.size(1), M = w.size(0);
    dx = Tensor::empty({N, K}, buf.dtype(), dev);
    if (dx.numel())
      XT_KERNEL(dev, gemm_ld, buf.dtype(), buf.dtype(), false, false, N, K, M, 1.0f, buf.data_ptr(), ld,
                w.data_ptr(), K, 0.0f, dx.data_ptr(), K, 1, N * ld, M * K, N * K, stream);
  }
  if (x.defined()) {  // dw [V, K] = dlogits^T (stored [N, V], row stride ld) @ x [N, K]
    // On CUDA over M = ld classes into [ld, K], dw the first V rows (the padding rows come out 0):
    // dlogits' contiguous extent is then aligned as in the forward, and cuBLAS keeps its Hopper
    // kernels (V = 50257, N = 32768 on the H200: an sm80 CUTLASS kernel, 5.4 ms over V; 3.0 ms
    // over ld, bench/lm_head_gemm.py). On the CPU over V, the calls of linear + cross_entropy.
    const int64_t K = x.size(1), M = dev.is_cuda() ? ld : V;
    Tensor full = Tensor::empty({M, K}, x.dtype(), dev);
    if (full.numel())
      XT_KERNEL(dev, gemm_ld, buf.dtype(), x.dtype(), true, false, M, K, N, 1.0f, buf.data_ptr(), ld, x.data_ptr(),
                K, 0.0f, full.data_ptr(), K, 1, N * ld, N * K, M * K, stream);
    dw = M == V ? full : full.storage_view(0, {V, K});
  }
  return {dx, dw};
}

// ---- the differentiable ops

namespace {

class CrossEntropyBackward : public NodeWithSaved<4> {
 public:
  CrossEntropyBackward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& count,
                       int64_t ignore_index)
      : NodeWithSaved({SavedTensor("logits", logits), SavedTensor("targets", targets), SavedTensor("lse", lse),
                       SavedTensor("count", count)}),
        ignore_index_(ignore_index) {}
  const char* name() const override { return "CrossEntropyBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!grads[0].defined()) return {Tensor()};
    const auto [logits, targets, lse, count] = unpack();
    return {cross_entropy_backward(logits, lse, targets, grads[0], count, ignore_index_)};
  }

 private:
  int64_t ignore_index_;
};

class LinearCrossEntropyBackward : public NodeWithSaved<6> {
 public:
  // x only when w needs grad, w (the weight the GEMMs used) only when x does.
  LinearCrossEntropyBackward(const Tensor& buf, int64_t vocab, const Tensor& x, const Tensor& w,
                             const Tensor& targets, const Tensor& lse, const Tensor& count, int64_t ignore_index)
      : NodeWithSaved({SavedTensor("logits buffer", buf), SavedTensor("x", x), SavedTensor("w", w),
                       SavedTensor("targets", targets), SavedTensor("lse", lse), SavedTensor("count", count)}),
        vocab_(vocab), ignore_index_(ignore_index) {}
  const char* name() const override { return "LinearCrossEntropyBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    std::vector<Tensor> out(2);
    if (!grads[0].defined()) return out;
    const auto [buf, x, w, targets, lse, count] = unpack();
    // dlogits overwrite the saved logits buffer (in place), then dx and dw.
    auto [dx, dw] = linear_cross_entropy_backward(buf, vocab_, wants_grad(1) ? x : Tensor(),
                                                  wants_grad(0) ? w : Tensor(), lse, targets, grads[0], count,
                                                  ignore_index_);
    out[0] = std::move(dx);
    out[1] = std::move(dw);
    return out;
  }

 private:
  int64_t vocab_, ignore_index_;
};

// The row-chunked head's node (Note [Row-chunked head]): the forward left the unscaled
// gradients; backward scales them by dloss / max(count, 1).
class ChunkedLinearCrossEntropyBackward : public NodeWithSaved<3> {
 public:
  ChunkedLinearCrossEntropyBackward(const Tensor& dx_acc, const Tensor& dw_acc, const Tensor& count, int64_t vocab,
                                    DType dt)
      : NodeWithSaved({SavedTensor("dx accumulator", dx_acc), SavedTensor("dw accumulator", dw_acc),
                       SavedTensor("count", count)}),
        vocab_(vocab), dt_(dt) {}
  const char* name() const override { return "ChunkedLinearCrossEntropyBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    std::vector<Tensor> out(2);
    if (!grads[0].defined()) return out;
    const auto [dx_acc, dw_acc, count] = unpack();
    const Tensor& dloss = grads[0];
    XT_CHECK(dloss.dtype() == DType::Float32 && dloss.numel() == 1 && dloss.device() == count.device(), ValueError,
             "linear_cross_entropy backward: dloss must be a float32 scalar on ", count.device().str(), ", got ",
             dloss.describe());
    if (dx_acc.defined() && wants_grad(0)) out[0] = scaled_grad(dx_acc, dx_acc.size(0), dt_, dloss, count);
    if (dw_acc.defined() && wants_grad(1)) out[1] = scaled_grad(dw_acc, vocab_, dt_, dloss, count);
    return out;
  }

 private:
  int64_t vocab_;
  DType dt_;
};

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  std::vector<Tensor> r = cross_entropy_forward(logits, targets, ignore_index);  // loss, lse, count
  Tensor loss = r[0];
  if (needs_grad({&logits}))
    set_history(loss, make_node<CrossEntropyBackward>({logits}, logits, targets, r[1], r[2], ignore_index));
  return loss;
}

std::pair<Tensor, Tensor> linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& targets,
                                               int64_t ignore_index, bool return_logits, int64_t chunk_rows) {
  XT_CHECK(chunk_rows >= 0, ValueError, "linear_cross_entropy: chunk_rows must be >= 0 (0: chosen from the "
           "shapes), got ", chunk_rows);
  check_linear_ce_inputs(x, w, targets);
  const int64_t N = x.size(0);
  const int64_t R = head_chunk_rows(N, logits_ld(w.size(0)), x.itemsize(), chunk_rows);
  if (R < N) {  // Note [Row-chunked head]
    check_cpu_targets(targets, w.size(0), ignore_index);
    const bool want_dx = needs_grad({&x}), want_dw = needs_grad({&w});
    ChunkedHead h = linear_cross_entropy_chunked(x, w, targets, ignore_index, return_logits, R, want_dx, want_dw);
    if (want_dx || want_dw)
      set_history(h.loss, make_node<ChunkedLinearCrossEntropyBackward>({x, w}, h.dx_acc, h.dw_acc, h.count,
                                                                        w.size(0), x.dtype()));
    return {h.loss, h.logits};
  }
  // loss, lse, count, logits buffer, the weight the GEMMs used (w, or w with zero rows to ld on CUDA)
  std::vector<Tensor> r = linear_cross_entropy_forward(x, w, targets, ignore_index);
  Tensor loss = r[0];
  const int64_t vocab = w.size(0);
  // The copy is made before backward can overwrite the buffer with dlogits.
  Tensor logits = return_logits ? logits_from_buffer(r[3], vocab) : Tensor();
  if (needs_grad({&x, &w}))
    set_history(loss, make_node<LinearCrossEntropyBackward>({x, w}, r[3], vocab, w.requires_grad() ? x : Tensor(),
                                                            x.requires_grad() ? r[4] : Tensor(), targets, r[1], r[2],
                                                            ignore_index));
  return {loss, logits};
}

}  // namespace ops
}  // namespace xt
