// Matmul ops: 2-D and batched 3-D GEMMs, linear (x @ w^T over all leading dims at once).
//
// Everything lands in one kernels::gemm call (batched 3-D: one call with strides). bf16 inputs
// multiply with float32 accumulation and round once; matmul_out_dtype can write float32 (or
// any floating dtype) directly, which the weight-gradient GEMMs of mixed precision use.
// matmul: C = A @ B; dA = dC @ B^T, dB = A^T @ dC, each one GEMM with the transpose folded into
// the BLAS call (no transposed copies). An [..., K] @ [K, N] product is flattened to 2-D first.
// linear: y = x @ W^T over all leading dims as [rows, K]; dx = dy @ W, dW = dy^T @ x as one GEMM
// over every row, written in W's dtype. Each node saves an input only when the other input needs
// its gradient.
// linear_multi: several linears of one input (q/k/v, gate/up), see Note [Merged projections];
// linear_multi_bias: the same with biases, added in the GEMM's epilogue on CUDA (below).
// rms_norm_linear_multi: the norm before the projections (with the residual add before it) and
// linear_multi, keeping the norm's input only (Note [Normed input recomputed for the projections]).
// swiglu_linear: linear(swiglu(gate, up), w), the SwiGLU MLP's down projection keeping gate and up
// only (Note [SwiGLU recomputed for the down projection]).
#include <atomic>
#include <cstring>
#include <string>
#include <tuple>

#include "core/error.h"
#include "ops/dispatch.h"
#include "tape/node.h"

