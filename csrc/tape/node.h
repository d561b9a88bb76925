// The tape's graph: Node (one per differentiable op application) and Edge.
//
// A Node holds what its backward needs (saved tensors, always detached aliases so a Node never
// keeps its own output's history alive) and one Edge per differentiable input: the Node that
// produced that input and which of its outputs it was, or the input's AccumulateGrad node when
// the input is a leaf that requires grad, or nothing. seq_nr orders Nodes by creation; the
// engine runs them in decreasing seq_nr, which is a topological order (an input always exists
// before the op that consumes it) and makes every backward walk deterministic.
#pragma once
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace xt {

class Node;

struct Edge {
  std::shared_ptr<Node> fn;
  uint32_t input_nr = 0;  // which output of fn (equivalently, which slot of fn's grad buffer)
  bool valid() const { return fn != nullptr; }
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node() = default;
  // grads[i] is the gradient of output i (undefined when no gradient reached it).
  // Returns one gradient per next_edges entry (undefined where none flows).
  virtual std::vector<Tensor> apply(std::vector<Tensor>& grads) = 0;
  // Drop saved tensors; called by the engine right after apply().
  virtual void release_saved() {}
  virtual const char* name() const = 0;
  virtual uint32_t num_outputs() const { return 1; }
  // AccumulateGrad nodes outlive a backward walk; op nodes do not.
  virtual bool reusable() const { return false; }
  // Whether input i takes a gradient (its edge leads somewhere): backward skips the others.
  bool wants_grad(size_t i) const { return i < next_edges.size() && next_edges[i].valid(); }
  // A cast made to be saved as its source (ops::cast_many with recast_saved): the source, which
  // a SavedTensor of the cast's output keeps instead, casting it again on unpack (Note [Casts
  // saved as their source], ops/cast.cpp). nullptr for every other node.
  virtual const Tensor* recast_source() const { return nullptr; }

  std::vector<Edge> next_edges;
  const uint64_t seq_nr;
  bool released = false;
};

// Leaf sink: adds the incoming gradient into leaf.grad (+=), or makes it .grad the first time
// (taken over when nothing else refers to it, else copied).
//
// Destination (a parameter store's flat gradient buffer): a view of the leaf's shape, dtype and
// device where the gradient goes when .grad is empty; it then becomes .grad. A backward that can
// write its result straight into that memory claims it first (claim_grad_buffer: a cast's backward
// does, so a bf16 weight's float32 gradient is written once, into its slot); any other gradient is
// copied in. Whoever sets a destination holds this node (grad_accumulator()), so the same node and
// destination serve every backward walk while the leaf lives.
class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override;
  const char* name() const override { return "AccumulateGrad"; }
  bool reusable() const override { return true; }
  Tensor leaf() const { return Tensor(leaf_); }

  // ValueError unless dest matches the leaf (shape, dtype, device); an undefined dest removes it.
  void set_destination(const Tensor& dest);
  const Tensor& destination() const { return destination_; }
  // Whether a producer of this walk claimed the destination (claim) and apply() has not run yet.
  bool destination_claimed() const { return claimed_ && destination_.defined(); }
  // The destination for a producer about to write `shape/dtype/device` into it: defined when the
  // leaf's .grad is empty, the destination matches and nothing claimed it in this walk (then it
  // is marked claimed until apply() takes it).
  Tensor claim(const Shape& shape, DType dtype, Device device);
  // A leaf without a destination (its gradient a tensor of its own): a fresh buffer of the leaf's
  // shape, dtype and device that apply() makes .grad when the gradient arriving is that buffer,
  // whoever else still refers to it (the walk's batched cast writes it: Note [Batched gradient
  // casts]); undefined when the leaf has a destination or a .grad. For the sole producer of the
  // leaf's gradient in a walk only (can_defer_grad_cast).
  Tensor claim_fresh();

 private:
  std::shared_ptr<TensorImpl> leaf_;
  Tensor destination_;
  Tensor fresh_;  // claim_fresh()'s buffer, until apply() of this walk takes it
  bool claimed_ = false;
};

// The AccumulateGrad node of a leaf that requires grad (made on first use; every use shares it).
std::shared_ptr<AccumulateGrad> grad_accumulator(const Tensor& leaf);

