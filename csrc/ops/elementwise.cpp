// Elementwise ops: broadcasting binary ops, scalar and unary ops (activations included), SwiGLU,
// and the raw helpers accumulate_ and sum_to (the gradient of a broadcast); forward and backward.
//
// Gradients of broadcast inputs are reduced back to the input's shape with sum_to. Nodes save
// only the tensors their backward reads (mul: the other input; div: b, and a when b needs grad;
// exp/sqrt: the output; log and the activations: x). Unary ops whose gradient is a formula of x
// (unary_has_grad_kernel: SiLU, GELU, tanh) run one unary_backward kernel; the others compose
// binary ops.
// The unary ops Python sees are the rows of unary_ops(): a new one is a row there plus its
// formula and gradient in kernels/common.h (docs/ops.md).
//
// Broadcasting follows numpy: shapes align on the right, a dimension of 1 stretches. Equal
// shapes take the fast path (no Broadcast at all). Otherwise the Broadcast handed to the
// kernel is simplified first: size-1 dimensions are dropped and neighbours that are contiguous
// for both operands are merged, so [B, S, D] + [D] reaches the kernel as [B*S, D].
#include <algorithm>

#include "core/error.h"
#include "ops/dispatch.h"
#include "tape/node.h"

namespace xt {
namespace ops {

const std::vector<UnaryOpInfo>& unary_ops() {
  static const std::vector<UnaryOpInfo> table = {
      {kernels::UnaryOp::Neg, "neg", "NegBackward", "-x"},
      {kernels::UnaryOp::Exp, "exp", "ExpBackward", "e ** x"},
      {kernels::UnaryOp::Log, "log", "LogBackward", "Natural logarithm"},
      {kernels::UnaryOp::Sqrt, "sqrt", "SqrtBackward", "Square root"},
      {kernels::UnaryOp::Silu, "silu", "SiluBackward", "x * sigmoid(x)"},
      {kernels::UnaryOp::Gelu, "gelu", "GeluBackward",
       "GELU, tanh approximation: x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))), as GPT-2 and "
       "torch.nn.functional.gelu(x, approximate='tanh')"},
      {kernels::UnaryOp::Tanh, "tanh", "TanhBackward",
       "Hyperbolic tangent (e.g. logit soft-capping: cap * tanh(logits / cap))"},
  };
  return table;
}

namespace {

const char* binary_name(kernels::BinaryOp op) {
  switch (op) {
    case kernels::BinaryOp::Add: return "add";
    case kernels::BinaryOp::Sub: return "sub";
    case kernels::BinaryOp::Mul: return "mul";
    case kernels::BinaryOp::Div: return "div";
  }
  return "binary";
}

const char* scalar_name(kernels::ScalarOp op) {
  switch (op) {
    case kernels::ScalarOp::Add: return "add_scalar";
    case kernels::ScalarOp::Mul: return "mul_scalar";
    case kernels::ScalarOp::RSub: return "rsub_scalar";
    case kernels::ScalarOp::Div: return "div_scalar";
    case kernels::ScalarOp::RDiv: return "rdiv_scalar";
    case kernels::ScalarOp::Pow: return "pow_scalar";
  }
  return "scalar op";
}

const UnaryOpInfo* unary_info(kernels::UnaryOp op) {
  for (const UnaryOpInfo& u : unary_ops())
    if (u.op == op) return &u;
  return nullptr;
}

const char* unary_name(kernels::UnaryOp op) {
  const UnaryOpInfo* u = unary_info(op);
  return u ? u->name : "unary op";
}

std::vector<int64_t> contiguous_strides(const Shape& s) {
  std::vector<int64_t> st(s.size());
  int64_t acc = 1;
  for (size_t d = s.size(); d-- > 0;) {
    st[d] = acc;
    acc *= s[d];
  }
  return st;
}

// Strides of `s` right-aligned to `out` (ndim out.size()): 0 where s lacks the dim or stretches it.
std::vector<int64_t> aligned_strides(const Shape& s, const Shape& out) {
  std::vector<int64_t> st(out.size(), 0);
  const std::vector<int64_t> own = contiguous_strides(s);
  const size_t lead = out.size() - s.size();
  for (size_t d = 0; d < s.size(); ++d) st[lead + d] = (s[d] == 1 && out[lead + d] != 1) ? 0 : own[d];
  return st;
}

// Drop size-1 dims, merge neighbours that are contiguous for both stride sets.
kernels::Broadcast make_broadcast(const Shape& shape, const std::vector<int64_t>& s1, const std::vector<int64_t>& s2,
                                  const char* op) {
  std::vector<int64_t> sh, a, b;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!sh.empty() && a.back() == s1[d] * shape[d] && b.back() == s2[d] * shape[d]) {
      sh.back() *= shape[d];
      a.back() = s1[d];
      b.back() = s2[d];
    } else {
      sh.push_back(shape[d]);
      a.push_back(s1[d]);
      b.push_back(s2[d]);
    }
  }
  XT_CHECK(sh.size() <= static_cast<size_t>(kernels::kMaxDims), ValueError, op, ": broadcasting over shape ",
           shape_str(shape), " needs ", sh.size(), " dimensions after merging; at most ", kernels::kMaxDims,
           " are supported");
  kernels::Broadcast bc;
  bc.ndim = static_cast<int>(sh.size());
  for (size_t d = 0; d < sh.size(); ++d) {
    bc.shape[d] = sh[d];
    bc.astride[d] = a[d];
    bc.bstride[d] = b[d];
  }
  return bc;
}

void check_binary_args(const Tensor& a, const Tensor& b, const char* op) {
  check_floating(a, op, "a");
  check_floating(b, op, "b");
  check_same_device(a, b, op, "a", "b");
  check_same_dtype(a, b, op, "a", "b");
}

}  // namespace

