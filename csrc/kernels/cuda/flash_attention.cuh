// Device code of flash attention and of the fused q/k head preparation; the launchers are in
// flash_attention.cu. Kept in a header so that tests/emu can compile the same kernels with a host
// compiler and run them on the CPU (a warp/block emulator: docs/attention.md, "How it is verified").
//
// Layout: q, out, dq [B, S, H, D] and k, v, dk, dv [B, S, Hkv, D], i.e. rows of [B*S, heads*D]
// matrices as the projection GEMMs write them; row s of head h of batch b starts at element
// ((b*S + s)*heads + h)*D. Query head h reads kv head h / (H / Hkv). lse and delta are [B, H, S].
//
// Tensor-core path (bf16, D in {32, 64, 128}): 4 warps per block, each owning 16 rows of the
// block's tile; mma.sync m16n8k16 with float32 accumulators, operands from padded shared-memory
// tiles (row stride D + 8 elements: the 8 rows an ldmatrix phase reads fall in distinct banks)
// filled by cp.async, double-buffered.
//  - forward: block = 64 queries of one (b, h); loops over 64-key tiles (causal: up to the
//    diagonal) with the online softmax in log2 units; keeps o (16 x D per warp) in registers,
//    writes out and lse = m + log(l) (natural log, float32).
//  - backward, deterministic (no atomics, every output element summed by one thread in a fixed
//    order): dq: block = 64 queries of one (b, h), first delta = rowsum(dO * O) of its rows (also
//    written for dk/dv), then loops over the key tiles recomputing P = exp2(s scale log2e - lse
//    log2e) and dS = P (dP - delta); dk, dv, launched after dq: block = 64 keys of one (b, kv
//    head), loops over the query heads of the group (in order) and their query tiles (BR rows),
//    accumulating dv += P^T dO and dk += dS^T Q in registers.
//    P and dS are rounded to bf16 as the operands of the second products (as FlashAttention-2).
// Fallback path (float32, float64, other D, or unaligned pointers): one warp per row, plain FMA
// loops in the compute type, the same recompute-from-lse scheme; correct and deterministic, slow.
//
// Head preparation: one block per token (b, s) with the position's cos/sin tabulated in shared
// memory, G lanes per head row (common.cuh's lanes_for), rms_norm then rope with rmsnorm.cu's sum
// order (row_sum_sq, Note [Wide RMSNorm forward]) and rounding points and kernels/common.h's row math (rms_rstd, rms_scaled,
// rope_inv_freq, rope_cos_sin, rope_rotate) that rmsnorm.cu and rope.cu use: bitwise the composition.
// For D in {32, 64, 128} the register kernels compute the same values with each row loaded once
// and several rows in flight (Note [Head preparation in registers]).
#pragma once
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/rmsnorm.cuh"  // the one-pass backward's plan, rounding and final pass

namespace xt {
namespace kernels {
namespace cuda {
namespace flash {

constexpr int kWarps = 4;
constexpr int kBlockThreads = kWarps * kWarp;
constexpr int kPad = 8;          // bf16 elements of padding per shared-memory row (16 bytes)
constexpr int kTile = 64;        // rows of a forward tile, of the dq/dkdv blocks, keys of a kv tile
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Queries per step of the dk/dv kernel: 64, or 32 for D = 128 (dk and dv take 128 registers).
template <int D> constexpr int dkdv_rows() { return D == 128 ? 32 : 64; }

// Blocks per SM that the backward kernels' __launch_bounds__ ask register room for (Note
// [Backward occupancy]): 4 at D = 32, 3 at D = 64; at D = 128 the compiler's choice (2).
template <int D> constexpr int bwd_min_blocks() { return D == 32 ? 4 : D == 64 ? 3 : 1; }
// Whether the dq kernel keeps its Q and dO rows as A fragments in registers (Note [A fragments
// kept in registers]); at D = 128 they would not fit beside the accumulators.
template <int D> constexpr bool dq_frags_in_regs() { return D <= 64; }

// Shared memory (bytes) of each kernel for head dim D.
template <int D> constexpr int fwd_smem() { return (kTile + 4 * kTile) * (D + kPad) * 2; }
template <int D> constexpr int dq_smem() { return (2 * kTile + 4 * kTile) * (D + kPad) * 2 + kTile * 4; }
template <int D> constexpr int dkdv_smem() {
  constexpr int BR = dkdv_rows<D>();
  return (2 * kTile + 4 * BR) * (D + kPad) * 2 + 4 * BR * 4;
}

struct Dims {
  int B, S, H, Hkv;
  float scale;       // softmax scale
  float scale_log2;  // scale * log2(e)
  bool causal;
};

inline Dims make_dims(int64_t B, int64_t S, int64_t H, int64_t Hkv, double scale, bool causal) {
  const float sc = static_cast<float>(scale);
  return Dims{static_cast<int>(B), static_cast<int>(S), static_cast<int>(H), static_cast<int>(Hkv), sc,
              sc * kLog2e, causal};
}

// Launch geometry (the launchers and tests/emu use these): x = (b, head), y = tile.
inline dim3 forward_grid(const Dims& n) {  // and the dq kernel's
  return dim3(static_cast<unsigned>(n.B * n.H), static_cast<unsigned>((n.S + kTile - 1) / kTile));
}
inline dim3 dkdv_grid(const Dims& n) {
  return dim3(static_cast<unsigned>(n.B * n.Hkv), static_cast<unsigned>((n.S + kTile - 1) / kTile));
}

__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }

// Element offset of the first row (s = 0) of head `head` of batch b in a [B, S, heads, D] tensor;
// row s is at + s * heads * D.
__device__ __forceinline__ int64_t head_offset(int b, int S, int head, int heads, int D) {
  return (static_cast<int64_t>(b) * S * heads + head) * D;
}

__device__ __forceinline__ void store_pair(bf16_t* p, float lo, float hi) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(lo, hi);
}

// ------------------------------------------------------------------ tiles and warp products

// cp.async rows [row0, row0 + R) of one head (row r at g + r * ld) into a shared tile [R][D + kPad];
// rows at or past S are zero-filled. The whole block calls it; no commit here.
template <int R, int D>
__device__ __forceinline__ void load_rows(bf16_t* sm, const bf16_t* g, int64_t ld, int row0, int S) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  static_assert(R * kChunks % kBlockThreads == 0, "a tile copy splits evenly over the block");
#pragma unroll
  for (int it = 0; it < R * kChunks / kBlockThreads; ++it) {
    const int c = it * kBlockThreads + static_cast<int>(threadIdx.x);
    const int r = c / kChunks, col = c % kChunks * 8;
    const bool valid = row0 + r < S;
    cp_async16(sm + r * (D + kPad) + col, valid ? g + (row0 + r) * ld + col : g, valid);
  }
}

// cp.async the R statistics g[row0 .. row0 + R) (zeros past S) into sm.
template <int R>
__device__ __forceinline__ void load_stats(float* sm, const float* g, int row0, int S) {
  static_assert(R <= kBlockThreads, "one statistic per thread");
  const int i = threadIdx.x;
  if (i < R) cp_async4(sm + i, row0 + i < S ? g + row0 + i : g, row0 + i < S);
}

// The A fragment of this warp's 16 rows of sa ([rows][D + kPad]) at columns 16kk .. 16kk + 15:
// matrices (rows 0-7 | 8-15) x (cols 0-7 | 8-15).
template <int D>
__device__ __forceinline__ void load_a_frag(uint32_t (&a)[4], const bf16_t* sa, int kk, int lane) {
  ldsm_x4(a, sa + (lane % 16) * (D + kPad) + kk * 16 + lane / 16 * 8);
}

// acc[N/8][4] += A B^T over columns 16kk .. 16kk + 15 of the reduction: A given as its fragment
// (load_a_frag), B = N rows of sb ([rows][D + kPad]).
template <int D, int N>
__device__ __forceinline__ void warp_mma_nt_slice(float (&acc)[N / 8][4], const uint32_t (&a)[4], const bf16_t* sb,
                                                  int kk, int lane) {
  constexpr int kLd = D + kPad;
#pragma unroll
  for (int np = 0; np < N / 16; ++np) {
    uint32_t b[4];  // rows 16np + (0-7 | 8-15) of sb, each at d = 16kk + (0-7 | 8-15)
    ldsm_x4(b, sb + (np * 16 + lane % 8 + lane / 16 * 8) * kLd + kk * 16 + lane / 8 % 2 * 8);
    mma_bf16(acc[2 * np], a, b[0], b[1]);
    mma_bf16(acc[2 * np + 1], a, b[2], b[3]);
  }
}

// acc[N/8][4] += A B^T for this warp: A = 16 rows of sa, B = N rows of sb (both [rows][D + kPad]),
// reduced over D. acc[nb][e] is (row lane/4 + 8(e/2), column 8 nb + 2(lane%4) + e%2).
template <int D, int N>
__device__ __forceinline__ void warp_gemm_nt(float (&acc)[N / 8][4], const bf16_t* sa, const bf16_t* sb, int lane) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4];
    load_a_frag<D>(a, sa, kk, lane);
    warp_mma_nt_slice<D, N>(acc, a, sb, kk, lane);
  }
}

// Note [A fragments kept in registers]
// The forward's Q rows and the dq kernel's Q and dO rows are the A operand of a product at every
// step of their loops and never change, so those kernels load the fragments once (load_a_frag,
// after the barrier that lands the rows) and keep them in registers instead of re-reading them
// with D/16 ldmatrix.x4 per product: D/8 (forward) or D/4 (dq) more registers. In dq that is only
// at D <= 64 (dq_frags_in_regs); at D = 128 the accumulators leave no room. The dk/dv kernel did
// the same with its K and V rows until its register count cost it a block per SM (Note [Backward
// occupancy]). The same mma.sync calls run in the same order on the same operand values, so every
// output keeps its bits whichever way the fragments arrive (tests/emu compares both).

