// Device code of flash attention; the launchers are in flash_attention.cu. Kept in a header so that
// tests/emu can compile the same kernels with a host compiler and run them on the CPU (a warp/block
// emulator: docs/attention.md, "How it is verified").
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
// Within documents (Dims::doc, int32 [B, S]: the start of each token's document): query i sees
// keys doc[i] .. i only. doc is non-decreasing along a row, so a query tile's keys begin at its
// first row's document: the forward and dq loops start at that key tile, the dk/dv loop stops
// after the last query tile that a document reaching into its keys covers, and the tiles in
// between take the mask element by element. A skipped tile would only have added exact zeros, so
// rows without a boundary give plain causal attention's bits. Values read from doc only bound
// loops (clamped to the row) and compare; they never address memory.
// Fallback path (float32, float64, other D, or unaligned pointers): one warp per row, plain FMA
// loops in the compute type, the same recompute-from-lse scheme; correct and deterministic, slow.
#pragma once
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"

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
  const int32_t* doc;  // [B, S] document starts, or nullptr (attention within documents)
};

inline Dims make_dims(int64_t B, int64_t S, int64_t H, int64_t Hkv, double scale, bool causal,
                      const int32_t* doc = nullptr) {
  const float sc = static_cast<float>(scale);
  return Dims{static_cast<int>(B), static_cast<int>(S), static_cast<int>(H), static_cast<int>(Hkv), sc,
              sc * kLog2e, causal, doc};
}

// The first key query i of batch b sees: its document's start (0 without documents), in [0, i].
__device__ __forceinline__ int first_key(const int32_t* doc, int b, int S, int i) {
  if (doc == nullptr || i >= S) return 0;
  const int d = doc[static_cast<int64_t>(b) * S + i];
  return d < 0 ? 0 : (d > i ? i : d);
}

// One past the last query of batch b that sees key j: the end of j's document (S without
// documents). doc is non-decreasing, so the queries seeing j (doc[i] <= j) end where it first
// exceeds j: a binary search over (j, S).
__device__ __forceinline__ int doc_end(const int32_t* doc, int b, int S, int j) {
  if (doc == nullptr) return S;
  const int32_t* row = doc + static_cast<int64_t>(b) * S;
  int lo = j + 1, hi = S;  // the answer is in [lo, hi]
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (row[mid] <= j) lo = mid + 1;
    else hi = mid;
  }
  return lo;
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

// Whether key kj is visible from query qi, whose document begins at key lo (0 without documents).
__device__ __forceinline__ bool visible(int qi, int kj, int S, bool causal, int lo = 0) {
  return qi < S && kj < S && (!causal || kj <= qi) && kj >= lo;
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
  int kv_first;         // the first key tile with a visible key (the block's first document's)
  int n_kv_tiles;       // key tiles [kv_first, n_kv_tiles) hold the visible keys
  int doc_last;         // the last row's document start: tiles with keys before it take the mask
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
  t.kv_first = first_key(n.doc, t.b, n.S, t.q0) / kTile;
  t.doc_last = first_key(n.doc, t.b, n.S, imin(t.q0 + kTile, n.S) - 1);
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
  load_kv_tile<D>(sK, sV, 0, kh, vh, qt.ldkv, qt.kv_first * kTile, n.S);
  cp_async_commit();

  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int row = qt.q0 + warp * 16 + lane / 4;  // this thread's rows: row, row + 8
  const int col = 2 * (lane % 4);                // and columns col + 8 nb + (0, 1) of a tile
  const int lo[2] = {first_key(n.doc, qt.b, n.S, row), first_key(n.doc, qt.b, n.S, row + 8)};
  uint32_t qa[D / 16][4];  // the warp's Q rows as A fragments, from step 0 on (Note [A fragments kept in registers])
  const int steps = qt.n_kv_tiles - qt.kv_first;
  for (int t = 0; t < steps; ++t) {
    const int j = qt.kv_first + t;
    begin_step(t, steps,
               [&] { load_kv_tile<D>(sK, sV, (t + 1) % 2, kh, vh, qt.ldkv, (j + 1) * kTile, n.S); });
    const bf16_t* sKj = sK + t % 2 * kTile * kLd;
    const bf16_t* sVj = sV + t % 2 * kTile * kLd;
    const int k0 = j * kTile;
    if (t == 0) load_a_frags<D>(qa, sQ + warp * 16 * kLd, lane);
    float s[kTile / 8][4] = {};
    warp_gemm_nt<D, kTile>(s, qa, sQ + warp * 16 * kLd, sKj, lane);
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
  load_kv_tile<D>(sK, sV, 0, kh, vh, qt.ldkv, qt.kv_first * kTile, n.S);
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
  const int lo[2] = {first_key(n.doc, qt.b, n.S, row), first_key(n.doc, qt.b, n.S, row + 8)};
  const int steps = qt.n_kv_tiles - qt.kv_first;
  for (int t = 0; t < steps; ++t) {
    const int j = qt.kv_first + t;
    begin_step(t, steps,
               [&] { load_kv_tile<D>(sK, sV, (t + 1) % 2, kh, vh, qt.ldkv, (j + 1) * kTile, n.S); });
    const bf16_t* sKj = sK + t % 2 * kTile * kLd;
    const bf16_t* sVj = sV + t % 2 * kTile * kLd;
    const int k0 = j * kTile;
    float s[kTile / 8][4] = {}, dp[kTile / 8][4] = {};
    warp_gemm_nt<D, kTile, kQInRegs>(s, qa, sQ + warp * 16 * kLd, sKj, lane);
    warp_gemm_nt<D, kTile, kQInRegs>(dp, oa, sdO + warp * 16 * kLd, sVj, lane);
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
  // nor do the query tiles past the end of the last key's document
  const int q_end = doc_end(n.doc, b, n.S, imin(k0 + kTile, n.S) - 1);
  const int per_head = (q_end + BR - 1) / BR - first;
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
    // a query of the step whose document begins after k0 hides some of these keys
    const bool masked = q0 + BR > n.S || (n.causal && q0 < k0 + kTile) ||
                        first_key(n.doc, b, n.S, imin(q0 + BR, n.S) - 1) > k0;
#pragma unroll
    for (int nb = 0; nb < BR / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qc = col + 8 * nb + e % 2;  // query within the step
        float p = 0.f;
        if (!masked || visible(q0 + qc, key + 8 * (e / 2), n.S, n.causal, first_key(n.doc, b, n.S, q0 + qc)))
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
  const int32_t* doc;  // [B, S] document starts, or nullptr
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
  for (int j = first_key(n.doc, b, n.S, i); j < jend; ++j) {
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
  for (int j = first_key(n.doc, b, n.S, i); j < jend; ++j) {
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
    const int iend = doc_end(n.doc, b, n.S, j);
    for (int i = n.causal ? j : 0; i < iend; ++i) {
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

}  // namespace flash
}  // namespace cuda
}  // namespace kernels
}  // namespace xt
