// Engine mechanics: topological order on a diamond, accumulation into leaves, saved-tensor
// release, the freed-graph error, backward_seeded, the saved tensors' version checks, and the
// batched conversions into gradient slots.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/error.h"
#include "ops/ops.h"
#include "tape/engine.h"
#include "tape/grad_slots.h"
#include "tape/node.h"

using namespace xt;

namespace {

std::vector<std::string> g_log;
std::vector<const void*> g_made;  // the gradients ScaleNodes returned, in order

// y = scale * x (elementwise), recording when its backward runs; saves x to show its release.
class ScaleNode : public NodeWithSaved<1> {
 public:
  ScaleNode(std::string tag, double s, const Tensor& x)
      : NodeWithSaved({SavedTensor("x", x)}), tag_(std::move(tag)), s_(s) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    g_log.push_back(tag_);
    const auto [x] = unpack();  // read, as a backward that needs x would
    EXPECT_TRUE(x.defined());
    Tensor g = ops::scalar_op(kernels::ScalarOp::Mul, grads[0], s_);
    g_made.push_back(g.data_ptr());
    return {g};
  }
  const char* name() const override { return "ScaleBackward"; }
  bool has_saved() const { return unpack()[0].defined(); }

 private:
  std::string tag_;
  double s_;
};

Tensor scale(const std::string& tag, const Tensor& x, double s, std::shared_ptr<ScaleNode>* node_out = nullptr) {
  Tensor y = ops::scalar_op(kernels::ScalarOp::Mul, x, s);
  auto node = make_node<ScaleNode>({x}, tag, s, x);
  set_history(y, node);
  if (node_out) *node_out = node;
  return y;
}

// z = a + b with gradient passed to both.
class AddNode : public Node {
 public:
  explicit AddNode(std::string tag) : tag_(std::move(tag)) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    g_log.push_back(tag_);
    return {grads[0], grads[0]};
  }
  const char* name() const override { return "AddBackward"; }

 private:
  std::string tag_;
};

Tensor add(const std::string& tag, const Tensor& a, const Tensor& b) {
  Tensor y = ops::binary(kernels::BinaryOp::Add, a, b);
  auto node = make_node<AddNode>({a, b}, tag);
  set_history(y, node);
  return y;
}

Tensor leaf(std::vector<float> v) {
  Tensor t = ops::empty({static_cast<int64_t>(v.size())}, DType::Float32, Device::cpu());
  std::copy(v.begin(), v.end(), t.data<float>());
  t.set_requires_grad(true);
  return t;
}

}  // namespace

TEST(Engine, DiamondRunsEachNodeOnceAfterAllItsConsumers) {
  g_log.clear();
  Tensor x = leaf({1, 2});
  Tensor a = scale("a", x, 2.0);        // a = 2x
  Tensor b = scale("b", a, 3.0);        // b = 6x
  Tensor c = scale("c", a, 5.0);        // c = 10x
  Tensor d = add("d", b, c);            // d = 16x
  backward_seeded(d, ops::full({2}, 1.0, DType::Float32, Device::cpu()));
  ASSERT_EQ(g_log.size(), 4u);
  EXPECT_EQ(g_log[0], "d");
  EXPECT_EQ(g_log[3], "a");  // a runs once, after both b and c delivered their gradients
  EXPECT_FLOAT_EQ(x.grad().data<float>()[0], 16.f);
  EXPECT_FLOAT_EQ(x.grad().data<float>()[1], 16.f);
}

TEST(Engine, LeavesAccumulateAcrossBackwardCalls) {
  Tensor x = leaf({1, 1, 1});
  for (int i = 0; i < 2; ++i) {
    Tensor y = scale("y", x, 4.0);
    backward_seeded(y, ops::full({3}, 0.5, DType::Float32, Device::cpu()));
  }
  EXPECT_FLOAT_EQ(x.grad().data<float>()[2], 4.f);  // 2 + 2
}

TEST(Engine, SavedTensorsAreReleasedAfterTheNodeRuns) {
  Tensor x = leaf({1, 2, 3});
  std::shared_ptr<ScaleNode> node;
  Tensor y = scale("y", x, 2.0, &node);
  EXPECT_TRUE(node->has_saved());
  backward_seeded(y, ops::full({3}, 1.0, DType::Float32, Device::cpu()));
  EXPECT_FALSE(node->has_saved());
  EXPECT_TRUE(node->released);
}

TEST(Engine, SecondBackwardThroughAFreedGraphRaises) {
  Tensor x = leaf({1});
  Tensor y = scale("y", x, 2.0);
  backward(y);
  EXPECT_THROW(backward(y), RuntimeError);
}