// Note [Backward occupancy]
// At 4 warps per block the backward kernels are latency-bound on their shared-memory loads and
// exp2 between the products, so blocks per SM decide their speed. Left to itself ptxas gave dq
// 161 / 218 registers and dk/dv 172 / 238 (D = 32 / 64): 3 / 2 and 2 / 2 blocks per SM. With
// __launch_bounds__ asking for 4 blocks at D = 32 and 3 at D = 64 (bwd_min_blocks) both fit
// without spills once dk/dv reads K and V from shared memory (ptxas, sm_90: dq 126 / 168, dk/dv
// 128 / 168 registers), and dq gains the Q/dO fragments in registers on top. Measured on the
// H200 (bench/flash_tune.py's one call, every variant bitwise the old kernels; forward +
// backward): [32, 24, 256, 32] 0.179 -> 0.148 ms, [128, 24, 256, 32] 0.676 -> 0.542,
// [8, 24, 1024, 32] 0.371 -> 0.318, [4, 12, 2048, 64] 0.521 -> 0.478, [2, 24, 4096, 32] 1.155 ->
// 1.021. Keeping K/V fragments in registers at 3 blocks (D = 64, 32-query steps) measured the
// same as this at D = 64 and slower at D = 32, so dk/dv has one form at every D.

// The same product with A held in registers (a[kk] from load_a_frag), or, when kInRegs is false,
// read from the warp's 16 rows of sa (a unused).
template <int D, int N, bool kInRegs = true, int F>
__device__ __forceinline__ void warp_gemm_nt(float (&acc)[N / 8][4], const uint32_t (&a)[F][4], const bf16_t* sa,
                                             const bf16_t* sb, int lane) {
  if constexpr (kInRegs) {
    static_assert(F == D / 16, "one fragment per 16 columns of the reduction");
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) warp_mma_nt_slice<D, N>(acc, a[kk], sb, kk, lane);
  } else {
    warp_gemm_nt<D, N>(acc, sa, sb, lane);
  }
}

// The warp's 16 rows of sa as the A fragments of every 16 columns (F = D / 16), or nothing when
// kInRegs is false.
template <int D, bool kInRegs = true, int F>
__device__ __forceinline__ void load_a_frags(uint32_t (&a)[F][4], const bf16_t* sa, int lane) {
  if constexpr (kInRegs) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) load_a_frag<D>(a[kk], sa, kk, lane);
  }
}

// acc[D/8][4] += A B for this warp: A = 16 x K given as bf16 fragments a[K/16][4] (to_a_frags),
// B = K rows of sb ([K][D + kPad], the k index along rows).
template <int K, int D>
__device__ __forceinline__ void warp_gemm_nn(float (&acc)[D / 8][4], const uint32_t (&a)[K / 16][4],
                                             const bf16_t* sb, int lane) {
  constexpr int kLd = D + kPad;
#pragma unroll
  for (int ks = 0; ks < K / 16; ++ks) {
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t b[4];  // transposed 8x8 blocks: rows 16ks + (0-7 | 8-15), columns 16dp + (0-7 | 8-15)
      ldsm_x4_trans(b, sb + (ks * 16 + lane % 8 + lane / 8 % 2 * 8) * kLd + dp * 16 + lane / 16 * 8);
      mma_bf16(acc[2 * dp], a[ks], b[0], b[1]);
      mma_bf16(acc[2 * dp + 1], a[ks], b[2], b[3]);
    }
  }
}

// The accumulator of a 16 x N product as the bf16 A operand of the next one (its columns become
// the k index): block ks of 16 columns is accumulator blocks 2ks (columns 0-7) and 2ks+1 (8-15).
template <int N>
__device__ __forceinline__ void to_a_frags(uint32_t (&a)[N / 16][4], const float (&acc)[N / 8][4]) {
#pragma unroll
  for (int ks = 0; ks < N / 16; ++ks) {
    a[ks][0] = pack_bf16(acc[2 * ks][0], acc[2 * ks][1]);
    a[ks][1] = pack_bf16(acc[2 * ks][2], acc[2 * ks][3]);
    a[ks][2] = pack_bf16(acc[2 * ks + 1][0], acc[2 * ks + 1][1]);
    a[ks][3] = pack_bf16(acc[2 * ks + 1][2], acc[2 * ks + 1][3]);
  }
}

// Whether key kj is visible from query qi.
__device__ __forceinline__ bool visible(int qi, int kj, int S, bool causal) {
  return qi < S && kj < S && (!causal || kj <= qi);
}

// K and V rows [k0, k0 + kTile) of one kv head into buffer `buf` of sK and sV.
template <int D>
__device__ __forceinline__ void load_kv_tile(bf16_t* sK, bf16_t* sV, int buf, const bf16_t* kh, const bf16_t* vh,
                                             int64_t ldkv, int k0, int S) {
  load_rows<kTile, D>(sK + buf * kTile * (D + kPad), kh, ldkv, k0, S);
  load_rows<kTile, D>(sV + buf * kTile * (D + kPad), vh, ldkv, k0, S);
}

// Starts step t of a double-buffered loop of n steps: issues step t + 1's copies (prefetch(), into
// the buffer of step t - 1, which the barrier ending that step freed), waits for this thread's
// copies of step t, then a barrier makes every thread's copies visible.
template <typename Prefetch>
__device__ __forceinline__ void begin_step(int t, int n, Prefetch&& prefetch) {
  if (t + 1 < n) {
    prefetch();
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  __syncthreads();
}

// The 64 queries of one (b, h) that a forward or dq block owns: grid (B*H, query tiles), tiles in
// reverse order (under the causal mask the last tiles see the most keys: they start first).
struct QueryTile {
  int b, h, q0;
  int n_kv_tiles;       // key tiles with a visible key
  int64_t qoff, kvoff;  // element offsets of row 0 of the query head and of its kv head
  int64_t ldq, ldkv;    // row strides (elements)
};

template <int D>
__device__ __forceinline__ QueryTile query_tile(const Dims& n) {
  QueryTile t;
  t.b = blockIdx.x / n.H;
  t.h = blockIdx.x % n.H;
  t.q0 = (gridDim.y - 1 - blockIdx.y) * kTile;
  const int kv_end = n.causal ? imin(t.q0 + kTile, n.S) : n.S;  // keys [0, kv_end) are visible
  t.n_kv_tiles = (kv_end + kTile - 1) / kTile;
  t.qoff = head_offset(t.b, n.S, t.h, n.H, D);
  t.kvoff = head_offset(t.b, n.S, t.h / (n.H / n.Hkv), n.Hkv, D);
  t.ldq = static_cast<int64_t>(n.H) * D;
  t.ldkv = static_cast<int64_t>(n.Hkv) * D;
  return t;
}

// Writes this thread's part of a warp's 16 x D accumulator, row r (rows row0 + 8r) times mul[r],
// as bf16 into rows of dst (stride ld); rows at or past S are skipped.
template <int D>
__device__ __forceinline__ void store_tile(bf16_t* dst, int64_t ld, int row0, int col, int S,
                                           const float (&acc)[D / 8][4], const float (&mul)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    if (row >= S) continue;
#pragma unroll
    for (int nb = 0; nb < D / 8; ++nb)
      store_pair(dst + row * ld + 8 * nb + col, acc[nb][2 * r] * mul[r], acc[nb][2 * r + 1] * mul[r]);
  }
}

// ------------------------------------------------------------------ forward