// The destination of the leaf behind `edge`, claimed for a backward that writes its gradient
// straight into it (AccumulateGrad::claim), or undefined when the edge leads elsewhere or the
// destination cannot take it. A second producer for the same leaf then gets a fresh tensor and
// the engine sums the two as usual.
Tensor claim_grad_buffer(const Edge& edge, const Shape& shape, DType dtype, Device device);
// AccumulateGrad::claim_fresh of the leaf behind `edge`; undefined when the edge leads elsewhere.
Tensor claim_fresh_grad_buffer(const Edge& edge);

// ---- grad mode (thread-local, like torch.no_grad)
bool grad_enabled();
void set_grad_enabled(bool enabled);
class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled) : prev_(grad_enabled()) { set_grad_enabled(enabled); }
  ~GradModeGuard() { set_grad_enabled(prev_); }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool prev_;
};

// ---- helpers every differentiable op uses (tape/node.cpp)
// True when grad mode is on and any input requires grad.
bool needs_grad(std::initializer_list<const Tensor*> inputs);
bool needs_grad(const std::vector<Tensor>& inputs);
// The edge a gradient for `t` should flow along (invalid if t does not require grad).
Edge gradient_edge(const Tensor& t);
// Make a node of type N whose edges point at `inputs` (undefined tensors give invalid edges).
template <typename N, typename... Args>
std::shared_ptr<N> make_node(const std::vector<Tensor>& inputs, Args&&... args) {
  auto node = std::make_shared<N>(std::forward<Args>(args)...);
  node->next_edges.reserve(inputs.size());
  for (const Tensor& t : inputs) node->next_edges.push_back(t.defined() ? gradient_edge(t) : Edge{});
  return node;
}
// Record that `out` is output `output_nr` of `node` (marks it requires_grad).
void set_history(Tensor& out, const std::shared_ptr<Node>& node, uint32_t output_nr = 0);

// ---- saved tensors
// A tensor a Node keeps for its backward: a detached alias (never its own output's history, so no
// cycles) and the version of its storage when it was saved (core/tensor.h). unpack() raises
// RuntimeError, naming the node and the tensor, when the storage has been written in place since:
// the gradient would come from values the forward never saw.
// The output of a cast made to be saved as its source (Node::recast_source), untouched since the
// cast, is kept as that source instead (its alias and version) and cast again by each unpack():
// the same kernel on the same values, so the same bits (Note [Casts saved as their source]).
class SavedTensor {
 public:
  SavedTensor() = default;
  SavedTensor(std::string name, const Tensor& t);  // t undefined: nothing saved
  Tensor unpack(const Node& node) const;           // undefined when nothing was saved
  void reset() { tensor_ = Tensor(); }

 private:
  std::string name_;
  Tensor tensor_;  // the saved tensor, or the cast's source when recast_
  uint64_t version_ = 0;
  bool recast_ = false;
  DType recast_dtype_ = DType::Float32;  // what unpack() casts the source to when recast_
};

// An op Node that keeps N tensors for its backward: the one place they live. unpack() checks
// their versions; release_saved() drops them once the node has run.
//   class MulBackward : public NodeWithSaved<2> { ...  auto [a, b] = unpack(); ... };
template <size_t N>
class NodeWithSaved : public Node {
 public:
  void release_saved() final {
    for (SavedTensor& s : saved_) s.reset();
  }

 protected:
  explicit NodeWithSaved(std::array<SavedTensor, N> saved) : saved_(std::move(saved)) {}
  std::array<Tensor, N> unpack() const {
    std::array<Tensor, N> out;
    for (size_t i = 0; i < N; ++i) out[i] = saved_[i].unpack(*this);
    return out;
  }

 private:
  std::array<SavedTensor, N> saved_;
};

// The same for a node whose inputs include a list (linear_multi's weights): the tensors are saved
// one by one in construction (save) and read back by position (unpack(i), version-checked).
//   class LinearMultiBackward : public NodeWithSavedList { ... save("x", x); ... unpack(0) ... };
class NodeWithSavedList : public Node {
 public:
  void release_saved() final {
    for (SavedTensor& s : saved_) s.reset();
  }

 protected:
  void save(std::string name, const Tensor& t) { saved_.emplace_back(std::move(name), t); }
  Tensor unpack(size_t i) const { return saved_[i].unpack(*this); }

 private:
  std::vector<SavedTensor> saved_;
};

}  // namespace xt
