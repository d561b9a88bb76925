// CUDA decode attention: the KV cache write and one query row per (b, h) against the cache
// [B, L, Hkv, D], split over the keys (flash-decoding) so that a batch of 1 still fills the GPU.
//
//  - kv_cache_write: a grid-stride copy in the widest word (16 bytes when the row allows it); the
//    slots of a row are contiguous, so it is a strided memcpy. A bad position is reported (Note
//    [Device-side index checks]) and its row is not written.
//  - decode_attention (kernels in decode_attention.cuh): grid (B*Hkv, chunks of `chunk` keys); a
//    block handles the G = H/Hkv query heads of one kv head over one chunk, so each K/V row is
//    read from memory once per group: scores thread-per-key into shared memory (q pre-scaled by
//    scale * log2 e), the chunk's max m and sum l of exp2(s - m) by fixed-order block reductions,
//    o = sum_j p_j v_j by (g, d) items with the keys split among thread subgroups and the subgroup
//    sums added in order. The combine, M = max of the chunks' m, out = sum_c o_c 2^(m_c - M) /
//    sum_c l_c 2^(m_c - M), chunks in order, rounded once, is done by the group's last block to
//    finish (Note [Decode attention in one kernel]), or by a second kernel, one block per (b, h),
//    where there are no arrival counters (same bits either way).
//  - Deterministic: the chunk size and launch shapes depend only on (B, L, H, Hkv, D, dtype), every
//    sum has a fixed order, no float atomics (an integer counter picks the block that combines).
//    Chunks past a row's length exit at once and are not read. Compute type float32 (float64 for
//    float64).
//  - decode_prep: one block per row, the rows' head preparation of a decode step in one launch (it
//    was rms_norm, rope, rms_norm, rope and two cache writes): the row's cos/sin at its position in
//    shared memory, then G lanes per q or k head row with rms_norm's sum of squares and rounding
//    (the same lanes_for(D) groups as the rms_norm kernel, so the same sums) and rope's rotation,
//    k written straight into its cache slot; v copied into its slot.
//  - greedy_next: one block per row, each thread's first maximum over a strided share of the row,
//    then a reduction that keeps the better value and, of equal ones, the lower index (so the
//    result does not depend on the order: the row's first maximum); thread 0 updates the state.
#include <map>
#include <mutex>
#include <utility>

#include "kernels/cuda/decode_attention.cuh"

