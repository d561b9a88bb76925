// Flash attention's tile products with Hopper's warpgroup MMA (sm_90a): the forward, dq and dk/dv
// kernels of flash_attention.cuh with their products as wgmma instead of mma.sync, everything
// else (blocks, loops, masks, the online softmax, the recompute of P from lse, delta, the
// epilogues) theirs. Included by flash_attention.cu only (tests/emu emulates mma.sync, not wgmma).
//
// Note [Warpgroup products]
// A block is still 4 warps = one warpgroup owning 64 rows; a product over a 64 x 64 tile is one
// chain of wgmma.mma_async m64n64k16 (bf16 in, float32 accumulators) instead of each warp's
// mma.sync m16n8k16 over its 16 rows. The accumulator fragment of m64n64 gives warp w rows
// 16w .. 16w + 15 in mma.sync's m16n8 layout, so the masks, the softmax, to_a_frags and
// store_tile are the mma.sync kernels' code unchanged. Operands:
//  - both from shared memory, K-major (S = Q K^T, dP = dO V^T, P^T = K Q^T, dP^T = V dO^T);
//  - the left factor from registers (P, dS, P^T, dS^T as to_a_frags makes them) and the right
//    one as it lies in memory, [rows, D] with the rows the reduction (MN-major, the transpose
//    flag): O += P V, dq += dS K, dv += P^T dO, dk += dS^T Q.
// Tiles are [64, D] in the 128-byte swizzle (a row of 64 elements in 128 bytes, its eight 16-byte
// chunks XOR the row's index mod 8; D = 128 as two 64-column atoms), double-buffered, and loaded
// by the Tensor Memory Accelerator (Note [Tiles by the Tensor Memory Accelerator]). The
// descriptor fields were read off the hardware by dev/wgmma_probe.cu.
// The bits: each output element is the same float32 sums in the same order as the mma.sync
// kernels' (the k16 steps in ascending order; dk/dv's queries in the same ascending 16-row chunks
// whether a step holds 32 or 64 of them), and dev/wgmma_flash.cu finds every output (out, lse,
// delta, dq, dk, dv) bitwise equal to theirs at GPT-2 d12, Llama-3.2-1B and Qwen3-1.7B attention
// shapes, with GQA and with documents (the H100, bacbfbe; the H200 ran the earlier cp.async form):
// the GPU a run uses does not change its bits. Measured there (ms, mma.sync -> wgmma, Qwen3-1.7B
// b4 s4096 D=128 per layer): forward 1.118 -> 0.676, dq 1.532 -> 0.868, dk/dv 2.215 -> 1.139
// (wgmma_flash-bacbfbe-20261205-150142.json; docs/attention.md has every shape).
// Where they run: flash_attention.cu launches them when the library holds sm_90a code
// (XT_FLASH_SM90A: CMakeLists.txt builds this file for 90a where the arch list has 90), the
// device is compute capability 9.0 and the driver makes the tensor maps, at D = 64 and 128 (D =
// 32 keeps mma.sync: a 64-column swizzle atom is wider than its rows). Elsewhere the bodies
// compile to a trap, never launched.
//
// Note [Tiles by the Tensor Memory Accelerator]
// One thread of the block (thread 0) issues every tile load as D / 64 bulk tensor copies of a
// [64 rows, 64 columns] box in the 128-byte swizzle (the layout swz describes, so the products
// read the tiles as they land); a copy completes on a shared-memory mbarrier that counts its
// bytes, and the block waits on the barrier's phase. Rows past S arrive as zeros (the tensor
// map's bounds), as cp.async's zero-fill gave them. The other 127 threads issue no tile copies
// (dk/dv's per-step lse and delta, 64 floats each, stay cp.async): with cp.async every thread
// issued 16 copies a step at D = 128 with the swizzle's address arithmetic, and the products
// waited for them (an ablation of that form, H100, Qwen3-1.7B b4 s4096 forward: 0.808 ms whole,
// 0.562 without the loop's copies, flash_ablate-8870509-20261205-144951.txt; the harness left
// dev/ with the form). Measured in dev/wgmma_flash.cu against the cp.async
// form (H100, per layer): forward 0.812 -> 0.675 ms, dq 1.022 -> 0.875, dk/dv 1.254 -> 1.138 at
// Qwen3-1.7B; forward 0.853 -> 0.749, dq 1.061 -> 0.844, dk/dv 1.483 -> 1.381 at Llama-3.2-1B
// (wgmma_flash-8870509-20261205-144943.json), every output bitwise equal. Tensor maps: q, k, v,
// dO as 4-D [B, S, heads, D] tensors (innermost first: D, heads, S, B), box {64, 1, 64, 1}, made
// on the host per call by make_head_map (the driver's cuTensorMapEncodeTiled through the
// runtime's entry-point query: nothing links libcuda) and passed by value (__grid_constant__), so
// a captured graph holds them. A stuck wait traps (a copy that never lands ends the kernel with an
// error instead of a hang).
#pragma once
#include <cudaTypedefs.h>