Shape broadcast_shape(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    XT_CHECK(da == db || da == 1 || db == 1, ValueError, op, ": shapes ", shape_str(a), " and ", shape_str(b),
             " cannot be broadcast together (dimension ", i, " is ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Tensor binary(kernels::BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = binary_name(op);
  check_binary_args(a, b, name);
  const Device dev = a.device();
  if (a.shape() == b.shape()) {
    Tensor out = Tensor::empty(a.shape(), a.dtype(), dev);
    if (out.numel())
      XT_KERNEL(dev, binary, op, a.dtype(), a.data_ptr(), b.data_ptr(), out.data_ptr(), out.numel(), nullptr,
                stream_for(dev));
    return out;
  }
  const Shape shape = broadcast_shape(a.shape(), b.shape(), name);
  Tensor out = Tensor::empty(shape, a.dtype(), dev);
  if (out.numel() == 0) return out;
  const kernels::Broadcast bc =
      make_broadcast(shape, aligned_strides(a.shape(), shape), aligned_strides(b.shape(), shape), name);
  XT_KERNEL(dev, binary, op, a.dtype(), a.data_ptr(), b.data_ptr(), out.data_ptr(), out.numel(), &bc,
            stream_for(dev));
  return out;
}

Tensor scalar_op(kernels::ScalarOp op, const Tensor& x, double s) {
  check_floating(x, scalar_name(op), "x");
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (out.numel())
    XT_KERNEL(x.device(), scalar_op, op, x.dtype(), x.data_ptr(), out.data_ptr(), out.numel(), s,
              stream_for(x.device()));
  return out;
}

Tensor unary(kernels::UnaryOp op, const Tensor& x) {
  check_floating(x, unary_name(op), "x");
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (out.numel())
    XT_KERNEL(x.device(), unary, op, x.dtype(), x.data_ptr(), out.data_ptr(), out.numel(), stream_for(x.device()));
  return out;
}

void accumulate_(Tensor& a, const Tensor& b, double alpha) {
  check_binary_args(a, b, "accumulate_");
  XT_CHECK(a.shape() == b.shape(), ValueError, "accumulate_: a ", a.describe(), " and b ", b.describe(),
           " must have the same shape");
  a.bump_version();
  if (a.numel())
    XT_KERNEL(a.device(), accumulate, a.dtype(), a.data_ptr(), b.data_ptr(), a.numel(), alpha,
              stream_for(a.device()));
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
  check_floating(g, "sum_to", "g");
  if (g.shape() == shape) return g;
  const Shape& in = g.shape();
  bool ok = shape.size() <= in.size();
  for (size_t d = 0; ok && d < shape.size(); ++d) {
    const int64_t o = shape[d], i = in[in.size() - shape.size() + d];
    ok = o == i || o == 1;
  }
  XT_CHECK(ok, ValueError, "sum_to: cannot reduce a gradient of shape ", shape_str(in), " to shape ",
           shape_str(shape), ": the target must broadcast to the gradient's shape");
  if (shape_numel(shape) == 0) return Tensor::empty(shape, g.dtype(), g.device());
  if (g.numel() == 0) return full(shape, 0.0, g.dtype(), g.device());
  Tensor out = Tensor::empty(shape, g.dtype(), g.device());
  const kernels::Broadcast bc = make_broadcast(in, contiguous_strides(in), aligned_strides(shape, in), "sum_to");
  XT_KERNEL(g.device(), sum_to, g.dtype(), g.data_ptr(), out.data_ptr(), out.numel(), &bc, stream_for(g.device()));
  return out;
}

Tensor unary_backward(kernels::UnaryOp op, const Tensor& x, const Tensor& dy) {
  XT_ASSERT(kernels::unary_has_grad_kernel(op), "unary_backward: no gradient kernel for ", unary_name(op));
  check_binary_args(x, dy, "unary_backward");
  XT_CHECK(x.shape() == dy.shape(), ValueError, unary_name(op), " backward: x ", x.describe(), " and dy ",
           dy.describe(), " must have the same shape");
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (dx.numel())
    XT_KERNEL(x.device(), unary_backward, op, x.dtype(), x.data_ptr(), dy.data_ptr(), dx.data_ptr(), dx.numel(),
              stream_for(x.device()));
  return dx;
}

Tensor swiglu_forward(const Tensor& gate, const Tensor& up, float* out_amax) {
  check_floating(gate, "swiglu", "gate");
  check_floating(up, "swiglu", "up");
  check_same_device(gate, up, "swiglu", "gate", "up");
  check_same_dtype(gate, up, "swiglu", "gate", "up");
  XT_CHECK(gate.shape() == up.shape(), ValueError, "swiglu: gate ", gate.describe(), " and up ", up.describe(),
           " must have the same shape");
  Tensor out = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
  if (out.numel())
    XT_KERNEL(gate.device(), swiglu_forward, gate.dtype(), gate.data_ptr(), up.data_ptr(), out.data_ptr(),
              out.numel(), out_amax, stream_for(gate.device()));
  return out;
}

std::pair<Tensor, Tensor> swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout, float* dgate_amax,
                                          float* dup_amax) {
  check_floating(dout, "swiglu_backward", "dout");
  check_same_device(gate, dout, "swiglu_backward", "gate", "dout");
  check_same_dtype(gate, dout, "swiglu_backward", "gate", "dout");
  XT_CHECK(gate.shape() == up.shape() && gate.shape() == dout.shape(), ValueError,
           "swiglu_backward: gate ", gate.describe(), ", up ", up.describe(), " and dout ", dout.describe(),
           " must have the same shape");
  check_same_dtype(gate, up, "swiglu_backward", "gate", "up");
  // dgate and dup in one buffer, dup right after dgate: the merged gate/up projection's backward
  // then computes both weight gradients as one batched GEMM (Note [Merged projections]).
  Tensor both = Tensor::empty({2 * gate.numel()}, gate.dtype(), gate.device());
  Tensor dgate = both.storage_view(0, gate.shape());
  Tensor dup = both.storage_view(gate.numel(), gate.shape());
  if (dgate.numel())
    XT_KERNEL(gate.device(), swiglu_backward, gate.dtype(), gate.data_ptr(), up.data_ptr(), dout.data_ptr(),
              dgate.data_ptr(), dup.data_ptr(), dgate.numel(), dgate_amax, dup_amax, stream_for(gate.device()));
  return {dgate, dup};
}