namespace xt {

#ifdef XT_CUDA
namespace kernels {
namespace cuda {
void set_allow_tf32(bool allow);  // kernels/cuda/gemm.cu (declared in the CUDA-only common.cuh)
}  // namespace cuda
}  // namespace kernels
#endif

namespace ops {

namespace {
std::atomic<bool> g_allow_tf32{false};
}  // namespace

// The flag lives here for every build; the CUDA GEMM keeps its own copy, set from here.
void set_allow_tf32(bool allow) {
  g_allow_tf32.store(allow);
#ifdef XT_CUDA
  kernels::cuda::set_allow_tf32(allow);
#endif
}
bool allow_tf32() { return g_allow_tf32.load(); }

Tensor matmul_out_dtype(const Tensor& a, const Tensor& b, bool ta, bool tb, DType out_dtype) {
  check_floating(a, "matmul", "a");
  check_floating(b, "matmul", "b");
  check_same_device(a, b, "matmul", "a", "b");
  check_same_dtype(a, b, "matmul", "a", "b");
  XT_CHECK(is_floating(out_dtype), TypeError, "matmul: the output dtype must be floating point, got ",
           dtype_name(out_dtype));
  XT_CHECK((a.dim() == 2 && b.dim() == 2) || (a.dim() == 3 && b.dim() == 3), ValueError,
           "matmul: expected two 2-D or two batched 3-D tensors, got a ", a.describe(), " and b ", b.describe());
  const bool batched = a.dim() == 3;
  const int64_t batch = batched ? a.size(0) : 1;
  XT_CHECK(!batched || b.size(0) == batch, ValueError, "matmul: batch sizes differ: a ", a.describe(), ", b ",
           b.describe());
  const int64_t ar = a.size(-2), ac = a.size(-1), br = b.size(-2), bcol = b.size(-1);
  const int64_t M = ta ? ac : ar, K = ta ? ar : ac;
  const int64_t Kb = tb ? bcol : br, N = tb ? br : bcol;
  XT_CHECK(K == Kb, ValueError, "matmul: inner dimensions differ: a ", a.describe(), (ta ? " (transposed)" : ""),
           " has K=", K, " but b ", b.describe(), (tb ? " (transposed)" : ""), " has K=", Kb);
  Shape shape = batched ? Shape{batch, M, N} : Shape{M, N};
  Tensor out = Tensor::empty(shape, out_dtype, a.device());
  if (out.numel() == 0) return out;
  XT_KERNEL(a.device(), gemm, a.dtype(), out_dtype, ta, tb, M, N, K, 1.0f, a.data_ptr(), b.data_ptr(), 0.0f,
            out.data_ptr(), batch, M * K, K * N, M * N, stream_for(a.device()));
  return out;
}

Tensor matmul_forward(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  check_defined(a, "a");
  return matmul_out_dtype(a, b, ta, tb, a.dtype());
}

Tensor linear_forward(const Tensor& x, const Tensor& w) {
  check_floating(x, "linear", "x");
  check_floating(w, "linear", "weight");
  check_dim(w, 2, "linear", "weight");
  check_same_device(x, w, "linear", "x", "weight");
  check_same_dtype(x, w, "linear", "x", "weight");
  XT_CHECK(x.dim() >= 1 && x.shape().back() == w.size(1), ValueError, "linear: x ", x.describe(),
           " must end in the weight's in_features ", w.size(1), " (weight ", w.describe(), " is [out, in])");
  const int64_t K = w.size(1), N = w.size(0);
  const int64_t rows = K ? x.numel() / K : shape_numel(Shape(x.shape().begin(), x.shape().end() - 1));
  Tensor y = matmul_out_dtype(x.view_as_shape({rows, K}), w, false, true, x.dtype());  // (rows, N)
  Shape shape = x.shape();
  shape.back() = N;
  return y.view_as_shape(shape);
}

namespace {

class MatmulBackward : public NodeWithSaved<2> {
 public:
  MatmulBackward(const Tensor& a, const Tensor& b) : NodeWithSaved({SavedTensor("a", a), SavedTensor("b", b)}) {}
  const char* name() const override { return "MatmulBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    std::vector<Tensor> out(2);
    if (!g.defined()) return out;
    const auto [a, b] = unpack();
    if (wants_grad(0)) out[0] = matmul_forward(g, b, false, true);
    if (wants_grad(1)) out[1] = matmul_forward(a, g, true, false);
    return out;
  }
};

class LinearBackward : public NodeWithSaved<2> {
 public:
  LinearBackward(const Tensor& x, const Tensor& w, DType w_dtype)
      : NodeWithSaved({SavedTensor("x", x), SavedTensor("weight", w)}), w_dtype_(w_dtype) {}
  const char* name() const override { return "LinearBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    std::vector<Tensor> out(2);
    if (!g.defined()) return out;
    const auto [x, w] = unpack();
    const int64_t N = g.shape().back();
    const int64_t rows = N ? g.numel() / N : 0;
    Tensor g2 = g.view_as_shape({rows, N});  // (rows, N)
    if (wants_grad(0)) {
      const int64_t K = w.size(1);
      Shape xshape = g.shape();
      xshape.back() = K;
      out[0] = matmul_forward(g2, w, false, false).view_as_shape(xshape);  // (rows, K)
    }
    if (wants_grad(1)) {
      const int64_t K = x.shape().back();
      out[1] = matmul_out_dtype(g2, x.view_as_shape({rows, K}), true, false, w_dtype_);  // (N, K)
    }
    return out;
  }