namespace xt {
namespace kernels {
namespace cuda {

namespace {

using decode::kDecodeThreads;
constexpr double kLog2e = 1.4426950408889634;

// ------------------------------------------------------------------ cache write

template <typename W>
__global__ void kv_cache_write_kernel(W* cache, const W* x, const int64_t* pos, int64_t B, int64_t L, int64_t S,
                                      int64_t row_words, IndexErrorRecord* err) {
  const int64_t per_row = S * row_words;
  XT_GRID_STRIDE(i, B * per_row) {
    const int64_t b = i / per_row, r = i - b * per_row;
    const int64_t p = pos[b];
    if (p < 0 || p > L - S) {
      if (r == 0) report_bad_index(err, IndexSite::KvCacheWrite, p, L - S + 1, 0);
      continue;
    }
    cache[(b * L + p) * row_words + r] = x[i];
  }
}

template <typename W>
void launch_cache_write(void* cache, const void* x, const int64_t* pos, int64_t B, int64_t L, int64_t S,
                        int64_t row_bytes, const OnStream& on) {
  const int64_t row_words = row_bytes / static_cast<int64_t>(sizeof(W));
  kv_cache_write_kernel<<<grid_for(B * S * row_words), kThreads, 0, on.s>>>(
      static_cast<W*>(cache), static_cast<const W*>(x), pos, B, L, S, row_words,
      xt::cuda::index_error_record(on.device));
  XT_LAUNCH_CHECK();
}

// ------------------------------------------------------------------ attention

// The arrival counters of decode_attention_kernel (Note [Decode attention in one kernel]): one
// buffer of kArrivalSlots ints per (device, stream), zeroed when created and zero again after
// every launch. Per stream, so that launches on concurrent streams (one per thread) never share a
// counter; a graph keeps the buffer of the stream it was captured on, and replays on that stream
// (core/cuda/graph.cpp), so its launches and the eager ones are ordered by the stream. Several
// caches or models on one stream share the buffer: each launch leaves it zero. Created by a
// launch outside a graph capture (generate's eager warm-up step); nullptr (the two-kernel path)
// while there is none and the stream is capturing, or when B * Hkv groups need more slots.
// Never freed: 16 KB per stream.
constexpr int64_t kArrivalSlots = 4096;

int* arrival_counters(const OnStream& on, int64_t groups) {
  if (groups > kArrivalSlots) return nullptr;
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, int*> buffers;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(on.device, on.s);
  if (auto it = buffers.find(key); it != buffers.end()) return it->second;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  XT_CUDA_CHECK(cudaStreamIsCapturing(on.s, &capture));
  if (capture != cudaStreamCaptureStatusNone) return nullptr;
  int* p = nullptr;
  XT_CUDA_CHECK(cudaMalloc(&p, kArrivalSlots * sizeof(int)));
  XT_CUDA_CHECK(cudaMemsetAsync(p, 0, kArrivalSlots * sizeof(int), on.s));  // before any launch that uses it
  buffers.emplace(key, p);
  return p;
}

// ------------------------------------------------------------------ decode head preparation

// Enough groups for every head row of a token at once at D <= 64 (G = 8 or 16 lanes per row):
// with one block per sequence, a decode step has few blocks and each round of rows is latency.
constexpr int kPrepThreads = 512;

template <int G, typename T, typename W>
__global__ void __launch_bounds__(kPrepThreads)
    decode_prep_kernel(const T* q, const T* k, const T* v, const W* wq, const W* wk, T* q_out, T* k_cache,
                       T* v_cache, const int64_t* pos, int64_t L, int H, int Hkv, int D, float eps, float theta,
                       IndexErrorRecord* err) {
  using C = compute_t<T>;
  extern __shared__ __align__(16) unsigned char prep_smem[];
  C* tab_cos = reinterpret_cast<C*>(prep_smem);
  const int half = D / 2;
  C* tab_sin = tab_cos + half;
  const int64_t b = blockIdx.x;
  const int64_t p = pos[b];
  const bool slot_ok = p >= 0 && p < L;
  if (!slot_ok && threadIdx.x == 0) report_bad_index(err, IndexSite::DecodePrep, p, L, 0);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    C sn, cs;  // rope_rows_kernel's table: the float32 angle of position p
    rope_cos_sin(static_cast<float>(p) * rope_inv_freq(theta, i, D), &cs, &sn);
    tab_cos[i] = cs;
    tab_sin[i] = sn;
  }
  __syncthreads();
  const int lane = threadIdx.x % G, group = threadIdx.x / G, groups = blockDim.x / G;
  const bool norm = wq != nullptr;
  for (int r0 = 0; r0 < H + Hkv; r0 += groups) {
    const int r = r0 + group;
    const bool valid = r < H + Hkv, is_q = r < H;
    const T* x = !valid ? q : is_q ? q + (b * H + r) * D : k + (b * Hkv + (r - H)) * D;
    // Every lane of the group takes part in the sum's shuffles, valid or not.
    const C inv = norm ? rms_rstd(group_sum_sq<G>(x, D, lane, valid), D, eps) : C(0);
    if (!valid || (!is_q && !slot_ok)) continue;
    const W* w = is_q ? wq : wk;
    T* y = is_q ? q_out + (b * H + r) * D : k_cache + ((b * L + p) * Hkv + (r - H)) * D;
#pragma unroll 4
    for (int j = lane; j < D; j += G) {
      const int i = j < half ? j : j - half;
      // rms_norm's output as stored and read back by rope (rounded to T), or the input itself
      const C x1 = norm ? rounded<T>(rms_scaled(x, w, i, inv)) : load(x, i);
      const C x2 = norm ? rounded<T>(rms_scaled(x, w, i + half, inv)) : load(x, i + half);
      C y1, y2;
      rope_rotate(x1, x2, tab_cos[i], tab_sin[i], &y1, &y2);
      store(y, j, j < half ? y1 : y2);
    }
  }
  if (!slot_ok) return;
  const int64_t n = static_cast<int64_t>(Hkv) * D;
  for (int64_t e = threadIdx.x; e < n; e += blockDim.x) v_cache[(b * L + p) * n + e] = v[b * n + e];
}

// ------------------------------------------------------------------ greedy pick

constexpr int kGreedyThreads = 512;

template <typename T>
__global__ void __launch_bounds__(kGreedyThreads)
    greedy_next_kernel(const T* logits, int64_t B, int64_t V, int64_t* state, int64_t* ring, int64_t R,
                       int64_t stop) {
  using C = compute_t<T>;
  __shared__ C best_v[kGreedyThreads / kWarp];
  __shared__ int64_t best_i[kGreedyThreads / kWarp];
  const int64_t b = blockIdx.x;
  const T* row = logits + b * V;
  C v = load(row, 0);
  int64_t idx = 0;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
    const C x = load(row, i);
    if (greedy_beats(x, i, v, idx)) v = x, idx = i;
  }
  for (int o = kWarp / 2; o > 0; o >>= 1) {
    const C ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (greedy_beats(ov, oi, v, idx)) v = ov, idx = oi;
  }
  const int warp = threadIdx.x / kWarp;
  if (threadIdx.x % kWarp == 0) best_v[warp] = v, best_i[warp] = idx;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < static_cast<int>(blockDim.x / kWarp); ++w)
    if (greedy_beats(best_v[w], best_i[w], v, idx)) v = best_v[w], idx = best_i[w];
  greedy_take(state, B, b, idx, ring, R, stop);
}

}  // namespace