#include "kernels/cuda/flash_attention.cuh"

namespace xt {
namespace kernels {
namespace cuda {
namespace flash {
namespace wg {

constexpr int kAtomBytes = 64 * 128;  // one 64-row x 64-column bf16 atom of the 128-byte swizzle
constexpr int kLbo = 16;              // (ignored by the hardware for swizzled K-major operands)
constexpr int kSbo = 1024;            // 8 rows of 128 bytes
template <int D> constexpr int tile_bytes() { return (D / 64) * kAtomBytes; }

// Shared memory (bytes): 1024 for aligning the first tile to the swizzle's 1024-byte period.
template <int D> constexpr int fwd_smem() { return 1024 + 5 * tile_bytes<D>(); }  // Q, 2 K, 2 V
template <int D> constexpr int dq_smem() { return 1024 + 6 * tile_bytes<D>() + kTile * 4; }  // Q, dO, 2 K, 2 V, delta
template <int D> constexpr int dkdv_smem() { return 1024 + 6 * tile_bytes<D>() + 4 * kTile * 4; }  // K, V, 2 Q, 2 dO, stats

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Byte offset of element (r, c) of a [64, D] tile in the swizzled layout.
__device__ __forceinline__ int swz(int r, int c) {
  return (c / 64) * kAtomBytes + r * 128 + ((((c % 64) / 8) ^ (r % 8)) * 16) + (c % 8) * 2;
}

__device__ __forceinline__ uint64_t descriptor(uint32_t addr) {
  return static_cast<uint64_t>((addr >> 4) & 0x3FFF) | static_cast<uint64_t>((kLbo >> 4) & 0x3FFF) << 16 |
         static_cast<uint64_t>((kSbo >> 4) & 0x3FFF) << 32 | (1ull << 62);  // 62: the 128-byte swizzle
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The 1024-byte-aligned start of the dynamic shared memory.
__device__ __forceinline__ unsigned char* aligned_smem() {
  return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(dynamic_smem()) + 1023) & ~uintptr_t(1023));
}

#define XT_WG_ACC(a)                                                                                          \
  "+f"(a[0][0]), "+f"(a[0][1]), "+f"(a[0][2]), "+f"(a[0][3]), "+f"(a[1][0]), "+f"(a[1][1]), "+f"(a[1][2]),     \
      "+f"(a[1][3]), "+f"(a[2][0]), "+f"(a[2][1]), "+f"(a[2][2]), "+f"(a[2][3]), "+f"(a[3][0]), "+f"(a[3][1]),  \
      "+f"(a[3][2]), "+f"(a[3][3]), "+f"(a[4][0]), "+f"(a[4][1]), "+f"(a[4][2]), "+f"(a[4][3]), "+f"(a[5][0]),  \
      "+f"(a[5][1]), "+f"(a[5][2]), "+f"(a[5][3]), "+f"(a[6][0]), "+f"(a[6][1]), "+f"(a[6][2]), "+f"(a[6][3]),  \
      "+f"(a[7][0]), "+f"(a[7][1]), "+f"(a[7][2]), "+f"(a[7][3])
#define XT_WG_D32                                                                                           \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"

// acc (this warp's part of a 64 x 64 float32 accumulator, mma.sync's m16n8 layout per 8 columns)
// += A B over one k-step of 16, both from shared memory, both K-major.
__device__ __forceinline__ void mma_ss(float (&acc)[8][4], uint64_t da, uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " XT_WG_D32 ", %32, %33, 1, 1, 1, 0, 0;\n"
               : XT_WG_ACC(acc)
               : "l"(da), "l"(db)
               : "memory");
}

// The same with A from registers (the m16n8k16 A fragment of this warp's rows) and B MN-major.
__device__ __forceinline__ void mma_rs_t(float (&acc)[8][4], const uint32_t (&a)[4], uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " XT_WG_D32
               ", {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
               : XT_WG_ACC(acc)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db)
               : "memory");
}
#undef XT_WG_ACC
#undef XT_WG_D32

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit_and_wait() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

// Keeps the compiler from moving reads or writes of an accumulator across the asynchronous MMA:
// its registers pass through an empty asm statement ordered with the wgmma statements.
template <int R>
__device__ __forceinline__ void pin(float (&acc)[R][4]) {
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(acc[i][e])::"memory");
}

// acc (this warp's part of a 64 x 64 accumulator) += A B^T over D: A and B the swizzled [64, D]
// tiles at a_addr and b_addr, both K-major (k-step kk: atom kk / 4, 32 bytes per step inside it).
template <int D>
__device__ __forceinline__ void mma_kk(float (&acc)[8][4], uint32_t a_addr, uint32_t b_addr) {
  pin(acc);
  fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint32_t off = (kk / 4) * kAtomBytes + (kk % 4) * 32;
    mma_ss(acc, descriptor(a_addr + off), descriptor(b_addr + off));
  }
  commit_and_wait();
  pin(acc);
}