 private:
  DType w_dtype_;
};

}  // namespace

// Note [Merged projections]
// linear_multi(x, [w0, w1, ...]) = [linear(x, w0), linear(x, w1), ...] with fewer, larger GEMMs.
// - Layout: the outputs are views of one buffer, block after block: y0 ([rows, N0], contiguous),
//   then y1, ... So each output is an ordinary contiguous tensor (attention and SwiGLU read them
//   without copies), and consecutive weights of one shape multiply as ONE strided-batched GEMM:
//   A = x with batch stride 0, B = the weights at their (uniform) distance in memory, C = the
//   blocks. The parameter store lays q/k/v (and gate/up) out at uniform distances, so their bf16
//   compute copies need no packing; weights that are not (another storage, uneven gaps) are first
//   copied into one packed buffer, which changes no bit (the same GEMM call on equal values).
// - Backward: dx = dy0 @ w0 + dy1 @ w1 + ... as a chain of GEMMs in weight order, the first
//   writing (beta 0), the others accumulating into it (beta 1) in dx's dtype: no separate gradient
//   adds. dWi = dyi^T @ x; consecutive weights of one shape whose gradients lie in one storage at a
//   uniform distance (SwiGLU's backward writes dgate and dup so) run as one batched GEMM into one
//   buffer, the others one GEMM each. Every choice depends only on shapes and on which storage
//   each tensor lives in (never on addresses the allocator happens to return), so a run repeats
//   bit for bit, and recompute (which re-runs the same ops) gives the same bits.
// - Numerics against separate linears: the forward and the weight gradients are the same GEMMs
//   batched (bitwise equal on the CPU, where each batch entry is one BLAS call; cuBLAS may pick
//   another kernel for a batched call); dx rounds once per accumulation step instead of once per
//   product and once per add.

namespace {

// Elements from a's first element to b's when both live in one storage and the distance is a
// whole number of elements; -1 otherwise.
int64_t element_distance(const Tensor& a, const Tensor& b) {
  if (a.storage() != b.storage() || a.dtype() != b.dtype()) return -1;
  const auto pa = reinterpret_cast<uintptr_t>(a.data_ptr()), pb = reinterpret_cast<uintptr_t>(b.data_ptr());
  if (pb < pa || (pb - pa) % a.itemsize()) return -1;
  return static_cast<int64_t>((pb - pa) / a.itemsize());
}

// The uniform distance between consecutive tensors ts[lo..hi) (one storage), or -1.
int64_t uniform_stride(const std::vector<Tensor>& ts, size_t lo, size_t hi) {
  if (hi - lo == 1) return ts[lo].numel();
  const int64_t d = element_distance(ts[lo], ts[lo + 1]);
  if (d < 0) return -1;
  for (size_t i = lo + 1; i + 1 < hi; ++i)
    if (element_distance(ts[i], ts[i + 1]) != d) return -1;
  return d;
}

// Runs [lo, hi) of consecutive weights of one shape.
std::vector<std::pair<size_t, size_t>> shape_runs_of(const std::vector<Shape>& shapes) {
  std::vector<std::pair<size_t, size_t>> runs;
  for (size_t i = 0; i < shapes.size();) {
    size_t j = i + 1;
    while (j < shapes.size() && shapes[j] == shapes[i]) ++j;
    runs.emplace_back(i, j);
    i = j;
  }
  return runs;
}

std::vector<Shape> shapes_of(const std::vector<Tensor>& ts) {
  std::vector<Shape> s;
  s.reserve(ts.size());
  for (const Tensor& t : ts) s.push_back(t.shape());
  return s;
}

void check_linear_multi(const Tensor& x, const std::vector<Tensor>& ws) {
  const char* op = "linear_multi";
  check_defined(x, "x");
  check_floating(x, op, "x");
  XT_CHECK(x.dim() >= 1, ValueError, op, ": x must have at least one dimension, got ", x.describe());
  check_linear_weights(x, ws, op);
}

}  // namespace

namespace {

// linear_multi's forward; with biases (bs non-null, CUDA only) each run's batched GEMM takes the
// Bias epilogue, the biases at a uniform distance or packed (linear_multi_bias), and an empty
// result means that epilogue has no algorithm here (nothing was written to the outputs).
std::vector<Tensor> multi_forward(const Tensor& x, const std::vector<Tensor>& ws, const std::vector<Tensor>* bs) {
  const int64_t K = x.shape().back();
  const int64_t rows = shape_numel(Shape(x.shape().begin(), x.shape().end() - 1));
  int64_t total = 0;
  for (const Tensor& w : ws) total += w.size(0);
  Tensor buf = Tensor::empty({rows * total}, x.dtype(), x.device());
  std::vector<Tensor> out;
  out.reserve(ws.size());
  int64_t off = 0;
  for (const Tensor& w : ws) {
    Shape shape = x.shape();
    shape.back() = w.size(0);
    out.push_back(buf.storage_view(off, shape));
    off += rows * w.size(0);
  }
  if (rows == 0) return out;
  const Tensor x2 = x.view_as_shape({rows, K});
  for (const auto& [lo, hi] : shape_runs_of(shapes_of(ws))) {
    const int64_t N = ws[lo].size(0), n = static_cast<int64_t>(hi - lo);
    if (N == 0) continue;
    int64_t wstride = uniform_stride(ws, lo, hi);
    Tensor wbase = ws[lo];
    if (wstride < 0) {  // pack the run's weights (same values, same GEMM call: same bits)
      wbase = Tensor::empty({n, N, K}, x.dtype(), x.device());
      for (size_t i = lo; i < hi; ++i) {
        Tensor dst = wbase.storage_view(static_cast<int64_t>(i - lo) * N * K, ws[i].shape());
        copy_(dst, ws[i]);
      }
      wstride = N * K;
    }
    if (bs == nullptr) {
      XT_KERNEL(x.device(), gemm, x.dtype(), x.dtype(), false, true, rows, N, K, 1.0f, x2.data_ptr(),
                wbase.data_ptr(), 0.0f, out[lo].data_ptr(), n, 0, wstride, rows * N, stream_for(x.device()));
      continue;
    }
#ifdef XT_CUDA
    int64_t bstride = uniform_stride(*bs, lo, hi);
    Tensor bbase = (*bs)[lo];
    if (bstride < 0) {
      bbase = Tensor::empty({n, N}, x.dtype(), x.device());
      for (size_t i = lo; i < hi; ++i) {
        Tensor dst = bbase.storage_view(static_cast<int64_t>(i - lo) * N, (*bs)[i].shape());
        copy_(dst, (*bs)[i]);
      }
      bstride = N;
    }
    if (!kernels::cuda::gemm_epilogue(x.dtype(), kernels::GemmEpilogue::Bias, false, true, rows, N, K, x2.data_ptr(),
                                      wbase.data_ptr(), out[lo].data_ptr(), bbase.data_ptr(), nullptr,
                                      stream_for(x.device()), n, 0, wstride, rows * N, bstride))
      return {};
#else
    return {};
#endif
  }
  return out;
}

}  // namespace

std::vector<Tensor> linear_multi_forward(const Tensor& x, const std::vector<Tensor>& ws) {
  check_linear_multi(x, ws);
  return multi_forward(x, ws, nullptr);
}

std::vector<Tensor> linear_multi_backward(const Tensor& x, const std::vector<Tensor>& ws,
                                          const std::vector<Shape>& w_shapes, const std::vector<Tensor>& grads,
                                          bool want_dx, const std::vector<bool>& want_dw) {
  const char* op = "linear_multi_backward";
  const size_t n = w_shapes.size();
  XT_CHECK(n > 0 && grads.size() == n && want_dw.size() == n && (!want_dx || ws.size() == n), ValueError, op, ": ",
           n, " weight shapes, ", ws.size(), " weights, ", grads.size(), " gradients and ", want_dw.size(), " flags");
  for (const Shape& s : w_shapes)
    XT_CHECK(s.size() == 2, ValueError, op, ": weight shapes must be [out, in]");
  std::vector<Tensor> out(n + 1);
  const int64_t K = w_shapes[0][1];
  int64_t rows = -1;
  Tensor ref;  // the first gradient: dtype, device and the leading dims of dx
  for (size_t i = 0; i < n; ++i) {
    if (!grads[i].defined()) continue;
    const Tensor& g = grads[i];
    if (!ref.defined()) ref = g;
    XT_CHECK(w_shapes[i][1] == K && g.dim() >= 1 && g.shape().back() == w_shapes[i][0] && g.dtype() == ref.dtype() &&
                 g.device() == ref.device(),
             ValueError, op, ": grads[", i, "] ", g.describe(), " does not match weight ", i, " [", w_shapes[i][0],
             ", ", w_shapes[i][1], "] (or the other gradients)");
    const int64_t r = shape_numel(Shape(g.shape().begin(), g.shape().end() - 1));
    XT_CHECK(rows < 0 || rows == r, ValueError, op, ": gradients with different row counts");
    rows = r;
  }
  if (!ref.defined()) return out;  // no gradient reached any output
  const Device dev = ref.device();
  const DType dt = ref.dtype();
  if (want_dx) {
    Shape xshape = ref.shape();
    xshape.back() = K;
    Tensor dx = Tensor::empty(xshape, dt, dev);
    bool first = true;
    for (size_t i = 0; i < n && rows > 0 && K > 0; ++i) {
      const int64_t N = w_shapes[i][0];
      if (!grads[i].defined() || N == 0) continue;
      XT_CHECK(ws[i].defined() && ws[i].shape() == w_shapes[i] && ws[i].dtype() == dt, ValueError, op,
               ": weights[", i, "] must be the forward's weight, got ", ws[i].defined() ? ws[i].describe() : "none");
      XT_KERNEL(dev, gemm, dt, dt, false, false, rows, K, N, 1.0f, grads[i].data_ptr(), ws[i].data_ptr(),
                first ? 0.0f : 1.0f, dx.data_ptr(), 1, rows * N, N * K, rows * K, stream_for(dev));
      first = false;
    }
    if (first) dx = zeros(xshape, dt, dev);  // nothing to multiply (N, K or rows zero)
    out[0] = dx;
  }
  bool any_dw = false;
  for (size_t i = 0; i < n; ++i) any_dw = any_dw || (want_dw[i] && grads[i].defined());
  if (!any_dw) return out;
  check_defined(x, "x");
  XT_CHECK(x.dtype() == dt && x.device() == dev && x.shape().back() == K && x.numel() == rows * K, ValueError, op,
           ": x ", x.describe(), " must be the forward's input (", rows, " rows of ", K, ")");
  for (const auto& [lo, hi] : shape_runs_of(w_shapes)) {
    const int64_t N = w_shapes[lo][0];
    for (size_t i = lo; i < hi;) {  // sub-runs whose gradients lie at one uniform distance
      if (!want_dw[i] || !grads[i].defined()) {
        ++i;
        continue;
      }
      size_t j = i + 1;
      int64_t gstride = grads[i].numel();
      if (j < hi && want_dw[j] && grads[j].defined()) {
        const int64_t d = element_distance(grads[i], grads[j]);
        if (d >= 0) {
          gstride = d;
          while (j < hi && want_dw[j] && grads[j].defined() && element_distance(grads[j - 1], grads[j]) == d) ++j;
        }
      }
      const int64_t cnt = static_cast<int64_t>(j - i);
      Tensor dw = rows == 0 ? zeros({cnt * N * K}, dt, dev) : Tensor::empty({cnt * N * K}, dt, dev);
      if (rows > 0 && N > 0 && K > 0)
        XT_KERNEL(dev, gemm, dt, dt, true, false, N, K, rows, 1.0f, grads[i].data_ptr(), x.data_ptr(), 0.0f,
                  dw.data_ptr(), cnt, gstride, 0, N * K, stream_for(dev));
      for (size_t t = i; t < j; ++t) out[1 + t] = dw.storage_view(static_cast<int64_t>(t - i) * N * K, w_shapes[t]);
      i = j;
    }
  }
  return out;
}

namespace {

// Inputs x, the weights, and with_biases the biases; the biases' gradients are sum_to's ordered
// row sums of their outputs' gradients (the unfused add's backward).
// Saved: x (when a weight takes a gradient), then the weights (when x does).
class LinearMultiBackward : public NodeWithSavedList {
 public:
  LinearMultiBackward(const Tensor& x, const std::vector<Tensor>& ws, bool keep_weights, bool with_biases)
      : with_biases_(with_biases) {
    save("x", x);
    for (size_t i = 0; i < ws.size(); ++i) {
      save("weights[" + std::to_string(i) + "]", keep_weights ? ws[i] : Tensor());
      shapes_.push_back(ws[i].shape());
    }
  }
  const char* name() const override { return with_biases_ ? "LinearMultiBiasBackward" : "LinearMultiBackward"; }
  uint32_t num_outputs() const override { return static_cast<uint32_t>(shapes_.size()); }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const size_t n = shapes_.size();
    const Tensor x = unpack(0);
    std::vector<Tensor> ws(n);
    for (size_t i = 0; i < n; ++i) ws[i] = unpack(1 + i);
    std::vector<bool> want_dw(n);
    for (size_t i = 0; i < n; ++i) want_dw[i] = wants_grad(1 + i);
    std::vector<Tensor> out = linear_multi_backward(x, ws, shapes_, grads, wants_grad(0), want_dw);
    if (with_biases_)
      for (size_t i = 0; i < n; ++i)
        out.push_back(wants_grad(1 + n + i) && grads[i].defined() ? sum_to(grads[i], {shapes_[i][0]}) : Tensor());
    return out;
  }

