// Differentiable elementwise ops: binary (broadcasting), scalar, unary, SiLU, SwiGLU, cast,
// cast_many, to, dropout. Each forward calls ops:: and, when an input needs grad, records its Node.
//
// Gradients of broadcast inputs are reduced back to the input's shape with ops::sum_to.
// Nodes save detached tensors only, and only those their backward reads. Dropout saves no
// mask: its backward reruns ops::dropout on the gradient with the forward's (seed, offset).
#include "core/error.h"
#include "ops/ops.h"
#include "tape/functions.h"
#include "tape/node.h"

namespace xt {
namespace tape {

namespace {

using kernels::BinaryOp;
using kernels::ScalarOp;
using kernels::UnaryOp;

bool wants(const Node& n, size_t i) { return i < n.next_edges.size() && n.next_edges[i].valid(); }

Tensor neg_of(const Tensor& t) { return ops::unary(UnaryOp::Neg, t); }

// ---------------------------------------------------------------- binary

class BinaryBackward : public Node {
 public:
  BinaryBackward(BinaryOp op, Tensor a, Tensor b, Shape a_shape, Shape b_shape)
      : op_(op), a_(std::move(a)), b_(std::move(b)), a_shape_(std::move(a_shape)), b_shape_(std::move(b_shape)) {}

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
    const bool da = wants(*this, 0), db = wants(*this, 1);
    switch (op_) {
      case BinaryOp::Add:
        if (da) out[0] = ops::sum_to(g, a_shape_);
        if (db) out[1] = ops::sum_to(g, b_shape_);
        break;
      case BinaryOp::Sub:
        if (da) out[0] = ops::sum_to(g, a_shape_);
        if (db) out[1] = neg_of(ops::sum_to(g, b_shape_));
        break;
      case BinaryOp::Mul:
        if (da) out[0] = ops::sum_to(ops::binary(BinaryOp::Mul, g, b_), a_shape_);
        if (db) out[1] = ops::sum_to(ops::binary(BinaryOp::Mul, g, a_), b_shape_);
        break;
      case BinaryOp::Div:
        // d(a/b)/da = 1/b ; d(a/b)/db = -a / b^2
        if (da) out[0] = ops::sum_to(ops::binary(BinaryOp::Div, g, b_), a_shape_);
        if (db) {
          Tensor num = ops::binary(BinaryOp::Mul, g, a_);
          Tensor t = ops::binary(BinaryOp::Div, num, ops::binary(BinaryOp::Mul, b_, b_));
          out[1] = neg_of(ops::sum_to(t, b_shape_));
        }
        break;
    }
    return out;
  }

  void release_saved() override {
    a_ = Tensor();
    b_ = Tensor();
  }

 private:
  BinaryOp op_;
  Tensor a_, b_;  // only what the backward reads (mul: the other input; div: both when db)
  Shape a_shape_, b_shape_;
};

Tensor binary_fn(BinaryOp op, const Tensor& a, const Tensor& b) {
  Tensor out = ops::binary(op, a, b);
  if (!needs_grad({&a, &b})) return out;
  Tensor sa, sb;
  const bool a_grad = a.requires_grad(), b_grad = b.requires_grad();
  if (op == BinaryOp::Mul) {
    if (b_grad) sa = a.detach();
    if (a_grad) sb = b.detach();
  } else if (op == BinaryOp::Div) {
    sb = b.detach();
    if (b_grad) sa = a.detach();
  }
  auto node = make_node<BinaryBackward>({a, b}, op, sa, sb, a.shape(), b.shape());
  set_history(out, node);
  return out;
}

// ---------------------------------------------------------------- scalar

class ScalarBackward : public Node {
 public:
  ScalarBackward(ScalarOp op, double s, Tensor x) : op_(op), s_(s), x_(std::move(x)) {}

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
    switch (op_) {
      case ScalarOp::Add: return {g};
      case ScalarOp::Mul: return {ops::scalar_op(ScalarOp::Mul, g, s_)};
      case ScalarOp::RSub: return {neg_of(g)};
      case ScalarOp::Div: return {ops::scalar_op(ScalarOp::Div, g, s_)};
      case ScalarOp::RDiv: {  // d(s/x)/dx = -s / x^2
        Tensor t = ops::scalar_op(ScalarOp::Mul, g, -s_);
        return {ops::binary(BinaryOp::Div, t, ops::binary(BinaryOp::Mul, x_, x_))};
      }
      case ScalarOp::Pow: {  // d(x^s)/dx = s * x^(s-1); zero for s == 0
        if (s_ == 0.0) return {ops::full(g.shape(), 0.0, g.dtype(), g.device())};
        Tensor d = ops::scalar_op(ScalarOp::Mul, ops::scalar_op(ScalarOp::Pow, x_, s_ - 1.0), s_);
        return {ops::binary(BinaryOp::Mul, g, d)};
      }
    }
    return {Tensor()};
  }

