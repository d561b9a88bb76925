// checkpoint (see checkpoint.h). Exactness rests on the kernels being deterministic: the
// recompute sees bit-identical inputs and RNG state, so it produces bit-identical activations,
// and the local backward accumulates each leaf's gradient in the same order as the full graph.
#include "tape/checkpoint.h"

#include "core/error.h"
#include "core/generator.h"
#include "tape/engine.h"
#include "tape/node.h"

namespace xt {

namespace {

// Restores a generator's state on scope exit (also when the segment throws).
class RngStateGuard {
 public:
  RngStateGuard(std::shared_ptr<Generator> gen, GeneratorState replay) : gen_(std::move(gen)), saved_(gen_->state()) {
    gen_->set_state(replay);
  }
  ~RngStateGuard() { gen_->set_state(saved_); }

 private:
  std::shared_ptr<Generator> gen_;
  GeneratorState saved_;
};

Tensor local_leaf(const Tensor& saved, bool requires_grad) {
  Tensor leaf = saved.detach();
  if (requires_grad) leaf.set_requires_grad(true);
  return leaf;
}

// x, then the params, as saved tensors named as the segment sees them.
std::vector<SavedTensor> save_inputs(const Tensor& x, const std::vector<Tensor>& params) {
  std::vector<SavedTensor> saved;
  saved.reserve(1 + params.size());
  saved.emplace_back("x", x);
  for (size_t i = 0; i < params.size(); ++i) saved.emplace_back(str("params[", i, "]"), params[i]);
  return saved;
}

class CheckpointNode : public Node {
 public:
  CheckpointNode(std::shared_ptr<SegmentFn> fn, const Tensor& x, const std::vector<Tensor>& params,
                 GeneratorState rng, Shape out_shape, DType out_dtype)
      : fn_(std::move(fn)), saved_(save_inputs(x, params)), device_(x.device()), rng_(rng),
        out_shape_(std::move(out_shape)), out_dtype_(out_dtype) {}

  const char* name() const override { return "CheckpointBackward"; }

  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    std::vector<Tensor> result(saved_.size());
    if (!grads[0].defined()) return result;
    // Fresh leaves from the inputs' current values (unpack raises if one was written in place).
    Tensor xl = local_leaf(saved_[0].unpack(*this), wants_grad(0));
    std::vector<Tensor> pl;
    pl.reserve(saved_.size() - 1);
    for (size_t i = 1; i < saved_.size(); ++i) pl.push_back(local_leaf(saved_[i].unpack(*this), wants_grad(i)));

    Tensor out;
    {
      RngStateGuard rng(default_generator(device_), rng_);
      GradModeGuard grad_on(true);
      out = (*fn_)(xl, pl);
    }
    XT_CHECK(out.defined(), RuntimeError, "checkpoint: the segment returned no tensor during recompute");
    XT_CHECK(out.shape() == out_shape_ && out.dtype() == out_dtype_, RuntimeError,
             "checkpoint: the recomputed output is ", out.describe(), " but the forward produced ",
             dtype_name(out_dtype_), shape_str(out_shape_),
             "; a checkpointed segment must be deterministic and depend only on (x, params)");
    if (!out.requires_grad()) return result;  // the segment did not use any input that needs grad
    backward_seeded(out, grads[0]);
    result[0] = xl.grad();
    for (size_t i = 0; i < pl.size(); ++i) result[1 + i] = pl[i].grad();
    return result;
  }

  void release_saved() override {
    saved_.clear();
    fn_.reset();
  }

 private:
  std::shared_ptr<SegmentFn> fn_;
  std::vector<SavedTensor> saved_;  // x, then the params
  Device device_;                   // x's: whose default generator the segment draws from
  GeneratorState rng_;
  Shape out_shape_;
  DType out_dtype_;
};

}  // namespace

Tensor checkpoint(std::shared_ptr<SegmentFn> segment, const Tensor& x, const std::vector<Tensor>& params) {
  XT_CHECK(segment && *segment, ValueError, "checkpoint: segment_fn must be callable");
  XT_CHECK(x.defined(), ValueError, "checkpoint: x must be a tensor");
  std::vector<Tensor> inputs{x};
  inputs.insert(inputs.end(), params.begin(), params.end());
  if (!needs_grad(inputs)) return (*segment)(x, params);  // plain call under no_grad

  GeneratorState rng = default_generator(x.device())->state();
  std::vector<Tensor> detached;
  detached.reserve(params.size());
  for (const Tensor& p : params) detached.push_back(p.detach());
  Tensor out;
  {
    GradModeGuard no_grad(false);
    out = (*segment)(x.detach(), detached);
  }
  XT_CHECK(out.defined(), RuntimeError, "checkpoint: the segment must return a tensor");
  out = out.detach();
  auto node = make_node<CheckpointNode>(inputs, segment, x, params, rng, out.shape(), out.dtype());
  set_history(out, node);
  return out;
}

}  // namespace xt