 private:
  std::vector<Shape> shapes_;  // the weights' shapes
  bool with_biases_;
};

// Records the node of linear_multi (bs empty) or linear_multi_bias on its outputs.
void record_multi(const Tensor& x, const std::vector<Tensor>& ws, const std::vector<Tensor>& bs,
                  std::vector<Tensor>& out) {
  std::vector<Tensor> inputs{x};
  inputs.insert(inputs.end(), ws.begin(), ws.end());
  inputs.insert(inputs.end(), bs.begin(), bs.end());
  if (!needs_grad(inputs)) return;
  bool w_grad = false;
  for (const Tensor& w : ws) w_grad = w_grad || w.requires_grad();
  auto node = make_node<LinearMultiBackward>(inputs, w_grad ? x : Tensor(), ws, x.requires_grad(), !bs.empty());
  for (size_t i = 0; i < out.size(); ++i) set_history(out[i], node, static_cast<uint32_t>(i));
}

}  // namespace

std::vector<Tensor> linear_multi(const Tensor& x, const std::vector<Tensor>& ws) {
  std::vector<Tensor> out = linear_multi_forward(x, ws);
  record_multi(x, ws, {}, out);
  return out;
}

// Note [Normed input recomputed for the projections]
// A block's norm and the projections after it as separate ops (add_rms_norm or rms_norm, then
// linear_multi) keep the norm's input h (the norm's node) and its output y (linear_multi's node,
// for the weight gradients): two [rows, dim] tensors where one and the float32 rstd rows would do.
// rms_norm_linear_multi keeps h, the norm weight, rstd and the projection weights; its backward
// recomputes y = rms_norm(h) with rms_norm's kernel (bitwise add_rms_norm's y: that op is bitwise the
// add then rms_norm) and runs the composition's backward kernels in its order: linear_multi's (dy
// as a chain of GEMMs, the weight gradients) then the norm's (dx, with h's own gradient added, and
// the norm weight's gradient straight into its slot). The loss and every gradient are therefore those
// of the two ops, bit for bit, on every device. Cost: one norm pass more per backward.

namespace {

// Inputs: x, residual (undefined: none), the norm weight, the projection weights. Outputs: h (only
// with a residual), then the projections.
// Saved: h, the norm weight, rstd, then the projection weights.
class RmsNormLinearMultiBackward : public NodeWithSavedList {
 public:
  RmsNormLinearMultiBackward(const Tensor& h, const Tensor& norm_w, const Tensor& rstd, const std::vector<Tensor>& ws,
                             double eps, bool residual)
      : eps_(eps), residual_(residual) {
    save("h", h);
    save("norm_weight", norm_w);
    save("rstd", rstd);
    for (size_t i = 0; i < ws.size(); ++i) {
      save("weights[" + std::to_string(i) + "]", ws[i]);
      shapes_.push_back(ws[i].shape());
    }
  }
  const char* name() const override { return "RmsNormLinearMultiBackward"; }
  uint32_t num_outputs() const override { return static_cast<uint32_t>(1 + shapes_.size()); }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const size_t n = shapes_.size();
    std::vector<Tensor> out(3 + n);
    const Tensor& dh = grads[0];
    std::vector<Tensor> dys(grads.begin() + 1, grads.end());
    bool any_dy = false;
    for (const Tensor& g : dys) any_dy = any_dy || g.defined();
    if (!any_dy) {  // only h was used: the add's backward
      out[0] = dh;
      out[1] = residual_ ? dh : Tensor();
      return out;
    }
    const Tensor h = unpack(0), w = unpack(1), rstd = unpack(2);
    std::vector<Tensor> ws(n);
    for (size_t i = 0; i < n; ++i) ws[i] = unpack(3 + i);
    Tensor y = rms_norm_forward(h, w, eps_).first;  // the forward's normed input, again
    std::vector<bool> want_dw(n);
    for (size_t i = 0; i < n; ++i) want_dw[i] = wants_grad(3 + i);
    const bool want_dy = wants_grad(0) || wants_grad(1) || wants_grad(2);
    std::vector<Tensor> lm = linear_multi_backward(y, ws, shapes_, dys, want_dy, want_dw);
    y = Tensor();
    for (size_t i = 0; i < n; ++i) out[3 + i] = lm[1 + i];
    if (want_dy) {
      auto [dsum, dw] = rms_norm_backward(h, w, rstd, lm[0], dh,
                                          claim_grad_buffer(next_edges[2], w.shape(), w.dtype(), w.device()));
      out[0] = dsum;
      out[1] = residual_ ? dsum : Tensor();  // gradients are never written in place: x and r may share one
      out[2] = dw;
    }
    return out;
  }

