// CUDA flash attention (forward, deterministic backward) and the fused q/k head preparation:
// the launchers. The kernels and the design notes are in flash_attention.cuh.
//
//  - Path: bf16 with D in {32, 64, 128} and 16-byte aligned pointers runs the tensor-core kernels;
//    anything else (float32, float64, other D <= 256) the one-warp-per-row fallback. The choice
//    depends only on dtype, D and alignment, so a given call always runs the same kernels.
//  - Backward: delta = rowsum(dO * O) into a scratch [B, H, S] (compute type), then dq and dk/dv
//    kernels; on the tensor-core path the dq kernel computes delta itself, so 2 launches there, 3
//    on the fallback. Every output is written with `=`, no atomics, no memset.
//  - Head preparation: 1 launch forward; backward: the one-pass kernel (1) + the dw tree (1, when a
//    side has more than one block), or for head dims too long for the one-pass plan dx (1) + dw
//    partial sums (1) + their chunk sum (1, when a side has more than one row chunk), q and k sides
//    together in each. D in {32, 64, 128} takes the register kernels (Note [Head preparation in
//    registers]), other D the general ones; the same bits either way.
//  - Launch shapes depend only on the problem sizes (never on the GPU), so the bits do too.
#include <atomic>
#include <initializer_list>

#include "kernels/cuda/flash_attention.cuh"

