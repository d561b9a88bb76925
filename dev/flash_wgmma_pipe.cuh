// Development variant, not part of the product (known issue 34): the warpgroup-MMA flash kernels of
// csrc/kernels/cuda/flash_wgmma.cuh with their products issued asynchronously and overlapped, for
// dev/wgmma_flash.cu to check bit for bit against the mma.sync kernels and to time beside the
// product's wgmma kernels. Each product waits for nothing it does not need:
//  - forward: step t issues S(t+1) = Q K(t+1)^T, then O += P(t) V(t), waits for S(t+1) only, masks
//    it and takes its softmax statistics while P(t) V(t) runs, then waits for that and rescales O.
//    K(t+1) must be in shared memory one step earlier than in the product kernel, so K's copies go
//    out at the start of a step (into the buffer S(t) used) and V's at its end (into the buffer
//    P(t) V(t) used): still double buffers, still one step between a copy and its use.
//  - dq: S(t+1) and dP(t+1) in one group, issued after dq += dS(t) K(t), so the tensor cores go
//    from one to the next without a wait between; tile t + 2's copies leave once dq(t) is done.
//  - dk/dv: P^T and dP^T in one group (one wait instead of two), dS computed while dv += P^T dO
//    runs.
// Every output element is the same float32 operations in the same order as in the product's
// kernels (the online softmax split into its statistics and O's rescale, applied in the same
// sequence: O *= alpha(t), then O += P(t) V(t)), so the bits are the mma.sync kernels'.
#pragma once
#include "kernels/cuda/flash_wgmma.cuh"