 private:
  std::vector<Shape> shapes_;
  double eps_;
  bool residual_;
};

}  // namespace

std::pair<Tensor, std::vector<Tensor>> rms_norm_linear_multi(const Tensor& x, const std::vector<Tensor>& ws,
                                                             const Tensor& norm_weight, double eps,
                                                             const Tensor& residual) {
  check_defined(x, "x");
  check_defined(norm_weight, "norm_weight");
  Tensor h = x, y, rstd;
  if (residual.defined()) {
    std::tie(h, y) = add_rms_norm_forward(x, residual, norm_weight, eps, &rstd);
  } else {
    std::tie(y, rstd) = rms_norm_forward(x, norm_weight, eps);
  }
  std::vector<Tensor> out = linear_multi_forward(y, ws);  // y dies here: backward recomputes it
  std::vector<Tensor> inputs{x, residual, norm_weight};
  inputs.insert(inputs.end(), ws.begin(), ws.end());
  if (needs_grad(inputs)) {
    auto node = make_node<RmsNormLinearMultiBackward>(inputs, h, norm_weight, rstd, ws, eps, residual.defined());
    if (residual.defined()) set_history(h, node, 0);
    for (size_t i = 0; i < out.size(); ++i) set_history(out[i], node, static_cast<uint32_t>(1 + i));
  }
  return {h, out};
}

