// CUDA optimizer kernels (float32, fused over a list of tensors): AdamW step, global norm, clip.
//
//  - The tensor list travels in the kernel's parameters (TensorList: pointers and cumulative
//    sizes, up to kMaxTensors per launch; longer lists take a few launches), so no pointer table
//    is copied to the device and nothing waits on the host.
//  - Blocks own fixed chunks of the concatenated elements; a chunk may span tensors.
//  - adamw_step: torch.optim.AdamW's math, as kernels/cpu/optim.cpp:
//      p *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g;
//      p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
//  - global_norm: each block sums the squares of its chunk in float64 (fixed order), then one
//    block adds the block partials in order and writes sqrt as float32: deterministic, on device.
//  - clip_by_norm reads the norm on the device: coef = min(1, max_norm / (norm + 1e-6)).
//  - adamw_step's per-step constants come from the launch, or from device memory (hp.hyper) so a
//    CUDA graph's replay uses the step's learning rate and bias corrections;
//  - adamw_step's guard (the step's loss or norm, on the device) skips the update when not finite;
//    its clip norm scales each gradient as it is read, by clip_by_norm's factor (no clip pass).
#include <cmath>

#include "kernels/cuda/common.cuh"

namespace xt {
namespace kernels {
namespace cuda {

namespace {

constexpr int kMaxTensors = 256;
constexpr int kOptThreads = 256;
constexpr int64_t kChunk = 8 * kOptThreads;  // elements per block

struct TensorList {
  int n = 0;
  int64_t start[kMaxTensors + 1];  // cumulative element offsets within this launch
  float* a[kMaxTensors];           // params (adamw) / tensors (norm, clip)
  const float* g[kMaxTensors];
  float* m[kMaxTensors];
  float* v[kMaxTensors];
};
// Kernel parameters may take up to 32 KiB on sm_70+ with CUDA >= 12.1.
static_assert(sizeof(TensorList) < 32000, "TensorList must fit in the kernel parameter space");

// The tensor holding element i of the launch, searching upward from t (elements a thread
// visits only increase, so each thread walks the list once).
__device__ __forceinline__ int advance(const TensorList& L, int t, int64_t i) {
  while (t + 1 < L.n && i >= L.start[t + 1]) ++t;
  return t;
}

// First tensor whose range holds element i (binary search over start).
__device__ __forceinline__ int find_tensor(const TensorList& L, int64_t i) {
  int lo = 0, hi = L.n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (L.start[mid] <= i) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

struct AdamWConsts {
  float beta1, beta2, eps, decay, step_size, bc2_sqrt;
};

// hyper (nullable): decay, step_size, bc2_sqrt in device memory, instead of k's (CUDA graphs).
__global__ void adamw_kernel(TensorList L, AdamWConsts k, const float* guard, const float* clip_norm,
                             float max_norm, const float* hyper) {
  if (guard && !isfinite(*guard)) return;  // a non-finite step: no update (the same for every thread)
  const float coef = clip_norm ? fminf(1.0f, max_norm / (*clip_norm + 1e-6f)) : 1.0f;
  const float decay = hyper ? hyper[0] : k.decay;
  const float step_size = hyper ? hyper[1] : k.step_size;
  const float bc2_sqrt = hyper ? hyper[2] : k.bc2_sqrt;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kChunk;
  const int64_t c1 = min(L.start[L.n], c0 + kChunk);
  int t = find_tensor(L, c0);
  for (int64_t i = c0 + threadIdx.x; i < c1; i += blockDim.x) {
    t = advance(L, t, i);
    const int64_t j = i - L.start[t];
    const float gi = clip_norm ? L.g[t][j] * coef : L.g[t][j];
    const float mi = k.beta1 * L.m[t][j] + (1.0f - k.beta1) * gi;
    const float vi = k.beta2 * L.v[t][j] + (1.0f - k.beta2) * gi * gi;
    L.m[t][j] = mi;
    L.v[t][j] = vi;
    const float denom = sqrtf(vi) / bc2_sqrt + k.eps;
    L.a[t][j] = L.a[t][j] * decay - step_size * (mi / denom);
  }
}

__global__ void sumsq_partial_kernel(TensorList L, double* partial) {
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kChunk;
  const int64_t c1 = min(L.start[L.n], c0 + kChunk);
  int t = find_tensor(L, c0);
  double acc = 0.0;
  for (int64_t i = c0 + threadIdx.x; i < c1; i += blockDim.x) {
    t = advance(L, t, i);
    const double x = L.a[t][i - L.start[t]];
    acc += x * x;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void norm_final_kernel(const double* partial, int64_t nparts, float* out) {
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < nparts; i += blockDim.x) acc += partial[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) out[0] = static_cast<float>(sqrt(acc));
}

__global__ void clip_kernel(TensorList L, const float* norm, float max_norm) {
  const float coef = fminf(1.0f, max_norm / (norm[0] + 1e-6f));
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kChunk;
  const int64_t c1 = min(L.start[L.n], c0 + kChunk);
  int t = find_tensor(L, c0);
  for (int64_t i = c0 + threadIdx.x; i < c1; i += blockDim.x) {
    t = advance(L, t, i);
    L.a[t][i - L.start[t]] *= coef;
  }
}

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
                const int64_t* sizes, AdamWParams hp, const float* guard, const float* clip_norm, float max_norm,
                void* stream) {
  OnStream on(stream);
  AdamWConsts k;
  k.beta1 = hp.beta1;
  k.beta2 = hp.beta2;
  k.eps = hp.eps;
  const AdamWStepConsts c = adamw_step_consts(hp);
  k.decay = c.decay;
  k.step_size = c.step_size;
  k.bc2_sqrt = c.bc2_sqrt;
  for_each_list(
      n_tensors, sizes,
      [&](TensorList& L, int slot, int i) {
        L.a[slot] = params[i];
        L.g[slot] = grads[i];
        L.m[slot] = m[i];
        L.v[slot] = v[i];
      },
      [&](const TensorList& L, unsigned blocks) {
        adamw_kernel<<<blocks, kOptThreads, 0, on.s>>>(L, k, guard, clip_norm, max_norm, hp.hyper);
        XT_LAUNCH_CHECK();
      });
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
        sumsq_partial_kernel<<<blocks, kOptThreads, 0, on.s>>>(L, partial.as<double>() + done);
        XT_LAUNCH_CHECK();
        done += blocks;
      });
  XT_ASSERT(done == total_blocks);
  norm_final_kernel<<<1, 1024, 0, on.s>>>(partial.as<double>(), total_blocks, out);
  XT_LAUNCH_CHECK();
}

void clip_by_norm(int n_tensors, float* const* tensors, const int64_t* sizes, const float* norm, float max_norm,
                  void* stream) {
  OnStream on(stream);
  for_each_list(
      n_tensors, sizes, [&](TensorList& L, int slot, int i) { L.a[slot] = tensors[i]; },
      [&](const TensorList& L, unsigned blocks) {
        clip_kernel<<<blocks, kOptThreads, 0, on.s>>>(L, norm, max_norm);
        XT_LAUNCH_CHECK();
      });
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