// acc (this warp's part of a [64, D] accumulator) += A B: A = 64 x 64 from registers (a product's
// accumulator as to_a_frags makes it), B = the swizzled [64, D] tile at b_addr read MN-major (its
// rows are the reduction: keys 16ks .. are 16 rows of 128 bytes further), at D = 128 as two n64
// halves (one 64-column atom each).
template <int D>
__device__ __forceinline__ void mma_regs(float (&acc)[D / 8][4], const uint32_t (&a)[kTile / 16][4], uint32_t b_addr) {
  pin(acc);
  fence();
#pragma unroll
  for (int h = 0; h < D / 64; ++h) {
    float(&half)[8][4] = *reinterpret_cast<float(*)[8][4]>(&acc[8 * h][0]);
#pragma unroll
    for (int ks = 0; ks < kTile / 16; ++ks) mma_rs_t(half, a[ks], descriptor(b_addr + h * kAtomBytes + ks * 16 * 128));
  }
  commit_and_wait();
  pin(acc);
}

// The tile loads (Note [Tiles by the Tensor Memory Accelerator]).
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
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(d0), "r"(head), "r"(s0), "r"(b)
      : "memory");
}
// A [64, D] tile (rows s0 .. s0 + 63 of one head): D / 64 boxes, one per 64-column atom.
template <int D>
__device__ __forceinline__ void tma_tile(unsigned char* dst, const CUtensorMap* map, uint64_t* bar, int head, int s0,
                                         int b) {
#pragma unroll
  for (int a = 0; a < D / 64; ++a) tma_box(dst + a * kAtomBytes, map, bar, a * 64, head, s0, b);
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
#define XT_WGMMA_BODY 1
#endif  // sm_90a

// The forward for 64 queries of one (b, h) (flash_forward_kernel with wgmma products): S = Q K^T
// from shared memory, the mask and online softmax as there, O += P V with P from registers.
template <int D>
__global__ void __launch_bounds__(kBlockThreads)
    flash_forward_wgmma_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                               const __grid_constant__ CUtensorMap tv, bf16_t* __restrict__ out,
                               float* __restrict__ lse, Dims n) {
#ifdef XT_WGMMA_BODY
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

// dq for 64 queries of one (b, h) (flash_backward_dq_kernel with wgmma products): Q and dO loaded
// once, K and V per step; delta of its rows from global memory with delta_kernel's lanes and order
// (Note [delta inside the dq kernel]; the rows are not contiguous in the swizzled tiles), written
// for dk/dv, then the loop over the visible key tiles: S = Q K^T, dP = dO V^T, dq += dS K.
template <int D>
__global__ void __launch_bounds__(kBlockThreads)
    flash_backward_dq_wgmma_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                                   const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tdo,
                                   const bf16_t* __restrict__ out, const bf16_t* __restrict__ dout,
                                   const float* __restrict__ lse, float* __restrict__ delta,
                                   bf16_t* __restrict__ dq, Dims n) {
#ifdef XT_WGMMA_BODY
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

// dk, dv for 64 keys of one (b, kv head) (flash_backward_dkdv_kernel with wgmma products), 64
// queries per step at every D: K and V loaded once, Q and dO per step (the step's lse and delta, 64
// floats each, by every thread's cp.async); P^T = K Q^T, dP^T = V dO^T, dv += P^T dO, dk += dS^T Q.
template <int D>
__global__ void __launch_bounds__(kBlockThreads)
    flash_backward_dkdv_wgmma_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                                     const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tdo,
                                     const float* __restrict__ lse, const float* __restrict__ delta,
                                     bf16_t* __restrict__ dk, bf16_t* __restrict__ dv, Dims n) {
#ifdef XT_WGMMA_BODY
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

#undef XT_WGMMA_BODY

// The driver's cuTensorMapEncodeTiled, looked up once per process (null if unavailable). A pure
// host function of its arguments: it touches no stream, so a graph capture may call it.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    cudaDriverEntryPointQueryResult found;
    void* fn = nullptr;
    const bool ok = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                                     &found) == cudaSuccess &&
                    found == cudaDriverEntryPointSuccess;
    return ok ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn) : nullptr;
  }();
  return encode;
}

// The tensor map of a [B, S, heads, D] bf16 tensor for tma_tile: boxes of 64 rows x 64 columns
// of one head in the 128-byte swizzle, rows past S read as zeros. Returns false if the driver's
// encoder is unavailable or refuses (the caller then takes another path).
inline bool make_head_map(CUtensorMap* map, const void* base, int64_t B, int64_t S, int64_t heads, int64_t D) {
  const auto encode = tensor_map_encoder();
  if (encode == nullptr) return false;
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

}  // namespace wg
}  // namespace flash
}  // namespace cuda
}  // namespace kernels
}  // namespace xt
