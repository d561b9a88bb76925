// Development harness, not part of the product (known issue 34): what bounds the wgmma flash
// forward. Copies of flash_forward_wgmma_kernel (kernels/cuda/flash_wgmma.cuh) with parts taken
// out, timed beside it by dev/flash_ablate.cu; their outputs are not attention (no bit checks):
//   kLoads = false: the loop issues no copies (every step reads the first K/V tiles again);
//   kSoftmax = false: no mask and no online softmax (P = S cast to bf16, no rescale of O).
// The time each removal saves bounds that part's cost.
#pragma once
#include "kernels/cuda/flash_wgmma.cuh"

namespace xt {
namespace kernels {
namespace cuda {
namespace flash {
namespace ablate {

template <int D, bool kLoads, bool kSoftmax>
__global__ void __launch_bounds__(kBlockThreads)
    forward_kernel(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
                   bf16_t* __restrict__ out, float* __restrict__ lse, Dims n) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace wg;
  constexpr int kTileBytes = tile_bytes<D>();
  unsigned char* sQ = aligned_smem();
  unsigned char* sK = sQ + kTileBytes;
  unsigned char* sV = sK + 2 * kTileBytes;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const QueryTile qt = query_tile<D>(n);
  const bf16_t* kh = k + qt.kvoff;
  const bf16_t* vh = v + qt.kvoff;
  load_tile<D>(sQ, q + qt.qoff, qt.ldq, qt.q0, n.S);
  load_tile<D>(sK, kh, qt.ldkv, qt.kv_first * kTile, n.S);
  load_tile<D>(sV, vh, qt.ldkv, qt.kv_first * kTile, n.S);
  cp_async_commit();
  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int row = qt.q0 + warp * 16 + lane / 4;
  const int col = 2 * (lane % 4);
  const int lo[2] = {first_key(n.doc, qt.b, n.S, row), first_key(n.doc, qt.b, n.S, row + 8)};
  const uint32_t q_addr = smem_addr(sQ);
  const int steps = qt.n_kv_tiles - qt.kv_first;
  if (!kLoads) {
    cp_async_wait<0>();
    fence_async_proxy();
    __syncthreads();
  }
  for (int t = 0; t < steps; ++t) {
    const int j = qt.kv_first + t;
    const int buf = kLoads ? t % 2 : 0;
    if (kLoads)
      begin_async_step(t, steps, [&] {
        load_tile<D>(sK + (t + 1) % 2 * kTileBytes, kh, qt.ldkv, (j + 1) * kTile, n.S);
        load_tile<D>(sV + (t + 1) % 2 * kTileBytes, vh, qt.ldkv, (j + 1) * kTile, n.S);
      });
    const uint32_t k_addr = smem_addr(sK + buf * kTileBytes), v_addr = smem_addr(sV + buf * kTileBytes);
    const int k0 = j * kTile;
    float s[kTile / 8][4] = {};
    mma_kk<D>(s, q_addr, k_addr);
    if (kSoftmax) {
      if (k0 + kTile > n.S || (n.causal && k0 + kTile > qt.q0) || k0 < qt.doc_last) {
#pragma unroll
        for (int nb = 0; nb < kTile / 8; ++nb)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (!visible(row + 8 * (e / 2), k0 + col + 8 * nb + e % 2, n.S, n.causal, lo[e / 2])) s[nb][e] = -INFINITY;
      }
      online_softmax<kTile, D>(s, o, m, l, n.scale_log2);
    }
    uint32_t p[kTile / 16][4];
    to_a_frags<kTile>(p, s);
    mma_regs<D>(o, p, v_addr);
    if (kLoads) __syncthreads();
  }
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    inv[r] = 1.f / l[r];
    const int qi = row + 8 * r;
    if (qi < n.S && lane % 4 == 0) lse[(static_cast<int64_t>(qt.b) * n.H + qt.h) * n.S + qi] = (m[r] + log2f(l[r])) * kLn2;
  }
  store_tile<D>(out + qt.qoff, qt.ldq, row, col, n.S, o, inv);
#else
  __trap();
#endif
}

}  // namespace ablate
}  // namespace flash
}  // namespace cuda
}  // namespace kernels
}  // namespace xt