// ---------------------------------------------------------------- differentiable ops

namespace {

using kernels::BinaryOp;
using kernels::ScalarOp;
using kernels::UnaryOp;

Tensor neg_of(const Tensor& t) { return unary(UnaryOp::Neg, t); }

class BinaryBackward : public NodeWithSaved<2> {
 public:
  // a and b only when the backward reads them (undefined otherwise).
  BinaryBackward(BinaryOp op, const Tensor& a, const Tensor& b, Shape a_shape, Shape b_shape)
      : NodeWithSaved({SavedTensor("a", a), SavedTensor("b", b)}), op_(op), a_shape_(std::move(a_shape)),
        b_shape_(std::move(b_shape)) {}

  const char* name() const override {
    switch (op_) {
      case BinaryOp::Add: return "AddBackward";
      case BinaryOp::Sub: return "SubBackward";
      case BinaryOp::Mul: return "MulBackward";
      case BinaryOp::Div: return "DivBackward";
    }
    return "BinaryBackward";
  }

  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    std::vector<Tensor> out(2);
    if (!g.defined()) return out;
    const auto [a, b] = unpack();
    const bool da = wants_grad(0), db = wants_grad(1);
    switch (op_) {
      case BinaryOp::Add:
        if (da) out[0] = sum_to(g, a_shape_);
        if (db) out[1] = sum_to(g, b_shape_);
        break;
      case BinaryOp::Sub:
        if (da) out[0] = sum_to(g, a_shape_);
        if (db) out[1] = neg_of(sum_to(g, b_shape_));
        break;
      case BinaryOp::Mul:
        if (da) out[0] = sum_to(binary(BinaryOp::Mul, g, b), a_shape_);
        if (db) out[1] = sum_to(binary(BinaryOp::Mul, g, a), b_shape_);
        break;
      case BinaryOp::Div:
        // d(a/b)/da = 1/b ; d(a/b)/db = -a / b^2
        if (da) out[0] = sum_to(binary(BinaryOp::Div, g, b), a_shape_);
        if (db) {
          Tensor num = binary(BinaryOp::Mul, g, a);
          Tensor t = binary(BinaryOp::Div, num, binary(BinaryOp::Mul, b, b));
          out[1] = neg_of(sum_to(t, b_shape_));
        }
        break;
    }
    return out;
  }