// One tile of raw scores s (16 x N per warp, masked entries -inf) for this thread's two rows:
// s becomes P = exp2(s scale_log2 - m), m (running max, log2 units) and l (this thread's share
// of the row sums) are updated and o is rescaled.
template <int N, int D>
__device__ __forceinline__ void online_softmax(float (&s)[N / 8][4], float (&o)[D / 8][4], float (&m)[2],
                                               float (&l)[2], float scale_log2) {
  float mt[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nb = 0; nb < N / 8; ++nb)
#pragma unroll
    for (int e = 0; e < 4; ++e) mt[e / 2] = fmaxf(mt[e / 2], s[nb][e]);
  float base[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mt[r] = fmaxf(mt[r], __shfl_xor_sync(0xffffffffu, mt[r], 1));  // the row's 4 lanes
    mt[r] = fmaxf(mt[r], __shfl_xor_sync(0xffffffffu, mt[r], 2));
    const float m_new = fmaxf(m[r], mt[r] * scale_log2);
    base[r] = m_new == -INFINITY ? 0.f : m_new;  // nothing visible yet: keep exp2's argument finite
    const float alpha = exp2f(m[r] - base[r]);
    m[r] = m_new;
    l[r] *= alpha;
#pragma unroll
    for (int nb = 0; nb < D / 8; ++nb) {
      o[nb][2 * r] *= alpha;
      o[nb][2 * r + 1] *= alpha;
    }
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
__global__ void __launch_bounds__(kBlockThreads)
    flash_forward_kernel(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
                         bf16_t* __restrict__ out, float* __restrict__ lse, Dims n) {
  constexpr int kLd = D + kPad;
  bf16_t* sQ = reinterpret_cast<bf16_t*>(dynamic_smem());
  bf16_t* sK = sQ + kTile * kLd;  // 2 buffers
  bf16_t* sV = sK + 2 * kTile * kLd;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const QueryTile qt = query_tile<D>(n);
  const bf16_t* kh = k + qt.kvoff;
  const bf16_t* vh = v + qt.kvoff;
  load_rows<kTile, D>(sQ, q + qt.qoff, qt.ldq, qt.q0, n.S);
  load_kv_tile<D>(sK, sV, 0, kh, vh, qt.ldkv, 0, n.S);
  cp_async_commit();

  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int row = qt.q0 + warp * 16 + lane / 4;  // this thread's rows: row, row + 8
  const int col = 2 * (lane % 4);                // and columns col + 8 nb + (0, 1) of a tile
  uint32_t qa[D / 16][4];  // the warp's Q rows as A fragments, from step 0 on (Note [A fragments kept in registers])
  for (int j = 0; j < qt.n_kv_tiles; ++j) {
    begin_step(j, qt.n_kv_tiles,
               [&] { load_kv_tile<D>(sK, sV, (j + 1) % 2, kh, vh, qt.ldkv, (j + 1) * kTile, n.S); });
    const bf16_t* sKj = sK + j % 2 * kTile * kLd;
    const bf16_t* sVj = sV + j % 2 * kTile * kLd;
    const int k0 = j * kTile;
    if (j == 0) load_a_frags<D>(qa, sQ + warp * 16 * kLd, lane);
    float s[kTile / 8][4] = {};
    warp_gemm_nt<D, kTile>(s, qa, sQ + warp * 16 * kLd, sKj, lane);
    if (k0 + kTile > n.S || (n.causal && k0 + kTile > qt.q0)) {
#pragma unroll
      for (int nb = 0; nb < kTile / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (!visible(row + 8 * (e / 2), k0 + col + 8 * nb + e % 2, n.S, n.causal)) s[nb][e] = -INFINITY;
    }
    online_softmax<kTile, D>(s, o, m, l, n.scale_log2);
    uint32_t p[kTile / 16][4];
    to_a_frags<kTile>(p, s);
    warp_gemm_nn<kTile, D>(o, p, sVj, lane);
    __syncthreads();  // before the next prefetch overwrites this tile's buffer
  }

  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);  // the same bits on the row's 4 lanes
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    inv[r] = 1.f / l[r];
    const int qi = row + 8 * r;
    if (qi < n.S && lane % 4 == 0)
      lse[(static_cast<int64_t>(qt.b) * n.H + qt.h) * n.S + qi] = (m[r] + log2f(l[r])) * kLn2;
  }
  store_tile<D>(out + qt.qoff, qt.ldq, row, col, n.S, o, inv);
}

// ------------------------------------------------------------------ backward

// A row's delta = sum_d dO * O, by the G lanes of its group (every lane calls it, `valid` or not:
// the shuffles): the one sum order of delta_kernel and of the tensor-core dq kernel (Note [delta
// inside the dq kernel]).
template <int G, typename T>
__device__ __forceinline__ compute_t<T> group_row_dot(const T* o, const T* dO, int D, int lane, bool valid) {
  using C = compute_t<T>;
  C acc = 0;
  if (valid)
    for (int d = lane; d < D; d += G) acc += load(o, d) * load(dO, d);
  return group_sum<G>(acc);
}

// Note [delta inside the dq kernel]
// delta = rowsum(dO * O) was a launch of its own before the dq and dk/dv kernels: a pass over O
// and dO (two tensors the size of q, 25 MB at each benchmark shape) plus a kernel boundary: by
// the bytes some 7-10 us of the backward (0.16-0.52 ms forward + backward), not measured alone. The dq block already holds its 64 rows
// of dO in shared memory, so on the tensor-core path it loads its rows of O too (into K's second
// buffer, which the first prefetch only fills later: no extra shared memory but delta's 64 floats),
// computes their delta and writes it to the [B, H, S] scratch for the dk/dv kernel, which runs
// after it on the stream. The forward grid covers every query row exactly once, so every delta
// is written once. The bits are delta_kernel's: the same group_row_dot with the same G lanes per
// row (lanes_for(D)), the same lane-strided products and group_sum tree; tests/emu checks the
// written delta against delta_kernel's bit for bit. The cost: the block's first K/V prefetch now
// waits for delta (one barrier), hidden by the other blocks on the SM. The fallback path keeps
// delta_kernel.

// dq for 64 queries of one (b, h): delta of its rows (Note [delta inside the dq kernel]), then a
// loop over the visible key tiles.
template <int D, bool kQInRegs = dq_frags_in_regs<D>()>
__global__ void __launch_bounds__(kBlockThreads, bwd_min_blocks<D>())
    flash_backward_dq_kernel(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k,
                             const bf16_t* __restrict__ v, const bf16_t* __restrict__ out,
                             const bf16_t* __restrict__ dout, const float* __restrict__ lse,
                             float* __restrict__ delta, bf16_t* __restrict__ dq, Dims n) {
  constexpr int kLd = D + kPad;
  bf16_t* sQ = reinterpret_cast<bf16_t*>(dynamic_smem());
  bf16_t* sdO = sQ + kTile * kLd;
  bf16_t* sK = sdO + kTile * kLd;  // 2 buffers
  bf16_t* sV = sK + 2 * kTile * kLd;
  bf16_t* sO = sK + kTile * kLd;                                // K's second buffer, until step 0's prefetch
  float* sDl = reinterpret_cast<float*>(sV + 2 * kTile * kLd);  // delta of the block's rows
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const QueryTile qt = query_tile<D>(n);
  const bf16_t* kh = k + qt.kvoff;
  const bf16_t* vh = v + qt.kvoff;
  load_rows<kTile, D>(sQ, q + qt.qoff, qt.ldq, qt.q0, n.S);
  load_rows<kTile, D>(sdO, dout + qt.qoff, qt.ldq, qt.q0, n.S);
  load_rows<kTile, D>(sO, out + qt.qoff, qt.ldq, qt.q0, n.S);
  load_kv_tile<D>(sK, sV, 0, kh, vh, qt.ldkv, 0, n.S);
  cp_async_commit();
  const int row = qt.q0 + warp * 16 + lane / 4;
  const int col = 2 * (lane % 4);
  const int64_t stat = (static_cast<int64_t>(qt.b) * n.H + qt.h) * n.S;
  float lse2[2], dl[2];  // this thread's rows' lse (log2 units) and delta
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int qi = row + 8 * r;
    lse2[r] = qi < n.S ? lse[stat + qi] * kLog2e : 0.f;
  }
  cp_async_wait<0>();
  __syncthreads();
  {
    constexpr int G = lanes_for(D);  // delta_kernel's lanes per row for this D
    static_assert(kTile % (kBlockThreads / G) == 0, "the block's rows split into whole rounds of groups");
    const int g_lane = threadIdx.x % G;
#pragma unroll
    for (int r0 = 0; r0 < kTile; r0 += kBlockThreads / G) {
      const int r = r0 + static_cast<int>(threadIdx.x) / G, qi = qt.q0 + r;
      const float d_row = group_row_dot<G, bf16_t>(sO + r * kLd, sdO + r * kLd, D, g_lane, qi < n.S);
      if (g_lane == 0) {
        sDl[r] = d_row;
        if (qi < n.S) delta[stat + qi] = d_row;
      }
    }
  }
  __syncthreads();  // sDl complete, and O's buffer free for step 0's prefetch
#pragma unroll
  for (int r = 0; r < 2; ++r) dl[r] = row + 8 * r < n.S ? sDl[row + 8 * r - qt.q0] : 0.f;
  float acc[D / 8][4] = {};
  constexpr int kQFrags = kQInRegs ? D / 16 : 1;
  uint32_t qa[kQFrags][4], oa[kQFrags][4];  // the warp's Q and dO rows as A fragments, or unused
  load_a_frags<D, kQInRegs>(qa, sQ + warp * 16 * kLd, lane);
  load_a_frags<D, kQInRegs>(oa, sdO + warp * 16 * kLd, lane);
  for (int j = 0; j < qt.n_kv_tiles; ++j) {
    begin_step(j, qt.n_kv_tiles,
               [&] { load_kv_tile<D>(sK, sV, (j + 1) % 2, kh, vh, qt.ldkv, (j + 1) * kTile, n.S); });
    const bf16_t* sKj = sK + j % 2 * kTile * kLd;
    const bf16_t* sVj = sV + j % 2 * kTile * kLd;
    const int k0 = j * kTile;
    float s[kTile / 8][4] = {}, dp[kTile / 8][4] = {};
    warp_gemm_nt<D, kTile, kQInRegs>(s, qa, sQ + warp * 16 * kLd, sKj, lane);
    warp_gemm_nt<D, kTile, kQInRegs>(dp, oa, sdO + warp * 16 * kLd, sVj, lane);
    const bool masked = k0 + kTile > n.S || qt.q0 + kTile > n.S || (n.causal && k0 + kTile > qt.q0);
#pragma unroll
    for (int nb = 0; nb < kTile / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2;
        float ds = 0.f;
        if (!masked || visible(row + 8 * r, k0 + col + 8 * nb + e % 2, n.S, n.causal)) {
          const float p = exp2f(fmaf(s[nb][e], n.scale_log2, -lse2[r]));
          ds = p * (dp[nb][e] - dl[r]);
        }
        s[nb][e] = ds;
      }
    uint32_t a[kTile / 16][4];
    to_a_frags<kTile>(a, s);
    warp_gemm_nn<kTile, D>(acc, a, sKj, lane);
    __syncthreads();
  }
  const float mul[2] = {n.scale, n.scale};
  store_tile<D>(dq + qt.qoff, qt.ldq, row, col, n.S, acc, mul);
}

