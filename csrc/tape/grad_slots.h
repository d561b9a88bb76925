// GradSlots: where the gradients of a parameter store's leaves go (one flat buffer, a view per
// leaf), for the optimizer, clipping and the collectives to work on that one buffer.
//
// Invariants:
//  - While a GradSlots lives, each leaf's AccumulateGrad holds the leaf's slot as its destination
//    (tape/node.h): a leaf's first gradient of a walk lands in its slot and the slot becomes .grad.
//    Its destructor removes the destinations again.
//  - After sync(), every leaf that has a gradient has it in its slot (a .grad assigned by hand is
//    copied in), so the flat buffer holds exactly the leaves' gradients; slots of leaves without
//    a gradient keep whatever they held and are reported.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "tape/node.h"

namespace xt {

class GradSlots {
 public:
  // leaves[i] (a leaf that requires grad) gets slots[i] (same shape, dtype, device) as destination.
  GradSlots(const std::vector<Tensor>& leaves, const std::vector<Tensor>& slots);
  ~GradSlots();
  GradSlots(const GradSlots&) = delete;
  GradSlots& operator=(const GradSlots&) = delete;

  // Every .grad into its slot; returns the indices of the leaves without a gradient.
  std::vector<int64_t> sync();
  // Every leaf's .grad set to none (the slots keep their memory and contents).
  void clear();
  size_t size() const { return sinks_.size(); }

 private:
  std::vector<std::shared_ptr<AccumulateGrad>> sinks_;
};

}  // namespace xt
