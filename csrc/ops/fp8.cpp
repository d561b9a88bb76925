// linear_fp8: y = x @ W^T with both operands in FP8 (E4M3), the backward's dy in E5M2 (docs/fp8.md).
// linear_fp8_multi: the same for several weights of one x (q/k/v, gate/up), x quantised once;
// linear_fp8 is its one-weight case.
//
// Every operand is quantised per tensor with its current amax and a power-of-two scale
// (Note [FP8 scaling], kernels/fp8_math.h): an amax pass, then a cast pass writing the codes, the
// transposed codes a backward GEMM needs, and the dequantisation factor, all on the device (no
// host sync; a CUDA graph captures it). The FP8 copies are transient: the weights stay the
// caller's (the bf16 compute copy of a float32 master), the output and every gradient have x's
// dtype, and the GEMMs accumulate in float32.
//   forward: xq [M, K], wq [N, K] (E4M3)             y  [M, N] = xq . wq^T    (fast accumulation)
//   dgrad:   dyq [M, N] (E5M2), wq^T [K, N]           dx [M, K] = dyq . (wq^T)^T
//   wgrad:   dyq^T [N, M] (E5M2), xq^T [K, M]         dW [N, K] = dyq^T . (xq^T)^T
// Every GEMM reads both operands K-major (Hopper's FP8 tensor cores want them so), which is why
// the forward's cast writes xq^T (when W takes a gradient) and wq^T (when x does) beside xq and
// wq: the node saves those FP8 copies (a byte per element) instead of x and W. dy's cast writes
// dyq and dyq^T as the two gradients need them. The codes live in int32 tensors used as byte
// buffers (core has no 8-bit dtype); they never leave this file.
// The CPU computes exactly quantise -> dequantise -> float32 GEMM -> round (kernels/cpu/fp8.cpp):
// the reference the CUDA path is tested against, and a CPU run's FP8 emulation.
// cuBLASLt's FP8 GEMMs want every dimension a multiple of 16. N and K are the weight's (a model's
// widths): checked. M, the rows of x (a generation prompt's length, say), is padded on CUDA with
// zero rows to the next multiple of 16 (x and dy): zeros change neither an amax nor a sum, so the
// results are the unpadded recipe's, and y and dx are the first M rows of the padded outputs.
#include <cstdint>

#include "core/error.h"
#include "kernels/fp8_math.h"
#include "ops/dispatch.h"
#include "tape/node.h"