// dk, dv for 64 keys of one (b, kv head): loops over the group's query heads in order and, for
// each, over the query tiles of BR rows that see these keys.
template <int D, int BR>
__global__ void __launch_bounds__(kBlockThreads, bwd_min_blocks<D>())
    flash_backward_dkdv_kernel(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k,
                               const bf16_t* __restrict__ v, const bf16_t* __restrict__ dout,
                               const float* __restrict__ lse, const float* __restrict__ delta,
                               bf16_t* __restrict__ dk, bf16_t* __restrict__ dv, Dims n) {
  constexpr int kLd = D + kPad;
  bf16_t* sK = reinterpret_cast<bf16_t*>(dynamic_smem());
  bf16_t* sV = sK + kTile * kLd;
  bf16_t* sQ = sV + kTile * kLd;   // 2 buffers of BR rows
  bf16_t* sdO = sQ + 2 * BR * kLd;  // 2 buffers
  float* sL = reinterpret_cast<float*>(sdO + 2 * BR * kLd);  // lse, 2 buffers of BR
  float* sDl = sL + 2 * BR;                                   // delta, 2 buffers
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int b = blockIdx.x / n.Hkv, hk = blockIdx.x % n.Hkv;
  const int k0 = blockIdx.y * kTile;  // causal: the first key tiles see the most queries; they start first
  const int rep = n.H / n.Hkv;
  const int64_t ldq = static_cast<int64_t>(n.H) * D, ldkv = static_cast<int64_t>(n.Hkv) * D;
  const int64_t kvoff = head_offset(b, n.S, hk, n.Hkv, D);
  const int first = n.causal ? k0 / BR : 0;  // query tiles before it see none of these keys
  const int per_head = (n.S + BR - 1) / BR - first;
  const int n_steps = rep * per_head;

  // Step t: query head hk * rep + t / per_head, query tile first + t % per_head, into buffer buf.
  const auto load_step = [&](int t, int buf) {
    const int h = hk * rep + t / per_head, q0 = (first + t % per_head) * BR;
    const int64_t qoff = head_offset(b, n.S, h, n.H, D);
    const int64_t stat = (static_cast<int64_t>(b) * n.H + h) * n.S;
    load_rows<BR, D>(sQ + buf * BR * kLd, q + qoff, ldq, q0, n.S);
    load_rows<BR, D>(sdO + buf * BR * kLd, dout + qoff, ldq, q0, n.S);
    load_stats<BR>(sL + buf * BR, lse + stat, q0, n.S);
    load_stats<BR>(sDl + buf * BR, delta + stat, q0, n.S);
  };
  load_kv_tile<D>(sK, sV, 0, k + kvoff, v + kvoff, ldkv, k0, n.S);
  load_step(0, 0);
  cp_async_commit();

  const int key = k0 + warp * 16 + lane / 4;  // this thread's keys: key, key + 8
  const int col = 2 * (lane % 4);             // and queries q0 + col + 8 nb + (0, 1) of a step
  float dk_acc[D / 8][4] = {}, dv_acc[D / 8][4] = {};
  // The warp's K and V rows are read from shared memory at every step (Note [Backward occupancy]).
  const bf16_t* sKw = sK + warp * 16 * kLd;
  const bf16_t* sVw = sV + warp * 16 * kLd;
  for (int t = 0; t < n_steps; ++t) {
    begin_step(t, n_steps, [&] { load_step(t + 1, (t + 1) % 2); });
    const int buf = t % 2, q0 = (first + t % per_head) * BR;
    const bf16_t* sQt = sQ + buf * BR * kLd;
    const bf16_t* sdOt = sdO + buf * BR * kLd;
    const float* sLt = sL + buf * BR;
    const float* sDlt = sDl + buf * BR;
    // P^T (16 keys x BR queries per warp), recomputed from lse.
    float pt[BR / 8][4] = {};
    warp_gemm_nt<D, BR>(pt, sKw, sQt, lane);
    const bool masked = q0 + BR > n.S || (n.causal && q0 < k0 + kTile);
#pragma unroll
    for (int nb = 0; nb < BR / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qc = col + 8 * nb + e % 2;  // query within the step
        float p = 0.f;
        if (!masked || visible(q0 + qc, key + 8 * (e / 2), n.S, n.causal))
          p = exp2f(fmaf(pt[nb][e], n.scale_log2, -sLt[qc] * kLog2e));
        pt[nb][e] = p;
      }
    uint32_t a[BR / 16][4];
    to_a_frags<BR>(a, pt);
    warp_gemm_nn<BR, D>(dv_acc, a, sdOt, lane);  // dv += P^T dO
    // dS^T = P^T (dP^T - delta), dP^T = V dO^T.
    float dst[BR / 8][4] = {};
    warp_gemm_nt<D, BR>(dst, sVw, sdOt, lane);
#pragma unroll
    for (int nb = 0; nb < BR / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) dst[nb][e] = pt[nb][e] * (dst[nb][e] - sDlt[col + 8 * nb + e % 2]);
    to_a_frags<BR>(a, dst);
    warp_gemm_nn<BR, D>(dk_acc, a, sQt, lane);  // dk += dS^T Q
    __syncthreads();
  }

  const float dk_mul[2] = {n.scale, n.scale}, dv_mul[2] = {1.f, 1.f};
  store_tile<D>(dk + kvoff, ldkv, key, col, n.S, dk_acc, dk_mul);
  store_tile<D>(dv + kvoff, ldkv, key, col, n.S, dv_acc, dv_mul);
}

// delta[b, h, s] = sum_d dO * O over each row of [B*S*H, D] (G lanes per row, rmsnorm's grouping);
// the fallback path's. The tensor-core path computes the same bits inside its dq kernel.
template <int G, typename T>
__global__ void delta_kernel(const T* __restrict__ out, const T* __restrict__ dout, compute_t<T>* __restrict__ delta,
                             int64_t rows, int S, int H, int D) {
  const int64_t r = group_row<G>();
  const bool valid = r < rows;  // every lane takes part in the shuffles
  const int lane = threadIdx.x % G;
  const int64_t off = (valid ? r : 0) * D;
  const compute_t<T> acc = group_row_dot<G, T>(out + off, dout + off, D, lane, valid);
  if (!valid || lane != 0) return;
  const int64_t bs = r / H;  // b * S + s
  const int64_t h = r % H, b = bs / S, s = bs % S;
  delta[(b * H + h) * S + s] = acc;
}

// ------------------------------------------------------------------ fallback (one warp per row)

constexpr int kRowWarps = 4;                     // rows (warps) per block
constexpr int kMaxRowD = 256;                    // the largest head dim of the fallback
constexpr int kPerLane = kMaxRowD / kWarp;       // elements of a row per lane: d = lane + 32 m

struct RowDims {
  int B, S, H, Hkv, D;
  double scale;
  bool causal;
};

// One warp per row of `heads` heads: B * heads * S warps.
inline unsigned row_grid(const RowDims& n, int heads) {
  return static_cast<unsigned>((static_cast<int64_t>(n.B) * heads * n.S + kRowWarps - 1) / kRowWarps);
}

template <typename T>
__device__ __forceinline__ void load_row(compute_t<T> (&x)[kPerLane], const T* p, int D, int lane) {
#pragma unroll
  for (int m = 0; m < kPerLane; ++m) {
    const int d = lane + kWarp * m;
    x[m] = d < D ? load(p, d) : compute_t<T>(0);
  }
}

// x . p over the row, the same bits on every lane.
template <typename T>
__device__ __forceinline__ compute_t<T> row_dot(const compute_t<T> (&x)[kPerLane], const T* p, int D, int lane) {
  compute_t<T> acc = 0;
#pragma unroll
  for (int m = 0; m < kPerLane; ++m) {
    const int d = lane + kWarp * m;
    if (d < D) acc += x[m] * load(p, d);
  }
  return warp_sum(acc);
}

// acc += c * p over the row.
template <typename T>
__device__ __forceinline__ void row_axpy(compute_t<T> (&acc)[kPerLane], compute_t<T> c, const T* p, int D, int lane) {
#pragma unroll
  for (int m = 0; m < kPerLane; ++m) {
    const int d = lane + kWarp * m;
    if (d < D) acc[m] += c * load(p, d);
  }
}

template <typename T>
__device__ __forceinline__ void store_row(T* p, const compute_t<T> (&x)[kPerLane], compute_t<T> c, int D, int lane) {
#pragma unroll
  for (int m = 0; m < kPerLane; ++m) {
    const int d = lane + kWarp * m;
    if (d < D) store(p, d, static_cast<compute_t<T>>(x[m] * c));
  }
}

// Warp w of the grid handles query row (b, h, i), w = (b H + h) S + i; false when past the end.
__device__ __forceinline__ bool row_of_warp(const RowDims& n, int heads, int* b, int* h, int* i) {
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / kWarp;
  if (w >= static_cast<int64_t>(n.B) * heads * n.S) return false;
  *i = static_cast<int>(w % n.S);
  const int64_t bh = w / n.S;
  *h = static_cast<int>(bh % heads);
  *b = static_cast<int>(bh / heads);
  return true;
}

__device__ __forceinline__ int64_t row_offset(const RowDims& n, int b, int s, int head, int heads) {
  return ((static_cast<int64_t>(b) * n.S + s) * heads + head) * n.D;
}

template <typename T>
__global__ void __launch_bounds__(kRowWarps * kWarp)
    row_forward_kernel(const T* q, const T* k, const T* v, T* out, compute_t<T>* lse, RowDims n) {
  using C = compute_t<T>;
  int b, h, i;
  if (!row_of_warp(n, n.H, &b, &h, &i)) return;  // the whole warp leaves together
  const int lane = threadIdx.x % kWarp, hk = h / (n.H / n.Hkv);
  const int64_t qo = row_offset(n, b, i, h, n.H);
  C qr[kPerLane], acc[kPerLane] = {};
  load_row(qr, q + qo, n.D, lane);
  C mx = NegInf<C>::get(), l = 0;
  const int jend = n.causal ? i + 1 : n.S;
  for (int j = 0; j < jend; ++j) {
    const int64_t kv = row_offset(n, b, j, hk, n.Hkv);
    const C s = row_dot(qr, k + kv, n.D, lane) * static_cast<C>(n.scale);
    const C m_new = xmax(mx, s);
    const C corr = xexp(mx - m_new), p = xexp(s - m_new);
    l = l * corr + p;
#pragma unroll
    for (int m = 0; m < kPerLane; ++m) acc[m] *= corr;
    row_axpy(acc, p, v + kv, n.D, lane);
    mx = m_new;
  }
  store_row(out + qo, acc, C(1) / l, n.D, lane);
  if (lane == 0) lse[(static_cast<int64_t>(b) * n.H + h) * n.S + i] = mx + xlog(l);
}