TEST(Engine, SeedMustMatchTheRoot) {
  Tensor x = leaf({1, 2});
  Tensor y = scale("y", x, 2.0);
  EXPECT_THROW(backward_seeded(y, ops::full({3}, 1.0, DType::Float32, Device::cpu())), ValueError);
  EXPECT_THROW(backward(y), RuntimeError);  // two elements: backward() needs one
}

TEST(Engine, RootWithoutHistoryRaises) {
  Tensor x = ops::full({1}, 1.0, DType::Float32, Device::cpu());
  EXPECT_THROW(backward(x), RuntimeError);
}

TEST(Engine, NoGradRecordsNothing) {
  Tensor x = leaf({1});
  GradModeGuard off(false);
  EXPECT_FALSE(needs_grad({&x}));
}

TEST(Engine, LeafGradientIsReadyAsSoonAsItsLastConsumerRan) {
  // w1 feeds the first op, w2 the second: backward finishes w2 before it reaches the op of w1,
  // and the hook sees each leaf once, with its final gradient, interleaved with the op nodes.
  g_log.clear();
  Tensor x = leaf({1, 2});
  Tensor w1 = leaf({3, 3});
  Tensor w2 = leaf({5, 5});
  Tensor a = add("a", x, w1);            // a = x + w1
  Tensor b = scale("b", a, 2.0);         // b = 2a
  Tensor c = add("c", b, w2);            // c = b + w2
  Tensor d = add("d", c, w2);            // d = b + 2 w2: w2 has two consumers
  std::vector<float> seen_grad;
  GradReadyHook prev = set_grad_ready_hook([&](const Tensor& l) {
    const char* who = l.same(x) ? "x" : l.same(w1) ? "w1" : l.same(w2) ? "w2" : "?";
    g_log.push_back(std::string("ready ") + who);
    seen_grad.push_back(l.grad().data<float>()[0]);
  });
  backward_seeded(d, ops::full({2}, 1.0, DType::Float32, Device::cpu()));
  set_grad_ready_hook(std::move(prev));
  const std::vector<std::string> want = {"d", "c", "ready w2", "b", "a", "ready x", "ready w1"};
  EXPECT_EQ(g_log, want);
  ASSERT_EQ(seen_grad.size(), 3u);
  EXPECT_FLOAT_EQ(seen_grad[0], 2.f);  // w2: final (both consumers) when the hook saw it
  EXPECT_FLOAT_EQ(seen_grad[1], 2.f);  // x
  EXPECT_FLOAT_EQ(seen_grad[2], 2.f);  // w1
  // Without a hook nothing is called and the results are the same.
  Tensor e = add("e", x, w1);
  backward_seeded(e, ops::full({2}, 1.0, DType::Float32, Device::cpu()));
  EXPECT_FLOAT_EQ(w1.grad().data<float>()[0], 3.f);
}

// y = scale * x, recording the data pointer of the gradient it receives (the sum the walk made).
class ProbeNode : public Node {
 public:
  explicit ProbeNode(const void** seen) : seen_(seen) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    *seen_ = grads[0].data_ptr();
    return {grads[0]};
  }
  const char* name() const override { return "ProbeBackward"; }

 private:
  const void** seen_;
};

TEST(Engine, GradientsOfATensorUsedTwiceSumInPlaceWhenNothingElseHoldsThem) {
  // Note [Summing gradients in place]: a's two gradients (3 g and 5 g, fresh from the scale
  // nodes) sum in the memory of the first; the values are the sum's.
  g_log.clear();
  g_made.clear();
  Tensor x = leaf({1, 2});
  Tensor p = ops::scalar_op(kernels::ScalarOp::Mul, x, 1.0);
  const void* seen = nullptr;
  set_history(p, make_node<ProbeNode>({x}, &seen));
  Tensor b = scale("b", p, 3.0);
  Tensor c = scale("c", p, 5.0);
  Tensor d = add("d", b, c);
  backward_seeded(d, ops::full({2}, 1.0, DType::Float32, Device::cpu()));
  ASSERT_EQ(g_made.size(), 2u);
  EXPECT_EQ(seen, g_made[0]);  // the sum in the first gradient's memory
  EXPECT_FLOAT_EQ(x.grad().data<float>()[0], 8.f);
  EXPECT_FLOAT_EQ(x.grad().data<float>()[1], 8.f);
}