namespace xt {
namespace ops {

namespace {

using kernels::Fp8Format;

// One quantised operand: the codes of a rows x cols matrix, optionally its transpose, and
// its record [2^-k, amax] (kernels::kFp8MetaFloats floats, a tensor of its own: the scale at its
// 16-byte aligned start, as cuBLASLt requires).
struct Fp8Operand {
  Tensor codes, codes_t, meta;
};

uint8_t* bytes_of(const Tensor& t) { return t.defined() ? static_cast<uint8_t*>(t.data_ptr()) : nullptr; }

Tensor byte_buffer(int64_t n, Device device) { return Tensor::empty({(n + 3) / 4}, DType::Int32, device); }

// x (rows x cols, contiguous) -> its FP8 codes in format f, its amax already in
// meta[kFp8MetaAmax] (taken by the kernel that wrote x); `rowwise` / `transposed` pick the copies
// written (at least one).
Fp8Operand cast_operand(const Tensor& x, Tensor meta, int64_t rows, int64_t cols, Fp8Format f, bool rowwise,
                        bool transposed) {
  Fp8Operand q;
  const Device dev = x.device();
  q.meta = std::move(meta);
  // The cast always writes the row-major codes; a caller wanting only the transpose drops them.
  q.codes = byte_buffer(rows * cols, dev);
  if (transposed) q.codes_t = byte_buffer(rows * cols, dev);
  XT_KERNEL(dev, fp8_cast, x.dtype(), f, x.data_ptr(), rows, cols, q.meta.data<float>(), bytes_of(q.codes),
            bytes_of(q.codes_t), stream_for(dev));
  if (!rowwise) q.codes = Tensor();
  return q;
}

// A record whose amax a producing kernel raises (it starts at 0).
Tensor zero_meta(Device dev) { return zeros({kernels::kFp8MetaFloats}, DType::Float32, dev); }
float* amax_of(const Tensor& meta) { return meta.data<float>() + kernels::kFp8MetaAmax; }

// x (rows x cols, contiguous) -> its FP8 codes: an amax pass, then the cast (cast_operand).
Fp8Operand quantize(const Tensor& x, int64_t rows, int64_t cols, Fp8Format f, bool rowwise, bool transposed) {
  const Device dev = x.device();
  Tensor meta = Tensor::empty({kernels::kFp8MetaFloats}, DType::Float32, dev);
  XT_KERNEL(dev, fp8_amax, x.dtype(), x.data_ptr(), rows * cols, meta.data<float>(), stream_for(dev));
  return cast_operand(x, std::move(meta), rows, cols, f, rowwise, transposed);
}

// C [M, N] = A [M, K] . B [N, K]^T of two quantised operands, in dtype c_dt; with `into` (a
// contiguous [M, N] tensor of c_dt) C = round(A . B^T + into), written into it and returned.
Tensor gemm_fp8(Fp8Format fa, const Tensor& a, const Tensor& a_meta, Fp8Format fb, const Tensor& b,
                const Tensor& b_meta, int64_t M, int64_t N, int64_t K, DType c_dt, bool fast_accum,
                const Tensor& into = Tensor()) {
  const Device dev = a.device();
  const bool accumulate = into.defined();
  Tensor c = accumulate ? into : Tensor::empty({M, N}, c_dt, dev);
  XT_KERNEL(dev, fp8_gemm, fa, fb, M, N, K, bytes_of(a), a_meta.data<float>(), bytes_of(b), b_meta.data<float>(),
            c_dt, c.data_ptr(), accumulate, fast_accum, stream_for(dev));
  return c;
}

// A CUDA operand must start 16-byte aligned (the cast's vector loads, cuBLASLt's FP8 operands);
// a view into a larger buffer that does not is copied (the same values).
Tensor aligned(const Tensor& t) {
  return t.device().is_cuda() && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 ? clone(t) : t;
}

// The rows a GEMM runs over: M, or on CUDA M rounded up to a multiple of 16.
int64_t padded_rows(int64_t M, Device dev) { return dev.is_cuda() ? (M + 15) / 16 * 16 : M; }

// t viewed as [M, cols], with zero rows appended up to Mp (a copy), else as it is (aligned).
Tensor rows_padded(const Tensor& t, int64_t M, int64_t cols, int64_t Mp) {
  const Tensor t2 = t.view_as_shape({M, cols});
  if (Mp == M) return aligned(t2);
  Tensor p = zeros({Mp, cols}, t.dtype(), t.device());
  Tensor head = p.storage_view(0, {M, cols});
  copy_(head, t2);
  return p;
}

void check_linear_fp8(const Tensor& x, const Tensor& w) {
  check_defined(x, "x");
  check_defined(w, "weight");
  check_floating(x, "linear_fp8", "x");
  check_floating(w, "linear_fp8", "weight");
  check_dim(w, 2, "linear_fp8", "weight");
  check_same_device(x, w, "linear_fp8", "x", "weight");
  check_same_dtype(x, w, "linear_fp8", "x", "weight");
  XT_CHECK(x.dtype() != DType::Float64, TypeError,
           "linear_fp8: x and weight must be float32 or bfloat16 (the output's dtype), got float64");
  XT_CHECK(x.dim() >= 1 && x.shape().back() == w.size(1), ValueError, "linear_fp8: x ", x.describe(),
           " must end in the weight's in_features ", w.size(1), " (weight ", w.describe(), " is [out, in])");
  const int64_t K = w.size(1), N = w.size(0);
  const int64_t M = K ? x.numel() / K : 0;
  XT_CHECK(M > 0 && N > 0 && K > 0, ValueError, "linear_fp8: empty operands (x ", x.describe(), ", weight ",
           w.describe(), ")");
  XT_CHECK(!x.device().is_cuda() || (N % 16 == 0 && K % 16 == 0), ValueError, "linear_fp8 on CUDA: out_features (",
           N, ") and in_features (", K, ") must be multiples of 16 (cuBLASLt's FP8 GEMMs), weight ", w.describe());
}

// One weight's gradients from its output's quantised gradient gq (codes for dx, transposed codes
// for dW): dx (x's [Mp, K]) accumulated by the dgrad GEMM in its epilogue (undefined dx: written),
// dW [N, K] by the wgrad GEMM. w_t, x_t: the forward's transposed codes, with their records.
void linear_fp8_grads(const Fp8Operand& gq, const Tensor& w_t, const Tensor& w_meta, const Tensor& x_t,
                      const Tensor& x_meta, int64_t Mp, int64_t N, int64_t K, DType dt, bool want_dx, bool want_dw,
                      Tensor& dx, Tensor& dw) {
  if (want_dx)
    dx = gemm_fp8(Fp8Format::E5M2, gq.codes, gq.meta, Fp8Format::E4M3, w_t, w_meta, Mp, K, N, dt, /*fast_accum=*/false,
                  dx);
  if (want_dw)
    dw = gemm_fp8(Fp8Format::E5M2, gq.codes_t, gq.meta, Fp8Format::E4M3, x_t, x_meta, N, K, Mp, dt,
                  /*fast_accum=*/false);
}

// The node of linear_fp8 (one weight) and linear_fp8_multi: x's transposed codes and record once,
// each weight's; dx is the weights' dgrad GEMMs accumulated in their order, each GEMM adding its
// product into the dx of the ones before in its epilogue (dx = round(G_i + dx), one rounding per
// weight, no separate add kernel and no buffer per part). Saved: x's transposed codes and record,
// then each weight's.
class LinearFp8Backward : public NodeWithSavedList {
 public:
  LinearFp8Backward(const Fp8Operand& xq, const std::vector<Fp8Operand>& wqs, Shape xshape, int64_t M, int64_t Mp,
                    std::vector<int64_t> ns, int64_t K)
      : xshape_(std::move(xshape)), M_(M), Mp_(Mp), K_(K), ns_(std::move(ns)) {
    save("x_fp8_t", xq.codes_t);
    save("x_meta", xq.meta);
    for (size_t i = 0; i < wqs.size(); ++i) {
      save("weight_fp8_t[" + std::to_string(i) + "]", wqs[i].codes_t);
      save("weight_meta[" + std::to_string(i) + "]", wqs[i].meta);
    }
  }
  const char* name() const override { return "LinearFp8Backward"; }
  uint32_t num_outputs() const override { return static_cast<uint32_t>(ns_.size()); }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const size_t n = ns_.size();
    std::vector<Tensor> out(1 + n);
    const Tensor x_t = unpack(0), x_meta = unpack(1);
    Tensor dx;  // [Mp, K], the parts accumulated in the weights' order
    for (size_t i = 0; i < n; ++i) {
      const Tensor& g = grads[i];
      const bool want_dx = wants_grad(0), want_dw = wants_grad(1 + i);
      if (!g.defined() || !(want_dx || want_dw)) continue;
      const Tensor w_t = unpack(2 + 2 * i), w_meta = unpack(3 + 2 * i);
      const Tensor dy = rows_padded(g, M_, ns_[i], Mp_);
      const Fp8Operand gq = quantize(dy, Mp_, ns_[i], Fp8Format::E5M2, want_dx, want_dw);
      linear_fp8_grads(gq, w_t, w_meta, x_t, x_meta, Mp_, ns_[i], K_, g.dtype(), want_dx, want_dw, dx, out[1 + i]);
    }
    if (dx.defined()) out[0] = dx.storage_view(0, xshape_);  // the first M rows, x's shape
    return out;
  }

