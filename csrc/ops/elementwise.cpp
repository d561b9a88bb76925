// Elementwise ops: broadcasting binary ops, scalar and unary ops, accumulate, sum_to (the
// gradient of a broadcast), SiLU/SwiGLU, cast, cast_many, dropout.
//
// Broadcasting follows numpy: shapes align on the right, a dimension of 1 stretches. Equal
// shapes take the fast path (no Broadcast at all). Otherwise the Broadcast handed to the
// kernel is simplified first: size-1 dimensions are dropped and neighbours that are contiguous
// for both operands are merged, so [B, S, D] + [D] reaches the kernel as [B*S, D].
#include <algorithm>
#include <limits>

#include "core/error.h"
#include "ops/dispatch.h"

namespace xt {
namespace ops {

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

const char* unary_name(kernels::UnaryOp op) {
  switch (op) {
    case kernels::UnaryOp::Neg: return "neg";
    case kernels::UnaryOp::Exp: return "exp";
    case kernels::UnaryOp::Log: return "log";
    case kernels::UnaryOp::Sqrt: return "sqrt";
    case kernels::UnaryOp::Silu: return "silu";
    case kernels::UnaryOp::Square: return "square";
    case kernels::UnaryOp::Abs: return "abs";
  }
  return "unary op";
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
  a.storage()->forget_range();
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

Tensor silu_backward(const Tensor& x, const Tensor& dy) {
  check_binary_args(x, dy, "silu_backward");
  XT_CHECK(x.shape() == dy.shape(), ValueError, "silu_backward: x ", x.describe(), " and dy ", dy.describe(),
           " must have the same shape");
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (dx.numel())
    XT_KERNEL(x.device(), unary_backward, kernels::UnaryOp::Silu, x.dtype(), x.data_ptr(), dy.data_ptr(),
              dx.data_ptr(), dx.numel(), stream_for(x.device()));
  return dx;
}

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  check_floating(gate, "swiglu", "gate");
  check_floating(up, "swiglu", "up");
  check_same_device(gate, up, "swiglu", "gate", "up");
  check_same_dtype(gate, up, "swiglu", "gate", "up");
  XT_CHECK(gate.shape() == up.shape(), ValueError, "swiglu: gate ", gate.describe(), " and up ", up.describe(),
           " must have the same shape");
  Tensor out = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
  if (out.numel())
    XT_KERNEL(gate.device(), swiglu_forward, gate.dtype(), gate.data_ptr(), up.data_ptr(), out.data_ptr(),
              out.numel(), stream_for(gate.device()));
  return out;
}

std::pair<Tensor, Tensor> swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout) {
  check_floating(dout, "swiglu_backward", "dout");
  check_same_device(gate, dout, "swiglu_backward", "gate", "dout");
  check_same_dtype(gate, dout, "swiglu_backward", "gate", "dout");
  XT_CHECK(gate.shape() == up.shape() && gate.shape() == dout.shape(), ValueError,
           "swiglu_backward: gate ", gate.describe(), ", up ", up.describe(), " and dout ", dout.describe(),
           " must have the same shape");
  check_same_dtype(gate, up, "swiglu_backward", "gate", "up");
  Tensor dgate = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
  Tensor dup = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
  if (dgate.numel())
    XT_KERNEL(gate.device(), swiglu_backward, gate.dtype(), gate.data_ptr(), up.data_ptr(), dout.data_ptr(),
              dgate.data_ptr(), dup.data_ptr(), dgate.numel(), stream_for(gate.device()));
  return {dgate, dup};
}

Tensor cast(const Tensor& x, DType dtype) {
  check_defined(x, "x");
  if (x.dtype() == dtype) return clone(x);
  Tensor out = Tensor::empty(x.shape(), dtype, x.device());
  if (out.numel())
    XT_KERNEL(x.device(), cast, x.dtype(), x.data_ptr(), dtype, out.data_ptr(), out.numel(), stream_for(x.device()));
  return out;
}

std::vector<Tensor> cast_many(const std::vector<Tensor>& xs, DType dtype) {
  XT_CHECK(xs.size() <= static_cast<size_t>(std::numeric_limits<int>::max()), ValueError,
           "cast_many: too many tensors (", xs.size(), ")");
  for (size_t i = 0; i < xs.size(); ++i) {
    XT_CHECK(xs[i].defined(), ValueError, "cast_many: tensors[", i, "] must be a tensor, got an undefined tensor");
    XT_CHECK(xs[i].device() == xs[0].device(), ValueError, "cast_many: tensors[", i, "] is ", xs[i].describe(),
             " but tensors[0] is on ", xs[0].device().str(), "; all tensors must be on one device");
  }
  std::vector<Tensor> out(xs);  // an input already of dtype stays itself
  if (xs.empty()) return out;
  const Device dev = xs[0].device();
  std::vector<bool> done(xs.size(), false);
  std::vector<const void*> src;
  std::vector<void*> dst;
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < xs.size(); ++i) {  // one group per source dtype, in order of first appearance
    const DType src_dt = xs[i].dtype();
    if (src_dt == dtype || done[i]) continue;
    src.clear();
    dst.clear();
    sizes.clear();
    for (size_t j = i; j < xs.size(); ++j) {
      if (xs[j].dtype() != src_dt) continue;
      done[j] = true;
      out[j] = Tensor::empty(xs[j].shape(), dtype, dev);
      src.push_back(xs[j].data_ptr());
      dst.push_back(out[j].data_ptr());
      sizes.push_back(xs[j].numel());
    }
    XT_KERNEL(dev, cast_many, static_cast<int>(src.size()), src_dt, src.data(), dtype, dst.data(), sizes.data(),
              stream_for(dev));
  }
  return out;
}

Tensor dropout(const Tensor& x, float p, uint64_t seed, uint64_t offset) {
  check_floating(x, "dropout", "x");
  XT_CHECK(p >= 0.0f && p <= 1.0f, ValueError, "dropout: p must be in [0, 1], got ", p);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (out.numel())
    XT_KERNEL(x.device(), dropout, x.dtype(), x.data_ptr(), out.data_ptr(), out.numel(), p, seed, offset,
              stream_for(x.device()));
  return out;
}

}  // namespace ops
}  // namespace xt