TEST(Engine, AGradientAnotherSlotHoldsIsNeverSummedIntoInPlace) {
  // h = x + y hands one tensor to x and y; x's second gradient (3 g) must not be added into it,
  // or y's gradient would change with it.
  Tensor x = leaf({1, 1});
  Tensor y = leaf({1, 1});
  Tensor h = add("h", x, y);
  Tensor k = scale("k", x, 3.0);
  Tensor z = add("z", h, k);
  backward_seeded(z, ops::full({2}, 0.5, DType::Float32, Device::cpu()));
  EXPECT_FLOAT_EQ(y.grad().data<float>()[0], 0.5f);
  EXPECT_FLOAT_EQ(x.grad().data<float>()[0], 2.f);
  EXPECT_NE(x.grad().data_ptr(), y.grad().data_ptr());
}

TEST(Engine, TwoUsesOfALargeTensorHoldTwoGradientsNotThree) {
  // The tied embedding's case: a leaf of 4 MiB used twice; backward's peak above its start is
  // the two gradients, the sum taking the first's memory.
  const int64_t n = int64_t{1} << 20;
  Tensor x = ops::full({n}, 1.0, DType::Float32, Device::cpu());
  x.set_requires_grad(true);
  Tensor a = scale("a", x, 2.0);
  Tensor b = scale("b", x, 3.0);
  Tensor d = add("d", a, b);
  Tensor seed = ops::full({n}, 1.0, DType::Float32, Device::cpu());
  Allocator& al = Allocator::get();
  const int64_t before = al.stats(Device::cpu()).requested_bytes;
  al.reset_peak(Device::cpu());
  backward_seeded(d, seed);
  const int64_t grew = al.stats(Device::cpu()).requested_bytes_peak - before;
  EXPECT_LE(grew, 2 * n * 4 + 4096);
  EXPECT_GE(grew, 2 * n * 4);
  EXPECT_FLOAT_EQ(x.grad().data<float>()[n - 1], 5.f);
}

TEST(Engine, ATiedTablesEmbeddingAddsItsRowsIntoTheOtherUsesGradient) {
  // A table read by an embedding and by another op (the tied head): the other op's gradient runs
  // first and the embedding's backward adds its rows' sums into it (take_pending_grad), so the
  // table's gradient takes one [V, K] buffer, with the bits of the two gradients added afterwards.
  const int64_t V = 512, K = 256;
  Tensor table = ops::full({V, K}, 0.25, DType::Float32, Device::cpu());
  table.set_requires_grad(true);
  Tensor ids = ops::empty({6}, DType::Int64, Device::cpu());
  const int64_t id_values[6] = {5, 1, 5, 300, 0, 5};
  std::copy(id_values, id_values + 6, ids.data<int64_t>());
  Tensor rows = ops::embedding(table, ids);  // the embedding: created first, its backward runs last
  Tensor head = scale("head", table, 3.0);
  Tensor seed_rows = ops::full({6, K}, 1.0, DType::Float32, Device::cpu());
  for (int64_t i = 0; i < 6 * K; ++i) seed_rows.data<float>()[i] = 0.001f * static_cast<float>(i % 97) - 0.03f;
  Tensor seed_head = ops::full({V, K}, 0.5, DType::Float32, Device::cpu());
  for (int64_t i = 0; i < V * K; ++i) seed_head.data<float>()[i] = 0.01f * static_cast<float>(i % 13) - 0.05f;
  Tensor want = ops::binary(kernels::BinaryOp::Add, ops::scalar_op(kernels::ScalarOp::Mul, seed_head, 3.0),
                            ops::embedding_backward(ids, seed_rows, V, DType::Float32));
  Allocator& al = Allocator::get();
  const int64_t before = al.stats(Device::cpu()).requested_bytes;
  al.reset_peak(Device::cpu());
  run_backward({rows, head}, {seed_rows, seed_head});
  const int64_t grew = al.stats(Device::cpu()).requested_bytes_peak - before;
  EXPECT_LE(grew, V * K * 4 + 4096);  // the head's gradient, which became the table's
  ASSERT_TRUE(table.grad().defined());
  EXPECT_EQ(std::memcmp(table.grad().data_ptr(), want.data_ptr(), V * K * 4), 0);
}

// y = s * x whose backward writes its gradient into the leaf's claimed destination when it can
// (as CastBackward does into a flat gradient buffer).
class ClaimingScaleNode : public Node {
 public:
  explicit ClaimingScaleNode(double s) : s_(s) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    Tensor g = ops::scalar_op(kernels::ScalarOp::Mul, grads[0], s_);
    Tensor dst = claim_grad_buffer(next_edges[0], g.shape(), g.dtype(), g.device());
    if (!dst.defined()) return {g};
    ops::copy_(dst, g);
    return {dst};
  }
  const char* name() const override { return "ClaimingScaleBackward"; }

 private:
  double s_;
};

