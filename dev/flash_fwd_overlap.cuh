// Development variant, not part of the product (known issue 34): the product's wgmma flash forward
// (kernels/cuda/flash_wgmma.cuh, tiles by TMA) with its two products overlapped, for
// dev/wgmma_flash.cu ("wgmma-overlap") to check bit for bit against the mma.sync forward and to
// time beside the product's. Step t issues S(t+1) = Q K(t+1)^T, then O += P(t) V(t), waits for
// S(t+1) only, masks it and takes its softmax statistics while P(t) V(t) runs, then waits for that
// and rescales O (FlashAttention-3's intra-warpgroup overlap). The same form with cp.async tile
// copies measured slower than the product on the H200 (bb1f9e2: 0.877 against 0.803 ms at the
// Qwen3-1.7B shape; 191 registers against 168); with TMA the copies' registers and issue slots are
// gone (the product's TMA forward: 140 registers), which is what this variant tests.
// K(t+1) is needed one step earlier than in the product, so K and V have barriers of their own:
// K(t+3) goes out once S(t+1) is done (into the buffer K(t+1) used), V(t+2) once P(t) V(t) is done.
// Every output element is the product's float32 operations in its order (the online softmax split
// into its statistics and O's rescale, applied in the same sequence: O *= alpha(t), then
// O += P(t) V(t)), so the bits are the mma.sync kernels'.
#pragma once
#include "kernels/cuda/flash_wgmma.cuh"

namespace xt {
namespace kernels {
namespace cuda {
namespace flash {
namespace wgo {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
using namespace wg;

__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// acc += A B^T over D as wg::mma_kk, issued only (the caller fences before and commits after).
template <int D>
__device__ __forceinline__ void issue_kk(float (&acc)[8][4], uint32_t a_addr, uint32_t b_addr) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint32_t off = (kk / 4) * kAtomBytes + (kk % 4) * 32;
    mma_ss(acc, descriptor(a_addr + off), descriptor(b_addr + off));
  }
}

// acc += A B with A from registers as wg::mma_regs, issued only.
template <int D>
__device__ __forceinline__ void issue_regs(float (&acc)[D / 8][4], const uint32_t (&a)[kTile / 16][4],
                                           uint32_t b_addr) {
#pragma unroll
  for (int h = 0; h < D / 64; ++h) {
    float(&half)[8][4] = *reinterpret_cast<float(*)[8][4]>(&acc[8 * h][0]);
#pragma unroll
    for (int ks = 0; ks < kTile / 16; ++ks) mma_rs_t(half, a[ks], descriptor(b_addr + h * kAtomBytes + ks * 16 * 128));
  }
}

template <int R>
__device__ __forceinline__ void zero(float (&acc)[R][4]) {
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] = 0.f;
}

// online_softmax (flash_attention.cuh) without O's rescale: s becomes P, m and l are updated,
// alpha is O's factor; the same operations in the same order.
template <int N>
__device__ __forceinline__ void softmax_stats(float (&s)[N / 8][4], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                              float scale_log2) {
  float mt[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nb = 0; nb < N / 8; ++nb)
#pragma unroll
    for (int e = 0; e < 4; ++e) mt[e / 2] = fmaxf(mt[e / 2], s[nb][e]);
  float base[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mt[r] = fmaxf(mt[r], __shfl_xor_sync(0xffffffffu, mt[r], 1));
    mt[r] = fmaxf(mt[r], __shfl_xor_sync(0xffffffffu, mt[r], 2));
    const float m_new = fmaxf(m[r], mt[r] * scale_log2);
    base[r] = m_new == -INFINITY ? 0.f : m_new;
    alpha[r] = exp2f(m[r] - base[r]);
    m[r] = m_new;
    l[r] *= alpha[r];
  }
#pragma unroll
  for (int nb = 0; nb < N / 8; ++nb)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[nb][e] = exp2f(fmaf(s[nb][e], scale_log2, -base[e / 2]));
      l[e / 2] += s[nb][e];
    }
}

template <int D>
__device__ __forceinline__ void rescale(float (&o)[D / 8][4], const float (&alpha)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int nb = 0; nb < D / 8; ++nb) {
      o[nb][2 * r] *= alpha[r];
      o[nb][2 * r + 1] *= alpha[r];
    }
}

// Tile u of K (or V) into buffer u % 2, counted on bars[u % 2] (the issuer only).
template <int D>
__device__ __forceinline__ void send(unsigned char* buf, uint64_t (&bars)[2], const CUtensorMap* map, int u, int j0,
                                     int hk, int b) {
  constexpr int kTileBytes = tile_bytes<D>();
  mbar_expect(&bars[u % 2], kTileBytes);
  tma_tile<D>(buf + u % 2 * kTileBytes, map, &bars[u % 2], hk, (j0 + u) * kTile, b);
}
__device__ __forceinline__ void arrive(uint64_t (&bars)[2], int u) {
  mbar_wait(&bars[u % 2], static_cast<uint32_t>((u / 2) & 1));
}
#define XT_WGO_BODY 1
#endif  // sm_90a