  void release_saved() override { x_ = Tensor(); }

 private:
  ScalarOp op_;
  double s_;
  Tensor x_;  // RDiv and Pow only
};

Tensor scalar_fn(ScalarOp op, const Tensor& x, double s) {
  Tensor out = ops::scalar_op(op, x, s);
  if (!needs_grad({&x})) return out;
  const bool keep_x = op == ScalarOp::RDiv || op == ScalarOp::Pow;
  auto node = make_node<ScalarBackward>({x}, op, s, keep_x ? x.detach() : Tensor());
  set_history(out, node);
  return out;
}

// ---------------------------------------------------------------- unary

class UnaryBackward : public Node {
 public:
  // `saved` is x (log, silu) or the output (exp, sqrt); nothing for neg.
  UnaryBackward(UnaryOp op, Tensor saved) : op_(op), saved_(std::move(saved)) {}

  const char* name() const override {
    switch (op_) {
      case UnaryOp::Neg: return "NegBackward";
      case UnaryOp::Exp: return "ExpBackward";
      case UnaryOp::Log: return "LogBackward";
      case UnaryOp::Sqrt: return "SqrtBackward";
      case UnaryOp::Silu: return "SiluBackward";
      default: return "UnaryBackward";
    }
  }

  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    if (!g.defined()) return {Tensor()};
    switch (op_) {
      case UnaryOp::Neg: return {neg_of(g)};
      case UnaryOp::Exp: return {ops::binary(BinaryOp::Mul, g, saved_)};
      case UnaryOp::Log: return {ops::binary(BinaryOp::Div, g, saved_)};
      case UnaryOp::Sqrt: return {ops::binary(BinaryOp::Div, g, ops::scalar_op(ScalarOp::Mul, saved_, 2.0))};
      case UnaryOp::Silu: return {ops::silu_backward(saved_, g)};
      default: break;
    }
    throw RuntimeError(str("xtrain internal error: no backward for unary op ", static_cast<int>(op_)));
  }

  void release_saved() override { saved_ = Tensor(); }

 private:
  UnaryOp op_;
  Tensor saved_;
};

Tensor unary_fn(UnaryOp op, const Tensor& x) {
  Tensor out = ops::unary(op, x);
  if (!needs_grad({&x})) return out;
  Tensor saved;
  if (op == UnaryOp::Exp || op == UnaryOp::Sqrt) saved = out.detach();
  else if (op != UnaryOp::Neg) saved = x.detach();
  auto node = make_node<UnaryBackward>({x}, op, saved);
  set_history(out, node);
  return out;
}

// ---------------------------------------------------------------- swiglu, cast, to, dropout