TEST(Engine, ATiedTablesEmbeddingAddsIntoAClaimedGradientSlot) {
  // Data parallelism's flat gradient buffer: the head's backward writes the table's slot, and the
  // embedding adds its rows there too; the slot becomes .grad with no [V, K] buffer of the walk's.
  const int64_t V = 512, K = 256;
  Tensor table = ops::full({V, K}, 0.25, DType::Float32, Device::cpu());
  table.set_requires_grad(true);
  Tensor flat = ops::full({V * K + 64}, 0.0, DType::Float32, Device::cpu());
  Tensor slot = flat.storage_view(64, {V, K});
  auto sink = grad_accumulator(table);  // the store holds its sinks, and so their destinations
  sink->set_destination(slot);
  Tensor ids = ops::empty({4}, DType::Int64, Device::cpu());
  const int64_t id_values[4] = {7, 7, 0, 511};
  std::copy(id_values, id_values + 4, ids.data<int64_t>());
  Tensor rows = ops::embedding(table, ids);
  Tensor head = ops::scalar_op(kernels::ScalarOp::Mul, table, 2.0);
  set_history(head, make_node<ClaimingScaleNode>({table}, 2.0));
  Tensor seed_rows = ops::full({4, K}, 0.125, DType::Float32, Device::cpu());
  Tensor seed_head = ops::full({V, K}, 0.5, DType::Float32, Device::cpu());
  Tensor want = ops::binary(kernels::BinaryOp::Add, ops::scalar_op(kernels::ScalarOp::Mul, seed_head, 2.0),
                            ops::embedding_backward(ids, seed_rows, V, DType::Float32));
  Allocator& al = Allocator::get();
  const int64_t before = al.stats(Device::cpu()).requested_bytes;
  al.reset_peak(Device::cpu());
  run_backward({rows, head}, {seed_rows, seed_head});
  EXPECT_LE(al.stats(Device::cpu()).requested_bytes_peak - before, V * K * 4 + 4096);  // the scale's product
  EXPECT_EQ(table.grad().data_ptr(), slot.data_ptr());
  EXPECT_EQ(std::memcmp(slot.data_ptr(), want.data_ptr(), V * K * 4), 0);
  sink->set_destination(Tensor());
}

TEST(SavedTensors, InPlaceWritesBumpTheStorageVersionSharedByViews) {
  Tensor x = ops::full({2, 3}, 1.0, DType::Float32, Device::cpu());
  Tensor view = x.view_as_shape({6});
  EXPECT_EQ(x.version(), 0u);
  ops::fill_(view, 2.0);
  ops::copy_(x, ops::full({2, 3}, 3.0, DType::Float32, Device::cpu()));
  ops::accumulate_(x, x.detach());
  EXPECT_EQ(x.version(), 3u);
  EXPECT_EQ(view.version(), 3u);
  EXPECT_EQ(ops::clone(x).version(), 0u);  // a result written out of place starts at 0
}

