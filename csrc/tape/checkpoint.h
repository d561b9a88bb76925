// Activation recompute: run a segment without keeping its activations, re-run it in backward.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace xt {

// segment(x, params) -> Tensor. Deterministic, depending only on x and params. The binding
// wraps a Python callable so that calling (and destroying) it takes the GIL.
using SegmentFn = std::function<Tensor(const Tensor&, const std::vector<Tensor>&)>;

// Forward: under grad mode, runs `segment` under no_grad on detached aliases of x and params,
// keeps only the output, and records a CheckpointNode with edges [x, *params]. Without grad
// mode (or when nothing requires grad) it is a plain call.
// Backward: restores the RNG state the forward saw, re-runs the segment with grad on fresh
// detached leaves, checks the output's shape/dtype, backward_seeded(dout) on it, and hands the
// leaves' gradients to the real parents. Exceptions from the segment propagate unchanged.
Tensor checkpoint(std::shared_ptr<SegmentFn> segment, const Tensor& x, const std::vector<Tensor>& params);

}  // namespace xt
