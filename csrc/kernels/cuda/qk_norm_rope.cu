// CUDA fused q/k head preparation (qk_norm_rope: rms_norm over D then rope, bitwise that
// composition): the launchers. The kernels and the design notes are in qk_norm_rope.cuh.
//
//  - Forward: 1 launch; backward: the one-pass kernel (1) + the dw tree (1, when a side has more
//    than one block), or for head dims too long for the one-pass plan dx (1) + dw partial sums (1)
//    + their chunk sum (1, when a side has more than one row chunk), q and k sides together in
//    each. D in {32, 64, 128} takes the register kernels (Note [Head preparation in registers]),
//    other D the general ones; the same bits either way. A bf16 head dim wide enough for rms_norm's
//    wide backward runs the composition itself (rope's inverse, then rmsnorm_backward).
//  - Launch shapes depend only on the problem sizes (never on the GPU), so the bits do too.
#include "kernels/cuda/qk_norm_rope.cuh"
#include "kernels/cuda/static_switch.h"

namespace xt {
namespace kernels {
namespace cuda {

namespace {

constexpr int kPrepThreads = 128;  // groups of G lanes over the token's head rows

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
  const qk_prep::HeadRows hr{static_cast<int>(H), static_cast<int>(Hkv)};
  dispatch_float_weight(dt, w_dt, op, [&](auto xtag, auto wtag) { fn(xtag, wtag, on, hr); });
}

}  // namespace

void qk_norm_rope_forward(DType dt, DType w_dt, const void* q, const void* k, const void* wq, const void* wk,
                          void* q_out, void* k_out, float* rstd_q, float* rstd_k, int64_t B, int64_t S, int64_t H,
                          int64_t Hkv, int64_t D, float eps, const RopeFreqs& freqs, RopePositions pos,
                          void* stream) {
  with_prep("qk_norm_rope_forward", dt, w_dt, B, S, H, Hkv, D, stream,
            [&](auto xtag, auto wtag, const OnStream& on, const qk_prep::HeadRows& hr) {
    using T = typename decltype(xtag)::type;
    using W = typename decltype(wtag)::type;
    using C = compute_t<T>;
    if (qk_prep::prep_reg_dim(D)) {  // Note [Head preparation in registers]
      XT_INT_SWITCH(D, kD, (32, 64, 128), [&] {
        const int64_t tpb = qk_prep::prep_tokens_per_block<kD, T>(H, Hkv);  // Note [Head preparation occupancy]
        const size_t smem = sizeof(C) * static_cast<size_t>(tpb * D);  // cos and sin of tpb tokens
        qk_prep::qk_norm_rope_forward_reg_kernel<kD, T, W>
            <<<static_cast<unsigned>(ceil_div(B * S, tpb)), kThreads, smem, on.s>>>(
                static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const W*>(wq),
                static_cast<const W*>(wk), static_cast<T*>(q_out), static_cast<T*>(k_out), rstd_q, rstd_k, B * S,
                static_cast<int>(S), hr, static_cast<int>(tpb), static_cast<int>(D), eps, freqs, pos);
      });
      XT_LAUNCH_CHECK();
      return;
    }
    with_lanes(D, [&](auto g) {
      constexpr int G = decltype(g)::value;
      const size_t smem = sizeof(compute_t<T>) * static_cast<size_t>(D);  // cos and sin, D/2 each
      qk_prep::qk_norm_rope_forward_kernel<G, T, W><<<static_cast<unsigned>(B * S), kPrepThreads, smem, on.s>>>(
          static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const W*>(wq), static_cast<const W*>(wk),
          static_cast<T*>(q_out), static_cast<T*>(k_out), rstd_q, rstd_k, static_cast<int>(S), hr,
          static_cast<int>(D), eps, freqs, pos);
      XT_LAUNCH_CHECK();
    });
  });
}

void qk_norm_rope_backward(DType dt, DType w_dt, const void* q, const void* k, const void* wq, const void* wk,
                           const float* rstd_q, const float* rstd_k, const void* dq_out, const void* dk_out, void* dq,
                           void* dk, void* dwq, void* dwk, int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t D,
                           const RopeFreqs& freqs, RopePositions pos, void* stream) {
  if (dt == DType::BFloat16 && rmsnorm::wide_chunks(D) != 0 && B * S * (H + Hkv) > 0) {
    // rms_norm's backward takes its wide kernel at this width (Note [Wide RMSNorm backward],
    // rmsnorm.cuh), whose sums no one-pass head kernel repeats: run the composition itself, rope's
    // inverse into a scratch gradient, then rmsnorm_backward, per side.
    OnStream on(stream);
    const auto side = [&](const void* x, const void* w, const float* rstd, const void* dy, void* dx, void* dw,
                          int64_t heads) {
      if (heads == 0 || dy == nullptr) return;  // a side without a gradient: nothing to write
      const int64_t rows = B * S * heads;
      Scratch g(sizeof(uint16_t) * static_cast<size_t>(rows > 0 ? rows * D : 1), on);
      rope(dt, dy, g.as<void>(), pos, B, S, heads, D, freqs, true, stream);
      rmsnorm_backward(dt, w_dt, x, w, rstd, g.as<void>(), dx, dw, rows, D, stream);
    };
    side(q, wq, rstd_q, dq_out, dq, dwq, H);
    side(k, wk, rstd_k, dk_out, dk, dwk, Hkv);
    return;
  }
  with_prep("qk_norm_rope_backward", dt, w_dt, B, S, H, Hkv, D, stream,
            [&](auto xtag, auto wtag, const OnStream& on, const qk_prep::HeadRows& hr) {
    using T = typename decltype(xtag)::type;
    using W = typename decltype(wtag)::type;
    using C = compute_t<T>;
    // The one-pass backward (Note [qk_norm_rope one-pass backward]): rms_norm's plan per side.
    bool done = false;
    with_lanes(D, [&](auto g) {
      constexpr int G = decltype(g)::value;
      const qk_prep::PrepDwPlan pq = qk_prep::prep_dw_plan<G, C>(B * S * H, H, D);
      const qk_prep::PrepDwPlan pk = qk_prep::prep_dw_plan<G, C>(B * S * Hkv, Hkv, D);
      if ((H > 0 && pq.smem == 0) || (Hkv > 0 && pk.smem == 0)) return;
      const auto side = [&](const void* x, const void* w, const float* rstd, const void* dy, void* dx, void* dw,
                            int64_t heads, const qk_prep::PrepDwPlan& p) {
        return qk_prep::OnePassSide<T, W>{static_cast<const T*>(x), static_cast<const W*>(w), rstd,
                                        static_cast<const T*>(dy), static_cast<T*>(dx), static_cast<W*>(dw), nullptr,
                                        B * S * heads, p.rows.rows_per_block, heads > 0 ? p.rows.nblocks : 0, heads,
                                        p.tab_tokens};
      };
      qk_prep::OnePassSide<T, W> qs = side(q, wq, rstd_q, dq_out, dq, dwq, H, pq);
      qk_prep::OnePassSide<T, W> ks = side(k, wk, rstd_k, dk_out, dk, dwk, Hkv, pk);
      const int64_t part_q = qs.nblocks > 1 ? qs.nblocks * D : 0, part_k = ks.nblocks > 1 ? ks.nblocks * D : 0;
      Scratch partial(sizeof(C) * static_cast<size_t>(part_q + part_k + 1), on);
      if (part_q > 0) qs.partial = partial.as<C>();
      if (part_k > 0) ks.partial = partial.as<C>() + part_q;
      const size_t smem = pq.smem > pk.smem ? pq.smem : pk.smem;  // each side's: <= 48 KB (prep_dw_plan)
      const unsigned nblocks = static_cast<unsigned>(qs.nblocks + ks.nblocks);
      if (qk_prep::prep_reg_dim(D)) {  // Note [Head preparation in registers]
        XT_INT_SWITCH(D, kD, (32, 64, 128), [&] {
          qk_prep::qk_norm_rope_backward_onepass_reg_kernel<kD, T, W><<<nblocks, kThreads, smem, on.s>>>(
              qs, ks, static_cast<int>(S), static_cast<int>(D), freqs, pos);
        });
      } else {
        qk_prep::qk_norm_rope_backward_onepass_kernel<G, T, W><<<nblocks, kThreads, smem, on.s>>>(
            qs, ks, static_cast<int>(S), static_cast<int>(D), freqs, pos);
      }
      XT_LAUNCH_CHECK();
      if (part_q + part_k > 0) {
        qk_prep::qk_norm_rope_dw_tree_kernel<T, W>
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
      qk_prep::qk_norm_rope_dx_kernel<G, T, W><<<static_cast<unsigned>(B * S), kPrepThreads, smem, on.s>>>(
          static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const W*>(wq), static_cast<const W*>(wk),
          rstd_q, rstd_k, static_cast<const T*>(dq_out), static_cast<const T*>(dk_out), static_cast<T*>(dq),
          static_cast<T*>(dk), static_cast<int>(S), hr, static_cast<int>(D), freqs, pos);
      XT_LAUNCH_CHECK();
    });
    // dw: rmsnorm_backward's column sums (column_sum_plan) of each side, both sides per launch.
    const auto side = [&](const void* x, const float* rstd, const void* dy, void* dw, int64_t heads) {
      qk_prep::DwSide sd{x, rstd, dy, dw, nullptr, static_cast<int>(heads), B * S * heads, 1, 0};
      if (heads == 0) return sd;
      const ColumnSumPlan plan = column_sum_plan(sd.rows, D);
      sd.rows_per_chunk = plan.rows_per_chunk;
      sd.nchunks = static_cast<int>(plan.nchunks);
      return sd;
    };
    qk_prep::DwSide qs = side(q, rstd_q, dq_out, dwq, H), ks = side(k, rstd_k, dk_out, dwk, Hkv);
    const int64_t part_q = qs.nchunks > 1 ? qs.nchunks * D : 0, part_k = ks.nchunks > 1 ? ks.nchunks * D : 0;
    Scratch partial(sizeof(C) * static_cast<size_t>(part_q + part_k + 1), on);
    qs.partial = partial.as<C>();
    ks.partial = partial.as<C>() + part_q;
    const ColumnSumPlan plan = column_sum_plan(1, D);  // threads and column blocks depend on D only
    const int max_chunks = qs.nchunks > ks.nchunks ? qs.nchunks : ks.nchunks;
    qk_prep::qk_norm_rope_dw_partial_kernel<T, W>
        <<<dim3(static_cast<unsigned>(plan.col_blocks), static_cast<unsigned>(max_chunks), 2), plan.threads, 0,
           on.s>>>(qs, ks, static_cast<int>(S), static_cast<int>(D), freqs, pos);
    XT_LAUNCH_CHECK();
    if (max_chunks > 1) {
      qk_prep::qk_norm_rope_dw_final_kernel<T, W>
          <<<dim3(static_cast<unsigned>(plan.col_blocks), 1, 2), plan.threads, 0, on.s>>>(qs, ks,
                                                                                           static_cast<int>(D));
      XT_LAUNCH_CHECK();
    }
  });
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
