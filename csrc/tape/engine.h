// The backward engine: one deterministic walk of the graph from explicit seeds.
#pragma once
#include <functional>
#include <vector>

#include "core/tensor.h"

namespace xt {

// Run backward from `roots` with upstream gradients `seeds` (same shape/dtype/device as each
// root). Gradients accumulate (+=) into leaves that require grad. Nodes run in decreasing
// creation order; each Node's saved tensors are freed right after it runs, and every op Node
// reached is marked released, so a second walk through it raises RuntimeError.
// Reentrant: checkpoint's backward calls it for its local graph.
void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& seeds);

// backward_seeded(root, seed) and backward(root) (one-element root, seed of ones).
void backward_seeded(const Tensor& root, const Tensor& seed);
void backward(const Tensor& root);

// Called on this thread as soon as a walk has written a leaf's gradient for the last time
// (the leaf's AccumulateGrad ran; leaf.grad() is final for this walk), with the leaf. Leaves
// get their final gradient in reverse order of use, interleaved with the rest of the walk,
// which is what lets data parallelism start reducing the last layers' gradients while the first
// layers' backward still runs (dist::GradReducer). Thread-local; returns the previous hook.
using GradReadyHook = std::function<void(const Tensor& leaf)>;
GradReadyHook set_grad_ready_hook(GradReadyHook hook);

}  // namespace xt
