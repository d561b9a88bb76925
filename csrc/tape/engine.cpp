// The backward engine (see engine.h).
//
// Why decreasing seq_nr: a Node is created after every Node that produced its inputs, so
// running the reachable Nodes from the newest to the oldest visits every consumer before its
// producers, without dependency counting, and in the same order on every run.
//
// Note [Batched gradient casts]
// A bf16 model's Linear weights are float32 leaves cast to bf16 (store.compute_weights): each
// weight's GEMM gives a bf16 gradient that its CastBackward converts into the leaf's float32 slot
// of the store's gradient buffer. Converting each as it comes costs one launch per weight (dim768:
// 127 launches of ~3.5 us, each also a CUDA graph node). The conversion only has to happen as soon
// as the float32 gradient is read, and within a walk nothing reads it when
//  - no gradient-ready hook is set (data-parallel training's overlapped all-reduce reads each
//    gradient as soon as it is final, so those walks convert at once, as before), and
//  - the leaf's sink has exactly one incoming edge in the walk and is not a root: otherwise the
//    engine adds a second gradient to the slot before the sink runs (a weight used twice).
// Then CastBackward hands the conversion to the walk (defer_grad_cast) and returns the slot as
// the gradient; the sink takes the claimed slot as .grad without reading it. A leaf without a
// slot (a store whose gradients are tensors of their own, the one-process default: Note
// [Gradients without a flat buffer], xtrain/store.py) gets the same batching: its sole producer
// claims a fresh float32 buffer (claim_fresh_grad_buffer), which the sink makes .grad. At the end of the
// walk (and before an exception leaves it) one cast_many call converts every deferred gradient,
// element by element the same conversion as copy_, so the same bits. A slot that already holds a
// gradient is never claimed (accumulation: to_forward and accumulate_ as before).
// Cost: the walk keeps each deferred bf16 gradient alive until its end instead of freeing it
// right after its conversion: at most every Linear weight's, 2 bytes per element (dim768: 166M
// elements, 317 MiB). They pile up while the activations are being freed, after the lm_head's
// backward has set the step's peak: dim768's backward peak did not move (docs/store.md). Without
// slots the float32 buffers appear as the casts run, so the walk's end holds 6 bytes per Linear
// weight element, what the flat buffer (4, held always) and the pending bf16 (2) hold there.
//
// Note [Summing gradients in place]
// A tensor used twice (the residual stream, a tied embedding and head) gets a gradient from each
// use; the walk sums them in the consumer's buffer slot. A new tensor for every sum would hold
// three at once (the two addends and the sum): at llama3.2-1b's tied weight that is three float32
// [128256, 2048] buffers at the end of backward, and the third, asked for when the freed
// activations' blocks are all smaller, was a fresh 1 GiB allocation (known issue 42's trace). So
// the sum goes into the slot's own memory when nothing else refers to it or to its storage (it
// came fresh from the node that made it, which kept no reference; the test AccumulateGrad makes
// before taking a gradient as .grad). A tensor another node also holds (an add hands one tensor to
// both its inputs), a view, a claimed gradient slot, a seed: summed into a new tensor, as before.
// The values are the same either way: accumulate_ and the binary Add compute a + b in the compute
// type and round once.
// A backward whose gradient is a sum it builds itself can start from the slot instead of zeros
// (take_pending_grad): the embedding's scatter-add of a tied table adds its rows into the head's
// gradient, so the table's gradient needs no buffer of its own at all (EmbeddingBackward; its
// kernels add each row's sum, made from zero as before, to the held value: the same a + b).
#include "tape/engine.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "core/cpu_profile.h"
#include "core/error.h"
#include "ops/ops.h"
#include "tape/node.h"

namespace xt {

namespace {

thread_local GradReadyHook t_grad_ready_hook;

// Points a thread-local at one walk's state for the walk's duration (a nested walk, checkpoint's,
// installs its own), then back at the enclosing walk's.
template <typename T>
class WalkScope {
 public:
  WalkScope(T*& current, T* mine) : current_(current), prev_(current) { current_ = mine; }
  ~WalkScope() { current_ = prev_; }
  WalkScope(const WalkScope&) = delete;
  WalkScope& operator=(const WalkScope&) = delete;