// linear_multi_bias: [linear(x, wi) + bi] (GPT-2's q/k/v). On CUDA each run of equal shapes is one
// strided-batched cuBLASLt GEMM with the Bias epilogue (the biases at a uniform distance, as the
// store lays them out, else packed: the same values): the outputs are written once, as
// linear_multi's views of one buffer. Backward: linear_multi's, and each bias gradient sum_to's
// ordered row sum of its output gradient (the unfused add's). On the CPU, in float64 and where
// cuBLASLt has no algorithm: linear_multi followed by ops::add, bitwise those ops.
// (ops/linear_bias.cpp holds the single biased linears; Note [cuBLASLt epilogues: exact and
// deterministic] in kernels/cuda/gemm_lt.cu.)

std::vector<Tensor> linear_multi_bias(const Tensor& x, const std::vector<Tensor>& ws, const std::vector<Tensor>& bs) {
  const char* op = "linear_multi_bias";
  check_linear_multi(x, ws);
  XT_CHECK(bs.size() == ws.size(), ValueError, op, ": ", ws.size(), " weights but ", bs.size(), " biases");
  for (size_t i = 0; i < bs.size(); ++i) {
    const std::string name = "biases[" + std::to_string(i) + "]";
    check_defined(bs[i], name.c_str());
    check_same_device(x, bs[i], op, "x", name.c_str());
    check_same_dtype(x, bs[i], op, "x", name.c_str());
    XT_CHECK(bs[i].dim() == 1 && bs[i].numel() == ws[i].size(0), ValueError, op, ": ", name, " must have shape [",
             ws[i].size(0), "] (weight ", i, "'s out_features), got ", bs[i].describe());
  }
  const int64_t rows = shape_numel(Shape(x.shape().begin(), x.shape().end() - 1));
  std::vector<Tensor> out;
  if (x.device().is_cuda() && rows > 0 && x.shape().back() > 0) out = multi_forward(x, ws, &bs);
  if (out.empty()) {  // the CPU, float64, no algorithm: linear_multi then add
    out = linear_multi(x, ws);
    for (size_t i = 0; i < out.size(); ++i) out[i] = add(out[i], bs[i]);
    return out;
  }
  record_multi(x, ws, bs, out);
  return out;
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_defined(a, "a");
  check_defined(b, "b");
  if (a.dim() > 2 && b.dim() == 2) {  // [..., K] @ [K, N]: one 2-D GEMM over all rows
    XT_CHECK(a.shape().back() == b.size(0), ValueError, "matmul: inner dimensions differ: a ", a.describe(),
             " has K=", a.shape().back(), " but b ", b.describe(), " has K=", b.size(0));
    Shape out_shape = a.shape();
    out_shape.back() = b.size(1);
    return reshape(matmul(reshape(a, {-1, a.shape().back()}), b), out_shape);
  }
  Tensor out = matmul_forward(a, b);
  if (needs_grad({&a, &b}))
    set_history(out, make_node<MatmulBackward>({a, b}, b.requires_grad() ? a : Tensor(),
                                               a.requires_grad() ? b : Tensor()));
  return out;
}