template <int D>
__global__ void __launch_bounds__(kBlockThreads)
    flash_forward_overlap_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                                 const __grid_constant__ CUtensorMap tv, bf16_t* __restrict__ out,
                                 float* __restrict__ lse, Dims n) {
#ifdef XT_WGO_BODY
  constexpr int kTileBytes = tile_bytes<D>();
  __shared__ __align__(8) uint64_t bar_q, bar_k[2], bar_v[2];
  unsigned char* sQ = aligned_smem();
  unsigned char* sK = sQ + kTileBytes;  // 2 buffers
  unsigned char* sV = sK + 2 * kTileBytes;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const QueryTile qt = query_tile<D>(n);
  const int hk = qt.h / (n.H / n.Hkv);
  const bool issuer = threadIdx.x == 0;
  const int steps = qt.n_kv_tiles - qt.kv_first;
  if (threadIdx.x == 0) {
    mbar_init(&bar_k[0], 1);
    mbar_init(&bar_k[1], 1);
  }
  init_bars(&bar_q, &bar_v[0], &bar_v[1]);  // and the block's barrier after every init
  if (issuer) {
    mbar_expect(&bar_q, kTileBytes);
    tma_tile<D>(sQ, &tq, &bar_q, qt.h, qt.q0, qt.b);
    for (int u = 0; u < 2 && u < steps; ++u) {
      send<D>(sK, bar_k, &tk, u, qt.kv_first, hk, qt.b);
      send<D>(sV, bar_v, &tv, u, qt.kv_first, hk, qt.b);
    }
  }
  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int row = qt.q0 + warp * 16 + lane / 4;
  const int col = 2 * (lane % 4);
  const int lo[2] = {first_key(n.doc, qt.b, n.S, row), first_key(n.doc, qt.b, n.S, row + 8)};
  const uint32_t q_addr = smem_addr(sQ);
  float s[kTile / 8][4];
  uint32_t p[kTile / 16][4];
  float alpha[2];
  // step t's scores (in s, after the product) masked, then the softmax statistics: s becomes P(t)
  const auto softmax_of = [&](int t) {
    const int k0 = (qt.kv_first + t) * kTile;
    if (k0 + kTile > n.S || (n.causal && k0 + kTile > qt.q0) || k0 < qt.doc_last) {
#pragma unroll
      for (int nb = 0; nb < kTile / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (!visible(row + 8 * (e / 2), k0 + col + 8 * nb + e % 2, n.S, n.causal, lo[e / 2])) s[nb][e] = -INFINITY;
    }
    softmax_stats<kTile>(s, m, l, alpha, n.scale_log2);
  };
  if (steps > 0) {
    mbar_wait(&bar_q, 0);
    arrive(bar_k, 0);
    zero(s);
    pin(s);
    fence();
    issue_kk<D>(s, q_addr, smem_addr(sK));
    commit();
    wait<0>();
    pin(s);
    softmax_of(0);
    rescale<D>(o, alpha);
    to_a_frags<kTile>(p, s);
    __syncthreads();  // every warp is done with K(0)'s buffer
    if (issuer && 2 < steps) send<D>(sK, bar_k, &tk, 2, qt.kv_first, hk, qt.b);
  }
  for (int t = 0; t < steps; ++t) {
    const uint32_t v_addr = smem_addr(sV + t % 2 * kTileBytes);
    pin(o);
    if (t + 1 < steps) {
      arrive(bar_k, t + 1);
      arrive(bar_v, t);  // sent two steps ago: both waits before the products, which then go out back to back
      zero(s);
      pin(s);
      fence();
      issue_kk<D>(s, q_addr, smem_addr(sK + (t + 1) % 2 * kTileBytes));
      commit();
      issue_regs<D>(o, p, v_addr);
      commit();
      wait<1>();  // S(t + 1); P(t) V(t) may still run
      pin(s);
      softmax_of(t + 1);
      wait<0>();
      pin(o);
      rescale<D>(o, alpha);
      to_a_frags<kTile>(p, s);
    } else {
      arrive(bar_v, t);
      fence();
      issue_regs<D>(o, p, v_addr);
      commit();
      wait<0>();
      pin(o);
    }
    __syncthreads();  // every warp is done with K(t + 1)'s and V(t)'s buffers
    if (issuer) {
      if (t + 3 < steps) send<D>(sK, bar_k, &tk, t + 3, qt.kv_first, hk, qt.b);
      if (t + 2 < steps) send<D>(sV, bar_v, &tv, t + 2, qt.kv_first, hk, qt.b);
    }
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

#undef XT_WGO_BODY

}  // namespace wgo
}  // namespace flash
}  // namespace cuda
}  // namespace kernels
}  // namespace xt