void kv_cache_write(DType dt, void* cache, const void* x, const int64_t* pos, int64_t B, int64_t L, int64_t S,
                    int64_t row, void* stream) {
  OnStream on(stream);
  const int64_t row_bytes = row * static_cast<int64_t>(dtype_size(dt));
  auto fits = [&](int64_t w) { return row_bytes % w == 0 && aligned_to(cache, w) && aligned_to(x, w); };
  if (fits(16)) launch_cache_write<uint4>(cache, x, pos, B, L, S, row_bytes, on);
  else if (fits(8)) launch_cache_write<uint2>(cache, x, pos, B, L, S, row_bytes, on);
  else if (fits(4)) launch_cache_write<uint32_t>(cache, x, pos, B, L, S, row_bytes, on);
  else launch_cache_write<uint16_t>(cache, x, pos, B, L, S, row_bytes, on);
}

void decode_attention(DType dt, const void* q, const void* k_cache, const void* v_cache, const int64_t* len,
                      void* out, int64_t B, int64_t L, int64_t H, int64_t Hkv, int64_t D, double scale,
                      void* stream) {
  OnStream on(stream);
  const int64_t G = H / Hkv;
  XT_DISPATCH_FLOAT(dt, "decode_attention", T, {
    using C = compute_t<T>;
    auto smem = [&](int64_t ch) { return decode::decode_smem_bytes(G, D, ch, sizeof(C)); };
    const int chunk = decode::decode_chunk(B, L, Hkv, G, D, sizeof(C));
    XT_CHECK(smem(chunk) <= decode::kDecodeSmem, ValueError, "decode_attention: ", G,
             " query heads per kv head of dimension ", D, " need more shared memory than the kernel's ", decode::kDecodeSmem, " bytes");
    const int64_t nchunks = ceil_div(L, chunk);
    XT_CHECK(nchunks <= 65535 && B * Hkv <= (int64_t{1} << 31) - 1, ValueError,
             "decode_attention: the cache is too large for one launch (B = ", B, ", L = ", L, ", H_kv = ", Hkv, ")");
    const int64_t rows = B * H;
    Scratch part(static_cast<size_t>(rows * (nchunks > 0 ? nchunks : 1) * (D + 2)) * sizeof(C), on);
    C* po = part.as<C>();
    C* pm = po + rows * nchunks * D;
    C* pl = pm + rows * nchunks;
    const T* qp = static_cast<const T*>(q);
    const T* kp = static_cast<const T*>(k_cache);
    const T* vp = static_cast<const T*>(v_cache);
    T* op = static_cast<T*>(out);
    const int Hi = static_cast<int>(H), Hkvi = static_cast<int>(Hkv), Di = static_cast<int>(D);
    const int nch = static_cast<int>(nchunks);
    int* arrivals = nchunks > 0 ? arrival_counters(on, B * Hkv) : nullptr;
    if (nchunks > 0) {
      const dim3 grid(static_cast<unsigned>(B * Hkv), static_cast<unsigned>(nchunks));
      const bool vec = D % (16 / static_cast<int64_t>(sizeof(T))) == 0 && aligned_to(k_cache, 16);
      const C qscale = static_cast<C>(scale * kLog2e);
      auto* err = xt::cuda::index_error_record(on.device);
      if (arrivals && vec)
        decode::decode_attention_kernel<true, T><<<grid, kDecodeThreads, smem(chunk), on.s>>>(
            qp, kp, vp, len, po, pm, pl, op, arrivals, L, Hi, Hkvi, Di, chunk, nch, qscale, err);
      else if (arrivals)
        decode::decode_attention_kernel<false, T><<<grid, kDecodeThreads, smem(chunk), on.s>>>(
            qp, kp, vp, len, po, pm, pl, op, arrivals, L, Hi, Hkvi, Di, chunk, nch, qscale, err);
      else if (vec)
        decode::decode_partial_kernel<true, T><<<grid, kDecodeThreads, smem(chunk), on.s>>>(
            qp, kp, vp, len, po, pm, pl, L, Hi, Hkvi, Di, chunk, nch, qscale, err);
      else
        decode::decode_partial_kernel<false, T><<<grid, kDecodeThreads, smem(chunk), on.s>>>(
            qp, kp, vp, len, po, pm, pl, L, Hi, Hkvi, Di, chunk, nch, qscale, err);
      XT_LAUNCH_CHECK();
    }
    if (arrivals) return;  // the last block of each group combined it
    const int threads = static_cast<int>(ceil_div(D, kWarp) * kWarp);
    decode::decode_combine_kernel<T><<<static_cast<unsigned>(rows), threads, 0, on.s>>>(po, pm, pl, len, op, L, Hi,
                                                                                          Di, chunk, nch);
    XT_LAUNCH_CHECK();
  });
}