 private:
  Shape xshape_;
  int64_t M_, Mp_, K_;
  std::vector<int64_t> ns_;  // each weight's out_features
};


// Note [The FP8 MLP in one op]
// linear_fp8_multi(x, [w_gate, w_up]) -> swiglu -> linear_fp8(h, w_down), composed, runs an amax
// pass over h in the forward and over dgate and dup in the backward: three reads of an [M, ffn]
// operand per layer only to find a maximum (at qwen3-1.7b, batch 4 x 4096: 192 MiB each, 28
// layers). mlp_fp8 is that composition as one op whose swiglu kernels raise the amax of what they
// write (swiglu_forward / swiglu_backward's amax pointers), so each cast follows its producer
// directly. Everything else is the composition's: the same codes (a maximum is exact, so the amax
// is the same either way), the same GEMMs on the same operands and sizes, dx accumulated over gate
// then up; so the output and every gradient are the composition's bits (tests/test_fp8.py), and
// selective recompute, which runs the composition (MLP.hidden, then down_proj), changes no bit.
// Kept for backward, as the composition keeps them: x's transposed codes, the three weights'
// transposed codes, gate and up (swiglu's backward), h's transposed codes, and their records.
class MlpFp8Backward : public NodeWithSavedList {
 public:
  MlpFp8Backward(const Fp8Operand& xq, const Fp8Operand& gq, const Fp8Operand& uq, const Fp8Operand& dq,
                 const Tensor& gate, const Tensor& up, const Fp8Operand& hq, Shape xshape, int64_t M, int64_t Mp,
                 int64_t K, int64_t F, int64_t N)
      : xshape_(std::move(xshape)), M_(M), Mp_(Mp), K_(K), F_(F), N_(N) {
    save("x_fp8_t", xq.codes_t);
    save("x_meta", xq.meta);
    save("gate_weight_fp8_t", gq.codes_t);
    save("gate_weight_meta", gq.meta);
    save("up_weight_fp8_t", uq.codes_t);
    save("up_weight_meta", uq.meta);
    save("down_weight_fp8_t", dq.codes_t);
    save("down_weight_meta", dq.meta);
    save("gate", gate);
    save("up", up);
    save("hidden_fp8_t", hq.codes_t);
    save("hidden_meta", hq.meta);
  }
  const char* name() const override { return "MlpFp8Backward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    std::vector<Tensor> out(4);
    const Tensor& g = grads[0];
    const bool want_x = wants_grad(0), want_gate = wants_grad(1), want_up = wants_grad(2), want_down = wants_grad(3);
    const bool want_dh = want_x || want_gate || want_up;
    if (!g.defined() || !(want_dh || want_down)) return out;
    const Device dev = g.device();
    const DType dt = g.dtype();
    const Tensor dy = rows_padded(g, M_, N_, Mp_);
    const Fp8Operand dyq = quantize(dy, Mp_, N_, Fp8Format::E5M2, want_dh, want_down);
    Tensor dh;  // [Mp, F]
    linear_fp8_grads(dyq, unpack(6), unpack(7), unpack(10), unpack(11), Mp_, N_, F_, dt, want_dh, want_down, dh,
                     out[3]);
    if (!want_dh) return out;
    const Tensor gate_meta = zero_meta(dev), up_meta = zero_meta(dev);
    const auto [dgate, dup] = swiglu_backward(unpack(8), unpack(9), dh, amax_of(gate_meta), amax_of(up_meta));
    const Tensor x_t = unpack(0), x_meta = unpack(1);
    Tensor dx;  // [Mp, K]: gate's dgrad, then up's added in its epilogue (linear_fp8_multi's order)
    const auto part = [&](const Tensor& d, const Tensor& meta, bool want_w, int w_slot, Tensor& dw) {
      if (!(want_x || want_w)) return;
      const Fp8Operand q = cast_operand(d, meta, Mp_, F_, Fp8Format::E5M2, want_x, want_w);
      linear_fp8_grads(q, unpack(w_slot), unpack(w_slot + 1), x_t, x_meta, Mp_, F_, K_, dt, want_x, want_w, dx, dw);
    };
    part(dgate, gate_meta, want_gate, 2, out[1]);
    part(dup, up_meta, want_up, 4, out[2]);
    if (dx.defined()) out[0] = dx.storage_view(0, xshape_);  // the first M rows, x's shape
    return out;
  }

