// Development variant, not part of the product (known issue 34): the wgmma flash forward of
// kernels/cuda/flash_wgmma.cuh with its tiles loaded by the Tensor Memory Accelerator instead of
// every thread's cp.async copies ("wgmma-tma" in dev/wgmma_flash.cu). One thread issues a tile as
// D / 64 bulk tensor copies of a [64 rows, 64 columns] box in the 128-byte swizzle (the layout
// wg::swz describes, so the products read the tiles unchanged), completing on a shared-memory
// mbarrier that counts the bytes; rows past S arrive as zeros (the tensor map's bounds), as the
// cp.async copies zero-fill them. The other 127 threads issue no copy instructions at all. Every
// value computed is the product kernel's, in its order, so the output is bitwise the mma.sync
// kernels' (the harness checks it).
// Tensor maps: q, k, v as 4-D [B, S, heads, D] tensors (innermost first: D, heads, S, B), box
// {64, 1, 64, 1}; made on the host by make_head_map (the driver's cuTensorMapEncodeTiled through
// the runtime's entry-point query: nothing links libcuda).
#pragma once
#include <cudaTypedefs.h>

#include "kernels/cuda/flash_wgmma.cuh"

namespace xt {
namespace kernels {
namespace cuda {
namespace flash {
namespace wgt {

using wg::tile_bytes;

// The tiles as wg::fwd_smem lays them out (1024 for alignment, Q, 2 K, 2 V); the three mbarriers
// are static shared memory.
template <int D> constexpr int fwd_smem() { return wg::fwd_smem<D>(); }
template <int D> constexpr int dq_smem() { return wg::dq_smem<D>(); }
template <int D> constexpr int dkdv_smem() { return wg::dkdv_smem<D>(); }

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
using wg::smem_addr;

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// This thread's arrival, announcing `bytes` more of asynchronous writes to wait for.
__device__ __forceinline__ void mbar_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
// Waits until the barrier's phase `parity` completed; traps after ~2^20 unsuccessful tries (a
// copy that never lands, say a wrong byte count, ends the kernel with an error instead of a hang).
__device__ __forceinline__ bool mbar_try(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  for (int tries = 0; !mbar_try(bar, parity); ++tries)
    if (tries > (1 << 20)) __trap();
}
// One [64, 64] box of a 4-D tensor map at (d0, head, s0, b) into shared memory, counted on bar.
__device__ __forceinline__ void tma_box(unsigned char* dst, const CUtensorMap* map, uint64_t* bar, int d0, int head,
                                        int s0, int b) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::
          "r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(d0), "r"(head), "r"(s0), "r"(b)
      : "memory");
}
// A [64, D] tile (rows s0 .. s0 + 63 of one head): D / 64 boxes, one per 64-column atom.
template <int D>
__device__ __forceinline__ void tma_tile(unsigned char* dst, const CUtensorMap* map, uint64_t* bar, int head, int s0,
                                         int b) {
#pragma unroll
  for (int a = 0; a < D / 64; ++a) tma_box(dst + a * wg::kAtomBytes, map, bar, a * 64, head, s0, b);
}
// Thread 0 initialises three single-arrival mbarriers; then the block's barrier.
__device__ __forceinline__ void init_bars(uint64_t* a, uint64_t* b, uint64_t* c) {
  if (threadIdx.x == 0) {
    mbar_init(a, 1);
    mbar_init(b, 1);
    mbar_init(c, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
}
// Step t of a loop over key tiles j0, j0 + 1, ... (steps of them), K and V double-buffered on
// bars: the issuer sends tile t + 1 (into the buffers step t - 1 read, which the barrier ending
// that step closed), then every thread waits for tile t. Returns step t's buffer.
template <int D>
__device__ __forceinline__ int kv_step(int t, int steps, int j0, bool issuer, unsigned char* sK, unsigned char* sV,
                                       uint64_t (&bars)[2], const CUtensorMap* tk, const CUtensorMap* tv, int hk,
                                       int b) {
  constexpr int kTileBytes = tile_bytes<D>();
  if (issuer && t + 1 < steps) {
    const int nb = (t + 1) % 2;
    mbar_expect(&bars[nb], 2 * kTileBytes);
    tma_tile<D>(sK + nb * kTileBytes, tk, &bars[nb], hk, (j0 + t + 1) * kTile, b);
    tma_tile<D>(sV + nb * kTileBytes, tv, &bars[nb], hk, (j0 + t + 1) * kTile, b);
  }
  mbar_wait(&bars[t % 2], static_cast<uint32_t>((t / 2) & 1));
  return t % 2;
}
#define XT_WGT_BODY 1
#endif  // sm_90a

template <int D>
__global__ void __launch_bounds__(kBlockThreads)
    flash_forward_tma_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                             const __grid_constant__ CUtensorMap tv, bf16_t* __restrict__ out, float* __restrict__ lse,
                             Dims n) {
#ifdef XT_WGT_BODY
  using namespace wg;
  constexpr int kTileBytes = tile_bytes<D>();
  __shared__ __align__(8) uint64_t bar_q, bar_kv[2];
  unsigned char* sQ = aligned_smem();
  unsigned char* sK = sQ + kTileBytes;  // 2 buffers
  unsigned char* sV = sK + 2 * kTileBytes;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const QueryTile qt = query_tile<D>(n);
  const int hk = qt.h / (n.H / n.Hkv);
  const bool issuer = threadIdx.x == 0;
  init_bars(&bar_q, &bar_kv[0], &bar_kv[1]);
  if (issuer) {
    mbar_expect(&bar_q, kTileBytes);
    tma_tile<D>(sQ, &tq, &bar_q, qt.h, qt.q0, qt.b);
    mbar_expect(&bar_kv[0], 2 * kTileBytes);
    tma_tile<D>(sK, &tk, &bar_kv[0], hk, qt.kv_first * kTile, qt.b);
    tma_tile<D>(sV, &tv, &bar_kv[0], hk, qt.kv_first * kTile, qt.b);
  }
  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int row = qt.q0 + warp * 16 + lane / 4;
  const int col = 2 * (lane % 4);
  const int lo[2] = {first_key(n.doc, qt.b, n.S, row), first_key(n.doc, qt.b, n.S, row + 8)};
  const uint32_t q_addr = smem_addr(sQ);
  const int steps = qt.n_kv_tiles - qt.kv_first;
  mbar_wait(&bar_q, 0);
  for (int t = 0; t < steps; ++t) {
    const int j = qt.kv_first + t;
    const int buf = kv_step<D>(t, steps, qt.kv_first, issuer, sK, sV, bar_kv, &tk, &tv, hk, qt.b);
    const uint32_t k_addr = smem_addr(sK + buf * kTileBytes), v_addr = smem_addr(sV + buf * kTileBytes);
    const int k0 = j * kTile;
    float s[kTile / 8][4] = {};
    mma_kk<D>(s, q_addr, k_addr);
    if (k0 + kTile > n.S || (n.causal && k0 + kTile > qt.q0) || k0 < qt.doc_last) {
#pragma unroll
      for (int nb = 0; nb < kTile / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (!visible(row + 8 * (e / 2), k0 + col + 8 * nb + e % 2, n.S, n.causal, lo[e / 2])) s[nb][e] = -INFINITY;
    }
    online_softmax<kTile, D>(s, o, m, l, n.scale_log2);
    uint32_t p[kTile / 16][4];
    to_a_frags<kTile>(p, s);
    mma_regs<D>(o, p, v_addr);
    __syncthreads();  // every warp is done with this step's buffers before they are refilled
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

// dq (flash_backward_dq_wgmma_kernel) with TMA tile loads: Q and dO once, K and V per step
// (double-buffered on two mbarriers); delta from global memory as there.
template <int D>
__global__ void __launch_bounds__(kBlockThreads)
    flash_backward_dq_tma_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                                 const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tdo,
                                 const bf16_t* __restrict__ out, const bf16_t* __restrict__ dout,
                                 const float* __restrict__ lse, float* __restrict__ delta, bf16_t* __restrict__ dq,
                                 Dims n) {
#ifdef XT_WGT_BODY
  using namespace wg;
  constexpr int kTileBytes = tile_bytes<D>();
  __shared__ __align__(8) uint64_t bar_q, bar_kv[2];
  unsigned char* sQ = aligned_smem();
  unsigned char* sdO = sQ + kTileBytes;
  unsigned char* sK = sdO + kTileBytes;  // 2 buffers
  unsigned char* sV = sK + 2 * kTileBytes;
  float* sDl = reinterpret_cast<float*>(sV + 2 * kTileBytes);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const QueryTile qt = query_tile<D>(n);
  const int hk = qt.h / (n.H / n.Hkv);
  const bool issuer = threadIdx.x == 0;
  const int steps = qt.n_kv_tiles - qt.kv_first;
  init_bars(&bar_q, &bar_kv[0], &bar_kv[1]);
  if (issuer) {
    mbar_expect(&bar_q, 2 * kTileBytes);
    tma_tile<D>(sQ, &tq, &bar_q, qt.h, qt.q0, qt.b);
    tma_tile<D>(sdO, &tdo, &bar_q, qt.h, qt.q0, qt.b);
    mbar_expect(&bar_kv[0], 2 * kTileBytes);
    tma_tile<D>(sK, &tk, &bar_kv[0], hk, qt.kv_first * kTile, qt.b);
    tma_tile<D>(sV, &tv, &bar_kv[0], hk, qt.kv_first * kTile, qt.b);
  }
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
  __syncthreads();  // sDl complete
  float dl[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) dl[r] = row + 8 * r < n.S ? sDl[row + 8 * r - qt.q0] : 0.f;
  float acc[D / 8][4] = {};
  const int lo[2] = {first_key(n.doc, qt.b, n.S, row), first_key(n.doc, qt.b, n.S, row + 8)};
  const uint32_t q_addr = smem_addr(sQ), o_addr = smem_addr(sdO);
  mbar_wait(&bar_q, 0);
  for (int t = 0; t < steps; ++t) {
    const int j = qt.kv_first + t;
    const int buf = kv_step<D>(t, steps, qt.kv_first, issuer, sK, sV, bar_kv, &tk, &tv, hk, qt.b);
    const uint32_t k_addr = smem_addr(sK + buf * kTileBytes), v_addr = smem_addr(sV + buf * kTileBytes);
    const int k0 = j * kTile;
    float s[kTile / 8][4] = {}, dp[kTile / 8][4] = {};
    mma_kk<D>(s, q_addr, k_addr);
    mma_kk<D>(dp, o_addr, v_addr);
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
    uint32_t a[kTile / 16][4];
    to_a_frags<kTile>(a, s);
    mma_regs<D>(acc, a, k_addr);
    __syncthreads();  // every warp is done with this step's buffers before they are refilled
  }
  const float mul[2] = {n.scale, n.scale};
  store_tile<D>(dq + qt.qoff, qt.ldq, row, col, n.S, acc, mul);
#else
  __trap();
#endif
}

// dk, dv (flash_backward_dkdv_wgmma_kernel) with TMA tile loads: K and V once, Q and dO per step
// (double-buffered on two mbarriers); the step's lse and delta (64 floats each) by cp.async as there.
template <int D>
__global__ void __launch_bounds__(kBlockThreads)
    flash_backward_dkdv_tma_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                                   const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tdo,
                                   const float* __restrict__ lse, const float* __restrict__ delta,
                                   bf16_t* __restrict__ dk, bf16_t* __restrict__ dv, Dims n) {
#ifdef XT_WGT_BODY
  using namespace wg;
  constexpr int BR = kTile, kTileBytes = tile_bytes<D>();
  __shared__ __align__(8) uint64_t bar_kv, bar_q[2];
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
  const int64_t ldkv = static_cast<int64_t>(n.Hkv) * D;
  const int64_t kvoff = head_offset(b, n.S, hk, n.Hkv, D);
  const int first = n.causal ? k0 / BR : 0;
  const int q_end = doc_end(n.doc, b, n.S, imin(k0 + kTile, n.S) - 1);
  const int per_head = (q_end + BR - 1) / BR - first;
  const int n_steps = rep * per_head;
  const bool issuer = threadIdx.x == 0;
  const auto load_step = [&](int t, int buf) {  // every thread: the stats; the issuer: the tiles
    const int h = hk * rep + t / per_head, q0 = (first + t % per_head) * BR;
    const int64_t stat = (static_cast<int64_t>(b) * n.H + h) * n.S;
    if (issuer) {
      mbar_expect(&bar_q[buf], 2 * kTileBytes);
      tma_tile<D>(sQ + buf * kTileBytes, &tq, &bar_q[buf], h, q0, b);
      tma_tile<D>(sdO + buf * kTileBytes, &tdo, &bar_q[buf], h, q0, b);
    }
    load_stats<BR>(sL + buf * BR, lse + stat, q0, n.S);
    load_stats<BR>(sDl + buf * BR, delta + stat, q0, n.S);
  };
  init_bars(&bar_kv, &bar_q[0], &bar_q[1]);
  if (issuer) {
    mbar_expect(&bar_kv, 2 * kTileBytes);
    tma_tile<D>(sK, &tk, &bar_kv, hk, k0, b);
    tma_tile<D>(sV, &tv, &bar_kv, hk, k0, b);
  }
  if (n_steps > 0) load_step(0, 0);
  cp_async_commit();
  const int key = k0 + warp * 16 + lane / 4;
  const int col = 2 * (lane % 4);
  float dk_acc[D / 8][4] = {}, dv_acc[D / 8][4] = {};
  const uint32_t k_addr = smem_addr(sK), v_addr = smem_addr(sV);
  mbar_wait(&bar_kv, 0);
  for (int t = 0; t < n_steps; ++t) {
    const int buf = t % 2, q0 = (first + t % per_head) * BR;
    if (t + 1 < n_steps) {
      load_step(t + 1, (t + 1) % 2);  // into the buffers step t - 1 read (the barrier ending it closed)
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    mbar_wait(&bar_q[buf], static_cast<uint32_t>((t / 2) & 1));
    __syncthreads();  // every thread's stats of step t landed
    const uint32_t q_addr = smem_addr(sQ + buf * kTileBytes), o_addr = smem_addr(sdO + buf * kTileBytes);
    const float* sLt = sL + buf * BR;
    const float* sDlt = sDl + buf * BR;
    float pt[BR / 8][4] = {};
    mma_kk<D>(pt, k_addr, q_addr);
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
    mma_regs<D>(dv_acc, a, o_addr);  // dv += P^T dO
    float dst[BR / 8][4] = {};
    mma_kk<D>(dst, v_addr, o_addr);  // dP^T = V dO^T
#pragma unroll
    for (int nb = 0; nb < BR / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) dst[nb][e] = pt[nb][e] * (dst[nb][e] - sDlt[col + 8 * nb + e % 2]);
    to_a_frags<BR>(a, dst);
    mma_regs<D>(dk_acc, a, q_addr);  // dk += dS^T Q
    __syncthreads();
  }
  const float dk_mul[2] = {n.scale, n.scale}, dv_mul[2] = {1.f, 1.f};
  store_tile<D>(dk + kvoff, ldkv, key, col, n.S, dk_acc, dk_mul);
  store_tile<D>(dv + kvoff, ldkv, key, col, n.S, dv_acc, dv_mul);
#else
  __trap();
#endif
}

#undef XT_WGT_BODY

// The tensor map of a [B, S, heads, D] bf16 tensor for tma_tile: boxes of 64 rows x 64 columns
// of one head in the 128-byte swizzle, rows past S read as zeros. Returns false (map untouched) if
// the driver's encoder is unavailable or refuses.
inline bool make_head_map(CUtensorMap* map, const void* base, int64_t B, int64_t S, int64_t heads, int64_t D) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  if (encode == nullptr) {
    cudaDriverEntryPointQueryResult found;
    void* fn = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess || fn == nullptr)
      return false;
    encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(D), static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(S),
                              static_cast<cuuint64_t>(B)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(D * 2), static_cast<cuuint64_t>(heads * D * 2),
                                 static_cast<cuuint64_t>(S * heads * D * 2)};  // bytes, dims 1..3
  const cuuint32_t box[4] = {64, 1, 64, 1};
  const cuuint32_t elem[4] = {1, 1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(base), dims, strides, box, elem,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace wgt
}  // namespace flash
}  // namespace cuda
}  // namespace kernels
}  // namespace xt