 private:
  T*& current_;
  T* prev_;
};

// The running walk's buffered gradients (take_pending_grad), per node: its inputs' sums so far.
using GradBuffers = std::unordered_map<Node*, std::vector<Tensor>>;
thread_local GradBuffers* t_buffers = nullptr;

bool sole_owner(const Tensor& t) { return t.impl_ptr().use_count() == 1 && t.storage().use_count() == 1; }

// The conversions one walk defers (Note [Batched gradient casts]).
struct GradCastBatch {
  std::unordered_set<const Node*> sole_producer_sinks;  // sinks one edge of the walk feeds, no roots
  std::vector<Tensor> src, dst;
};
thread_local GradCastBatch* t_cast_batch = nullptr;  // the innermost running walk's, if it batches
thread_local int64_t t_last_batched = 0;

// A walk's batch runs at the end of the walk, or before an exception leaves it.
void run_cast_batch(GradCastBatch& batch) {
  if (!batch.src.empty()) ops::cast_many_into(batch.src, batch.dst);
  t_last_batched = static_cast<int64_t>(batch.src.size());
  batch.src.clear();
  batch.dst.clear();
}

std::vector<std::shared_ptr<Node>> reachable_nodes(const std::vector<Edge>& starts) {
  std::vector<std::shared_ptr<Node>> nodes;
  std::unordered_set<Node*> seen;
  std::vector<Node*> stack;
  for (const Edge& e : starts) {
    if (seen.insert(e.fn.get()).second) {
      nodes.push_back(e.fn);
      stack.push_back(e.fn.get());
    }
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges) {
      if (e.valid() && seen.insert(e.fn.get()).second) {
        nodes.push_back(e.fn);
        stack.push_back(e.fn.get());
      }
    }
  }
  // Leaf sinks (AccumulateGrad) are made lazily, possibly after their consumer, and have no
  // outgoing edges: they sort last. The walk runs each one as soon as every node with an edge
  // to it has been visited (its gradient is then final), else in this order at the end.
  std::sort(nodes.begin(), nodes.end(), [](const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) {
    if (a->reusable() != b->reusable()) return b->reusable();
    return a->seq_nr > b->seq_nr;
  });
  return nodes;
}

// buffer slot += g (Note [Summing gradients in place]).
void add_into(Tensor& slot, const Tensor& g) {
  if (!slot.defined()) {
    slot = g;
    return;
  }
  XT_CHECK(slot.shape() == g.shape() && slot.dtype() == g.dtype() && slot.device() == g.device(), RuntimeError,
           "gradients for one tensor disagree: ", slot.describe(), " vs ", g.describe());
  if (sole_owner(slot))
    ops::accumulate_(slot, g);
  else
    slot = ops::binary(kernels::BinaryOp::Add, slot, g);
}

}  // namespace

void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& seeds) {
  XT_CHECK(roots.size() == seeds.size(), ValueError, "backward: got ", roots.size(), " roots and ", seeds.size(),
           " seeds");
  std::vector<Edge> starts;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    const Tensor& s = seeds[i];
    XT_CHECK(r.defined() && s.defined(), ValueError, "backward: root and seed must be tensors");
    XT_CHECK(s.shape() == r.shape() && s.dtype() == r.dtype() && s.device() == r.device(), ValueError,
             "backward_seeded: seed must match the root's shape, dtype and device: root is ", r.describe(),
             ", seed is ", s.describe());
    Edge e = gradient_edge(r);
    XT_CHECK(e.valid(), RuntimeError,
             "backward: the tensor does not require grad and has no grad_fn (did you build it under no_grad, "
             "or from tensors with requires_grad=False?)");
    starts.push_back(e);
  }

  std::vector<std::shared_ptr<Node>> order = reachable_nodes(starts);
  GradBuffers buffers;
  buffers.reserve(order.size());
  WalkScope<GradBuffers> buffers_scope(t_buffers, &buffers);
  for (size_t i = 0; i < starts.size(); ++i) {
    auto& buf = buffers[starts[i].fn.get()];
    buf.resize(starts[i].fn->num_outputs());
    add_into(buf[starts[i].input_nr], seeds[i]);
  }

  // Edges into each leaf sink from the nodes of this walk: a sink runs when its count hits 0.
  std::unordered_map<Node*, int> sink_inputs;
  for (const std::shared_ptr<Node>& node : order)
    for (const Edge& e : node->next_edges)
      if (e.valid() && e.fn->reusable()) ++sink_inputs[e.fn.get()];

  // Without a gradient-ready hook, conversions into sole-producer sinks' slots wait for the end.
  GradCastBatch batch;
  const bool batching = !t_grad_ready_hook;
  if (batching) {
    for (const auto& [sink, n] : sink_inputs)
      if (n == 1) batch.sole_producer_sinks.insert(sink);
    for (const Edge& e : starts) batch.sole_producer_sinks.erase(e.fn.get());
  }
  WalkScope<GradCastBatch> scope(t_cast_batch, batching ? &batch : nullptr);
  t_last_batched = 0;
  cpu_profile::BackwardPhase phase;  // the CPU profile files this walk's kernels under backward

  // Run `node` on its buffered gradients (none reached it: nothing to do).
  const auto run = [&](Node* node) {
    auto it = buffers.find(node);
    if (it == buffers.end()) return;
    XT_CHECK(!node->released, RuntimeError, "Trying to backward through the graph a second time: node ",
             node->name(), " has already run and freed its saved tensors. Run the forward again.");
    std::vector<Tensor> grads = std::move(it->second);
    buffers.erase(it);
    std::vector<Tensor> in_grads = cpu_profile::timed(node->name(), true, [&] { return node->apply(grads); });
    grads.clear();
    if (!node->reusable()) {
      node->release_saved();
      node->released = true;
    } else if (t_grad_ready_hook) {
      t_grad_ready_hook(static_cast<AccumulateGrad*>(node)->leaf());
    }
    const size_t n = std::min(in_grads.size(), node->next_edges.size());
    for (size_t j = 0; j < n; ++j) {
      const Edge& e = node->next_edges[j];
      if (!e.valid() || !in_grads[j].defined()) continue;
      auto& buf = buffers[e.fn.get()];
      if (buf.empty()) buf.resize(e.fn->num_outputs());
      add_into(buf[e.input_nr], in_grads[j]);
    }
  };

  try {
    for (const std::shared_ptr<Node>& node : order) {
      if (node->reusable()) {
        run(node.get());  // a sink no op node feeds (a leaf root), or left over: in order, at the end
        continue;
      }
      run(node.get());
      for (const Edge& e : node->next_edges) {
        if (!e.valid() || !e.fn->reusable()) continue;
        if (--sink_inputs[e.fn.get()] == 0) run(e.fn.get());  // every producer visited: final
      }
    }
  } catch (...) {
    // Slots already handed out as .grad get their values; the walk's own error is what surfaces.
    try {
      run_cast_batch(batch);
    } catch (...) {
    }
    throw;
  }
  run_cast_batch(batch);
}

