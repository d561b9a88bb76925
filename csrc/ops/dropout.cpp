// Dropout: zero each element with probability p and scale the rest by 1/(1-p). The mask is a
// pure function of (seed, offset + i) (core/philox.h), drawn from a generator's counter range; it
// is never stored: the backward reruns the kernel on the gradient with the forward's (seed,
// offset), and a checkpointed recompute replays the same generator state, so the same mask.
// Inside a captured CUDA graph the generator is in capture mode and the offset is relative to the
// device words `base` the replays fill (Note [Random draws in captured graphs], core/generator.h);
// a generator that is not in capture mode would freeze its counters into the graph, so that
// raises.
#include "core/cuda_api.h"
#include "core/error.h"
#include "ops/dispatch.h"
#include "tape/node.h"

namespace xt {
namespace ops {

Tensor dropout_forward(const Tensor& x, float p, uint64_t seed, uint64_t offset, const uint64_t* base) {
  check_floating(x, "dropout", "x");
  XT_CHECK(p >= 0.0f && p <= 1.0f, ValueError, "dropout: p must be in [0, 1], got ", p);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (out.numel())
    XT_KERNEL(x.device(), dropout, x.dtype(), x.data_ptr(), out.data_ptr(), out.numel(), p, seed, offset, base,
              stream_for(x.device()));
  return out;
}

namespace {

class DropoutBackward : public Node {
 public:
  DropoutBackward(float p, uint64_t seed, uint64_t offset, const uint64_t* base)
      : p_(p), seed_(seed), offset_(offset), base_(base) {}
  const char* name() const override { return "DropoutBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!grads[0].defined()) return {Tensor()};
    return {dropout_forward(grads[0], p_, seed_, offset_, base_)};  // same counters -> same mask and scale
  }

 private:
  float p_;
  uint64_t seed_, offset_;
  const uint64_t* base_;  // the capture's device words, or nullptr (eager)
};

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training, const std::shared_ptr<Generator>& gen) {
  check_floating(x, "dropout", "x");
  XT_CHECK(p >= 0.0 && p <= 1.0, ValueError, "dropout: p must be in [0, 1], got ", p);
  if (!training || p == 0.0) return x;
  const std::shared_ptr<Generator> g = gen ? gen : default_generator(x.device());
  uint64_t seed = 0;
  const uint64_t* base = nullptr;
  const uint64_t offset = g->reserve(static_cast<uint64_t>(x.numel()), &seed, &base);
  XT_CHECK(base != nullptr || !x.device().is_cuda() || !cuda::capturing(), RuntimeError,
           "dropout inside a CUDA graph capture needs its generator in capture mode, or every replay would "
           "draw the same mask (xtrain.graphs.StepGraphs puts the device's default generator in it; "
           "Generator.begin_capture does it by hand)");
  const float pf = static_cast<float>(p);
  Tensor out = dropout_forward(x, pf, seed, offset, base);
  if (needs_grad({&x})) set_history(out, make_node<DropoutBackward>({x}, pf, seed, offset, base));
  return out;
}

}  // namespace ops
}  // namespace xt