class SwigluBackward : public Node {
 public:
  SwigluBackward(Tensor gate, Tensor up) : gate_(std::move(gate)), up_(std::move(up)) {}
  const char* name() const override { return "SwigluBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!grads[0].defined()) return {Tensor(), Tensor()};
    auto [dgate, dup] = ops::swiglu_backward(gate_, up_, grads[0]);
    return {dgate, dup};
  }
  void release_saved() override {
    gate_ = Tensor();
    up_ = Tensor();
  }

 private:
  Tensor gate_, up_;
};

// Backward of cast and to: bring the gradient back to the input's device and dtype.
class ToBackward : public Node {
 public:
  ToBackward(Device device, DType dtype, const char* name) : device_(device), dtype_(dtype), name_(name) {}
  const char* name() const override { return name_; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!grads[0].defined()) return {Tensor()};
    // Data-parallel training: the float32 gradient of a weight goes straight into its slot of
    // the flat gradient buffer (the same conversion kernel, so the same bits; no extra copy).
    Tensor dst = claim_grad_buffer(next_edges[0], grads[0].shape(), dtype_, device_);
    if (dst.defined()) {
      ops::copy_(dst, grads[0]);
      return {dst};
    }
    return {ops::to(grads[0], device_, dtype_)};
  }

 private:
  Device device_;
  DType dtype_;
  const char* name_;
};

class DropoutBackward : public Node {
 public:
  DropoutBackward(float p, uint64_t seed, uint64_t offset) : p_(p), seed_(seed), offset_(offset) {}
  const char* name() const override { return "DropoutBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!grads[0].defined()) return {Tensor()};
    return {ops::dropout(grads[0], p_, seed_, offset_)};  // same counters -> same mask and scale
  }

 private:
  float p_;
  uint64_t seed_, offset_;
};

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return binary_fn(BinaryOp::Add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary_fn(BinaryOp::Sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary_fn(BinaryOp::Mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary_fn(BinaryOp::Div, a, b); }

Tensor add_scalar(const Tensor& x, double s) { return scalar_fn(ScalarOp::Add, x, s); }
Tensor mul_scalar(const Tensor& x, double s) { return scalar_fn(ScalarOp::Mul, x, s); }
Tensor rsub_scalar(const Tensor& x, double s) { return scalar_fn(ScalarOp::RSub, x, s); }
Tensor div_scalar(const Tensor& x, double s) { return scalar_fn(ScalarOp::Div, x, s); }
Tensor rdiv_scalar(const Tensor& x, double s) { return scalar_fn(ScalarOp::RDiv, x, s); }
Tensor pow_scalar(const Tensor& x, double s) { return scalar_fn(ScalarOp::Pow, x, s); }

Tensor neg(const Tensor& x) { return unary_fn(UnaryOp::Neg, x); }
Tensor exp(const Tensor& x) { return unary_fn(UnaryOp::Exp, x); }
Tensor log(const Tensor& x) { return unary_fn(UnaryOp::Log, x); }
Tensor sqrt(const Tensor& x) { return unary_fn(UnaryOp::Sqrt, x); }
Tensor silu(const Tensor& x) { return unary_fn(UnaryOp::Silu, x); }

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  Tensor out = ops::swiglu(gate, up);
  if (!needs_grad({&gate, &up})) return out;
  auto node = make_node<SwigluBackward>({gate, up}, gate.detach(), up.detach());
  set_history(out, node);
  return out;
}

// Like torch's .to(): a cast to the tensor's own dtype returns the tensor itself.
Tensor cast(const Tensor& x, DType dtype) {
  ops::check_defined(x, "x");
  if (x.dtype() == dtype) return x;
  Tensor out = ops::cast(x, dtype);
  if (!needs_grad({&x})) return out;
  XT_CHECK(is_floating(dtype), TypeError, "cast: a tensor that requires grad can only be cast to a floating dtype, got ",
           dtype_name(dtype), " for ", x.describe());
  auto node = make_node<ToBackward>({x}, x.device(), x.dtype(), "CastBackward");
  set_history(out, node);
  return out;
}

// The forward is fused; the backward is not: one CastBackward per output, with an edge to its own
// input only (one node with many outputs would hold every weight's gradient until the last one
// arrived, and the data-parallel gradient-ready hook needs each as soon as it is final).
std::vector<Tensor> cast_many(const std::vector<Tensor>& xs, DType dtype) {
  for (size_t i = 0; i < xs.size(); ++i) {  // before any conversion runs
    const Tensor& x = xs[i];
    XT_CHECK(x.defined(), ValueError, "cast_many: tensors[", i, "] must be a tensor, got an undefined tensor");
    XT_CHECK(x.dtype() == dtype || is_floating(dtype) || !needs_grad({&x}), TypeError,
             "cast_many: a tensor that requires grad can only be cast to a floating dtype, got ", dtype_name(dtype),
             " for tensors[", i, "] ", x.describe());
  }
  std::vector<Tensor> out = ops::cast_many(xs, dtype);
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    if (x.dtype() == dtype || !needs_grad({&x})) continue;
    auto node = make_node<ToBackward>({x}, x.device(), x.dtype(), "CastBackward");
    set_history(out[i], node);
  }
  return out;
}

