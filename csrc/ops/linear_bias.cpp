// Biased linears with their epilogues fused into the GEMM (GPT-2's projections and MLP):
//   linear_bias(x, w, b)              = x @ w^T + b
//   gelu_mlp(x, w_fc, b_fc, w_pr, b_pr) = gelu_tanh(x @ w_fc^T + b_fc) @ w_pr^T + b_pr
// x [..., K] over all leading dims as [rows, K]; weights [out, in]; biases [out]; one dtype.
//
// On CUDA the bias (bfloat16, float32) and GELU (bfloat16) run in cuBLASLt's epilogues
// (kernels/cuda/gemm_lt.cu, Note [cuBLASLt epilogues: exact and deterministic]): the forward
// writes each output once, and gelu_mlp's backward applies GELU's derivative in the epilogue of
// the GEMM that makes the hidden gradient (DGELU, reading the pre-activation the forward kept), so
// neither the biased outputs nor the hidden gradient take an elementwise pass of their own. In
// float32 gelu_mlp is linear_bias, gelu, linear_bias. Bias gradients are
// ops::sum_to's ordered column sums of the output gradients (the unfused add's backward, the same
// bits); weight gradients and dx are the linear's GEMMs. Numerics: the bias and GELU act on the
// float32 accumulator, rounded once, where the unfused ops round after the GEMM, after the add and
// after GELU: equal within that rounding, not bitwise. Every choice (fused or composed, the GEMM
// algorithm) depends only on the call's shapes, dtypes and alignments, so a run repeats bit for
// bit and recompute (the same op re-run) gives the same bits.
//
// On the CPU, in float64, and where cuBLASLt has no algorithm, both ops are the composition of the
// unfused differentiable ops (linear, add, gelu), recorded on the tape as those ops: bitwise what
// the model computed before the fused ops existed.
#include "core/error.h"
#include "ops/dispatch.h"
#include "tape/node.h"

