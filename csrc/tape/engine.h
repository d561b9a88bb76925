// The backward engine: one deterministic walk of the graph from explicit seeds.
#pragma once
#include <functional>
#include <vector>

#include "core/tensor.h"
#include "tape/node.h"

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

// Note [Batched gradient casts] (tape/engine.cpp). Asks the running walk on this thread to do
// `dst = cast(src)` later, in one kernel call with the walk's other such conversions, where dst is
// the gradient destination of the leaf behind `edge` (a backward's claim_grad_buffer result) and
// src a gradient on dst's device in another floating dtype. True when the walk took it (dst counts
// as written now: its version moves; src is kept alive until the batch runs); false when the
// caller must convert now: no walk runs, a gradient-ready hook is set (it reads each gradient as
// soon as it is final), or the leaf has another producer or is a root of this walk (the engine
// would read dst before the batch wrote it).
bool defer_grad_cast(const Edge& edge, const Tensor& dst, const Tensor& src);
// Whether defer_grad_cast would take a conversion for the leaf behind `edge` now (asked before
// allocating a buffer for it: claim_fresh_grad_buffer).
bool can_defer_grad_cast(const Edge& edge);
// Note [Summing gradients in place] (tape/engine.cpp). The gradient this thread's running walk
// holds so far for the input behind `edge` (another use's), handed to a backward that adds its own
// into it: defined when one is held, nobody else refers to it or its storage and it has this
// shape, dtype and device. The walk forgets it, so the caller must return the sum as its gradient
// for that input. Undefined when no walk runs or any of that does not hold.
Tensor take_pending_grad(const Edge& edge, const Shape& shape, DType dtype, Device device);
// Conversions the last walk on this thread batched (0 when none): a count for tests and profiles.
int64_t last_backward_batched_casts();

}  // namespace xt