std::vector<Tensor> cast_many_cached(const std::vector<Tensor>& xs, const std::vector<Tensor>& cached) {
  XT_CHECK(xs.size() == cached.size(), ValueError, "cast_many: ", xs.size(), " tensors but ", cached.size(),
           " cached casts");
  for (size_t i = 0; i < xs.size(); ++i) {
    XT_CHECK(xs[i].defined() && cached[i].defined(), ValueError, "cast_many: tensors[", i, "] and cached[", i,
             "] must be tensors");
    XT_CHECK(cached[i].shape() == xs[i].shape() && cached[i].device() == xs[i].device() &&
                 is_floating(cached[i].dtype()) && cached[i].dtype() != xs[i].dtype(),
             ValueError, "cast_many: cached[", i, "] ", cached[i].describe(), " is not a cast of tensors[", i, "] ",
             xs[i].describe(), " (same shape and device, another floating dtype)");
  }
  std::vector<Tensor> out;
  out.reserve(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    out.push_back(cached[i].detach());  // its own handle: the history goes on it, not on the cache
    if (!needs_grad({&xs[i]})) continue;
    auto node = make_node<ToBackward>({xs[i]}, xs[i].device(), xs[i].dtype(), "CastBackward");
    set_history(out.back(), node);
  }
  return out;
}

Tensor to(const Tensor& x, Device device, DType dtype) {
  ops::check_defined(x, "x");
  if (x.device() == device && x.dtype() == dtype) return x;
  Tensor out = ops::to(x, device, dtype);
  if (!needs_grad({&x})) return out;
  XT_CHECK(is_floating(dtype), TypeError, "to: a tensor that requires grad can only be converted to a floating dtype, got ",
           dtype_name(dtype), " for ", x.describe());
  auto node = make_node<ToBackward>({x}, x.device(), x.dtype(), "ToBackward");
  set_history(out, node);
  return out;
}

Tensor dropout(const Tensor& x, double p, bool training, const std::shared_ptr<Generator>& gen) {
  ops::check_floating(x, "dropout", "x");
  XT_CHECK(p >= 0.0 && p <= 1.0, ValueError, "dropout: p must be in [0, 1], got ", p);
  if (!training || p == 0.0) return x;
  const std::shared_ptr<Generator> g = gen ? gen : default_generator(x.device());
  uint64_t seed = 0;
  const uint64_t offset = g->reserve(static_cast<uint64_t>(x.numel()), &seed);
  const float pf = static_cast<float>(p);
  Tensor out = ops::dropout(x, pf, seed, offset);
  if (!needs_grad({&x})) return out;
  auto node = make_node<DropoutBackward>({x}, pf, seed, offset);
  set_history(out, node);
  return out;
}

}  // namespace tape
}  // namespace xt