namespace xt {
namespace ops {

namespace {

using kernels::GemmEpilogue;

// A biased linear's operands: x [..., K], w [N, K], b [N], one dtype and device.
void check_biased(const Tensor& x, const Tensor& w, const Tensor& b, const char* op, const char* wn, const char* bn) {
  check_defined(w, wn);
  check_defined(b, bn);
  check_floating(w, op, wn);
  check_dim(w, 2, op, wn);
  check_same_device(x, w, op, "x", wn);
  check_same_device(x, b, op, "x", bn);
  check_same_dtype(x, w, op, "x", wn);
  check_same_dtype(x, b, op, "x", bn);
  XT_CHECK(b.dim() == 1 && b.numel() == w.size(0), ValueError, op, ": ", bn, " must have shape [", w.size(0),
           "] (", wn, "'s out_features), got ", b.describe());
}

void check_input(const Tensor& x, const char* op) {
  check_defined(x, "x");
  check_floating(x, op, "x");
  XT_CHECK(x.dim() >= 1, ValueError, op, ": x must have at least one dimension, got ", x.describe());
}

int64_t rows_of(const Tensor& x) { return shape_numel(Shape(x.shape().begin(), x.shape().end() - 1)); }

Shape with_last(const Tensor& x, int64_t n) {
  Shape s = x.shape();
  s.back() = n;
  return s;
}

// The fused GEMM on CUDA; false (nothing launched) on the CPU, for empty sizes, and where cuBLASLt
// has no algorithm.
bool fused_gemm(const Tensor& ref, GemmEpilogue ep, bool tb, int64_t M, int64_t N, int64_t K, const Tensor& a,
                const Tensor& b, const Tensor& c, const Tensor* bias, const Tensor* aux) {
#ifdef XT_CUDA
  if (!ref.device().is_cuda() || M == 0 || N == 0 || K == 0) return false;
  return kernels::cuda::gemm_epilogue(ref.dtype(), ep, false, tb, M, N, K, a.data_ptr(), b.data_ptr(), c.data_ptr(),
                                      bias ? bias->data_ptr() : nullptr, aux ? aux->data_ptr() : nullptr,
                                      stream_for(ref.device()));
#else
  (void)ref, (void)ep, (void)tb, (void)M, (void)N, (void)K, (void)a, (void)b, (void)c, (void)bias, (void)aux;
  return false;
#endif
}

// dx and dW of a linear y = x @ w^T from dy (rows x N), as LinearBackward computes them.
Tensor linear_dx(const Tensor& g2, const Tensor& w, const Shape& xshape) {
  return matmul_forward(g2, w, false, false).view_as_shape(xshape);
}
Tensor linear_dw(const Tensor& g2, const Tensor& x, DType w_dtype) {
  const int64_t K = x.shape().back();
  return matmul_out_dtype(g2, x.view_as_shape({rows_of(x), K}), true, false, w_dtype);
}

class LinearBiasBackward : public NodeWithSaved<2> {
 public:
  LinearBiasBackward(const Tensor& x, const Tensor& w)
      : NodeWithSaved({SavedTensor("x", x), SavedTensor("weight", w)}) {}
  const char* name() const override { return "LinearBiasBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    std::vector<Tensor> out(3);
    if (!g.defined()) return out;
    const auto [x, w] = unpack();
    const int64_t N = g.shape().back();
    const Tensor g2 = g.view_as_shape({rows_of(g), N});
    if (wants_grad(0)) out[0] = linear_dx(g2, w, with_last(g, w.size(1)));
    if (wants_grad(1)) out[1] = linear_dw(g2, x, w.dtype());
    if (wants_grad(2)) out[2] = sum_to(g, {N});
    return out;
  }
};

// Inputs: x, w_fc, b_fc, w_pr, b_pr. Saves x, the weights, the pre-activation and GELU's output.
class GeluMlpBackward : public NodeWithSaved<5> {
 public:
  GeluMlpBackward(const Tensor& x, const Tensor& w_fc, const Tensor& w_pr, const Tensor& pre, const Tensor& h)
      : NodeWithSaved({SavedTensor("x", x), SavedTensor("fc_weight", w_fc), SavedTensor("proj_weight", w_pr),
                       SavedTensor("pre", pre), SavedTensor("hidden", h)}) {}
  const char* name() const override { return "GeluMlpBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    std::vector<Tensor> out(5);
    if (!g.defined()) return out;
    const auto [x, w_fc, w_pr, pre, h] = unpack();
    const int64_t N = g.shape().back(), F = w_pr.size(1), rows = rows_of(g);
    const Tensor g2 = g.view_as_shape({rows, N});
    if (wants_grad(4)) out[4] = sum_to(g, {N});
    if (wants_grad(3)) out[3] = linear_dw(g2, h, w_pr.dtype());
    if (!wants_grad(0) && !wants_grad(1) && !wants_grad(2)) return out;
    // dpre = (dy @ w_pr) * gelu'(pre): GELU's derivative in the GEMM's epilogue where it can.
    Tensor dpre = Tensor::empty({rows, F}, g.dtype(), g.device());
    if (!fused_gemm(g, GemmEpilogue::DGelu, false, rows, F, N, g2, w_pr, dpre, nullptr, &pre))
      dpre = unary_backward(kernels::UnaryOp::Gelu, pre, matmul_forward(g2, w_pr, false, false));
    if (wants_grad(2)) out[2] = sum_to(dpre, {F});
    if (wants_grad(1)) out[1] = linear_dw(dpre, x, w_fc.dtype());
    if (wants_grad(0)) out[0] = linear_dx(dpre, w_fc, with_last(g, w_fc.size(1)));
    return out;
  }
};

// x @ w^T + b in one GEMM (Bias epilogue); undefined when that cannot run (then compose).
Tensor linear_bias_fused(const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t K = w.size(1), N = w.size(0), rows = rows_of(x);
  Tensor y = Tensor::empty({rows, N}, x.dtype(), x.device());
  if (!fused_gemm(x, GemmEpilogue::Bias, true, rows, N, K, x.view_as_shape({rows, K}), w, y, &b, nullptr))
    return Tensor();
  return y.view_as_shape(with_last(x, N));
}

void check_linear_bias(const Tensor& x, const Tensor& w, const Tensor& b) {
  const char* op = "linear_bias";
  check_input(x, op);
  check_biased(x, w, b, op, "weight", "bias");
  XT_CHECK(x.shape().back() == w.size(1), ValueError, op, ": x ", x.describe(),
           " must end in the weight's in_features ", w.size(1), " (weight ", w.describe(), " is [out, in])");
}

}  // namespace

Tensor linear_bias(const Tensor& x, const Tensor& w, const Tensor& b) {
  check_linear_bias(x, w, b);
  Tensor y = x.device().is_cuda() ? linear_bias_fused(x, w, b) : Tensor();
  if (!y.defined()) return add(linear(x, w), b);
  if (needs_grad({&x, &w, &b}))
    set_history(y, make_node<LinearBiasBackward>({x, w, b}, w.requires_grad() ? x : Tensor(),
                                                 x.requires_grad() ? w : Tensor()));
  return y;
}

Tensor gelu_mlp(const Tensor& x, const Tensor& w_fc, const Tensor& b_fc, const Tensor& w_pr, const Tensor& b_pr) {
  const char* op = "gelu_mlp";
  check_input(x, op);
  check_biased(x, w_fc, b_fc, op, "fc_weight", "fc_bias");
  check_biased(x, w_pr, b_pr, op, "proj_weight", "proj_bias");
  const int64_t K = x.shape().back(), F = w_fc.size(0), N = w_pr.size(0), rows = rows_of(x);
  XT_CHECK(w_fc.size(1) == K && w_pr.size(1) == F, ValueError, op, ": x ", x.describe(), ", fc_weight ",
           w_fc.describe(), " and proj_weight ", w_pr.describe(),
           " do not chain (x [..., K], fc_weight [F, K], proj_weight [N, F])");
  // The composition: on the CPU linear then add, bitwise the unfused ops; on CUDA the BIAS GEMMs
  // around the engine's GELU (float32, and where the GELU epilogues have no algorithm).
  const auto composed = [&] { return linear_bias(gelu(linear_bias(x, w_fc, b_fc)), w_pr, b_pr); };
  if (!x.device().is_cuda() || x.dtype() != DType::BFloat16) return composed();  // GELU epilogues: bf16 only
  Tensor pre = Tensor::empty({rows, F}, x.dtype(), x.device());
  Tensor h = Tensor::empty({rows, F}, x.dtype(), x.device());
  if (!fused_gemm(x, GemmEpilogue::GeluAuxBias, true, rows, F, K, x.view_as_shape({rows, K}), w_fc, h, &b_fc, &pre))
    return composed();
  Tensor y = Tensor::empty({rows, N}, x.dtype(), x.device());
  if (!fused_gemm(x, GemmEpilogue::Bias, true, rows, N, F, h, w_pr, y, &b_pr, nullptr))
    y = binary(kernels::BinaryOp::Add, matmul_forward(h, w_pr, false, true), b_pr);
  y = y.view_as_shape(with_last(x, N));
  if (needs_grad({&x, &w_fc, &b_fc, &w_pr, &b_pr}))
    set_history(y, make_node<GeluMlpBackward>({x, w_fc, b_fc, w_pr, b_pr}, x, w_fc, w_pr, pre, h));
  return y;
}

}  // namespace ops
}  // namespace xt
