// Casts and device moves: cast, cast_many (one fused forward for a list), cast_many_cached (the
// casts' values already known), to; their raw forwards, cast_many_into, and the backward they share.
//
// The backward of a cast or a move brings the gradient back to the input's dtype and device
// (CastBackward / ToBackward). A cast's backward writes a float32 weight gradient straight into
// the leaf's grad buffer when it has one (a parameter store: claim_grad_buffer), with the same
// conversion kernel, so the same bits; when nothing reads it before the walk ends it leaves the
// conversion to the walk, which runs every such weight's in one launch at its end (Note [Batched
// gradient casts], tape/engine.cpp). cast_many keeps one CastBackward per output: one node with
// many outputs would hold every weight's gradient until the last one arrived, and the
// data-parallel gradient-ready hook needs each as soon as it is final.
//
// Note [Casts saved as their source]
// A bf16 model's linears save their bf16 weight for backward (dx = dy @ w), so the casts of every
// layer's weights live from the forward that uses them to the backward that reads them: all of
// them at the step's peak, the start of backward (1.8 GiB at llama3.2-1b, 2.6 at qwen3-1.7b).
// cast_many(..., recast_saved=true) marks its casts instead: a SavedTensor given such a cast's
// output keeps the cast's source (the float32 weight, which the store holds anyway) and casts it
// again when its node unpacks it in backward (tape/node.h). The value is the forward's bit for
// bit (the same kernel on the same float32 values; the source's version is checked as any saved
// tensor's), the cast's own memory is freed as soon as nothing but saved tensors refer to it, and
// the cost is the cast again: per weight, read 4 and write 2 bytes a parameter in backward. Only
// the cast's whole output as the cast wrote it is recast (no view of it, never written in place);
// anything else is saved as usual. ToBackward keeps the source for this (a detached alias), so a
// marked cast's source lives as long as its node.
#include <limits>

#include "core/error.h"
#include "ops/dispatch.h"
#include "tape/engine.h"
#include "tape/node.h"

namespace xt {
namespace ops {

Tensor cast_forward(const Tensor& x, DType dtype) {
  check_defined(x, "x");
  if (x.dtype() == dtype) return clone(x);
  Tensor out = Tensor::empty(x.shape(), dtype, x.device());
  if (out.numel())
    XT_KERNEL(x.device(), cast, x.dtype(), x.data_ptr(), dtype, out.data_ptr(), out.numel(), stream_for(x.device()));
  return out;
}

namespace {

// One cast_many launch per (source dtype, destination dtype) pair of src[i] -> dst[i], the groups
// in order of first appearance, each in index order: the order every caller's kernels run in.
void launch_cast_groups(const std::vector<Tensor>& src, const std::vector<Tensor>& dst, Device dev) {
  std::vector<bool> done(src.size(), false);
  std::vector<const void*> from;
  std::vector<void*> into;
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < src.size(); ++i) {
    if (done[i]) continue;
    const DType s_dt = src[i].dtype(), d_dt = dst[i].dtype();
    from.clear();
    into.clear();
    sizes.clear();
    for (size_t j = i; j < src.size(); ++j) {
      if (src[j].dtype() != s_dt || dst[j].dtype() != d_dt) continue;
      done[j] = true;
      from.push_back(src[j].data_ptr());
      into.push_back(dst[j].data_ptr());
      sizes.push_back(src[j].numel());
    }
    XT_KERNEL(dev, cast_many, static_cast<int>(from.size()), s_dt, from.data(), d_dt, into.data(), sizes.data(),
              stream_for(dev));
  }
}

}  // namespace

std::vector<Tensor> cast_many_forward(const std::vector<Tensor>& xs, DType dtype) {
  XT_CHECK(xs.size() <= static_cast<size_t>(std::numeric_limits<int>::max()), ValueError,
           "cast_many: too many tensors (", xs.size(), ")");
  for (size_t i = 0; i < xs.size(); ++i) {
    XT_CHECK(xs[i].defined(), ValueError, "cast_many: tensors[", i, "] must be a tensor, got an undefined tensor");
    XT_CHECK(xs[i].device() == xs[0].device(), ValueError, "cast_many: tensors[", i, "] is ", xs[i].describe(),
             " but tensors[0] is on ", xs[0].device().str(), "; all tensors must be on one device");
  }
  std::vector<Tensor> out(xs);  // an input already of dtype stays itself
  if (xs.empty()) return out;
  std::vector<Tensor> src, dst;  // the inputs that change dtype and their new tensors
  for (size_t i = 0; i < xs.size(); ++i) {
    if (xs[i].dtype() == dtype) continue;
    out[i] = Tensor::empty(xs[i].shape(), dtype, xs[i].device());
    src.push_back(xs[i]);
    dst.push_back(out[i]);
  }
  launch_cast_groups(src, dst, xs[0].device());
  return out;
}

void cast_many_into(const std::vector<Tensor>& src, const std::vector<Tensor>& dst) {
  XT_CHECK(src.size() == dst.size(), ValueError, "cast_many_into: ", src.size(), " sources but ", dst.size(),
           " destinations");
  XT_CHECK(src.size() <= static_cast<size_t>(std::numeric_limits<int>::max()), ValueError,
           "cast_many_into: too many tensors (", src.size(), ")");
  for (size_t i = 0; i < src.size(); ++i) {
    XT_CHECK(src[i].defined() && dst[i].defined(), ValueError, "cast_many_into: src[", i, "] and dst[", i,
             "] must be tensors");
    XT_CHECK(src[i].numel() == dst[i].numel() && src[i].device() == dst[0].device() &&
                 dst[i].device() == dst[0].device() && is_floating(src[i].dtype()) && is_floating(dst[i].dtype()),
             ValueError, "cast_many_into: src[", i, "] ", src[i].describe(), " cannot be cast into dst[", i, "] ",
             dst[i].describe(), " (same size, one device, floating dtypes)");
  }
  if (!src.empty()) launch_cast_groups(src, dst, dst[0].device());
}

namespace {

// Backward of cast and to: bring the gradient back to the input's device and dtype.
class ToBackward : public Node {
 public:
  ToBackward(Device device, DType dtype, const char* name, Tensor recast_source = Tensor())
      : device_(device), dtype_(dtype), name_(name), recast_source_(std::move(recast_source)) {}
  const char* name() const override { return name_; }
  const Tensor* recast_source() const override { return recast_source_.defined() ? &recast_source_ : nullptr; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!grads[0].defined()) return {Tensor()};
    // A parameter store's weight: the float32 gradient goes straight into its slot of the flat
    // gradient buffer (no extra copy), converted at the end of the walk with the other weights'
    // in one launch when nothing reads it earlier (Note [Batched gradient casts], tape/engine.cpp),
    // else now (data-parallel training's gradient-ready hook). Same conversion, same bits.
    Tensor dst = claim_grad_buffer(next_edges[0], grads[0].shape(), dtype_, device_);
    if (dst.defined()) {
      if (!defer_grad_cast(next_edges[0], dst, grads[0])) copy_(dst, grads[0]);
      return {dst};
    }
    // A leaf whose gradient is a tensor of its own (no flat buffer): batched the same way, into
    // a fresh buffer that becomes its .grad (Note [Batched gradient casts]).
    if (grads[0].device() == device_ && can_defer_grad_cast(next_edges[0])) {
      Tensor fresh = claim_fresh_grad_buffer(next_edges[0]);
      if (fresh.defined() && defer_grad_cast(next_edges[0], fresh, grads[0]))
        return {fresh};
    }
    return {to_forward(grads[0], device_, dtype_)};
  }