 private:
  BinaryOp op_;
  Shape a_shape_, b_shape_;
};

Tensor binary_op(BinaryOp op, const Tensor& a, const Tensor& b) {
  Tensor out = binary(op, a, b);
  if (!needs_grad({&a, &b})) return out;
  Tensor sa, sb;
  const bool a_grad = a.requires_grad(), b_grad = b.requires_grad();
  if (op == BinaryOp::Mul) {
    if (b_grad) sa = a;
    if (a_grad) sb = b;
  } else if (op == BinaryOp::Div) {
    sb = b;
    if (b_grad) sa = a;
  }
  set_history(out, make_node<BinaryBackward>({a, b}, op, sa, sb, a.shape(), b.shape()));
  return out;
}

class ScalarBackward : public NodeWithSaved<1> {
 public:
  ScalarBackward(ScalarOp op, double s, const Tensor& x) : NodeWithSaved({SavedTensor("x", x)}), op_(op), s_(s) {}

  const char* name() const override {
    switch (op_) {
      case ScalarOp::Add: return "AddScalarBackward";
      case ScalarOp::Mul: return "MulScalarBackward";
      case ScalarOp::RSub: return "RSubScalarBackward";
      case ScalarOp::Div: return "DivScalarBackward";
      case ScalarOp::RDiv: return "RDivScalarBackward";
      case ScalarOp::Pow: return "PowScalarBackward";
    }
    return "ScalarBackward";
  }

  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    if (!g.defined()) return {Tensor()};
    const auto [x] = unpack();
    switch (op_) {
      case ScalarOp::Add: return {g};
      case ScalarOp::Mul: return {scalar_op(ScalarOp::Mul, g, s_)};
      case ScalarOp::RSub: return {neg_of(g)};
      case ScalarOp::Div: return {scalar_op(ScalarOp::Div, g, s_)};
      case ScalarOp::RDiv: {  // d(s/x)/dx = -s / x^2
        Tensor t = scalar_op(ScalarOp::Mul, g, -s_);
        return {binary(BinaryOp::Div, t, binary(BinaryOp::Mul, x, x))};
      }
      case ScalarOp::Pow: {  // d(x^s)/dx = s * x^(s-1); zero for s == 0
        if (s_ == 0.0) return {full(g.shape(), 0.0, g.dtype(), g.device())};
        Tensor d = scalar_op(ScalarOp::Mul, scalar_op(ScalarOp::Pow, x, s_ - 1.0), s_);
        return {binary(BinaryOp::Mul, g, d)};
      }
    }
    return {Tensor()};
  }

 private:
  ScalarOp op_;
  double s_;
};