namespace xt {
namespace kernels {
namespace cuda {

namespace {

using flash::Dims;
using flash::RowDims;

constexpr int kPrepThreads = 128;  // head preparation: groups of G lanes over the token's head rows
constexpr int kDefaultSmem = 48 * 1024;

bool aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (!aligned_to(p, 16)) return false;
  return true;
}

bool tensor_core_path(DType dt, int64_t D, std::initializer_list<const void*> ptrs) {
  return dt == DType::BFloat16 && (D == 32 || D == 64 || D == 128) && aligned16(ptrs);
}

// Calls fn(std::integral_constant<int, D>{}) for D in {32, 64, 128}.
template <typename Fn>
void with_head_dim(int64_t D, Fn&& fn) {
  switch (D) {
    case 32: fn(std::integral_constant<int, 32>{}); break;
    case 64: fn(std::integral_constant<int, 64>{}); break;
    default: fn(std::integral_constant<int, 128>{}); break;
  }
}

// Calls fn(std::integral_constant<int, D>{}) and returns true when D has the head preparation's
// register path (flash::prep_reg_dim), else returns false.
template <typename Fn>
bool with_prep_reg_dim(int64_t D, Fn&& fn) {
  switch (D) {
    case 32: fn(std::integral_constant<int, 32>{}); return true;
    case 64: fn(std::integral_constant<int, 64>{}); return true;
    case 128: fn(std::integral_constant<int, 128>{}); return true;
    default: return false;
  }
}

// Kernel's dynamic shared memory above the default 48 KB needs an opt-in, once per device.
template <auto Kernel>
void allow_smem(int bytes, int device) {
  static std::atomic<uint64_t> done{0};
  if (bytes <= kDefaultSmem || device >= 64 || (done.load() >> device & 1)) return;
  XT_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  done.fetch_or(uint64_t(1) << device);
}

void check_sizes(int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t D) {
  XT_CHECK(B * H <= INT32_MAX && S <= int64_t(65535) * flash::kTile && B * S * H <= INT32_MAX &&
               D <= flash::kMaxRowD,
           ValueError, "flash_attention: shape too large for CUDA: B=", B, ", S=", S, ", H=", H, ", H_kv=", Hkv,
           ", D=", D);
}

RowDims row_dims(int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t D, double scale, bool causal) {
  return RowDims{static_cast<int>(B), static_cast<int>(S), static_cast<int>(H), static_cast<int>(Hkv),
                 static_cast<int>(D), scale, causal};
}

}  // namespace

void flash_attention_forward(DType dt, const void* q, const void* k, const void* v, void* out, void* lse, int64_t B,
                             int64_t S, int64_t H, int64_t Hkv, int64_t D, double scale, bool causal, void* stream) {
  if (B * S * H == 0) return;
  check_sizes(B, S, H, Hkv, D);
  OnStream on(stream);
  if (tensor_core_path(dt, D, {q, k, v, out})) {
    const Dims n = flash::make_dims(B, S, H, Hkv, scale, causal);
    with_head_dim(D, [&](auto d) {
      constexpr int kD = decltype(d)::value;
      constexpr int smem = flash::fwd_smem<kD>();
      allow_smem<flash::flash_forward_kernel<kD>>(smem, on.device);
      flash::flash_forward_kernel<kD><<<flash::forward_grid(n), flash::kBlockThreads, smem, on.s>>>(
          static_cast<const bf16_t*>(q), static_cast<const bf16_t*>(k), static_cast<const bf16_t*>(v),
          static_cast<bf16_t*>(out), static_cast<float*>(lse), n);
      XT_LAUNCH_CHECK();
    });
    return;
  }
  const RowDims n = row_dims(B, S, H, Hkv, D, scale, causal);
  XT_DISPATCH_FLOAT(dt, "flash_attention_forward", T, {
    flash::row_forward_kernel<T><<<flash::row_grid(n, n.H), flash::kRowWarps * kWarp, 0, on.s>>>(
        static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(out),
        static_cast<compute_t<T>*>(lse), n);
    XT_LAUNCH_CHECK();
  });
}

void flash_attention_backward(DType dt, const void* q, const void* k, const void* v, const void* out,
                              const void* dout, const void* lse, void* dq, void* dk, void* dv, int64_t B, int64_t S,
                              int64_t H, int64_t Hkv, int64_t D, double scale, bool causal, void* stream) {
  if (B * S * H == 0) return;
  check_sizes(B, S, H, Hkv, D);
  OnStream on(stream);
  const bool tc = tensor_core_path(dt, D, {q, k, v, out, dout, dq, dk, dv});
  XT_DISPATCH_FLOAT(dt, "flash_attention_backward", T, {
    using C = compute_t<T>;
    const int64_t rows = B * S * H;
    Scratch delta(sizeof(C) * static_cast<size_t>(rows), on);
    // The tensor-core dq kernel writes delta itself (Note [delta inside the dq kernel]).
    if (!tc) with_lanes(D, [&](auto g) {
      constexpr int G = decltype(g)::value;
      flash::delta_kernel<G, T><<<static_cast<unsigned>(ceil_div(rows, rows_per_block<G>())), kThreads, 0, on.s>>>(
          static_cast<const T*>(out), static_cast<const T*>(dout), delta.as<C>(), rows, static_cast<int>(S),
          static_cast<int>(H), static_cast<int>(D));
      XT_LAUNCH_CHECK();
    });
    if constexpr (std::is_same_v<T, bf16_t>) {
      if (tc) {
        const Dims n = flash::make_dims(B, S, H, Hkv, scale, causal);
        with_head_dim(D, [&](auto d) {
          // Each kernel's form and occupancy per D: Notes [A fragments kept in registers] and
          // [Backward occupancy] (flash_attention.cuh).
          constexpr int kD = decltype(d)::value, kBR = flash::dkdv_rows<kD>();
          constexpr int dq_smem = flash::dq_smem<kD>(), dkdv_smem = flash::dkdv_smem<kD>();
          allow_smem<flash::flash_backward_dq_kernel<kD>>(dq_smem, on.device);
          allow_smem<flash::flash_backward_dkdv_kernel<kD, kBR>>(dkdv_smem, on.device);
          flash::flash_backward_dq_kernel<kD><<<flash::forward_grid(n), flash::kBlockThreads, dq_smem, on.s>>>(
              static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
              static_cast<const T*>(out), static_cast<const T*>(dout), static_cast<const float*>(lse),
              delta.as<float>(), static_cast<T*>(dq), n);
          XT_LAUNCH_CHECK();
          flash::flash_backward_dkdv_kernel<kD, kBR><<<flash::dkdv_grid(n), flash::kBlockThreads, dkdv_smem, on.s>>>(
              static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
              static_cast<const T*>(dout), static_cast<const float*>(lse), delta.as<float>(), static_cast<T*>(dk),
              static_cast<T*>(dv), n);
          XT_LAUNCH_CHECK();
        });
        return;
      }
    }
    const RowDims n = row_dims(B, S, H, Hkv, D, scale, causal);
    const auto* lse_c = static_cast<const C*>(lse);
    flash::row_backward_dq_kernel<T><<<flash::row_grid(n, n.H), flash::kRowWarps * kWarp, 0, on.s>>>(
        static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<const T*>(dout),
        lse_c, delta.as<C>(), static_cast<T*>(dq), n);
    XT_LAUNCH_CHECK();
    flash::row_backward_dkdv_kernel<T><<<flash::row_grid(n, n.Hkv), flash::kRowWarps * kWarp, 0, on.s>>>(
        static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<const T*>(dout),
        lse_c, delta.as<C>(), static_cast<T*>(dk), static_cast<T*>(dv), n);
    XT_LAUNCH_CHECK();
  });
}

namespace {

// A head-preparation launcher's common part: nothing to do for an empty problem, the size checks,
// then fn(TypeTag<T>, TypeTag<W>, on, head rows) on the stream's device.
template <typename Fn>
void with_prep(const char* op, DType dt, DType w_dt, int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t D,
               void* stream, Fn&& fn) {
  if (B * S * (H + Hkv) * D == 0) return;
  XT_ASSERT(D % 2 == 0, op, ": odd head dim ", D);
  XT_CHECK(B * S <= INT32_MAX && S <= INT32_MAX && (H + Hkv) * D <= INT32_MAX, ValueError,
           "qk_norm_rope: shape too large for CUDA: B=", B, ", S=", S, ", H=", H, ", H_kv=", Hkv, ", D=", D);
  OnStream on(stream);
  const flash::HeadRows hr{static_cast<int>(H), static_cast<int>(Hkv)};
  dispatch_float_weight(dt, w_dt, op, [&](auto xtag, auto wtag) { fn(xtag, wtag, on, hr); });
}

}  // namespace

void qk_norm_rope_forward(DType dt, DType w_dt, const void* q, const void* k, const void* wq, const void* wk,
                          void* q_out, void* k_out, float* rstd_q, float* rstd_k, int64_t B, int64_t S, int64_t H,
                          int64_t Hkv, int64_t D, float eps, float theta, void* stream) {
  with_prep("qk_norm_rope_forward", dt, w_dt, B, S, H, Hkv, D, stream,
            [&](auto xtag, auto wtag, const OnStream& on, const flash::HeadRows& hr) {
    using T = typename decltype(xtag)::type;
    using W = typename decltype(wtag)::type;
    using C = compute_t<T>;
    const bool reg = with_prep_reg_dim(D, [&](auto d) {  // Note [Head preparation in registers]
      constexpr int kD = decltype(d)::value;
      const int64_t tpb = flash::prep_tokens_per_block<kD, T>(H, Hkv);  // Note [Head preparation occupancy]
      const size_t smem = sizeof(C) * static_cast<size_t>(tpb * D);  // cos and sin of tpb tokens
      flash::qk_norm_rope_forward_reg_kernel<kD, T, W>
          <<<static_cast<unsigned>(ceil_div(B * S, tpb)), kThreads, smem, on.s>>>(
              static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const W*>(wq),
              static_cast<const W*>(wk), static_cast<T*>(q_out), static_cast<T*>(k_out), rstd_q, rstd_k, B * S,
              static_cast<int>(S), hr, static_cast<int>(tpb), static_cast<int>(D), eps, theta);
      XT_LAUNCH_CHECK();
    });
    if (reg) return;
    with_lanes(D, [&](auto g) {
      constexpr int G = decltype(g)::value;
      const size_t smem = sizeof(compute_t<T>) * static_cast<size_t>(D);  // cos and sin, D/2 each
      flash::qk_norm_rope_forward_kernel<G, T, W><<<static_cast<unsigned>(B * S), kPrepThreads, smem, on.s>>>(
          static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const W*>(wq), static_cast<const W*>(wk),
          static_cast<T*>(q_out), static_cast<T*>(k_out), rstd_q, rstd_k, static_cast<int>(S), hr,
          static_cast<int>(D), eps, theta);
      XT_LAUNCH_CHECK();
    });
  });
}

void qk_norm_rope_backward(DType dt, DType w_dt, const void* q, const void* k, const void* wq, const void* wk,
                           const float* rstd_q, const float* rstd_k, const void* dq_out, const void* dk_out, void* dq,
                           void* dk, void* dwq, void* dwk, int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t D,
                           float theta, void* stream) {
  if (dt == DType::BFloat16 && rmsnorm::wide_chunks(D) != 0 && B * S * (H + Hkv) > 0) {
    // rms_norm's backward takes its wide kernel at this width (Note [Wide RMSNorm backward],
    // rmsnorm.cuh), whose sums no one-pass head kernel repeats: run the composition itself, rope's
    // inverse into a scratch gradient, then rmsnorm_backward, per side.
    OnStream on(stream);
    Scratch pos(sizeof(int64_t) * static_cast<size_t>(S > 0 ? S : 1), on);
    arange(DType::Int64, pos.as<void>(), S, 0.0, 1.0, stream);  // positions 0 .. S-1
    const auto side = [&](const void* x, const void* w, const float* rstd, const void* dy, void* dx, void* dw,
                          int64_t heads) {
      if (heads == 0 || dy == nullptr) return;  // a side without a gradient: nothing to write
      const int64_t rows = B * S * heads;
      Scratch g(sizeof(uint16_t) * static_cast<size_t>(rows > 0 ? rows * D : 1), on);
      rope(dt, dy, g.as<void>(), pos.as<int64_t>(), B, S, heads, D, theta, true, stream);
      rmsnorm_backward(dt, w_dt, x, w, rstd, g.as<void>(), dx, dw, rows, D, stream);
    };
    side(q, wq, rstd_q, dq_out, dq, dwq, H);
    side(k, wk, rstd_k, dk_out, dk, dwk, Hkv);
    return;
  }
  with_prep("qk_norm_rope_backward", dt, w_dt, B, S, H, Hkv, D, stream,
            [&](auto xtag, auto wtag, const OnStream& on, const flash::HeadRows& hr) {
    using T = typename decltype(xtag)::type;
    using W = typename decltype(wtag)::type;
    using C = compute_t<T>;
    // The one-pass backward (Note [qk_norm_rope one-pass backward]): rms_norm's plan per side.
    bool done = false;
    with_lanes(D, [&](auto g) {
      constexpr int G = decltype(g)::value;
      const flash::PrepDwPlan pq = flash::prep_dw_plan<G, C>(B * S * H, H, D);
      const flash::PrepDwPlan pk = flash::prep_dw_plan<G, C>(B * S * Hkv, Hkv, D);
      if ((H > 0 && pq.smem == 0) || (Hkv > 0 && pk.smem == 0)) return;
      const auto side = [&](const void* x, const void* w, const float* rstd, const void* dy, void* dx, void* dw,
                            int64_t heads, const flash::PrepDwPlan& p) {
        return flash::OnePassSide<T, W>{static_cast<const T*>(x), static_cast<const W*>(w), rstd,
                                        static_cast<const T*>(dy), static_cast<T*>(dx), static_cast<W*>(dw), nullptr,
                                        B * S * heads, p.rows.rows_per_block, heads > 0 ? p.rows.nblocks : 0, heads,
                                        p.tab_tokens};
      };
      flash::OnePassSide<T, W> qs = side(q, wq, rstd_q, dq_out, dq, dwq, H, pq);
      flash::OnePassSide<T, W> ks = side(k, wk, rstd_k, dk_out, dk, dwk, Hkv, pk);
      const int64_t part_q = qs.nblocks > 1 ? qs.nblocks * D : 0, part_k = ks.nblocks > 1 ? ks.nblocks * D : 0;
      Scratch partial(sizeof(C) * static_cast<size_t>(part_q + part_k + 1), on);
      if (part_q > 0) qs.partial = partial.as<C>();
      if (part_k > 0) ks.partial = partial.as<C>() + part_q;
      const size_t smem = pq.smem > pk.smem ? pq.smem : pk.smem;  // each side's: <= 48 KB (prep_dw_plan)
      const unsigned nblocks = static_cast<unsigned>(qs.nblocks + ks.nblocks);
      const bool reg = with_prep_reg_dim(D, [&](auto d) {  // Note [Head preparation in registers]
        constexpr int kD = decltype(d)::value;
        flash::qk_norm_rope_backward_onepass_reg_kernel<kD, T, W><<<nblocks, kThreads, smem, on.s>>>(
            qs, ks, static_cast<int>(S), static_cast<int>(D), theta);
        XT_LAUNCH_CHECK();
      });
      if (!reg) {
        flash::qk_norm_rope_backward_onepass_kernel<G, T, W><<<nblocks, kThreads, smem, on.s>>>(
            qs, ks, static_cast<int>(S), static_cast<int>(D), theta);
        XT_LAUNCH_CHECK();
      }
      if (part_q + part_k > 0) {
        flash::qk_norm_rope_dw_tree_kernel<T, W>
            <<<dim3(static_cast<unsigned>(ceil_div(D, rmsnorm::kFinalCols)), 2), rmsnorm::kTreeThreads,
               rmsnorm::tree_smem<C>(),
               on.s>>>(qs, ks, static_cast<int>(D));
        XT_LAUNCH_CHECK();
      }
      done = true;
    });
    if (done) return;
    // Head dims too long for the one-pass plan: rms_norm's dx + column-sum path, as the composition.
    with_lanes(D, [&](auto g) {
      constexpr int G = decltype(g)::value;
      const size_t smem = sizeof(C) * static_cast<size_t>(D);
      flash::qk_norm_rope_dx_kernel<G, T, W><<<static_cast<unsigned>(B * S), kPrepThreads, smem, on.s>>>(
          static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const W*>(wq), static_cast<const W*>(wk),
          rstd_q, rstd_k, static_cast<const T*>(dq_out), static_cast<const T*>(dk_out), static_cast<T*>(dq),
          static_cast<T*>(dk), static_cast<int>(S), hr, static_cast<int>(D), theta);
      XT_LAUNCH_CHECK();
    });
    // dw: rmsnorm_backward's column sums (column_sum_plan) of each side, both sides per launch.
    const auto side = [&](const void* x, const float* rstd, const void* dy, void* dw, int64_t heads) {
      flash::DwSide sd{x, rstd, dy, dw, nullptr, static_cast<int>(heads), B * S * heads, 1, 0};
      if (heads == 0) return sd;
      const ColumnSumPlan plan = column_sum_plan(sd.rows, D);
      sd.rows_per_chunk = plan.rows_per_chunk;
      sd.nchunks = static_cast<int>(plan.nchunks);
      return sd;
    };
    flash::DwSide qs = side(q, rstd_q, dq_out, dwq, H), ks = side(k, rstd_k, dk_out, dwk, Hkv);
    const int64_t part_q = qs.nchunks > 1 ? qs.nchunks * D : 0, part_k = ks.nchunks > 1 ? ks.nchunks * D : 0;
    Scratch partial(sizeof(C) * static_cast<size_t>(part_q + part_k + 1), on);
    qs.partial = partial.as<C>();
    ks.partial = partial.as<C>() + part_q;
    const ColumnSumPlan plan = column_sum_plan(1, D);  // threads and column blocks depend on D only
    const int max_chunks = qs.nchunks > ks.nchunks ? qs.nchunks : ks.nchunks;
    flash::qk_norm_rope_dw_partial_kernel<T, W>
        <<<dim3(static_cast<unsigned>(plan.col_blocks), static_cast<unsigned>(max_chunks), 2), plan.threads, 0,
           on.s>>>(qs, ks, static_cast<int>(S), static_cast<int>(D), theta);
    XT_LAUNCH_CHECK();
    if (max_chunks > 1) {
      flash::qk_norm_rope_dw_final_kernel<T, W>
          <<<dim3(static_cast<unsigned>(plan.col_blocks), 1, 2), plan.threads, 0, on.s>>>(qs, ks,
                                                                                           static_cast<int>(D));
      XT_LAUNCH_CHECK();
    }
  });
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
