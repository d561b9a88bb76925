// Differentiable matmul and linear.
//
// matmul: C = A @ B (2-D, or batched 3-D); dA = dC @ B^T, dB = A^T @ dC, each one GEMM with the
// transpose folded into the BLAS call (no transposed copies). An [..., K] @ [K, N] product is
// flattened to 2-D first. linear: y = x @ W^T over all leading dims as [rows, K]; dx = dy @ W,
// dW = dy^T @ x as one GEMM over every row, written in W's dtype.
#include "core/error.h"
#include "ops/ops.h"
#include "tape/functions.h"
#include "tape/node.h"

namespace xt {
namespace tape {

namespace {

bool wants(const Node& n, size_t i) { return i < n.next_edges.size() && n.next_edges[i].valid(); }

class MatmulBackward : public Node {
 public:
  MatmulBackward(Tensor a, Tensor b) : a_(std::move(a)), b_(std::move(b)) {}
  const char* name() const override { return "MatmulBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    std::vector<Tensor> out(2);
    if (!g.defined()) return out;
    if (wants(*this, 0)) out[0] = ops::matmul(g, b_, false, true);
    if (wants(*this, 1)) out[1] = ops::matmul(a_, g, true, false);
    return out;
  }
  void release_saved() override {
    a_ = Tensor();
    b_ = Tensor();
  }

 private:
  Tensor a_, b_;  // a is kept only when b needs grad, and b only when a does
};

class LinearBackward : public Node {
 public:
  LinearBackward(Tensor x, Tensor w, DType w_dtype) : x_(std::move(x)), w_(std::move(w)), w_dtype_(w_dtype) {}
  const char* name() const override { return "LinearBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    std::vector<Tensor> out(2);
    if (!g.defined()) return out;
    const int64_t N = g.shape().back();
    const int64_t rows = N ? g.numel() / N : 0;
    Tensor g2 = g.view_as_shape({rows, N});  // (rows, N)
    if (wants(*this, 0)) {
      const int64_t K = w_.size(1);
      Shape xshape = g.shape();
      xshape.back() = K;
      out[0] = ops::matmul(g2, w_, false, false).view_as_shape(xshape);  // (rows, K)
    }
    if (wants(*this, 1)) {
      const int64_t K = x_.shape().back();
      out[1] = ops::matmul_out_dtype(g2, x_.view_as_shape({rows, K}), true, false, w_dtype_);  // (N, K)
    }
    return out;
  }
  void release_saved() override {
    x_ = Tensor();
    w_ = Tensor();
  }

 private:
  Tensor x_, w_;  // x kept only when w needs grad, w only when x does
  DType w_dtype_;
};

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  ops::check_defined(a, "a");
  ops::check_defined(b, "b");
  if (a.dim() > 2 && b.dim() == 2) {  // [..., K] @ [K, N]: one 2-D GEMM over all rows
    XT_CHECK(a.shape().back() == b.size(0), ValueError, "matmul: inner dimensions differ: a ", a.describe(),
             " has K=", a.shape().back(), " but b ", b.describe(), " has K=", b.size(0));
    Shape out_shape = a.shape();
    out_shape.back() = b.size(1);
    return reshape(matmul(reshape(a, {-1, a.shape().back()}), b), out_shape);
  }
  Tensor out = ops::matmul(a, b);
  if (!needs_grad({&a, &b})) return out;
  auto node = make_node<MatmulBackward>({a, b}, b.requires_grad() ? a.detach() : Tensor(),
                                        a.requires_grad() ? b.detach() : Tensor());
  set_history(out, node);
  return out;
}

Tensor linear(const Tensor& x, const Tensor& w) {
  Tensor out = ops::linear(x, w);
  if (!needs_grad({&x, &w})) return out;
  auto node = make_node<LinearBackward>({x, w}, w.requires_grad() ? x.detach() : Tensor(),
                                        x.requires_grad() ? w.detach() : Tensor(), w.dtype());
  set_history(out, node);
  return out;
}

}  // namespace tape
}  // namespace xt