Tensor scalar_fn(ScalarOp op, const Tensor& x, double s) {
  Tensor out = scalar_op(op, x, s);
  if (!needs_grad({&x})) return out;
  const bool keep_x = op == ScalarOp::RDiv || op == ScalarOp::Pow;  // the others never read x
  set_history(out, make_node<ScalarBackward>({x}, op, s, keep_x ? x : Tensor()));
  return out;
}

class UnaryBackward : public NodeWithSaved<1> {
 public:
  // `saved` is x (log and the unary_has_grad_kernel ops), the output (exp, sqrt), or nothing (neg).
  UnaryBackward(UnaryOp op, const Tensor& saved)
      : NodeWithSaved({SavedTensor(saves_output(op) ? "result" : "x", saved)}), op_(op) {}

  static bool saves_output(UnaryOp op) { return op == UnaryOp::Exp || op == UnaryOp::Sqrt; }

  const char* name() const override {
    const UnaryOpInfo* u = unary_info(op_);
    return u ? u->backward : "UnaryBackward";
  }

  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    if (!g.defined()) return {Tensor()};
    const auto [saved] = unpack();
    if (kernels::unary_has_grad_kernel(op_)) return {unary_backward(op_, saved, g)};
    switch (op_) {
      case UnaryOp::Neg: return {neg_of(g)};
      case UnaryOp::Exp: return {binary(BinaryOp::Mul, g, saved)};
      case UnaryOp::Log: return {binary(BinaryOp::Div, g, saved)};
      case UnaryOp::Sqrt: return {binary(BinaryOp::Div, g, scalar_op(ScalarOp::Mul, saved, 2.0))};
      default: break;
    }
    throw RuntimeError(str("xtrain internal error: no backward for unary op ", unary_name(op_)));
  }

 private:
  UnaryOp op_;
};

class SwigluBackward : public NodeWithSaved<2> {
 public:
  SwigluBackward(const Tensor& gate, const Tensor& up)
      : NodeWithSaved({SavedTensor("gate", gate), SavedTensor("up", up)}) {}
  const char* name() const override { return "SwigluBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!grads[0].defined()) return {Tensor(), Tensor()};
    const auto [gate, up] = unpack();
    auto [dgate, dup] = swiglu_backward(gate, up, grads[0]);
    return {dgate, dup};
  }
};

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::Add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::Sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::Mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::Div, a, b); }

Tensor add_scalar(const Tensor& x, double s) { return scalar_fn(ScalarOp::Add, x, s); }
Tensor mul_scalar(const Tensor& x, double s) { return scalar_fn(ScalarOp::Mul, x, s); }
Tensor rsub_scalar(const Tensor& x, double s) { return scalar_fn(ScalarOp::RSub, x, s); }
Tensor div_scalar(const Tensor& x, double s) { return scalar_fn(ScalarOp::Div, x, s); }
Tensor rdiv_scalar(const Tensor& x, double s) { return scalar_fn(ScalarOp::RDiv, x, s); }
Tensor pow_scalar(const Tensor& x, double s) { return scalar_fn(ScalarOp::Pow, x, s); }

Tensor unary_fn(UnaryOp op, const Tensor& x) {
  Tensor out = unary(op, x);
  if (!needs_grad({&x})) return out;
  const Tensor saved = UnaryBackward::saves_output(op) ? out : op == UnaryOp::Neg ? Tensor() : x;
  set_history(out, make_node<UnaryBackward>({x}, op, saved));
  return out;
}

Tensor neg(const Tensor& x) { return unary_fn(UnaryOp::Neg, x); }
Tensor exp(const Tensor& x) { return unary_fn(UnaryOp::Exp, x); }
Tensor log(const Tensor& x) { return unary_fn(UnaryOp::Log, x); }
Tensor sqrt(const Tensor& x) { return unary_fn(UnaryOp::Sqrt, x); }
Tensor silu(const Tensor& x) { return unary_fn(UnaryOp::Silu, x); }
Tensor gelu(const Tensor& x) { return unary_fn(UnaryOp::Gelu, x); }

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  Tensor out = swiglu_forward(gate, up);
  if (needs_grad({&gate, &up})) set_history(out, make_node<SwigluBackward>({gate, up}, gate, up));
  return out;
}

}  // namespace ops
}  // namespace xt