Tensor take_pending_grad(const Edge& edge, const Shape& shape, DType dtype, Device device) {
  GradBuffers* buffers = t_buffers;
  if (!buffers || !edge.valid()) return Tensor();
  auto it = buffers->find(edge.fn.get());
  if (it == buffers->end() || edge.input_nr >= it->second.size()) return Tensor();
  Tensor& slot = it->second[edge.input_nr];
  if (!slot.defined() || slot.shape() != shape || slot.dtype() != dtype || slot.device() != device) return Tensor();
  // Also the leaf's gradient slot that another producer claimed and wrote (data parallelism's flat
  // buffer): it is the leaf's .grad-to-be, which the sink would add into anyway.
  const auto* sink = edge.fn->reusable() ? static_cast<const AccumulateGrad*>(edge.fn.get()) : nullptr;
  const bool claimed_slot = sink && sink->destination_claimed() && slot.data_ptr() == sink->destination().data_ptr();
  if (!claimed_slot && !sole_owner(slot)) return Tensor();
  return std::move(slot);  // the slot is undefined again: the caller's gradient takes its place
}

bool can_defer_grad_cast(const Edge& edge) {
  const GradCastBatch* batch = t_cast_batch;
  return batch && edge.valid() && batch->sole_producer_sinks.count(edge.fn.get());
}

bool defer_grad_cast(const Edge& edge, const Tensor& dst, const Tensor& src) {
  GradCastBatch* batch = t_cast_batch;
  if (!can_defer_grad_cast(edge)) return false;
  if (!dst.defined() || !src.defined() || src.device() != dst.device() || src.numel() != dst.numel() ||
      !is_floating(src.dtype()) || !is_floating(dst.dtype()))
    return false;
  dst.bump_version();  // written, as far as anyone can see, now (copy_ would bump it here)
  batch->src.push_back(src);
  batch->dst.push_back(dst);
  return true;
}

int64_t last_backward_batched_casts() { return t_last_batched; }

GradReadyHook set_grad_ready_hook(GradReadyHook hook) {
  GradReadyHook prev = std::move(t_grad_ready_hook);
  t_grad_ready_hook = std::move(hook);
  return prev;
}

void backward_seeded(const Tensor& root, const Tensor& seed) { run_backward({root}, {seed}); }

void backward(const Tensor& root) {
  XT_CHECK(root.defined(), ValueError, "backward: undefined tensor");
  XT_CHECK(root.numel() == 1, RuntimeError, "backward() needs a one-element tensor, got shape ",
           shape_str(root.shape()), "; use backward_seeded(seed) for other shapes");
  run_backward({root}, {ops::full(root.shape(), 1.0, root.dtype(), root.device())});
}

}  // namespace xt