void decode_prep(DType dt, DType w_dt, const void* q, const void* k, const void* v, const void* wq, const void* wk,
                 void* q_out, void* k_cache, void* v_cache, const int64_t* pos, int64_t B, int64_t L, int64_t H,
                 int64_t Hkv, int64_t D, float eps, float theta, void* stream) {
  if (B == 0 || D == 0) return;
  XT_ASSERT(D % 2 == 0, "decode_prep: odd head dim ", D);
  XT_CHECK(B <= INT32_MAX && (H + Hkv) * D <= INT32_MAX, ValueError, "decode_prep: shape too large for CUDA: B=", B,
           ", H=", H, ", H_kv=", Hkv, ", D=", D);
  OnStream on(stream);
  auto* err = xt::cuda::index_error_record(on.device);
  dispatch_float_weight(dt, w_dt, "decode_prep", [&](auto xtag, auto wtag) {
    using T = typename decltype(xtag)::type;
    using W = typename decltype(wtag)::type;
    with_lanes(D, [&](auto g) {
      constexpr int G = decltype(g)::value;
      const size_t smem = sizeof(compute_t<T>) * static_cast<size_t>(D);  // cos and sin, D/2 each
      decode_prep_kernel<G, T, W><<<static_cast<unsigned>(B), kPrepThreads, smem, on.s>>>(
          static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<const W*>(wq),
          static_cast<const W*>(wk), static_cast<T*>(q_out), static_cast<T*>(k_cache), static_cast<T*>(v_cache), pos,
          L, static_cast<int>(H), static_cast<int>(Hkv), static_cast<int>(D), eps, theta, err);
      XT_LAUNCH_CHECK();
    });
  });
}

void greedy_next(DType dt, const void* logits, int64_t B, int64_t V, int64_t* state, int64_t* ring, int64_t R,
                 int64_t stop, void* stream) {
  if (B == 0) return;
  XT_CHECK(B <= INT32_MAX, ValueError, "greedy_next: too many rows for CUDA: ", B);
  OnStream on(stream);
  XT_DISPATCH_FLOAT(dt, "greedy_next", T, {
    greedy_next_kernel<T><<<static_cast<unsigned>(B), kGreedyThreads, 0, on.s>>>(static_cast<const T*>(logits), B, V,
                                                                                  state, ring, R, stop);
    XT_LAUNCH_CHECK();
  });
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