TEST(SavedTensors, BackwardRefusesASavedTensorWrittenInPlaceSinceAndNamesIt) {
  Tensor x = leaf({1, 2});
  Tensor y = scale("y", x, 2.0);  // ScaleNode saves x
  ops::zero_(x);
  try {
    backward_seeded(y, ops::full({2}, 1.0, DType::Float32, Device::cpu()));
    FAIL() << "expected RuntimeError";
  } catch (const RuntimeError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("ScaleBackward's saved tensor 'x'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("is at version 1; expected version 0"), std::string::npos) << msg;
  }
  EXPECT_FALSE(x.grad().defined());
}

TEST(SavedTensors, UnpackIsCheckedOnlyForWhatWasSaved) {
  Tensor x = leaf({1, 2});
  Tensor nothing;
  SavedTensor empty("nothing", nothing);
  SavedTensor kept("x", x);
  std::shared_ptr<ScaleNode> node;
  scale("y", x, 1.0, &node);
  EXPECT_FALSE(empty.unpack(*node).defined());
  EXPECT_EQ(kept.unpack(*node).data_ptr(), x.data_ptr());  // an alias, not a copy
  ops::fill_(x, 5.0);
  EXPECT_THROW(kept.unpack(*node), RuntimeError);
  EXPECT_NO_THROW(empty.unpack(*node));
}

TEST(Engine, ConversionsWaitForTheEndOfTheWalkUnlessAHookReadsThem) {
  // Note [Batched gradient casts]: a cast's backward into a leaf's gradient slot, or without a
  // slot into a fresh float32 buffer that becomes .grad, is deferred to one batch at the end of the
  // walk; with a gradient-ready hook set it is done at once, so the hook reads the final value;
  // with .grad already set it is converted and added.
  for (const bool with_slot : {true, false}) {
    for (const bool hook : {false, true}) {
      Tensor w = leaf({1.5f, -2.f, 3.25f});
      Tensor slot = ops::zeros({3}, DType::Float32, Device::cpu());
      std::unique_ptr<GradSlots> slots;
      if (with_slot) slots = std::make_unique<GradSlots>(std::vector<Tensor>{w}, std::vector<Tensor>{slot});
      Tensor y = scale("s", ops::cast(w, DType::BFloat16), 3.0);  // dy/dw = 3, a bf16 gradient
      std::vector<float> seen;
      GradReadyHook prev;
      if (hook) prev = set_grad_ready_hook([&](const Tensor& l) { seen.push_back(l.grad().data<float>()[1]); });
      backward_seeded(y, ops::full({3}, 1.0, DType::BFloat16, Device::cpu()));
      if (hook) set_grad_ready_hook(std::move(prev));
      EXPECT_EQ(last_backward_batched_casts(), hook ? 0 : 1);
      ASSERT_TRUE(w.grad().defined());
      EXPECT_EQ(w.grad().dtype(), DType::Float32);
      if (with_slot) EXPECT_EQ(w.grad().data_ptr(), slot.data_ptr());
      for (int i = 0; i < 3; ++i) EXPECT_EQ(w.grad().data<float>()[i], 3.f);
      if (hook) {
        ASSERT_EQ(seen.size(), 1u);
        EXPECT_EQ(seen[0], 3.f);
      }
      Tensor y2 = scale("s", ops::cast(w, DType::BFloat16), 3.0);
      backward_seeded(y2, ops::full({3}, 1.0, DType::BFloat16, Device::cpu()));
      EXPECT_EQ(last_backward_batched_casts(), 0);  // .grad set: converted and added
      for (int i = 0; i < 3; ++i) EXPECT_EQ(w.grad().data<float>()[i], 6.f);
    }
  }
}

TEST(Engine, DeferredConversionsRunBeforeAnErrorLeavesTheWalk) {
  // The cast's backward (newer) runs and hands its slot, or without a slot a fresh buffer, out as
  // .grad (the sink runs as soon as its one producer has) before the older node raises: the
  // gradient still gets its value, the node's error is what the caller sees, and no claim is
  // left standing (the next walk batches as usual).
  class Raises : public Node {
   public:
    std::vector<Tensor> apply(std::vector<Tensor>&) override { throw RuntimeError("raised in backward"); }
    const char* name() const override { return "Raises"; }
  };
  for (const bool with_slot : {true, false}) {
    Tensor x = leaf({1.f, 1.f, 1.f});
    Tensor r = ops::cast(ops::scalar_op(kernels::ScalarOp::Mul, x, 1.0), DType::BFloat16);
    set_history(r, make_node<Raises>({x}));
    Tensor w = leaf({1.5f, -2.f, 3.25f});
    Tensor slot = ops::zeros({3}, DType::Float32, Device::cpu());
    std::unique_ptr<GradSlots> slots;
    if (with_slot) slots = std::make_unique<GradSlots>(std::vector<Tensor>{w}, std::vector<Tensor>{slot});
    Tensor y = add("sum", scale("s", ops::cast(w, DType::BFloat16), 3.0), r);
    EXPECT_THROW(backward_seeded(y, ops::full({3}, 1.0, DType::BFloat16, Device::cpu())), RuntimeError);
    EXPECT_EQ(last_backward_batched_casts(), 1);
    ASSERT_TRUE(w.grad().defined());
    if (with_slot) EXPECT_EQ(w.grad().data_ptr(), slot.data_ptr());
    for (int i = 0; i < 3; ++i) EXPECT_EQ(w.grad().data<float>()[i], 3.f);
    w.set_grad(Tensor());
    Tensor y2 = scale("s", ops::cast(w, DType::BFloat16), 2.0);
    backward_seeded(y2, ops::full({3}, 1.0, DType::BFloat16, Device::cpu()));
    EXPECT_EQ(last_backward_batched_casts(), 1);
    ASSERT_TRUE(w.grad().defined());
    for (int i = 0; i < 3; ++i) EXPECT_EQ(w.grad().data<float>()[i], 2.f);
  }
}