 private:
  Device device_;
  DType dtype_;
  const char* name_;
  Tensor recast_source_;  // Note [Casts saved as their source]: x's detached alias, or undefined
};

void record_cast(Tensor& out, const Tensor& x, bool recast_saved = false) {
  set_history(out, make_node<ToBackward>({x}, x.device(), x.dtype(), "CastBackward",
                                         recast_saved ? x.detach() : Tensor()));
}

}  // namespace

Tensor cast(const Tensor& x, DType dtype) {
  check_defined(x, "x");
  if (x.dtype() == dtype) return x;
  Tensor out = cast_forward(x, dtype);
  if (!needs_grad({&x})) return out;
  XT_CHECK(is_floating(dtype), TypeError,
           "cast: a tensor that requires grad can only be cast to a floating dtype, got ", dtype_name(dtype), " for ",
           x.describe());
  record_cast(out, x);
  return out;
}

std::vector<Tensor> cast_many(const std::vector<Tensor>& xs, DType dtype, bool recast_saved) {
  for (size_t i = 0; i < xs.size(); ++i) {  // before any conversion runs
    const Tensor& x = xs[i];
    XT_CHECK(x.defined(), ValueError, "cast_many: tensors[", i, "] must be a tensor, got an undefined tensor");
    XT_CHECK(x.dtype() == dtype || is_floating(dtype) || !needs_grad({&x}), TypeError,
             "cast_many: a tensor that requires grad can only be cast to a floating dtype, got ", dtype_name(dtype),
             " for tensors[", i, "] ", x.describe());
  }
  std::vector<Tensor> out = cast_many_forward(xs, dtype);
  for (size_t i = 0; i < xs.size(); ++i)
    if (xs[i].dtype() != dtype && needs_grad({&xs[i]})) record_cast(out[i], xs[i], recast_saved);
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
    if (needs_grad({&xs[i]})) record_cast(out.back(), xs[i]);
  }
  return out;
}

Tensor to(const Tensor& x, Device device, DType dtype) {
  check_defined(x, "x");
  if (x.device() == device && x.dtype() == dtype) return x;
  Tensor out = to_forward(x, device, dtype);
  if (!needs_grad({&x})) return out;
  XT_CHECK(is_floating(dtype), TypeError,
           "to: a tensor that requires grad can only be converted to a floating dtype, got ", dtype_name(dtype),
           " for ", x.describe());
  set_history(out, make_node<ToBackward>({x}, x.device(), x.dtype(), "ToBackward"));
  return out;
}

}  // namespace ops
}  // namespace xt