 private:
  Shape xshape_;
  int64_t M_, Mp_, K_, F_, N_;
};

}  // namespace

std::vector<Tensor> linear_fp8_multi(const Tensor& x, const std::vector<Tensor>& ws) {
  XT_CHECK(!ws.empty(), ValueError, "linear_fp8_multi: weights must not be empty");
  for (const Tensor& w : ws) check_linear_fp8(x, w);
  const int64_t K = ws[0].size(1), M = x.numel() / K, Mp = padded_rows(M, x.device());
  std::vector<Tensor> inputs{x};
  inputs.insert(inputs.end(), ws.begin(), ws.end());
  const bool record = needs_grad(inputs);
  const bool x_grad = record && x.requires_grad();
  bool w_grad = false;
  for (const Tensor& w : ws) w_grad = w_grad || (record && w.requires_grad());
  const Fp8Operand xq = quantize(rows_padded(x, M, K, Mp), Mp, K, Fp8Format::E4M3, true, w_grad);
  std::vector<Fp8Operand> wqs;
  std::vector<int64_t> ns;
  std::vector<Tensor> ys;
  for (const Tensor& w : ws) {
    const int64_t N = w.size(0);
    wqs.push_back(quantize(aligned(w), N, K, Fp8Format::E4M3, true, x_grad));
    Tensor y = gemm_fp8(Fp8Format::E4M3, xq.codes, xq.meta, Fp8Format::E4M3, wqs.back().codes, wqs.back().meta, Mp,
                        N, K, x.dtype(), /*fast_accum=*/true);
    Shape shape = x.shape();
    shape.back() = N;
    ys.push_back(y.storage_view(0, shape));  // the first M rows
    ns.push_back(N);
    wqs.back().codes = Tensor();  // the forward's copy: not kept (the node keeps the transpose, if x takes a grad)
  }
  if (record) {
    auto node = make_node<LinearFp8Backward>(inputs, xq, wqs, x.shape(), M, Mp, ns, K);
    for (size_t i = 0; i < ys.size(); ++i) set_history(ys[i], node, static_cast<uint32_t>(i));
  }
  return ys;
}

Tensor linear_fp8(const Tensor& x, const Tensor& w) { return linear_fp8_multi(x, {w})[0]; }

Tensor mlp_fp8(const Tensor& x, const Tensor& w_gate, const Tensor& w_up, const Tensor& w_down) {
  check_linear_fp8(x, w_gate);
  check_linear_fp8(x, w_up);
  XT_CHECK(w_gate.shape() == w_up.shape(), ValueError, "mlp_fp8: w_gate ", w_gate.describe(), " and w_up ",
           w_up.describe(), " must have the same shape");
  const int64_t K = w_gate.size(1), F = w_gate.size(0), M = x.numel() / K, Mp = padded_rows(M, x.device());
  check_defined(w_down, "w_down");
  check_floating(w_down, "mlp_fp8", "w_down");
  check_dim(w_down, 2, "mlp_fp8", "w_down");
  check_same_device(x, w_down, "mlp_fp8", "x", "w_down");
  check_same_dtype(x, w_down, "mlp_fp8", "x", "w_down");
  XT_CHECK(w_down.size(1) == F, ValueError, "mlp_fp8: w_down ", w_down.describe(), " must take the gate's ", F,
           " features (w_gate ", w_gate.describe(), "; weights are [out, in])");
  const int64_t N = w_down.size(0);
  XT_CHECK(N > 0, ValueError, "mlp_fp8: empty w_down ", w_down.describe());
  XT_CHECK(!x.device().is_cuda() || N % 16 == 0, ValueError, "mlp_fp8 on CUDA: w_down's out_features (", N,
           ") must be a multiple of 16 (cuBLASLt's FP8 GEMMs)");
  const std::vector<Tensor> inputs{x, w_gate, w_up, w_down};
  const bool record = needs_grad(inputs);
  const bool x_grad = record && x.requires_grad(), gate_grad = record && w_gate.requires_grad(),
             up_grad = record && w_up.requires_grad(), down_grad = record && w_down.requires_grad();
  const bool h_grad = x_grad || gate_grad || up_grad;  // the composition's hidden requires a gradient
  const Device dev = x.device();

  Fp8Operand xq = quantize(rows_padded(x, M, K, Mp), Mp, K, Fp8Format::E4M3, true, gate_grad || up_grad);
  Fp8Operand gq = quantize(aligned(w_gate), F, K, Fp8Format::E4M3, true, x_grad);
  Fp8Operand uq = quantize(aligned(w_up), F, K, Fp8Format::E4M3, true, x_grad);
  Tensor gate = gemm_fp8(Fp8Format::E4M3, xq.codes, xq.meta, Fp8Format::E4M3, gq.codes, gq.meta, Mp, F, K, x.dtype(),
                         /*fast_accum=*/true);
  Tensor up = gemm_fp8(Fp8Format::E4M3, xq.codes, xq.meta, Fp8Format::E4M3, uq.codes, uq.meta, Mp, F, K, x.dtype(),
                       /*fast_accum=*/true);
  xq.codes = gq.codes = uq.codes = Tensor();  // the forward's copies
  const Tensor h_meta = zero_meta(dev);
  const Tensor h = swiglu_forward(gate, up, amax_of(h_meta));  // padded rows: silu(0) * 0 = 0, no amax change
  Fp8Operand hq = cast_operand(h, h_meta, Mp, F, Fp8Format::E4M3, true, down_grad);
  Fp8Operand dq = quantize(aligned(w_down), N, F, Fp8Format::E4M3, true, h_grad);
  Tensor y = gemm_fp8(Fp8Format::E4M3, hq.codes, hq.meta, Fp8Format::E4M3, dq.codes, dq.meta, Mp, N, F, x.dtype(),
                      /*fast_accum=*/true);
  hq.codes = dq.codes = Tensor();
  Shape shape = x.shape();
  shape.back() = N;
  Tensor out = y.storage_view(0, shape);  // the first M rows
  if (record) {
    if (!h_grad) gate = up = Tensor();  // swiglu's backward runs only for dh's consumers
    auto node = make_node<MlpFp8Backward>(inputs, xq, gq, uq, dq, gate, up, hq, x.shape(), M, Mp, K, F, N);
    set_history(out, node, 0);
  }
  return out;
}

}  // namespace ops
}  // namespace xt
