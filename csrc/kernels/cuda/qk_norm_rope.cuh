// Device code of the fused q/k head preparation (qk_norm_rope: rms_norm over D then rope, for the
// q and k heads of each token in the (B, S, heads, D) layout the projection GEMMs write); the
// launchers are in qk_norm_rope.cu. Kept in a header so that tests/emu can compile the same kernels
// with a host compiler and run them on the CPU (tests/emu/flash_attention_emu.cpp, --prep).
//
// One block per token (b, s) with the position's cos/sin tabulated in shared memory, G lanes per
// head row (common.cuh's lanes_for), rms_norm then rope with rmsnorm.cu's sum order (row_sum_sq,
// Note [Wide RMSNorm forward]) and rounding points and kernels/common.h's row math (rms_rstd,
// rms_scaled, rope_inv_freq, rope_cos_sin, rope_rotate) that rmsnorm.cu and rope.cu use: bitwise
// the composition. For D in {32, 64, 128} the register kernels compute the same values with each
// row loaded once and several rows in flight (Note [Head preparation in registers]).
#pragma once
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rmsnorm.cuh"  // the one-pass backward's plan, rounding and final pass

namespace xt {
namespace kernels {
namespace cuda {
namespace qk_prep {

// Element j of rope applied to row x (cos/sin of frequency j mod D/2 in the tables).
template <typename T>
__device__ __forceinline__ compute_t<T> rope_at(compute_t<T> x1, compute_t<T> x2, compute_t<T> cs, compute_t<T> sn,
                                               bool second) {
  compute_t<T> y1, y2;
  rope_rotate(x1, x2, cs, sn, &y1, &y2);
  return second ? y2 : y1;
}

// Fills this block's tables with cos and sin (negated when inverse) of position p.
template <typename C>
__device__ __forceinline__ void rope_table(C* tab_cos, C* tab_sin, float p, int D, const RopeFreqs& freqs,
                                           bool inverse) {
  for (int i = threadIdx.x; i < D / 2; i += blockDim.x) {
    C sn, cs;
    rope_cos_sin(p * rope_inv_freq(freqs, i, D), &cs, &sn);
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
                                            RopeFreqs freqs, RopePositions pos) {
  using C = compute_t<T>;
  C* tab_cos = reinterpret_cast<C*>(dynamic_smem());
  C* tab_sin = tab_cos + D / 2;
  rope_table(tab_cos, tab_sin, pos.at(blockIdx.x, S), D, freqs, /*inverse=*/false);
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
                                       HeadRows hr, int D, RopeFreqs freqs, RopePositions pos) {
  using C = compute_t<T>;
  C* tab_cos = reinterpret_cast<C*>(dynamic_smem());
  C* tab_sin = tab_cos + D / 2;
  rope_table(tab_cos, tab_sin, pos.at(blockIdx.x, S), D, freqs, /*inverse=*/true);
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
__device__ __forceinline__ void dw_partial(const DwSide& sd, int S, int D, const RopeFreqs& freqs,
                                           const RopePositions& pos) {
  using C = compute_t<T>;
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (static_cast<int>(blockIdx.y) >= sd.nchunks || j >= D) return;
  const T* x = static_cast<const T*>(sd.x);
  const T* dy = static_cast<const T*>(sd.dy);
  const int half = D / 2, i = j < half ? j : j - half;
  const float inv_freq = rope_inv_freq(freqs, i, D);
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * sd.rows_per_chunk;
  const int64_t r1 = r0 + sd.rows_per_chunk < sd.rows ? r0 + sd.rows_per_chunk : sd.rows;
  C acc = 0;
  for (int64_t r = r0; r < r1; ++r) {
    C sn, cs;
    rope_cos_sin(pos.at(r / sd.heads, S) * inv_freq, &cs, &sn);
    const C g = rounded<T>(rope_at<T>(load(dy, r * D + i), load(dy, r * D + i + half), cs, -sn, j >= half));
    acc += g * (load(x, r * D + j) * static_cast<C>(sd.rstd[r]));
  }
  if (sd.nchunks == 1) store(static_cast<W*>(sd.dw), j, static_cast<compute_t<W>>(acc));
  else static_cast<C*>(sd.partial)[static_cast<int64_t>(blockIdx.y) * D + j] = acc;
}

template <typename T, typename W>
__global__ void qk_norm_rope_dw_partial_kernel(DwSide q_side, DwSide k_side, int S, int D, RopeFreqs freqs,
                                               RopePositions pos) {
  if (blockIdx.z == 0) dw_partial<T, W>(q_side, S, D, freqs, pos);
  else dw_partial<T, W>(k_side, S, D, freqs, pos);
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
// (negated) sin of a row's position (token row / heads's) come from a shared-memory table of
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
                                                     const RopePositions& pos, InvFreq&& inv_freq) {
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
      rope_cos_sin(pos.at(t_lo + t, S) * inv_freq(i), &cs, &sn);
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
                                     RopeFreqs freqs, RopePositions pos) {
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
    refill_inverse_table(tab, t_lo, t_hi, base, r1, groups, heads, tab_tokens, S, D, pos,
                         [&](int i) { return rope_inv_freq(freqs, i, D); });
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
                                HeadRows hr, int tpb, int dim, float eps, RopeFreqs freqs, RopePositions pos) {
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
                             ? rope_inv_freq(freqs, static_cast<int>(threadIdx.x % half), dim)
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
        rope_cos_sin(pos.at(t0 + t, S) * inv_freq, &cs, &sn);
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
                                         RopeFreqs freqs, RopePositions pos) {
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
  const float inv_freq = rope_inv_freq(freqs, static_cast<int>(threadIdx.x % half), dim);
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
      refill_inverse_table(tab, t_lo, t_hi, base, r1, groups, heads, tab_tokens, S, D, pos,
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

}  // namespace qk_prep
}  // namespace cuda
}  // namespace kernels
}  // namespace xt