template <typename T>
__global__ void __launch_bounds__(kRowWarps * kWarp)
    row_backward_dq_kernel(const T* q, const T* k, const T* v, const T* dout, const compute_t<T>* lse,
                           const compute_t<T>* delta, T* dq, RowDims n) {
  using C = compute_t<T>;
  int b, h, i;
  if (!row_of_warp(n, n.H, &b, &h, &i)) return;
  const int lane = threadIdx.x % kWarp, hk = h / (n.H / n.Hkv);
  const int64_t qo = row_offset(n, b, i, h, n.H);
  const int64_t stat = (static_cast<int64_t>(b) * n.H + h) * n.S + i;
  C qr[kPerLane], dor[kPerLane], acc[kPerLane] = {};
  load_row(qr, q + qo, n.D, lane);
  load_row(dor, dout + qo, n.D, lane);
  const C L = lse[stat], dl = delta[stat], scale = static_cast<C>(n.scale);
  const int jend = n.causal ? i + 1 : n.S;
  for (int j = 0; j < jend; ++j) {
    const int64_t kv = row_offset(n, b, j, hk, n.Hkv);
    const C p = xexp(row_dot(qr, k + kv, n.D, lane) * scale - L);
    const C ds = p * (row_dot(dor, v + kv, n.D, lane) - dl);
    row_axpy(acc, ds, k + kv, n.D, lane);
  }
  store_row(dq + qo, acc, scale, n.D, lane);
}

template <typename T>
__global__ void __launch_bounds__(kRowWarps * kWarp)
    row_backward_dkdv_kernel(const T* q, const T* k, const T* v, const T* dout, const compute_t<T>* lse,
                             const compute_t<T>* delta, T* dk, T* dv, RowDims n) {
  using C = compute_t<T>;
  int b, hk, j;
  if (!row_of_warp(n, n.Hkv, &b, &hk, &j)) return;
  const int lane = threadIdx.x % kWarp, rep = n.H / n.Hkv;
  const int64_t kv = row_offset(n, b, j, hk, n.Hkv);
  C kr[kPerLane], vr[kPerLane], dk_acc[kPerLane] = {}, dv_acc[kPerLane] = {};
  load_row(kr, k + kv, n.D, lane);
  load_row(vr, v + kv, n.D, lane);
  const C scale = static_cast<C>(n.scale);
  for (int h = hk * rep; h < (hk + 1) * rep; ++h) {
    const int64_t stat = (static_cast<int64_t>(b) * n.H + h) * n.S;
    for (int i = n.causal ? j : 0; i < n.S; ++i) {
      const int64_t qo = row_offset(n, b, i, h, n.H);
      const C p = xexp(row_dot(kr, q + qo, n.D, lane) * scale - lse[stat + i]);
      const C ds = p * (row_dot(vr, dout + qo, n.D, lane) - delta[stat + i]);
      row_axpy(dv_acc, p, dout + qo, n.D, lane);
      row_axpy(dk_acc, ds, q + qo, n.D, lane);
    }
  }
  store_row(dk + kv, dk_acc, scale, n.D, lane);
  store_row(dv + kv, dv_acc, C(1), n.D, lane);
}

// ------------------------------------------------------------------ q/k head preparation

// Element j of rope applied to row x (cos/sin of frequency j mod D/2 in the tables).
template <typename T>
__device__ __forceinline__ compute_t<T> rope_at(compute_t<T> x1, compute_t<T> x2, compute_t<T> cs, compute_t<T> sn,
                                               bool second) {
  compute_t<T> y1, y2;
  rope_rotate(x1, x2, cs, sn, &y1, &y2);
  return second ? y2 : y1;
}

// Fills this block's tables with cos and sin (negated when inverse) of position s.
template <typename C>
__device__ __forceinline__ void rope_table(C* tab_cos, C* tab_sin, int s, int D, float theta, bool inverse) {
  for (int i = threadIdx.x; i < D / 2; i += blockDim.x) {
    C sn, cs;
    rope_cos_sin(static_cast<float>(s) * rope_inv_freq(theta, i, D), &cs, &sn);
    tab_cos[i] = cs;
    tab_sin[i] = inverse ? -sn : sn;
  }
  __syncthreads();
}

// The head rows of one token: q heads 0..H-1 then k heads; a row r of the token is
// x + (token * heads + head) * D for its tensor.
struct HeadRows {
  int H, Hkv;
  __device__ bool is_q(int r) const { return r < H; }
  __device__ int64_t row(int64_t token, int r) const { return r < H ? token * H + r : token * Hkv + (r - H); }
};

// Calls row_fn(is_q, row, valid) for each head row of this block's token (b, s) = blockIdx.x: the
// q heads, then the k heads, a group of G lanes per row. Every lane takes part in every call (valid
// is false past the last row) since the rows' sums shuffle within the warp.
template <int G, typename Fn>
__device__ __forceinline__ void for_token_rows(const HeadRows& hr, Fn&& row_fn) {
  const int group = threadIdx.x / G, groups = blockDim.x / G;
  for (int r0 = 0; r0 < hr.H + hr.Hkv; r0 += groups) {
    const int r = r0 + group;
    const bool valid = r < hr.H + hr.Hkv;
    row_fn(valid && hr.is_q(r), valid ? hr.row(blockIdx.x, r) : 0, valid);
  }
}

// One block per token: rms_norm (rmsnorm_forward_kernel's sums and rounding) then rope.
template <int G, typename T, typename W>
__global__ void qk_norm_rope_forward_kernel(const T* q, const T* k, const W* wq, const W* wk, T* q_out, T* k_out,
                                            float* rstd_q, float* rstd_k, int S, HeadRows hr, int D, float eps,
                                            float theta) {
  using C = compute_t<T>;
  C* tab_cos = reinterpret_cast<C*>(dynamic_smem());
  C* tab_sin = tab_cos + D / 2;
  rope_table(tab_cos, tab_sin, static_cast<int>(blockIdx.x % S), D, theta, /*inverse=*/false);
  const int lane = threadIdx.x % G, half = D / 2;
  for_token_rows<G>(hr, [&](bool is_q, int64_t row, bool valid) {
    const T* x = (is_q ? q : k) + row * D;
    const C ss = rmsnorm::row_sum_sq<G>(x, D, lane, valid);  // rms_norm's order (Note [Wide RMSNorm forward])
    if (!valid) return;
    const C inv = rms_rstd(ss, D, eps);
    const W* w = is_q ? wq : wk;
    T* y = (is_q ? q_out : k_out) + row * D;
    if (lane == 0) (is_q ? rstd_q : rstd_k)[row] = static_cast<float>(inv);
    for (int j = lane; j < D; j += G) {
      const int i = j < half ? j : j - half;
      const C x1 = rounded<T>(rms_scaled(x, w, i, inv));  // the normed tensor rope reads
      const C x2 = rounded<T>(rms_scaled(x, w, i + half, inv));
      store(y, j, rope_at<T>(x1, x2, tab_cos[i], tab_sin[i], j >= half));
    }
  });
}

// dx of rms_norm at the rope-inverted upstream gradient g = round(rope^-1(dy)) (rmsnorm_dx_kernel's
// sums and rounding), one block per token.
template <int G, typename T, typename W>
__global__ void qk_norm_rope_dx_kernel(const T* q, const T* k, const W* wq, const W* wk, const float* rstd_q,
                                       const float* rstd_k, const T* dq_out, const T* dk_out, T* dq, T* dk, int S,
                                       HeadRows hr, int D, float theta) {
  using C = compute_t<T>;
  C* tab_cos = reinterpret_cast<C*>(dynamic_smem());
  C* tab_sin = tab_cos + D / 2;
  rope_table(tab_cos, tab_sin, static_cast<int>(blockIdx.x % S), D, theta, /*inverse=*/true);
  const int lane = threadIdx.x % G, half = D / 2;
  for_token_rows<G>(hr, [&](bool is_q, int64_t row, bool valid) {
    const T* x = (is_q ? q : k) + row * D;
    const T* dy = (is_q ? dq_out : dk_out) + row * D;
    const W* w = is_q ? wq : wk;
    const C inv = valid ? static_cast<C>((is_q ? rstd_q : rstd_k)[row]) : C(0);
    const auto g_at = [&](int j) {  // the norm's upstream gradient, as the composition stores it
      const int i = j < half ? j : j - half;
      return rounded<T>(rope_at<T>(load(dy, i), load(dy, i + half), tab_cos[i], tab_sin[i], j >= half));
    };
    C dot = 0;
    if (valid)
      for (int j = lane; j < D; j += G) dot += g_at(j) * static_cast<C>(load(w, j)) * (load(x, j) * inv);
    dot = group_sum<G>(dot);
    if (!valid) return;
    T* dx = (is_q ? dq : dk) + row * D;
    const C mean_dot = dot / static_cast<C>(D);
    for (int j = lane; j < D; j += G) {
      const C xhat = load(x, j) * inv;
      const C gw = g_at(j) * static_cast<C>(load(w, j));
      store(dx, j, static_cast<C>(inv * (gw - xhat * mean_dot)));
    }
  });
}

