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
#include <atomic>

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

}  // namespace ops
}  // namespace xt
