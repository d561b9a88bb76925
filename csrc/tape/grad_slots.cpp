// GradSlots (see grad_slots.h).
#include "tape/grad_slots.h"

#include "core/error.h"
#include "ops/ops.h"

namespace xt {

GradSlots::GradSlots(const std::vector<Tensor>& leaves, const std::vector<Tensor>& slots) {
  XT_CHECK(leaves.size() == slots.size(), ValueError, "GradSlots: ", leaves.size(), " leaves but ", slots.size(),
           " slots");
  sinks_.reserve(leaves.size());
  for (const Tensor& leaf : leaves) sinks_.push_back(grad_accumulator(leaf));  // checks leaf-ness
  for (size_t i = 0; i < sinks_.size(); ++i) {
    try {
      sinks_[i]->set_destination(slots[i]);
    } catch (...) {
      for (size_t j = 0; j < i; ++j) sinks_[j]->set_destination(Tensor());
      throw;
    }
  }
}

GradSlots::~GradSlots() {
  for (auto& s : sinks_) s->set_destination(Tensor());
}

std::vector<int64_t> GradSlots::sync() {
  std::vector<int64_t> missing;
  for (size_t i = 0; i < sinks_.size(); ++i) {
    Tensor leaf = sinks_[i]->leaf();
    Tensor slot = sinks_[i]->destination();
    Tensor g = leaf.grad();
    if (!g.defined()) {
      missing.push_back(static_cast<int64_t>(i));
    } else if (g.data_ptr() != slot.data_ptr()) {
      ops::copy_(slot, g);
      leaf.set_grad(slot);
    }
  }
  return missing;
}

void GradSlots::clear() {
  for (auto& s : sinks_) s->leaf().set_grad(Tensor());
}

}  // namespace xt