// dw of one side (blockIdx.z: 0 = q, 1 = k) as rmsnorm_dw_partial_kernel sums it (column_sum_plan):
// thread = column j, blockIdx.y = row chunk; with one chunk it writes dw, else a partial row.
struct DwSide {
  const void* x;
  const float* rstd;
  const void* dy;
  void* dw;
  void* partial;
  int heads;
  int64_t rows, rows_per_chunk;
  int nchunks;  // 0: side skipped
};

template <typename T, typename W>
__device__ __forceinline__ void dw_partial(const DwSide& sd, int S, int D, float theta) {
  using C = compute_t<T>;
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (static_cast<int>(blockIdx.y) >= sd.nchunks || j >= D) return;
  const T* x = static_cast<const T*>(sd.x);
  const T* dy = static_cast<const T*>(sd.dy);
  const int half = D / 2, i = j < half ? j : j - half;
  const float inv_freq = rope_inv_freq(theta, i, D);
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * sd.rows_per_chunk;
  const int64_t r1 = r0 + sd.rows_per_chunk < sd.rows ? r0 + sd.rows_per_chunk : sd.rows;
  C acc = 0;
  for (int64_t r = r0; r < r1; ++r) {
    C sn, cs;
    rope_cos_sin(static_cast<float>((r / sd.heads) % S) * inv_freq, &cs, &sn);
    const C g = rounded<T>(rope_at<T>(load(dy, r * D + i), load(dy, r * D + i + half), cs, -sn, j >= half));
    acc += g * (load(x, r * D + j) * static_cast<C>(sd.rstd[r]));
  }
  if (sd.nchunks == 1) store(static_cast<W*>(sd.dw), j, static_cast<compute_t<W>>(acc));
  else static_cast<C*>(sd.partial)[static_cast<int64_t>(blockIdx.y) * D + j] = acc;
}

template <typename T, typename W>
__global__ void qk_norm_rope_dw_partial_kernel(DwSide q_side, DwSide k_side, int S, int D, float theta) {
  if (blockIdx.z == 0) dw_partial<T, W>(q_side, S, D, theta);
  else dw_partial<T, W>(k_side, S, D, theta);
}

// dw = the partial rows added in chunk order (rmsnorm_dw_final_kernel), sides with > 1 chunk.
template <typename T, typename W>
__device__ __forceinline__ void dw_final(const DwSide& sd, int D) {
  using C = compute_t<T>;
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (sd.nchunks <= 1 || j >= D) return;
  const C* partial = static_cast<const C*>(sd.partial);
  C acc = 0;
  for (int c = 0; c < sd.nchunks; ++c) acc += partial[static_cast<int64_t>(c) * D + j];
  store(static_cast<W*>(sd.dw), j, static_cast<compute_t<W>>(acc));
}

template <typename T, typename W>
__global__ void qk_norm_rope_dw_final_kernel(DwSide q_side, DwSide k_side, int D) {
  if (blockIdx.z == 0) dw_final<T, W>(q_side, D);
  else dw_final<T, W>(k_side, D);
}

// ---- one-pass backward: dx and the weight gradient in rms_norm's one-pass order
//
// Note [qk_norm_rope one-pass backward]
// The composition's backward is rope's inverse (g = round(rope^-1(dy)), stored) then rms_norm's
// backward over rows = B*S*heads of width D: rmsnorm_backward_onepass_kernel under
// rmsnorm::onepass_plan<G, C>(rows, D), then rmsnorm_dw_tree_kernel when there is more than one
// block. This kernel runs that plan on each side (q rows [token][head] exactly as the composition's
// rows, k rows likewise; the q blocks first, then the k blocks, in one launch): block b takes the
// same rows, group g of G lanes the same rows in the same order, and dx, the groups' shared-memory
// sums, the block's partial row and the final pass are the same expressions, with g computed from
// dy as the rows are read. So dq, dk, dwq and dwk are bitwise the composition's. RoPE's cos and
// (negated) sin of a row's position (row / heads) % S come from a shared-memory table of
// consecutive tokens per block, refilled (between two barriers) when a round of rows runs past
// it; PrepDwPlan sizes it to the whole block's tokens when that fits in 48 KB.
template <typename T, typename W>
struct OnePassSide {
  const T* x;
  const W* w;
  const float* rstd;
  const T* dy;  // the upstream gradient of the rotated output
  T* dx;
  W* dw;
  compute_t<T>* partial;  // [nblocks][D] when nblocks > 1
  int64_t rows, rows_per_block, nblocks;  // rmsnorm::onepass_plan's; nblocks == 0: side skipped
  int64_t heads;
  int64_t tab_tokens;  // the token table's size: at least the tokens of a round (prep_dw_plan)
};

// One side's plan: rms_norm's one-pass plan plus the token table (tab_tokens tokens of D values:
// cos, then sin). smem == 0: no one-pass plan (rms_norm takes its dx + column-sum path then; so
// does qk_norm_rope, also when a round's tokens do not fit beside the sums in 48 KB).
struct PrepDwPlan {
  rmsnorm::OnePassPlan rows;
  int64_t tab_tokens = 0;
  size_t smem = 0;
};
template <int G, typename C>
PrepDwPlan prep_dw_plan(int64_t rows, int64_t heads, int64_t D) {
  PrepDwPlan p;
  p.rows = rmsnorm::onepass_plan<G, C>(rows, D);
  if (p.rows.smem == 0 || rows == 0) return p;
  constexpr int64_t groups = kThreads / G;
  const size_t token_bytes = sizeof(C) * static_cast<size_t>(D);
  const int64_t round_tokens = ceil_div(groups - 1, heads) + 1;  // tokens of any `groups` consecutive rows
  const int64_t block_tokens = ceil_div(p.rows.rows_per_block - 1, heads) + 1;
  if (p.rows.smem + token_bytes * static_cast<size_t>(round_tokens) > rmsnorm::kOnePassMaxSmem) return p;
  const int64_t budget = static_cast<int64_t>((rmsnorm::kOnePassMaxSmem - p.rows.smem) / token_bytes);
  p.tab_tokens = block_tokens < budget ? block_tokens : budget;
  if (p.tab_tokens < round_tokens) p.tab_tokens = round_tokens;
  p.smem = p.rows.smem + token_bytes * static_cast<size_t>(p.tab_tokens);
  return p;
}

// The table refill of a round of rows [base, min(base + groups, r1)) (the same for every thread
// of the block, so the barriers are uniform): when the round's tokens run past the tokens
// [t_lo, t_hi) the table holds, the table takes tab_tokens tokens from base's, cos then the
// negated sin (the inverse rotation) of each; inv_freq(i) is frequency i's rope_inv_freq.
template <typename C, typename InvFreq>
__device__ __forceinline__ void refill_inverse_table(C* tab, int64_t& t_lo, int64_t& t_hi, int64_t base, int64_t r1,
                                                     int groups, int64_t heads, int64_t tab_tokens, int S, int D,
                                                     InvFreq&& inv_freq) {
  const int half = D / 2;
  const int64_t last = (base + groups < r1 ? base + groups : r1) - 1;
  if (base / heads < t_lo || last / heads >= t_hi) {
    __syncthreads();  // every group is done with the old table
    t_lo = base / heads;
    t_hi = t_lo + tab_tokens;
    for (int64_t e = threadIdx.x; e < tab_tokens * half; e += kThreads) {
      const int64_t t = e / half;
      const int i = static_cast<int>(e - t * half);
      C sn, cs;
      rope_cos_sin(static_cast<float>(static_cast<int>((t_lo + t) % S)) * inv_freq(i), &cs, &sn);
      tab[t * D + i] = cs;
      tab[t * D + half + i] = -sn;  // the inverse rotation
    }
    __syncthreads();
  }
}

// Blocks [0, q.nblocks) take q's plan, the next k.nblocks k's; dynamic shared memory: the larger
// side's PrepDwPlan::smem. The loop, sums and stores are rmsnorm_backward_onepass_kernel's.
template <int G, typename T, typename W>
__global__ void __launch_bounds__(kThreads)
qk_norm_rope_backward_onepass_kernel(OnePassSide<T, W> q_side, OnePassSide<T, W> k_side, int S, int D,
                                     float theta) {
  using C = compute_t<T>;
  const bool is_q = static_cast<int64_t>(blockIdx.x) < q_side.nblocks;
  const OnePassSide<T, W>& sd = is_q ? q_side : k_side;
  const int64_t block = is_q ? blockIdx.x : static_cast<int64_t>(blockIdx.x) - q_side.nblocks;
  constexpr int groups = kThreads / G;
  C* acc = reinterpret_cast<C*>(dynamic_smem());  // [groups][D], then the table [tab_tokens][D]
  C* tab = acc + static_cast<int64_t>(groups) * D;
  const int lane = threadIdx.x % G, group = threadIdx.x / G, half = D / 2;
  C* my = acc + static_cast<int64_t>(group) * D;
  for (int j = lane; j < D; j += G) my[j] = 0;
  const int64_t heads = sd.heads, tab_tokens = sd.tab_tokens;
  const int64_t r0 = block * sd.rows_per_block;
  const int64_t r1 = sd.rows < r0 + sd.rows_per_block ? sd.rows : r0 + sd.rows_per_block;
  int64_t t_lo = 0, t_hi = 0;  // the table holds tokens [t_lo, t_hi)
  for (int64_t base = r0; base < r1; base += groups) {
    refill_inverse_table(tab, t_lo, t_hi, base, r1, groups, heads, tab_tokens, S, D,
                         [&](int i) { return rope_inv_freq(theta, i, D); });
    const int64_t r = base + group;
    const bool valid = r < r1;
    const T* xr = sd.x + (valid ? r : 0) * D;
    const T* dyr = sd.dy + (valid ? r : 0) * D;
    const C* tc = tab + (valid ? r / heads - t_lo : 0) * D;
    const C* ts = tc + half;
    const C inv = valid ? static_cast<C>(sd.rstd[r]) : C(0);
    const auto g_at = [&](int j) {  // rms_norm's upstream gradient, as rope's backward stores it
      const int i = j < half ? j : j - half;
      return rounded<T>(rope_at<T>(load(dyr, i), load(dyr, i + half), tc[i], ts[i], j >= half));
    };
    C dot = 0;
    if (valid)
      for (int j = lane; j < D; j += G) dot += g_at(j) * static_cast<C>(load(sd.w, j)) * (load(xr, j) * inv);
    dot = group_sum<G>(dot);
    if (!valid) continue;
    const C mean_dot = dot / static_cast<C>(D);
    T* dxr = sd.dx + r * D;
    for (int j = lane; j < D; j += G) {
      const C xhat = load(xr, j) * inv;
      const C d = g_at(j);
      const C g = d * static_cast<C>(load(sd.w, j));
      const C v = rmsnorm::mul_rn(inv, g - xhat * mean_dot);
      store(dxr, j, v);
      my[j] += d * xhat;
    }
  }
  rmsnorm::store_block_dw<int64_t>(acc, groups, D, sd.nblocks == 1, sd.dw, sd.partial, block);
}

