// Node bookkeeping, AccumulateGrad, grad mode and the helpers Functions use to record history.
#include "tape/node.h"

#include "core/error.h"
#include "ops/ops.h"

namespace xt {

namespace {
std::atomic<uint64_t> g_next_seq{0};
thread_local bool t_grad_enabled = true;
}  // namespace

Node::Node() : seq_nr(g_next_seq.fetch_add(1, std::memory_order_relaxed)) {}

bool grad_enabled() { return t_grad_enabled; }
void set_grad_enabled(bool enabled) { t_grad_enabled = enabled; }

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>& grads) {
  Tensor g = std::move(grads[0]);
  const bool claimed = claimed_;
  claimed_ = false;
  Tensor fresh = std::move(fresh_);  // this walk's, or a stale one from a walk that failed before here
  fresh_ = Tensor();
  if (!g.defined()) return {};
  Tensor leaf(leaf_);
  XT_CHECK(g.shape() == leaf.shape() && g.dtype() == leaf.dtype() && g.device() == leaf.device(), RuntimeError,
           "gradient ", g.describe(), " does not match its leaf ", leaf.describe());
  Tensor cur = leaf.grad();
  if (!cur.defined() && claimed && fresh.defined() && g.data_ptr() == fresh.data_ptr()) {
    leaf.set_grad(fresh);  // the claimed fresh buffer itself (the batched cast still writes it)
  } else if (!cur.defined() && destination_.defined()) {
    // A producer that claimed the destination wrote it in place (g is that memory): nothing to move.
    if (!(claimed && g.data_ptr() == destination_.data_ptr())) ops::copy_(destination_, g);
    leaf.set_grad(destination_);
  } else if (!cur.defined()) {
    // The buffer becomes .grad when nothing else refers to it or to its storage (the usual case:
    // a weight gradient fresh from its GEMM); otherwise a copy, since it may alias another
    // gradient (an add hands one tensor to both inputs) or a view of one.
    const bool sole_owner = g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1;
    leaf.set_grad(sole_owner ? g : ops::clone(g));
  } else {
    ops::accumulate_(cur, g);  // leaves accumulate across backward calls until zeroed
  }
  return {};
}

void AccumulateGrad::set_destination(const Tensor& dest) {
  claimed_ = false;
  if (!dest.defined()) {
    destination_ = Tensor();
    return;
  }
  XT_CHECK(dest.shape() == leaf_->shape && dest.dtype() == leaf_->dtype && dest.device() == leaf_->device,
           ValueError, "gradient destination ", dest.describe(), " does not match its leaf ", leaf().describe());
  destination_ = dest;
}

Tensor AccumulateGrad::claim(const Shape& shape, DType dtype, Device device) {
  if (!destination_.defined() || leaf_->grad || claimed_) return Tensor();
  if (destination_.shape() != shape || destination_.dtype() != dtype || destination_.device() != device)
    return Tensor();
  claimed_ = true;
  return destination_;
}

Tensor AccumulateGrad::claim_fresh() {
  // Only the sole producer of a walk asks (can_defer_grad_cast), so a claim still standing is a
  // failed walk's, whose sink never ran: replaced.
  if (destination_.defined() || leaf_->grad) return Tensor();
  fresh_ = Tensor::empty(leaf_->shape, leaf_->dtype, leaf_->device);
  claimed_ = true;
  return fresh_;
}

std::shared_ptr<AccumulateGrad> grad_accumulator(const Tensor& leaf) {
  XT_CHECK(leaf.defined() && leaf.is_leaf() && leaf.requires_grad(), ValueError,
           "grad_accumulator: needs a leaf tensor that requires grad, got ",
           leaf.defined() ? leaf.describe() : std::string("an undefined tensor"));
  auto acc = std::static_pointer_cast<AccumulateGrad>(leaf.impl()->grad_accumulator.lock());
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(leaf.impl_ptr());
    leaf.impl()->grad_accumulator = acc;
  }
  return acc;
}

Tensor claim_grad_buffer(const Edge& edge, const Shape& shape, DType dtype, Device device) {
  if (!edge.valid() || !edge.fn->reusable()) return Tensor();
  return static_cast<AccumulateGrad*>(edge.fn.get())->claim(shape, dtype, device);
}

Tensor claim_fresh_grad_buffer(const Edge& edge) {
  if (!edge.valid() || !edge.fn->reusable()) return Tensor();
  return static_cast<AccumulateGrad*>(edge.fn.get())->claim_fresh();
}

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor* t : inputs)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

Edge gradient_edge(const Tensor& t) {
  if (t.grad_fn()) return Edge{t.grad_fn(), t.impl()->output_nr};
  if (!t.requires_grad()) return Edge{};
  return Edge{grad_accumulator(t), 0};
}

void set_history(Tensor& out, const std::shared_ptr<Node>& node, uint32_t output_nr) {
  out.impl()->grad_fn = node;
  out.impl()->output_nr = output_nr;
  out.impl()->requires_grad = true;
}

namespace {

// The source to keep instead of t (Note [Casts saved as their source]): t must be the cast's whole
// output as the cast wrote it (its node's own output, no view of it, never written since).
const Tensor* recast_source_of(const Tensor& t) {
  if (!t.defined() || !t.grad_fn()) return nullptr;
  const Tensor* src = t.grad_fn()->recast_source();
  if (src == nullptr || t.impl()->output_nr != 0 || t.impl()->offset_bytes != 0 || t.version() != 0 ||
      t.shape() != src->shape() || t.device() != src->device())
    return nullptr;
  return src;
}

}  // namespace

SavedTensor::SavedTensor(std::string name, const Tensor& t) : name_(std::move(name)) {
  if (!t.defined()) return;
  if (const Tensor* src = recast_source_of(t)) {
    tensor_ = *src;  // already a detached alias (ToBackward keeps it so)
    version_ = src->version();
    recast_ = true;
    recast_dtype_ = t.dtype();
    return;
  }
  tensor_ = t.detach();
  version_ = t.version();
}

Tensor SavedTensor::unpack(const Node& node) const {
  if (!tensor_.defined()) return tensor_;
  const uint64_t now = tensor_.version();
  XT_CHECK(now == version_, RuntimeError,
           "one of the tensors needed for gradient computation has been modified by an in-place operation: ",
           node.name(), "'s saved tensor '", name_, "' (", tensor_.describe(),
           recast_ ? ", saved as its cast's source" : "", ") is at version ", now, "; expected version ", version_,
           " instead. Clone it before writing to it in place (fill_, zero_, copy_, an optimizer step, a collective), "
           "or write it after backward.");
  return recast_ ? ops::cast_forward(tensor_, recast_dtype_) : tensor_;
}

}  // namespace xt
