// The backward engine (see engine.h).
//
// Why decreasing seq_nr: a Node is created after every Node that produced its inputs, so
// running the reachable Nodes from the newest to the oldest visits every consumer before its
// producers, without dependency counting, and in the same order on every run.
#include "tape/engine.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "ops/ops.h"
#include "tape/node.h"

namespace xt {

namespace {

thread_local GradReadyHook t_grad_ready_hook;

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

// buffer slot += g (a new tensor: never mutate a gradient another Node handed over).
void add_into(Tensor& slot, const Tensor& g) {
  if (!slot.defined()) {
    slot = g;
  } else {
    XT_CHECK(slot.shape() == g.shape() && slot.dtype() == g.dtype(), RuntimeError,
             "gradients for one tensor disagree: ", slot.describe(), " vs ", g.describe());
    slot = ops::binary(kernels::BinaryOp::Add, slot, g);
  }
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
  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  buffers.reserve(order.size());
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

  // Run `node` on its buffered gradients (none reached it: nothing to do).
  const auto run = [&](Node* node) {
    auto it = buffers.find(node);
    if (it == buffers.end()) return;
    XT_CHECK(!node->released, RuntimeError, "Trying to backward through the graph a second time: node ",
             node->name(), " has already run and freed its saved tensors. Run the forward again.");
    std::vector<Tensor> grads = std::move(it->second);
    buffers.erase(it);
    std::vector<Tensor> in_grads = node->apply(grads);
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
}

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