// dw of the sides with more than one block (blockIdx.y: 0 = q, 1 = k): rmsnorm::dw_tree's sums
// (block = kFinalCols columns x kFinalSlices slices; slice s adds partial rows s, s +
// kFinalSlices, ... in order, then slice 0 adds the slice sums in order), with a slice's rows
// loaded kTreeBatch at a time before they are added: at head dims <= 32 there are only two blocks
// (one per side), and a load-then-add loop waited for a memory round trip every few rows.
constexpr int kTreeBatch = 32;
template <typename T, typename W>
__global__ void __launch_bounds__(rmsnorm::kTreeThreads)
qk_norm_rope_dw_tree_kernel(OnePassSide<T, W> q_side, OnePassSide<T, W> k_side, int D) {
  using C = compute_t<T>;
  using rmsnorm::kFinalCols;
  using rmsnorm::kFinalSlices;
  const OnePassSide<T, W> sd = blockIdx.y == 0 ? q_side : k_side;  // a copy: no local memory
  if (sd.nblocks <= 1) return;
  C* part = reinterpret_cast<C*>(dynamic_smem());  // [kFinalSlices][kFinalCols]: tree_smem<C>() bytes
  const int col = threadIdx.x % kFinalCols, slice = threadIdx.x / kFinalCols;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kFinalCols + col, nparts = sd.nblocks;
  C s = 0;
  if (j < D)
    for (int64_t k0 = slice; k0 < nparts; k0 += static_cast<int64_t>(kTreeBatch) * kFinalSlices) {
      C v[kTreeBatch];
#pragma unroll
      for (int b = 0; b < kTreeBatch; ++b) {
        const int64_t k = k0 + static_cast<int64_t>(b) * kFinalSlices;
        v[b] = k < nparts ? sd.partial[k * D + j] : C(0);
      }
#pragma unroll
      for (int b = 0; b < kTreeBatch; ++b)
        if (k0 + static_cast<int64_t>(b) * kFinalSlices < nparts) s += v[b];
    }
  part[slice * kFinalCols + col] = s;
  __syncthreads();
  if (slice != 0 || j >= D) return;
  C t = 0;
  for (int k = 0; k < kFinalSlices; ++k) t += part[k * kFinalCols + col];
  store(sd.dw, j, static_cast<compute_t<W>>(t));
}

// ---- the register paths: each row loaded once, several rows per group in flight
//
// Note [Head preparation in registers]
// The kernels above read a row element by element, several times over (rms_scaled re-reads x
// and w for both elements of a pair, g_at recomputes the inverse rotation from dy at each use),
// one row per group at a time, and the forward gives a block one token (48 rows at dim768 over
// 16 groups) behind a table barrier: about 20-25% of HBM bandwidth on the H200 (forward 52 us,
// one-pass backward 96 us at B=32, S=256, H=H_kv=24, D=32). For D in {32, 64, 128} (D = E * G
// with E = 4, G = lanes_for(D); prep_reg_dim) lane L of a group holds its elements L + k*G (k < E)
// in registers, which are exactly the elements the kernels above give lane L, in the same order,
// and the RoPE partners of its first-half elements (i and i + D/2 = L + (k + E/2)*G). So:
//  - a group issues the loads of several rows (PrepShape's fwd_rows of x in the forward, bwd_rows
//    of x, dy and rstd in the backward) before it uses any, a lane loads each element once, w once per
//    kernel;
//  - every value is the same expression of the same operands as in the kernels above: the sum of
//    squares and the dot in increasing element order per lane then group_sum's tree, rms_rstd,
//    the products and rope_rotate; the products and multiply-adds that nvcc contracts in those
//    kernels (sm_90 SASS: ss = fma(v, v, ss); dot = fma(d * w, x * inv, dot); dx = inv * fma(d,
//    w, -(xhat * mean_dot)); acc = fma(xhat, d, acc)) are spelled out (fma_dev, rmsnorm::mul_rn)
//    so that the bits do not hang on how nvcc contracts a differently shaped loop;
//  - the forward gives a block tokens_per_block whole tokens (q rows, then k rows; group g takes
//    the block's rows g, g + groups, ...) with their cos/sin table filled once while the first
//    rows' loads are in flight;
//  - the one-pass backward keeps rmsnorm::onepass_plan's blocks and group rows and order (dw's
//    bits depend on them) and the token-table refills of Note [qk_norm_rope one-pass backward];
//    a lane's dw partials stay in registers across its rows (the same additions, in the same row
//    order, as the shared-memory row `my` of the kernel above received) and are written to that
//    row once at the end, before the same block sum.
// Other head dims take the kernels above. tests/emu/flash_attention_emu.cpp runs both paths and
// compares them bit for bit (and with the CPU reference and the emulated composition).
// How many rows a group keeps in flight, how many blocks share an SM and how many tokens a forward
// block takes change no bits (each row's arithmetic is the same; the backward's blocks are
// onepass_plan's whatever the rows in flight); they are PrepShape below, chosen by measurement
// (Note [Head preparation occupancy]).

// Note [Head preparation occupancy]
// The bitwise-neutral launch shape of the register kernels, per head dim and row type:
//  - fwd_rows: rows of x per group whose loads are in flight together; fwd_blocks: blocks per SM
//    asked of the register allocator (__launch_bounds__); fwd_token_mult: the forward's tokens per
//    block as a multiple of "fwd_rows rows per group" (prep_tokens_per_block);
//  - bwd_rows, bwd_blocks: the same for the one-pass backward (rows of x and dy).
// The default (4, 5, x1; 3, 4) keeps 5 forward blocks of 256 threads at <= 51 registers and 4
// backward at <= 64 (bf16 and float32; float64 spills some). At head dim 32 with bf16 rows (the
// presets) 22 shapes were timed on the H200, every one bitwise the default (e54a624,
// bench/results/kernel_tune-prep-20261202-010809.json): the forward gives a block only 2 tokens at
// dim768 (96 rows, 3 per group), so each block waits one memory round trip behind its own cos/sin
// table; 8 rows in flight at 4 blocks per SM with twice the tokens per block (10 tokens, 480 rows)
// took the forward from 110.3 to 96.4 us at [128, 256, 24 + 24, 32], and 2 backward rows in
// flight (4 blocks) the forward + backward from 259.6 to 233.5 us (x1.11; x1.06 at batch 32).
struct PrepShape {
  int fwd_rows, fwd_blocks, fwd_token_mult, bwd_rows, bwd_blocks;
};
template <int D, typename T>
constexpr PrepShape prep_shape() {
  if constexpr (D == 32 && std::is_same_v<T, bf16_t>) return PrepShape{8, 4, 2, 2, 4};
  return PrepShape{4, 5, 1, 3, 4};
}

using rmsnorm::fma_dev;  // a * b + c, one rounding on the device (rmsnorm.cuh)

// The head dims of the register path: D = E * G for G = lanes_for(D), E even (the RoPE partner of
// lane L's element L + k*G is its element L + (k + E/2)*G).
constexpr bool prep_reg_dim(int64_t D) { return D == 32 || D == 64 || D == 128; }
template <int D> constexpr int prep_lanes() {
  static_assert(prep_reg_dim(D) && D % (2 * lanes_for(D)) == 0, "not a register-path head dim");
  return lanes_for(D);
}

// The forward's tokens per block: about fwd_rows rows per group times fwd_token_mult, at least one
// token, the table (tokens * D compute-type values) within 48 KB.
template <int D, typename T>
int64_t prep_tokens_per_block(int64_t H, int64_t Hkv) {
  using C = compute_t<T>;
  constexpr PrepShape ps = prep_shape<D, T>();
  int64_t t = (kThreads / prep_lanes<D>()) * ps.fwd_rows / (H + Hkv) * ps.fwd_token_mult;
  const int64_t fit = static_cast<int64_t>(rmsnorm::kOnePassMaxSmem / (sizeof(C) * static_cast<size_t>(D)));
  if (t > fit) t = fit;
  return t < 1 ? 1 : t;
}

// Forward, D in prep_reg_dim: block b takes tokens [b * tpb, ...) of the `tokens` = B*S, their q rows then
// their k rows; group g the block's rows g, g + groups, ... (Note [Head preparation in registers]).
// Dynamic shared memory: tpb * D compute-type values (cos, then sin, of each token).
// dim == D, as a runtime value: rms_rstd's ss / dim and rope_inv_freq's 2i / dim divide by it as
// in the kernels above (a constant power of two would let nvcc turn ss / dim + eps into one fma).
template <int D, typename T, typename W, int R = prep_shape<D, T>().fwd_rows,
          int kMinBlocks = prep_shape<D, T>().fwd_blocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