Tensor linear(const Tensor& x, const Tensor& w) {
  Tensor out = linear_forward(x, w);
  if (needs_grad({&x, &w}))
    set_history(out, make_node<LinearBackward>({x, w}, w.requires_grad() ? x : Tensor(),
                                               x.requires_grad() ? w : Tensor(), w.dtype()));
  return out;
}

// Note [SwiGLU recomputed for the down projection]
// The MLP's down projection linear(swiglu(gate, up), w) as separate ops keeps three tensors for
// backward: gate and up (swiglu's node) and the hidden swiglu(gate, up) (the linear's node, for
// dW), 1.5x the bytes of gate and up. swiglu_linear keeps gate, up and w and recomputes the hidden
// in backward with the same kernel on the same inputs, so it is bitwise the value the forward
// multiplied. Backward then runs the composition's kernels on the same values: dhidden = dy @ w,
// dW = dy^T @ hidden in w's dtype, swiglu's backward of dhidden. The loss and every gradient are
// therefore bitwise those of swiglu then linear, forward and backward, on every device (recompute,
// which runs the composition, gives the same bits). Cost: one swiglu pass more in backward (it
// reads gate and up, writes the hidden), against a third fewer bytes kept per MLP.

namespace {

class SwigluLinearBackward : public NodeWithSaved<3> {
 public:
  SwigluLinearBackward(const Tensor& gate, const Tensor& up, const Tensor& w, DType w_dtype)
      : NodeWithSaved({SavedTensor("gate", gate), SavedTensor("up", up), SavedTensor("weight", w)}),
        w_dtype_(w_dtype) {}
  const char* name() const override { return "SwigluLinearBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    std::vector<Tensor> out(3);
    if (!g.defined()) return out;
    const auto [gate, up, w] = unpack();
    const int64_t N = g.shape().back(), K = gate.shape().back();
    const int64_t rows = N ? g.numel() / N : 0;
    const Tensor g2 = g.view_as_shape({rows, N});                    // (rows, N)
    Tensor hidden = swiglu_forward(gate, up);                        // the forward's bits, again
    if (wants_grad(0) || wants_grad(1)) {
      const Tensor dhidden = matmul_forward(g2, w, false, false).view_as_shape(gate.shape());  // (rows, K)
      if (wants_grad(2)) out[2] = matmul_out_dtype(g2, hidden.view_as_shape({rows, K}), true, false, w_dtype_);
      hidden = Tensor();
      auto [dgate, dup] = swiglu_backward(gate, up, dhidden);
      out[0] = dgate;
      out[1] = dup;
    } else if (wants_grad(2)) {
      out[2] = matmul_out_dtype(g2, hidden.view_as_shape({rows, K}), true, false, w_dtype_);  // (N, K)
    }
    return out;
  }

 private:
  DType w_dtype_;
};

}  // namespace

Tensor swiglu_linear(const Tensor& gate, const Tensor& up, const Tensor& w) {
  check_defined(gate, "gate");
  check_defined(up, "up");
  check_defined(w, "weight");
  XT_CHECK(w.dim() == 2 && gate.dim() >= 1 && gate.shape().back() == w.size(1), ValueError, "swiglu_linear: gate ",
           gate.describe(), " must end in the weight's in_features (weight ", w.describe(), " is [out, in])");
  Tensor out = linear_forward(swiglu_forward(gate, up), w);  // the hidden dies here: backward recomputes it
  if (needs_grad({&gate, &up, &w}))
    set_history(out, make_node<SwigluLinearBackward>({gate, up, w}, gate, up,
                                                     gate.requires_grad() || up.requires_grad() ? w : Tensor(),
                                                     w.dtype()));
  return out;
}

}  // namespace ops
}  // namespace xt