namespace xt {
namespace kernels {
namespace cuda {
namespace flash {
namespace wgp {

using wg::tile_bytes;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
using wg::aligned_smem;
using wg::fence;
using wg::fence_async_proxy;
using wg::kAtomBytes;
using wg::load_tile;
using wg::pin;
using wg::smem_addr;

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
    wg::mma_ss(acc, wg::descriptor(a_addr + off), wg::descriptor(b_addr + off));
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
    for (int ks = 0; ks < kTile / 16; ++ks)
      wg::mma_rs_t(half, a[ks], wg::descriptor(b_addr + h * kAtomBytes + ks * 16 * 128));
  }
}

template <int R>
__device__ __forceinline__ void zero(float (&acc)[R][4]) {
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] = 0.f;
}

// online_softmax without O's rescale: s becomes P, m and l are updated, alpha is O's factor.
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

#define XT_WGP_BODY 1
#endif  // sm_90a

template <int D>
__global__ void __launch_bounds__(kBlockThreads)
    flash_forward_pipe_kernel(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
                              bf16_t* __restrict__ out, float* __restrict__ lse, Dims n) {
#ifdef XT_WGP_BODY
  constexpr int kTileBytes = tile_bytes<D>();
  unsigned char* sQ = aligned_smem();
  unsigned char* sK = sQ + kTileBytes;  // 2 buffers
  unsigned char* sV = sK + 2 * kTileBytes;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const QueryTile qt = query_tile<D>(n);
  const bf16_t* kh = k + qt.kvoff;
  const bf16_t* vh = v + qt.kvoff;
  const int steps = qt.n_kv_tiles - qt.kv_first;
  const auto load_k = [&](int t) {
    if (t < steps) load_tile<D>(sK + t % 2 * kTileBytes, kh, qt.ldkv, (qt.kv_first + t) * kTile, n.S);
  };
  const auto load_v = [&](int t) {
    if (t < steps) load_tile<D>(sV + t % 2 * kTileBytes, vh, qt.ldkv, (qt.kv_first + t) * kTile, n.S);
  };
  load_tile<D>(sQ, q + qt.qoff, qt.ldq, qt.q0, n.S);
  load_k(0);
  load_v(0);
  cp_async_commit();
  load_k(1);
  cp_async_commit();
  load_v(1);
  cp_async_commit();
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
  cp_async_wait<2>();  // Q, K(0), V(0)
  fence_async_proxy();
  __syncthreads();
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
  for (int t = 0; t < steps; ++t) {
    cp_async_wait<1>();  // K(t + 1) and V(t); only V(t + 1) may still be in flight
    fence_async_proxy();
    __syncthreads();  // every thread's copies landed; every warp is done with S(t)'s K buffer
    load_k(t + 2);
    cp_async_commit();
    const uint32_t v_addr = smem_addr(sV + t % 2 * kTileBytes);
    pin(o);
    if (t + 1 < steps) {
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
      fence();
      issue_regs<D>(o, p, v_addr);
      commit();
      wait<0>();
      pin(o);
    }
    __syncthreads();  // every warp is done with V(t)'s buffer
    load_v(t + 2);
    cp_async_commit();
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

template <int D>
__global__ void __launch_bounds__(kBlockThreads)
    flash_backward_dq_pipe_kernel(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k,
                                  const bf16_t* __restrict__ v, const bf16_t* __restrict__ out,
                                  const bf16_t* __restrict__ dout, const float* __restrict__ lse,
                                  float* __restrict__ delta, bf16_t* __restrict__ dq, Dims n) {
#ifdef XT_WGP_BODY
  constexpr int kTileBytes = tile_bytes<D>();
  unsigned char* sQ = aligned_smem();
  unsigned char* sdO = sQ + kTileBytes;
  unsigned char* sK = sdO + kTileBytes;  // 2 buffers
  unsigned char* sV = sK + 2 * kTileBytes;
  float* sDl = reinterpret_cast<float*>(sV + 2 * kTileBytes);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const QueryTile qt = query_tile<D>(n);
  const bf16_t* kh = k + qt.kvoff;
  const bf16_t* vh = v + qt.kvoff;
  const int steps = qt.n_kv_tiles - qt.kv_first;
  const auto load_kv = [&](int t) {
    if (t >= steps) return;
    load_tile<D>(sK + t % 2 * kTileBytes, kh, qt.ldkv, (qt.kv_first + t) * kTile, n.S);
    load_tile<D>(sV + t % 2 * kTileBytes, vh, qt.ldkv, (qt.kv_first + t) * kTile, n.S);
  };
  load_tile<D>(sQ, q + qt.qoff, qt.ldq, qt.q0, n.S);
  load_tile<D>(sdO, dout + qt.qoff, qt.ldq, qt.q0, n.S);
  load_kv(0);
  cp_async_commit();
  load_kv(1);
  cp_async_commit();
  const int64_t stat = (static_cast<int64_t>(qt.b) * n.H + qt.h) * n.S;
  {
    constexpr int G = lanes_for(D);
    static_assert(kTile % (kBlockThreads / G) == 0, "the block's rows split into whole rounds of groups");
    const int g_lane = threadIdx.x % G;
#pragma unroll
    for (int r0 = 0; r0 < kTile; r0 += kBlockThreads / G) {
      const int r = r0 + static_cast<int>(threadIdx.x) / G, qi = qt.q0 + r;
      const int64_t at = qt.qoff + static_cast<int64_t>(qi) * qt.ldq;
      const float d_row = group_row_dot<G, bf16_t>(out + at, dout + at, D, g_lane, qi < n.S);
      if (g_lane == 0) {
        sDl[r] = d_row;
        if (qi < n.S) delta[stat + qi] = d_row;
      }
    }
  }
  const int row = qt.q0 + warp * 16 + lane / 4;
  const int col = 2 * (lane % 4);
  float lse2[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) lse2[r] = row + 8 * r < n.S ? lse[stat + row + 8 * r] * kLog2e : 0.f;
  cp_async_wait<1>();  // Q, dO, K(0), V(0)
  fence_async_proxy();
  __syncthreads();  // and sDl complete
  float dl[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) dl[r] = row + 8 * r < n.S ? sDl[row + 8 * r - qt.q0] : 0.f;
  float acc[D / 8][4] = {};
  const int lo[2] = {first_key(n.doc, qt.b, n.S, row), first_key(n.doc, qt.b, n.S, row + 8)};
  const uint32_t q_addr = smem_addr(sQ), o_addr = smem_addr(sdO);
  float s[kTile / 8][4], dp[kTile / 8][4];
  uint32_t a[kTile / 16][4];
  const auto issue_s_dp = [&](int t) {  // S(t) and dP(t), one group
    zero(s);
    zero(dp);
    pin(s);
    pin(dp);
    fence();
    issue_kk<D>(s, q_addr, smem_addr(sK + t % 2 * kTileBytes));
    issue_kk<D>(dp, o_addr, smem_addr(sV + t % 2 * kTileBytes));
    commit();
  };
  const auto ds_of = [&](int t) {  // s becomes dS(t), then its A fragments
    const int k0 = (qt.kv_first + t) * kTile;
    const bool masked =
        k0 + kTile > n.S || qt.q0 + kTile > n.S || (n.causal && k0 + kTile > qt.q0) || k0 < qt.doc_last;
#pragma unroll
    for (int nb = 0; nb < kTile / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2;
        float ds = 0.f;
        if (!masked || visible(row + 8 * r, k0 + col + 8 * nb + e % 2, n.S, n.causal, lo[r])) {
          const float p = exp2f(fmaf(s[nb][e], n.scale_log2, -lse2[r]));
          ds = p * (dp[nb][e] - dl[r]);
        }
        s[nb][e] = ds;
      }
    to_a_frags<kTile>(a, s);
  };
  issue_s_dp(0);
  wait<0>();
  pin(s);
  pin(dp);
  ds_of(0);
  for (int t = 0; t < steps; ++t) {
    pin(acc);
    fence();
    issue_regs<D>(acc, a, smem_addr(sK + t % 2 * kTileBytes));  // dq += dS(t) K(t)
    commit();
    if (t + 1 < steps) {
      cp_async_wait<0>();  // K(t + 1), V(t + 1)
      fence_async_proxy();
      __syncthreads();
      issue_s_dp(t + 1);
      wait<0>();
      pin(acc);
      pin(s);
      pin(dp);
      __syncthreads();  // every warp is done with buffer t % 2 (dP(t) and dq(t))
      load_kv(t + 2);
      cp_async_commit();
      ds_of(t + 1);
    } else {
      wait<0>();
      pin(acc);
    }
  }
  const float mul[2] = {n.scale, n.scale};
  store_tile<D>(dq + qt.qoff, qt.ldq, row, col, n.S, acc, mul);
#else
  __trap();
#endif
}

template <int D>
__global__ void __launch_bounds__(kBlockThreads)
    flash_backward_dkdv_pipe_kernel(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k,
                                    const bf16_t* __restrict__ v, const bf16_t* __restrict__ dout,
                                    const float* __restrict__ lse, const float* __restrict__ delta,
                                    bf16_t* __restrict__ dk, bf16_t* __restrict__ dv, Dims n) {
#ifdef XT_WGP_BODY
  constexpr int BR = kTile, kTileBytes = tile_bytes<D>();
  unsigned char* sK = aligned_smem();
  unsigned char* sV = sK + kTileBytes;
  unsigned char* sQ = sV + kTileBytes;       // 2 buffers
  unsigned char* sdO = sQ + 2 * kTileBytes;  // 2 buffers
  float* sL = reinterpret_cast<float*>(sdO + 2 * kTileBytes);
  float* sDl = sL + 2 * BR;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int b = blockIdx.x / n.Hkv, hk = blockIdx.x % n.Hkv;
  const int k0 = blockIdx.y * kTile;
  const int rep = n.H / n.Hkv;
  const int64_t ldq = static_cast<int64_t>(n.H) * D, ldkv = static_cast<int64_t>(n.Hkv) * D;
  const int64_t kvoff = head_offset(b, n.S, hk, n.Hkv, D);
  const int first = n.causal ? k0 / BR : 0;
  const int q_end = doc_end(n.doc, b, n.S, imin(k0 + kTile, n.S) - 1);
  const int per_head = (q_end + BR - 1) / BR - first;
  const int n_steps = rep * per_head;
  const auto load_step = [&](int t, int buf) {
    const int h = hk * rep + t / per_head, q0 = (first + t % per_head) * BR;
    const int64_t qoff = head_offset(b, n.S, h, n.H, D);
    const int64_t stat = (static_cast<int64_t>(b) * n.H + h) * n.S;
    load_tile<D>(sQ + buf * kTileBytes, q + qoff, ldq, q0, n.S);
    load_tile<D>(sdO + buf * kTileBytes, dout + qoff, ldq, q0, n.S);
    load_stats<BR>(sL + buf * BR, lse + stat, q0, n.S);
    load_stats<BR>(sDl + buf * BR, delta + stat, q0, n.S);
  };
  load_tile<D>(sK, k + kvoff, ldkv, k0, n.S);
  load_tile<D>(sV, v + kvoff, ldkv, k0, n.S);
  load_step(0, 0);
  cp_async_commit();
  const int key = k0 + warp * 16 + lane / 4;
  const int col = 2 * (lane % 4);
  float dk_acc[D / 8][4] = {}, dv_acc[D / 8][4] = {};
  const uint32_t k_addr = smem_addr(sK), v_addr = smem_addr(sV);
  for (int t = 0; t < n_steps; ++t) {
    wg::begin_async_step(t, n_steps, [&] { load_step(t + 1, (t + 1) % 2); });
    const int buf = t % 2, q0 = (first + t % per_head) * BR;
    const uint32_t q_addr = smem_addr(sQ + buf * kTileBytes), o_addr = smem_addr(sdO + buf * kTileBytes);
    const float* sLt = sL + buf * BR;
    const float* sDlt = sDl + buf * BR;
    float pt[BR / 8][4], dst[BR / 8][4];
    zero(pt);
    zero(dst);
    pin(pt);
    pin(dst);
    fence();
    issue_kk<D>(pt, k_addr, q_addr);   // P^T = K Q^T
    issue_kk<D>(dst, v_addr, o_addr);  // dP^T = V dO^T
    commit();
    wait<0>();
    pin(pt);
    pin(dst);
    const bool masked = q0 + BR > n.S || (n.causal && q0 < k0 + kTile) ||
                        first_key(n.doc, b, n.S, imin(q0 + BR, n.S) - 1) > k0;
#pragma unroll
    for (int nb = 0; nb < BR / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qc = col + 8 * nb + e % 2;
        float p = 0.f;
        if (!masked || visible(q0 + qc, key + 8 * (e / 2), n.S, n.causal, first_key(n.doc, b, n.S, q0 + qc)))
          p = exp2f(fmaf(pt[nb][e], n.scale_log2, -sLt[qc] * kLog2e));
        pt[nb][e] = p;
      }
    uint32_t a[BR / 16][4];
    to_a_frags<BR>(a, pt);
    pin(dv_acc);
    fence();
    issue_regs<D>(dv_acc, a, o_addr);  // dv += P^T dO, while dS is computed
    commit();
#pragma unroll
    for (int nb = 0; nb < BR / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) dst[nb][e] = pt[nb][e] * (dst[nb][e] - sDlt[col + 8 * nb + e % 2]);
    wait<0>();
    pin(dv_acc);
    to_a_frags<BR>(a, dst);
    pin(dk_acc);
    fence();
    issue_regs<D>(dk_acc, a, q_addr);  // dk += dS^T Q
    commit();
    wait<0>();
    pin(dk_acc);
    __syncthreads();
  }
  const float dk_mul[2] = {n.scale, n.scale}, dv_mul[2] = {1.f, 1.f};
  store_tile<D>(dk + kvoff, ldkv, key, col, n.S, dk_acc, dk_mul);
  store_tile<D>(dv + kvoff, ldkv, key, col, n.S, dv_acc, dv_mul);
#else
  __trap();
#endif
}

// ---- the forward with two warpgroups per block ("wgmma-pipe2")
//
// 128 queries per block, warpgroup w owning rows q0 + 64w .. + 63 exactly as the one-warpgroup
// kernel's block for that tile would (its own key tiles [kv_first, n_kv_tiles), its own masks and
// statistics), the K and V tiles of the union of both ranges loaded once for both: half the
// shared-memory fills per query of the kernels above. The products overlap as in
// flash_forward_pipe_kernel. A warpgroup with no rows (past S), or a step outside its own range,
// issues nothing but takes part in the copies and barriers. Grid: (B * H, ceil(S / 128)).
constexpr int kPairThreads = 2 * kBlockThreads;
inline dim3 forward_pair_grid(const Dims& n) {
  return dim3(static_cast<unsigned>(n.B * n.H), static_cast<unsigned>((n.S + 2 * kTile - 1) / (2 * kTile)));
}
template <int D> constexpr int fwd_pair_smem() { return 1024 + 6 * tile_bytes<D>(); }  // 2 Q, 2 K, 2 V

#ifdef XT_WGP_BODY
// wg::load_tile for `threads` threads, this one being number `tid`.
template <int D, int kThreads>
__device__ __forceinline__ void load_tile_by(unsigned char* sm, const bf16_t* g, int64_t ld, int row0, int S, int tid) {
  constexpr int kChunks = D / 8;
  static_assert(kTile * kChunks % kThreads == 0, "a tile copy splits evenly over the threads");
#pragma unroll
  for (int it = 0; it < kTile * kChunks / kThreads; ++it) {
    const int c = it * kThreads + tid;
    const int r = c / kChunks, col = c % kChunks * 8;
    const bool valid = row0 + r < S;
    cp_async16(sm + wg::swz(r, col), valid ? g + (row0 + r) * ld + col : g, valid);
  }
}
#endif

template <int D>
__global__ void __launch_bounds__(kPairThreads, 1)
    flash_forward_pair_kernel(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
                              bf16_t* __restrict__ out, float* __restrict__ lse, Dims n) {
#ifdef XT_WGP_BODY
  constexpr int kTileBytes = tile_bytes<D>();
  unsigned char* sQ = aligned_smem();   // one tile per warpgroup
  unsigned char* sK = sQ + 2 * kTileBytes;  // 2 buffers
  unsigned char* sV = sK + 2 * kTileBytes;
  // the warpgroup's index through a shuffle: the compiler then knows it is the same across the
  // warp, and the branches on it below do not serialize the wgmma instructions (ptxas C7520)
  const int wgi = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / kBlockThreads, 0);
  const int tid = threadIdx.x % kBlockThreads;
  const int warp = tid / kWarp, lane = tid % kWarp;
  const int b = blockIdx.x / n.H, h = blockIdx.x % n.H;
  const int q_block = (gridDim.y - 1 - blockIdx.y) * 2 * kTile;
  const int q0 = q_block + wgi * kTile;  // this warpgroup's rows
  const bool active = q0 < n.S;
  // this warpgroup's key tiles [f, e) (query_tile's), and the block's: [f of warpgroup 0, e of the last active)
  const auto range = [&](int r0, int& f, int& e, int& doc_last) {
    const int kv_end = n.causal ? imin(r0 + kTile, n.S) : n.S;
    e = (kv_end + kTile - 1) / kTile;
    f = first_key(n.doc, b, n.S, r0) / kTile;
    doc_last = first_key(n.doc, b, n.S, imin(r0 + kTile, n.S) - 1);
  };
  int f, e, doc_last;
  range(active ? q0 : q_block, f, e, doc_last);
  int blk_first, blk_end, unused;
  range(q_block, blk_first, unused, unused);
  {
    const int last = q_block + kTile < n.S ? q_block + kTile : q_block;
    int f1;
    range(last, f1, blk_end, unused);
  }
  const int64_t ldq = static_cast<int64_t>(n.H) * D, ldkv = static_cast<int64_t>(n.Hkv) * D;
  const int64_t qoff = head_offset(b, n.S, h, n.H, D);
  const int64_t kvoff = head_offset(b, n.S, h / (n.H / n.Hkv), n.Hkv, D);
  const bf16_t* kh = k + kvoff;
  const bf16_t* vh = v + kvoff;
  const int steps = blk_end - blk_first;
  const auto load_k = [&](int t) {
    if (t < steps)
      load_tile_by<D, kPairThreads>(sK + t % 2 * kTileBytes, kh, ldkv, (blk_first + t) * kTile, n.S, threadIdx.x);
  };
  const auto load_v = [&](int t) {
    if (t < steps)
      load_tile_by<D, kPairThreads>(sV + t % 2 * kTileBytes, vh, ldkv, (blk_first + t) * kTile, n.S, threadIdx.x);
  };
  unsigned char* myQ = sQ + wgi * kTileBytes;
  load_tile_by<D, kBlockThreads>(myQ, q + qoff, ldq, q0, n.S, tid);
  load_k(0);
  load_v(0);
  cp_async_commit();
  load_k(1);
  cp_async_commit();
  load_v(1);
  cp_async_commit();
  const auto mine = [&](int t) { return active && blk_first + t >= f && blk_first + t < e; };
  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int row = q0 + warp * 16 + lane / 4;
  const int col = 2 * (lane % 4);
  const int lo[2] = {first_key(n.doc, b, n.S, row), first_key(n.doc, b, n.S, row + 8)};
  const uint32_t q_addr = smem_addr(myQ);
  float s[kTile / 8][4];
  uint32_t p[kTile / 16][4];
  float alpha[2];
  const auto softmax_of = [&](int t) {
    const int k0 = (blk_first + t) * kTile;
    if (k0 + kTile > n.S || (n.causal && k0 + kTile > q0) || k0 < doc_last) {
#pragma unroll
      for (int nb = 0; nb < kTile / 8; ++nb)
#pragma unroll
        for (int e4 = 0; e4 < 4; ++e4)
          if (!visible(row + 8 * (e4 / 2), k0 + col + 8 * nb + e4 % 2, n.S, n.causal, lo[e4 / 2])) s[nb][e4] = -INFINITY;
    }
    softmax_stats<kTile>(s, m, l, alpha, n.scale_log2);
  };
  cp_async_wait<2>();
  fence_async_proxy();
  __syncthreads();
  if (mine(0)) {
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
  }
  for (int t = 0; t < steps; ++t) {
    cp_async_wait<1>();
    fence_async_proxy();
    __syncthreads();
    load_k(t + 2);
    cp_async_commit();
    const uint32_t v_addr = smem_addr(sV + t % 2 * kTileBytes);
    const bool now = mine(t), next = t + 1 < steps && mine(t + 1);
    pin(o);
    if (next) {
      zero(s);
      pin(s);
      fence();
      issue_kk<D>(s, q_addr, smem_addr(sK + (t + 1) % 2 * kTileBytes));
      commit();
      if (now) {
        issue_regs<D>(o, p, v_addr);
        commit();
        wait<1>();
      } else {
        wait<0>();
      }
      pin(s);
      softmax_of(t + 1);
      wait<0>();
      pin(o);
      rescale<D>(o, alpha);
      to_a_frags<kTile>(p, s);
    } else if (now) {
      fence();
      issue_regs<D>(o, p, v_addr);
      commit();
      wait<0>();
      pin(o);
    }
    __syncthreads();
    load_v(t + 2);
    cp_async_commit();
  }
  if (!active) return;
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    inv[r] = 1.f / l[r];
    const int qi = row + 8 * r;
    if (qi < n.S && lane % 4 == 0) lse[(static_cast<int64_t>(b) * n.H + h) * n.S + qi] = (m[r] + log2f(l[r])) * kLn2;
  }
  store_tile<D>(out + qoff, ldq, row, col, n.S, o, inv);
#else
  __trap();
#endif
}

#undef XT_WGP_BODY

}  // namespace wgp
}  // namespace flash
}  // namespace cuda
}  // namespace kernels
}  // namespace xt