qk_norm_rope_forward_reg_kernel(const T* __restrict__ q, const T* __restrict__ k, const W* __restrict__ wq,
                                const W* __restrict__ wk, T* __restrict__ q_out, T* __restrict__ k_out,
                                float* __restrict__ rstd_q, float* __restrict__ rstd_k, int64_t tokens, int S,
                                HeadRows hr, int tpb, int dim, float eps, float theta) {
  using C = compute_t<T>;
  constexpr int G = prep_lanes<D>(), groups = kThreads / G, E = D / G, half = D / 2, E2 = E / 2;
  C* tab = reinterpret_cast<C*>(dynamic_smem());  // [tpb][D]: cos, then sin
  const int lane = threadIdx.x % G, group = threadIdx.x / G;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * tpb;
  const int nt = static_cast<int>(tokens - t0 < tpb ? tokens - t0 : tpb);
  const int nq = nt * hr.H, nrows = nq + nt * hr.Hkv;
  static_assert(kThreads % half == 0, "a thread fills the table's frequency threadIdx.x % half");
  // Only the threads that fill the table need their frequency (a float64 pow each: computed by
  // every thread of every block, it cost more than the loads it was meant to hide behind).
  const float inv_freq = static_cast<int>(threadIdx.x) < nt * half
                             ? rope_inv_freq(theta, static_cast<int>(threadIdx.x % half), dim)
                             : 0.0f;  // before the loads
  C wqv[E], wkv[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    wqv[e] = static_cast<C>(load(wq, lane + e * G));
    wkv[e] = static_cast<C>(load(wk, lane + e * G));
  }
  for (int m0 = 0; m0 * groups < nrows; m0 += R) {  // the same trip count for every thread
    T xv[R][E];
#pragma unroll
    for (int m = 0; m < R; ++m) {
      const int r = group + (m0 + m) * groups;
      if (r >= nrows) continue;
      const T* x = r < nq ? q + (t0 * hr.H + r) * D : k + (t0 * hr.Hkv + (r - nq)) * D;
#pragma unroll
      for (int e = 0; e < E; ++e) xv[m][e] = x[lane + e * G];
    }
    if (m0 == 0) {  // the table, while the first rows load
      for (int e = threadIdx.x; e < nt * half; e += kThreads) {
        const int t = e / half, i = e - t * half;
        C sn, cs;
        rope_cos_sin(static_cast<float>(static_cast<int>((t0 + t) % S)) * inv_freq, &cs, &sn);
        tab[t * D + i] = cs;
        tab[t * D + half + i] = sn;
      }
      __syncthreads();
    }
#pragma unroll
    for (int m = 0; m < R; ++m) {
      const int r = group + (m0 + m) * groups;
      const bool valid = r < nrows;
      C x[E];
      C ss = 0;  // group_sum_sq's sum
#pragma unroll
      for (int e = 0; e < E; ++e) {
        x[e] = valid ? to_compute(xv[m][e]) : C(0);
        if (valid) ss = fma_dev(x[e], x[e], ss);
      }
      ss = group_sum<G>(ss);
      if (!valid) continue;
      const bool is_q = r < nq;
      const int t = is_q ? r / hr.H : (r - nq) / hr.Hkv;
      const int64_t row = is_q ? t0 * hr.H + r : t0 * hr.Hkv + (r - nq);
      const C inv = rms_rstd(ss, dim, eps);
      if (lane == 0) (is_q ? rstd_q : rstd_k)[row] = static_cast<float>(inv);
      T* y = (is_q ? q_out : k_out) + row * D;
      const C* tc = tab + t * D;
#pragma unroll
      for (int e = 0; e < E2; ++e) {
        const int i = lane + e * G;
        // rms_scaled's value rounded to T: the normed tensor rope reads
        const C x1 = rounded<T>(rmsnorm::mul_rn(rmsnorm::mul_rn(x[e], inv), is_q ? wqv[e] : wkv[e]));
        const C x2 = rounded<T>(rmsnorm::mul_rn(rmsnorm::mul_rn(x[e + E2], inv), is_q ? wqv[e + E2] : wkv[e + E2]));
        C y1, y2;
        rope_rotate(x1, x2, tc[i], tc[half + i], &y1, &y2);
        store(y, i, y1);
        store(y, i + half, y2);
      }
    }
  }
}

// One-pass backward, D in prep_reg_dim: qk_norm_rope_backward_onepass_kernel's plan, rows, order
// and table, with the rows in registers (Note [Head preparation in registers]); dim == D as in the
// forward.
template <int D, typename T, typename W, int RB = prep_shape<D, T>().bwd_rows,
          int kMinBlocks = prep_shape<D, T>().bwd_blocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
qk_norm_rope_backward_onepass_reg_kernel(OnePassSide<T, W> q_side, OnePassSide<T, W> k_side, int S, int dim,
                                         float theta) {
  using C = compute_t<T>;
  constexpr int G = prep_lanes<D>(), groups = kThreads / G, E = D / G, half = D / 2, E2 = E / 2;
  const bool is_q = static_cast<int64_t>(blockIdx.x) < q_side.nblocks;
  const OnePassSide<T, W> sd = is_q ? q_side : k_side;  // a copy: a reference would put both in local memory
  const int64_t block = is_q ? blockIdx.x : static_cast<int64_t>(blockIdx.x) - q_side.nblocks;
  C* acc = reinterpret_cast<C*>(dynamic_smem());  // [groups][D], then the table [tab_tokens][D]
  C* tab = acc + groups * D;
  const int lane = threadIdx.x % G, group = threadIdx.x / G;
  const T* __restrict__ xs = sd.x;
  const T* __restrict__ dys = sd.dy;
  T* __restrict__ dxs = sd.dx;
  static_assert(kThreads % half == 0, "a thread fills the table's frequency threadIdx.x % half");
  const float inv_freq = rope_inv_freq(theta, static_cast<int>(threadIdx.x % half), dim);
  C wv[E], my[E];  // my: this lane's elements of the group's dw row
#pragma unroll
  for (int e = 0; e < E; ++e) {
    wv[e] = static_cast<C>(load(sd.w, lane + e * G));
    my[e] = 0;
  }
  const int64_t heads = sd.heads, tab_tokens = sd.tab_tokens;
  const int64_t r0 = block * sd.rows_per_block;
  const int64_t r1 = sd.rows < r0 + sd.rows_per_block ? sd.rows : r0 + sd.rows_per_block;
  int64_t t_lo = 0, t_hi = 0;  // the table holds tokens [t_lo, t_hi)
  for (int64_t b0 = r0; b0 < r1; b0 += static_cast<int64_t>(RB) * groups) {
    T xv[RB][E], dyv[RB][E];
    C inv[RB];
#pragma unroll
    for (int m = 0; m < RB; ++m) {
      const int64_t r = b0 + static_cast<int64_t>(m) * groups + group;
      if (r >= r1) continue;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        xv[m][e] = xs[r * D + lane + e * G];
        dyv[m][e] = dys[r * D + lane + e * G];
      }
      inv[m] = static_cast<C>(sd.rstd[r]);
    }
#pragma unroll
    for (int m = 0; m < RB; ++m) {
      const int64_t base = b0 + static_cast<int64_t>(m) * groups;  // a round of the kernel above
      if (base >= r1) break;  // the same for every thread of the block
      // a thread's table entries are all of frequency threadIdx.x % half (kThreads % half == 0)
      refill_inverse_table(tab, t_lo, t_hi, base, r1, groups, heads, tab_tokens, S, D,
                           [inv_freq](int) { return inv_freq; });
      const int64_t r = base + group;
      const bool valid = r < r1;
      // r / heads - t_lo, with one 64-bit division per round (base's) and a 32-bit one per row
      const int64_t base_t = base / heads;
      const int in_tok = static_cast<int>(base - base_t * heads) + group;
      const C* tc = tab + (valid ? base_t - t_lo + in_tok / static_cast<int>(heads) : 0) * D;
      // d: rms_norm's upstream gradient, as rope's backward stores it (g_at above)
      C x[E], d[E];
      C dot = 0;
      if (valid) {
#pragma unroll
        for (int e = 0; e < E2; ++e) {
          const int i = lane + e * G;
          C g1, g2;
          rope_rotate(to_compute(dyv[m][e]), to_compute(dyv[m][e + E2]), tc[i], tc[half + i], &g1, &g2);
          d[e] = rounded<T>(g1);
          d[e + E2] = rounded<T>(g2);
        }
#pragma unroll
        for (int e = 0; e < E; ++e) {
          x[e] = to_compute(xv[m][e]);
          dot = fma_dev(rmsnorm::mul_rn(d[e], wv[e]), rmsnorm::mul_rn(x[e], inv[m]), dot);
        }
      }
      dot = group_sum<G>(dot);
      if (!valid) continue;
      const C mean_dot = dot / static_cast<C>(dim);
      T* dxr = dxs + r * D;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const C xhat = rmsnorm::mul_rn(x[e], inv[m]);
        const C v = rmsnorm::mul_rn(inv[m], fma_dev(d[e], wv[e], -rmsnorm::mul_rn(xhat, mean_dot)));
        store(dxr, lane + e * G, v);
        my[e] = fma_dev(xhat, d[e], my[e]);
      }
    }
  }
  C* my_row = acc + group * D;
#pragma unroll
  for (int e = 0; e < E; ++e) my_row[lane + e * G] = my[e];
  rmsnorm::store_block_dw<int>(acc, groups, D, sd.nblocks == 1, sd.dw, sd.partial, block);
}

}  // namespace flash
}  // namespace cuda
}  // namespace kernels
}  // namespace xt
