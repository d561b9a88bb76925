// CUDA optimizer kernels (float32, fused over a list of tensors): AdamW step, global norm, clip.
// The kernels live in optim.cuh (Note [Optimizer kernels at the memory roofline]); here, their
// launchers.
//
//  - The tensor list travels in the kernel's parameters (pointers and sizes, up to kMaxTensors
//    per launch; longer lists take a few launches), so no pointer table is copied to the device
//    and nothing waits on the host.
//  - adamw_step: torch.optim.AdamW's math, as kernels/cpu/optim.cpp:
//      p *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g;
//      p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
//    with wd per tensor (decays), so a model's two weight-decay groups are one launch.
//  - global_norm: each block sums the squares of its chunk in float64 (fixed order), then one
//    block adds the block partials in order and writes sqrt as float32: deterministic, on device.
//  - clip_by_norm reads the norm on the device: coef = min(1, max_norm / (norm + 1e-6)).
//  - adamw_step's per-step constants come from the launch, or from device memory (hp.hyper) so a
//    CUDA graph's replay uses the step's learning rate and bias corrections;
//  - adamw_step's guard (the step's loss or norm, on the device) skips the update when not finite;
//    its clip norm scales each gradient as it is read, by clip_by_norm's factor (no clip pass).
#include "kernels/cuda/optim.cuh"

namespace xt {
namespace kernels {
namespace cuda {

namespace {

using optim::AdamWList;
using optim::kChunk;
using optim::kMaxTensors;
using optim::kOptThreads;
using optim::TensorList;

// Splits the tensors (empty ones skipped) into lists of at most kMaxTensors and calls
// fn(list, blocks) for each, in order.
template <typename Fill, typename Fn>
void for_each_list(int n_tensors, const int64_t* sizes, Fill&& fill, Fn&& fn) {
  TensorList L;
  auto flush = [&] {
    if (L.n == 0) return;
    fn(L, static_cast<unsigned>(ceil_div(L.start[L.n], kChunk)));
    L.n = 0;
  };
  L.start[0] = 0;
  for (int i = 0; i < n_tensors; ++i) {
    if (sizes[i] == 0) continue;
    fill(L, L.n, i);
    L.start[L.n + 1] = L.start[L.n] + sizes[i];
    L.n++;
    if (L.n == kMaxTensors) flush();
  }
  flush();
}

}  // namespace

void adamw_step(int n_tensors, float* const* params, const float* const* grads, float* const* m, float* const* v,
                const int64_t* sizes, const bool* decays, AdamWParams hp, const float* guard, const float* clip_norm,
                float max_norm, void* stream) {
  OnStream on(stream);
  const optim::AdamWConsts k = optim::adamw_kernel_consts(hp);
  AdamWList L;
  auto flush = [&] {
    if (L.n == 0) return;
    optim::adamw_kernel<<<optim::adamw_blocks(L), kOptThreads, 0, on.s>>>(L, k, guard, clip_norm, max_norm, hp.hyper);
    XT_LAUNCH_CHECK();
    L.n = 0;
  };
  L.chunk0[0] = 0;
  for (int i = 0; i < n_tensors; ++i) {
    if (sizes[i] == 0) continue;
    optim::push_range(L, params[i], grads[i], m[i], v[i], sizes[i], !decays || decays[i]);
    if (L.n == kMaxTensors) flush();
  }
  flush();
}

void global_norm(int n_tensors, const float* const* tensors, const int64_t* sizes, float* out, void* stream) {
  OnStream on(stream);
  int64_t total_blocks = 0;  // the same split as for_each_list makes
  {
    int64_t in_list = 0;
    int count = 0;
    for (int i = 0; i < n_tensors; ++i) {
      if (sizes[i] == 0) continue;
      in_list += sizes[i];
      if (++count == kMaxTensors) {
        total_blocks += ceil_div(in_list, kChunk);
        in_list = 0;
        count = 0;
      }
    }
    if (count) total_blocks += ceil_div(in_list, kChunk);
  }
  Scratch partial(sizeof(double) * static_cast<size_t>(total_blocks > 0 ? total_blocks : 1), on);
  int64_t done = 0;
  for_each_list(
      n_tensors, sizes, [&](TensorList& L, int slot, int i) { L.a[slot] = const_cast<float*>(tensors[i]); },
      [&](const TensorList& L, unsigned blocks) {
        optim::sumsq_partial_kernel<<<blocks, kOptThreads, 0, on.s>>>(L, partial.as<double>() + done);
        XT_LAUNCH_CHECK();
        done += blocks;
      });
  XT_ASSERT(done == total_blocks);
  optim::norm_final_kernel<<<1, 1024, 0, on.s>>>(partial.as<double>(), total_blocks, out);
  XT_LAUNCH_CHECK();
}

void clip_by_norm(int n_tensors, float* const* tensors, const int64_t* sizes, const float* norm, float max_norm,
                  void* stream) {
  OnStream on(stream);
  for_each_list(
      n_tensors, sizes, [&](TensorList& L, int slot, int i) { L.a[slot] = tensors[i]; },
      [&](const TensorList& L, unsigned blocks) {
        optim::clip_kernel<<<blocks, kOptThreads, 0, on.s>>>(L, norm, max_norm);
        XT_LAUNCH_CHECK();
      });
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
