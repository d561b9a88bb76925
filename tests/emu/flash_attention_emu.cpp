// The CUDA flash attention and head-preparation kernels (csrc/kernels/cuda/flash_attention.cuh,
// qk_norm_rope.cuh), run on the CPU under the warp/block emulator (cuda_emu.h) and compared with
// the CPU reference kernels (csrc/kernels/cpu/flash_attention.cpp, qk_norm_rope.cpp). What it
// checks before any GPU run: fragment and tile indexing, masking of partial and causal tiles, GQA
// head mapping, the cp.async pipeline (copies land only at their wait), barriers (three schedules
// of the threads give the same bits), and the backward's recompute scheme. What it cannot check:
// the hardware's rounding, speed.
//   tests/emu/run.sh [--quick | --schedules | --prep]   (builds with g++ against build-cpu/libxtrain_core.a)
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/bf16.h"
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/qk_norm_rope.cuh"
#include "kernels/kernels.h"

namespace {

using xt::DType;
namespace cu = xt::kernels::cuda;
namespace fl = xt::kernels::cuda::flash;
namespace qp = xt::kernels::cuda::qk_prep;
namespace cpu = xt::kernels::cpu;
using bf16_t = xt::kernels::bf16_t;  // __nv_bfloat16 under the emulation (kernels/common.h)

int g_failures = 0;

// Values held as float; stored as T for the kernels.
template <typename T>
struct Buf {
  std::vector<T> v;
  explicit Buf(size_t n) : v(n) {}
  Buf(const std::vector<float>& x) : v(x.size()) {
    for (size_t i = 0; i < x.size(); ++i) set(i, x[i]);
  }
  void set(size_t i, float f) {
    if constexpr (std::is_same_v<T, bf16_t>) {
      const uint16_t bits = xt::float_to_bf16(f).bits;
      std::memcpy(static_cast<void*>(&v[i]), &bits, 2);
    } else {
      v[i] = f;
    }
  }
  float get(size_t i) const {
    if constexpr (std::is_same_v<T, bf16_t>) {
      uint16_t bits;
      std::memcpy(&bits, &v[i], 2);
      return xt::bf16_to_float(xt::bf16{bits});
    } else {
      return static_cast<float>(v[i]);
    }
  }
  std::vector<float> floats() const {
    std::vector<float> r(v.size());
    for (size_t i = 0; i < v.size(); ++i) r[i] = get(i);
    return r;
  }
  T* p() { return v.data(); }
};

std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.f) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> r(n);
  for (float& x : r) x = d(gen);
  return r;
}

// max |got - want| / max(max |want|, 0.01), reported and checked against tol. (The floor: at S = 1
// the exact dq, dk are 0 and the kernels' are rounding noise of the inputs' O(1) scale.)
void expect_close(const std::string& what, const std::vector<float>& got, const std::vector<float>& want, double tol) {
  double err = 0, ref = 0.01;
  bool finite = true;
  for (size_t i = 0; i < want.size(); ++i) {
    finite = finite && std::isfinite(got[i]);
    err = std::max(err, std::fabs(static_cast<double>(got[i]) - want[i]));
    ref = std::max(ref, std::fabs(static_cast<double>(want[i])));
  }
  const bool ok = finite && err / ref <= tol;
  std::printf("  %-52s rel err %.2e (tol %.0e) %s\n", what.c_str(), err / ref, tol, ok ? "ok" : "FAIL");
  if (!ok) ++g_failures;
}

void expect(const std::string& what, bool ok) {
  std::printf("  %-52s %s\n", what.c_str(), ok ? "ok" : "FAIL");
  if (!ok) ++g_failures;
}

struct Case {
  int B, S, H, Hkv, D;
  bool causal;
  std::vector<int32_t> doc = {};  // [B, S] document starts (attention within documents), or empty
  const int32_t* docp() const { return doc.empty() ? nullptr : doc.data(); }
  std::string str() const {
    return "B" + std::to_string(B) + " S" + std::to_string(S) + " H" + std::to_string(H) + "/" + std::to_string(Hkv) +
           " D" + std::to_string(D) + (causal ? " causal" : " full") + (doc.empty() ? "" : " documents");
  }
  size_t q_size() const { return size_t(B) * S * H * D; }
  size_t kv_size() const { return size_t(B) * S * Hkv * D; }
  size_t stat_size() const { return size_t(B) * H * S; }
  double scale() const { return 1.0 / std::sqrt(double(D)); }
};

// ------------------------------------------------------------------ tensor-core path (bf16)

struct AttnResult {
  std::vector<float> out, lse, dq, dk, dv;
  bool operator==(const AttnResult& o) const {  // bitwise (no NaN expected)
    return out == o.out && lse == o.lse && dq == o.dq && dk == o.dk && dv == o.dv;
  }
};

// kQR: the dq kernel's form (Q/dO fragments in registers or read from shared memory at every step).
template <int D, bool kQR = fl::dq_frags_in_regs<D>()>
AttnResult run_tensor_core(const Case& c, Buf<bf16_t>& q, Buf<bf16_t>& k, Buf<bf16_t>& v, Buf<bf16_t>& dout) {
  Buf<bf16_t> out(c.q_size()), dq(c.q_size()), dk(c.kv_size()), dv(c.kv_size());
  std::vector<float> lse(c.stat_size()), delta(c.stat_size());
  const fl::Dims n = fl::make_dims(c.B, c.S, c.H, c.Hkv, c.scale(), c.causal, c.docp());
  emu::launch(fl::forward_grid(n), dim3(fl::kBlockThreads), fl::fwd_smem<D>(),
              [&] { fl::flash_forward_kernel<D>(q.p(), k.p(), v.p(), out.p(), lse.data(), n); });
  // delta from the dq kernel (Note [delta inside the dq kernel]); it must be delta_kernel's bits.
  emu::launch(fl::forward_grid(n), dim3(fl::kBlockThreads), fl::dq_smem<D>(), [&] {
    fl::flash_backward_dq_kernel<D, kQR>(q.p(), k.p(), v.p(), out.p(), dout.p(), lse.data(), delta.data(), dq.p(), n);
  });
  std::vector<float> delta_ref(c.stat_size());
  const int64_t rows = int64_t(c.B) * c.S * c.H;
  cu::with_lanes(D, [&](auto g) {
    constexpr int G = decltype(g)::value;
    emu::launch(dim3(unsigned(cu::ceil_div(rows, cu::rows_per_block<G>()))), dim3(cu::kThreads), 0,
                [&] { fl::delta_kernel<G, bf16_t>(out.p(), dout.p(), delta_ref.data(), rows, c.S, c.H, D); });
  });
  expect("tc: dq kernel's delta bitwise delta_kernel's",
         std::memcmp(delta.data(), delta_ref.data(), delta.size() * sizeof(float)) == 0);
  emu::launch(fl::dkdv_grid(n), dim3(fl::kBlockThreads), fl::dkdv_smem<D>(), [&] {
    fl::flash_backward_dkdv_kernel<D, fl::dkdv_rows<D>()>(q.p(), k.p(), v.p(), dout.p(), lse.data(), delta.data(),
                                                         dk.p(), dv.p(), n);
  });
  return {out.floats(), lse, dq.floats(), dk.floats(), dv.floats()};
}

// The CPU reference on the same values; T is the storage type of both.
template <typename T>
AttnResult reference(const Case& c, Buf<T>& q, Buf<T>& k, Buf<T>& v, Buf<T>& dout, DType dt) {
  Buf<T> out(c.q_size()), dq(c.q_size()), dk(c.kv_size()), dv(c.kv_size());
  std::vector<float> lse(c.stat_size());
  cpu::flash_attention_forward(dt, q.p(), k.p(), v.p(), out.p(), lse.data(), c.B, c.S, c.H, c.Hkv, c.D, c.scale(),
                               c.causal, c.docp(), nullptr);
  cpu::flash_attention_backward(dt, q.p(), k.p(), v.p(), out.p(), dout.p(), lse.data(), dq.p(), dk.p(), dv.p(), c.B,
                                c.S, c.H, c.Hkv, c.D, c.scale(), c.causal, c.docp(), nullptr);
  return {out.floats(), lse, dq.floats(), dk.floats(), dv.floats()};
}

void compare(const std::string& tag, const AttnResult& got, const AttnResult& want, double tol_out, double tol_grad) {
  expect_close(tag + " out", got.out, want.out, tol_out);
  expect_close(tag + " lse", got.lse, want.lse, 1e-5);
  expect_close(tag + " dq", got.dq, want.dq, tol_grad);
  expect_close(tag + " dk", got.dk, want.dk, tol_grad);
  expect_close(tag + " dv", got.dv, want.dv, tol_grad);
}

template <int D>
void tensor_core_case(Case c, bool race_check) {
  c.D = D;
  std::printf("tensor cores, %s\n", c.str().c_str());
  Buf<bf16_t> q(randn(c.q_size(), 1)), k(randn(c.kv_size(), 2)), v(randn(c.kv_size(), 3)), dout(randn(c.q_size(), 4));
  const AttnResult got = run_tensor_core<D>(c, q, k, v, dout);
  compare("tc", got, reference(c, q, k, v, dout, DType::BFloat16), 1e-2, 2e-2);
  if constexpr (fl::dq_frags_in_regs<D>())  // Note [A fragments kept in registers]: either form, the same bits
    expect("tc: dq with Q/dO fragments from shared memory bitwise the register form",
           run_tensor_core<D, false>(c, q, k, v, dout) == got);
  if (!race_check) return;
  const auto rerun = [&](emu::Schedule schedule) {
    emu::set_schedule(schedule);
    const AttnResult r = run_tensor_core<D>(c, q, k, v, dout);
    emu::set_schedule(emu::Schedule::Lockstep);
    return r;
  };
  expect("tc: same bits with threads in reverse order", got == rerun(emu::Schedule::LockstepReversed));
  expect("tc: same bits with warps one at a time, lazy copies", got == rerun(emu::Schedule::WarpSerialLazy));
  expect("tc: same bits with warps one at a time, eager copies", got == rerun(emu::Schedule::WarpSerialEager));
}

// ------------------------------------------------------------------ fallback path (one warp per row)

template <typename T>
void row_case(Case c, DType dt, double tol) {
  std::printf("row kernels (%s), %s\n", std::is_same_v<T, float> ? "float32" : "bf16", c.str().c_str());
  Buf<T> q(randn(c.q_size(), 5)), k(randn(c.kv_size(), 6)), v(randn(c.kv_size(), 7)), dout(randn(c.q_size(), 8));
  const fl::RowDims n{c.B, c.S, c.H, c.Hkv, c.D, c.scale(), c.causal, c.docp()};
  Buf<T> out(c.q_size()), dq(c.q_size()), dk(c.kv_size()), dv(c.kv_size());
  std::vector<float> lse(c.stat_size()), delta(c.stat_size());
  const dim3 block(fl::kRowWarps * 32);
  emu::launch(dim3(fl::row_grid(n, c.H)), block, 0,
              [&] { fl::row_forward_kernel<T>(q.p(), k.p(), v.p(), out.p(), lse.data(), n); });
  const int64_t rows = int64_t(c.B) * c.S * c.H;
  cu::with_lanes(c.D, [&](auto g) {
    constexpr int G = decltype(g)::value;
    emu::launch(dim3(unsigned(cu::ceil_div(rows, cu::rows_per_block<G>()))), dim3(cu::kThreads), 0,
                [&] { fl::delta_kernel<G, T>(out.p(), dout.p(), delta.data(), rows, c.S, c.H, c.D); });
  });
  emu::launch(dim3(fl::row_grid(n, c.H)), block, 0, [&] {
    fl::row_backward_dq_kernel<T>(q.p(), k.p(), v.p(), dout.p(), lse.data(), delta.data(), dq.p(), n);
  });
  emu::launch(dim3(fl::row_grid(n, c.Hkv)), block, 0, [&] {
    fl::row_backward_dkdv_kernel<T>(q.p(), k.p(), v.p(), dout.p(), lse.data(), delta.data(), dk.p(), dv.p(), n);
  });
  compare("row", {out.floats(), lse, dq.floats(), dk.floats(), dv.floats()}, reference(c, q, k, v, dout, dt), tol, tol);
}

// ------------------------------------------------------------------ head preparation

template <typename T>
const char* type_name() {
  return std::is_same_v<T, float> ? "float32" : std::is_same_v<T, double> ? "float64" : "bf16";
}

// The one-pass backward's dw tree (batched loads) bitwise rmsnorm_dw_tree_kernel's, for partial row
// counts of one batch of a slice and several (up to onepass_plan's 1024), the two sides at once.
void prep_dw_tree_cases() {
  namespace rn = xt::kernels::cuda::rmsnorm;
  for (const int D : {32, 72, 128})
    for (const int nparts : {2, 9, 300, 1024}) {
      const std::vector<float> pq = randn(size_t(nparts) * D, 31 + nparts), pk = randn(size_t(nparts) * D, 32 + D);
      std::vector<float> want_q(D), want_k(D), got_q(D, -1.f), got_k(D, -1.f);
      const dim3 grid(unsigned(cu::ceil_div(D, rn::kFinalCols)));
      emu::launch(grid, dim3(rn::kTreeThreads), rn::tree_smem<float>(),
                  [&] { rn::rmsnorm_dw_tree_kernel<float, float>(pq.data(), nparts, want_q.data(), D); });
      emu::launch(grid, dim3(rn::kTreeThreads), rn::tree_smem<float>(),
                  [&] { rn::rmsnorm_dw_tree_kernel<float, float>(pk.data(), nparts, want_k.data(), D); });
      qp::OnePassSide<float, float> qs{}, ks{};
      qs.partial = const_cast<float*>(pq.data());
      ks.partial = const_cast<float*>(pk.data());
      qs.dw = got_q.data();
      ks.dw = got_k.data();
      qs.nblocks = ks.nblocks = nparts;
      emu::launch(dim3(grid.x, 2), dim3(rn::kTreeThreads), rn::tree_smem<float>(),
                  [&] { qp::qk_norm_rope_dw_tree_kernel<float, float>(qs, ks, D); });
      expect("dw tree bitwise rmsnorm_dw_tree_kernel's, D " + std::to_string(D) + ", " + std::to_string(nparts) +
                 " partial rows",
             got_q == want_q && got_k == want_k);
    }
}

// Rows in flight of the register one-pass backward that fused_onepass launches (0: the launch
// shape of Note [Head preparation occupancy]).
int g_prep_bwd_rows = 0;

// The register path's head dim whose group has G lanes (G = lanes_for(D), D in 32, 64, 128).
template <int G>
constexpr int reg_dim_of() {
  return G == cu::lanes_for(32) ? 32 : G == cu::lanes_for(64) ? 64 : 128;
}

// The RoPE of a head-preparation case: theta at positions 0..S-1, or (doc_llama3) Llama 3's
// frequencies (a short original context, so that D/2 <= 64 frequencies fall in all three bands)
// at each row's own positions: documents of lengths 5, 1, 9, 3, ... (row b starting at length b),
// each token's distance from its document's start. `positions` holds them.
struct PrepRope {
  xt::kernels::RopeFreqs freqs;
  xt::kernels::RopePositions pos;
};
PrepRope prep_rope(double theta, int B, int S, bool doc_llama3, std::vector<int64_t>& positions) {
  if (!doc_llama3) return {xt::kernels::rope_freqs(theta), {}};
  const int lengths[] = {5, 1, 9, 3};
  positions.assign(size_t(B) * S, 0);
  for (int b = 0; b < B; ++b)
    for (int s = 0, start = 0, i = b, next = lengths[b % 4]; s < S; ++s) {
      if (s == next) {
        start = s;
        next += lengths[++i % 4];
      }
      positions[size_t(b) * S + s] = s - start;
    }
  return {xt::kernels::rope_freqs_llama3(theta, 8.0, 1.0, 4.0, 64.0), {positions.data(), S}};
}

// The register-path forward (Note [Head preparation in registers]) as qk_norm_rope.cu launches
// it, bit for bit against the general kernel's outputs (yq, yk, rstd), under the schedules.
template <typename T>
void prep_forward_reg(Buf<T>& q, Buf<T>& k, const std::vector<float>& wq, const std::vector<float>& wk,
                      const Buf<T>& yq, const Buf<T>& yk, const std::vector<float>& rsq, const std::vector<float>& rsk,
                      int B, int S, int H, int Hkv, int D, float eps, const PrepRope& rope) {
  using C = xt::kernels::compute_t<T>;
  // rows: rows in flight (0: the launch shape of Note [Head preparation occupancy]); tpb_override:
  // tokens per block (0: prep_tokens_per_block's). Neither may change a bit.
  const auto run = [&](auto d, emu::Schedule schedule, auto rows, int64_t tpb_override) {
    constexpr int kD = decltype(d)::value, kR = decltype(rows)::value;
    const int64_t tpb = tpb_override > 0 ? tpb_override : qp::prep_tokens_per_block<kD, T>(H, Hkv);
    Buf<T> oq(yq.v.size()), ok(yk.v.size());
    std::vector<float> sq(rsq.size(), -1.f), sk(rsk.size(), -1.f);
    emu::set_schedule(schedule);
    emu::launch(dim3(unsigned(cu::ceil_div(int64_t(B) * S, tpb))), dim3(cu::kThreads), sizeof(C) * size_t(tpb * D), [&] {
      const auto args = std::make_tuple(q.p(), k.p(), wq.data(), wk.data(), oq.p(), ok.p(), sq.data(), sk.data(),
                                        int64_t(B) * S, S, qp::HeadRows{H, Hkv}, int(tpb), D, eps, rope.freqs,
                                        rope.pos);
      if constexpr (kR == 0)
        std::apply(qp::qk_norm_rope_forward_reg_kernel<kD, T, float>, args);
      else
        std::apply(qp::qk_norm_rope_forward_reg_kernel<kD, T, float, kR>, args);
    });
    emu::set_schedule(emu::Schedule::Lockstep);
    const std::string tag = "  register forward (" + (kR == 0 ? std::string("launch shape") : std::to_string(kR) +
                            " rows in flight") + ", " + std::to_string(tpb) + " tokens per block) ";
    expect(tag + "q bitwise the general kernel's", oq.v.size() == yq.v.size() &&
                                                       std::memcmp(oq.v.data(), yq.v.data(), sizeof(T) * yq.v.size()) == 0);
    expect(tag + "k bitwise the general kernel's", ok.v.size() == yk.v.size() &&
                                                       std::memcmp(ok.v.data(), yk.v.data(), sizeof(T) * yk.v.size()) == 0);
    expect(tag + "rstd bitwise the general kernel's", sq == rsq && sk == rsk);
  };
  using std::integral_constant;
  const auto each = [&](emu::Schedule schedule) {
    const integral_constant<int, 0> shape{};
    switch (D) {
      case 32:
        run(integral_constant<int, 32>{}, schedule, shape, 0);
        run(integral_constant<int, 32>{}, schedule, integral_constant<int, 3>{}, 1);
        run(integral_constant<int, 32>{}, schedule, integral_constant<int, 16>{}, 3);
        break;
      case 64: run(integral_constant<int, 64>{}, schedule, shape, 0); break;
      default: run(integral_constant<int, 128>{}, schedule, shape, 0); break;
    }
  };
  each(emu::Schedule::Lockstep);
  each(emu::Schedule::LockstepReversed);
}

template <typename T>
void prep_case(int B, int S, int H, int Hkv, int D, DType dt, double tol, bool doc_llama3 = false) {
  using C = xt::kernels::compute_t<T>;
  std::printf("qk_norm_rope (%s), B%d S%d H%d/%d D%d%s\n", type_name<T>(), B, S, H, Hkv, D,
              doc_llama3 ? ", llama3 frequencies at document positions" : "");
  const size_t nq = size_t(B) * S * H * D, nk = size_t(B) * S * Hkv * D;
  Buf<T> q(randn(nq, 9)), k(randn(nk, 10)), dq_out(randn(nq, 11)), dk_out(randn(nk, 12));
  std::vector<float> wq = randn(D, 13, 0.3f), wk = randn(D, 14, 0.3f);
  for (float& w : wq) w += 1.f;
  for (float& w : wk) w += 1.f;
  const float eps = 1e-5f;
  std::vector<int64_t> positions;
  const PrepRope rope = prep_rope(10000.0, B, S, doc_llama3, positions);
  // CPU reference
  Buf<T> rq(nq), rk(nk), rdq(nq), rdk(nk);
  std::vector<float> rrq(nq / D), rrk(nk / D), rdwq(D), rdwk(D);
  cpu::qk_norm_rope_forward(dt, DType::Float32, q.p(), k.p(), wq.data(), wk.data(), rq.p(), rk.p(), rrq.data(),
                            rrk.data(), B, S, H, Hkv, D, eps, rope.freqs, rope.pos, nullptr);
  cpu::qk_norm_rope_backward(dt, DType::Float32, q.p(), k.p(), wq.data(), wk.data(), rrq.data(), rrk.data(),
                             dq_out.p(), dk_out.p(), rdq.p(), rdk.p(), rdwq.data(), rdwk.data(), B, S, H, Hkv, D,
                             rope.freqs, rope.pos, nullptr);
  // emulated CUDA kernels, launched as qk_norm_rope.cu does (the forward; the backward of head
  // dims without a one-pass plan: dx kernel + column sums; prep_onepass_case covers the one-pass one)
  Buf<T> yq(nq), yk(nk), dq(nq), dk(nk);
  std::vector<float> rsq(nq / D), rsk(nk / D), dwq(D), dwk(D);
  const qp::HeadRows hr{H, Hkv};
  cu::with_lanes(D, [&](auto g) {
    constexpr int G = decltype(g)::value;
    emu::launch(dim3(B * S), dim3(128), sizeof(C) * D, [&] {
      qp::qk_norm_rope_forward_kernel<G, T, float>(q.p(), k.p(), wq.data(), wk.data(), yq.p(), yk.p(), rsq.data(),
                                                   rsk.data(), S, hr, D, eps, rope.freqs, rope.pos);
    });
    emu::launch(dim3(B * S), dim3(128), sizeof(C) * D, [&] {
      qp::qk_norm_rope_dx_kernel<G, T, float>(q.p(), k.p(), wq.data(), wk.data(), rsq.data(), rsk.data(),
                                              dq_out.p(), dk_out.p(), dq.p(), dk.p(), S, hr, D, rope.freqs, rope.pos);
    });
  });
  const auto side = [&](const void* x, const float* rstd, const void* dy, float* dw, int heads, C* partial) {
    const cu::ColumnSumPlan plan = cu::column_sum_plan(int64_t(B) * S * heads, D);
    return qp::DwSide{x, rstd, dy, dw, partial, heads, int64_t(B) * S * heads, plan.rows_per_chunk, int(plan.nchunks)};
  };
  std::vector<C> part(size_t(2) * 1024 * D);
  const qp::DwSide qs = side(q.p(), rsq.data(), dq_out.p(), dwq.data(), H, part.data());
  const qp::DwSide ks = side(k.p(), rsk.data(), dk_out.p(), dwk.data(), Hkv, part.data() + size_t(1024) * D);
  const cu::ColumnSumPlan plan = cu::column_sum_plan(1, D);
  const int max_chunks = std::max(qs.nchunks, ks.nchunks);
  emu::launch(dim3(unsigned(plan.col_blocks), unsigned(max_chunks), 2), dim3(plan.threads), 0,
              [&] { qp::qk_norm_rope_dw_partial_kernel<T, float>(qs, ks, S, D, rope.freqs, rope.pos); });
  if (max_chunks > 1)
    emu::launch(dim3(unsigned(plan.col_blocks), 1, 2), dim3(plan.threads), 0,
                [&] { qp::qk_norm_rope_dw_final_kernel<T, float>(qs, ks, D); });
  std::printf("  (dw row chunks: q %d, k %d)\n", qs.nchunks, ks.nchunks);
  if (qp::prep_reg_dim(D)) prep_forward_reg(q, k, wq, wk, yq, yk, rsq, rsk, B, S, H, Hkv, D, eps, rope);
  expect_close("prep q", yq.floats(), rq.floats(), tol);
  expect_close("prep k", yk.floats(), rk.floats(), tol);
  expect_close("prep rstd_q", rsq, rrq, 1e-6);
  expect_close("prep rstd_k", rsk, rrk, 1e-6);
  expect_close("prep dq", dq.floats(), rdq.floats(), tol);
  expect_close("prep dk", dk.floats(), rdk.floats(), tol);
  expect_close("prep dwq", dwq, rdwq, 1e-5);
  expect_close("prep dwk", dwk, rdwk, 1e-5);
}


// The composition's CUDA backward of one side, as the ops run it: rope.cu's inverse rotation
// (rope_rows_kernel's math: the cos/sin table of position s, negated sin, rope_rotate, stored as T),
// then rmsnorm.cu's one-pass backward (rmsnorm_backward_onepass_kernel + rmsnorm_dw_tree_kernel
// under onepass_plan) over rows = B*S*heads of width D.
template <int G, typename T>
void composed_side(const Buf<T>& x, const std::vector<float>& w, const std::vector<float>& rstd, const Buf<T>& dy,
                   int B, int S, int heads, int D, const PrepRope& rope, Buf<T>& dx, std::vector<float>& dw) {
  using C = xt::kernels::compute_t<T>;
  namespace rn = xt::kernels::cuda::rmsnorm;
  const int half = D / 2;
  Buf<T> g(dy.v.size());
  for (int64_t t = 0; t < int64_t(B) * S; ++t) {
    for (int i = 0; i < half; ++i) {
      C cs, sn;
      xt::kernels::rope_cos_sin(rope.pos.at(t, S) * xt::kernels::rope_inv_freq(rope.freqs, i, D), &cs, &sn);
      sn = -sn;
      for (int h = 0; h < heads; ++h) {
        const int64_t base = (t * heads + h) * D;
        C y1, y2;
        xt::kernels::rope_rotate(xt::kernels::load(dy.v.data(), base + i), xt::kernels::load(dy.v.data(), base + i + half),
                                 cs, sn, &y1, &y2);
        xt::kernels::store(g.p(), base + i, y1);
        xt::kernels::store(g.p(), base + i + half, y2);
      }
    }
  }
  const int64_t rows = int64_t(B) * S * heads;
  const rn::OnePassPlan plan = rn::onepass_plan<G, C>(rows, D);
  std::vector<C> partial(size_t(plan.nblocks) * D);
  emu::launch(dim3(unsigned(plan.nblocks)), dim3(cu::kThreads), plan.smem, [&] {
    rn::rmsnorm_backward_onepass_kernel<G, T, float>(x.v.data(), w.data(), rstd.data(), g.p(), nullptr, dx.p(),
                                                     dw.data(), plan.nblocks == 1 ? nullptr : partial.data(), rows, D,
                                                     plan.rows_per_block);
  });
  if (plan.nblocks > 1)
    emu::launch(dim3(unsigned(cu::ceil_div(D, rn::kFinalCols))), dim3(rn::kTreeThreads), rn::tree_smem<C>(),
                [&] { rn::rmsnorm_dw_tree_kernel<C, float>(partial.data(), plan.nblocks, dw.data(), D); });
}

struct PrepGrads {
  std::vector<float> dq, dk, dwq, dwk;
  bool operator==(const PrepGrads& o) const {  // bitwise (no NaN expected)
    return dq == o.dq && dk == o.dk && dwq == o.dwq && dwk == o.dwk;
  }
};

// qk_norm_rope's one-pass backward as qk_norm_rope.cu launches it; min_table: each side's token
// table only as large as one round of rows needs (refilled within the blocks).
template <int G, typename T>
PrepGrads fused_onepass(Buf<T>& q, Buf<T>& k, const std::vector<float>& wq, const std::vector<float>& wk,
                        const std::vector<float>& rsq, const std::vector<float>& rsk, Buf<T>& dq_out, Buf<T>& dk_out,
                        int B, int S, int H, int Hkv, int D, const PrepRope& rope, bool min_table, bool reg,
                        std::string* info, int64_t force_rows_per_block = 0) {
  using C = xt::kernels::compute_t<T>;
  namespace rn = xt::kernels::cuda::rmsnorm;
  Buf<T> dq(q.v.size()), dk(k.v.size());
  std::vector<float> dwq(D, -1.f), dwk(D, -1.f);
  const qp::PrepDwPlan pq = qp::prep_dw_plan<G, C>(int64_t(B) * S * H, H, D);
  const qp::PrepDwPlan pk = qp::prep_dw_plan<G, C>(int64_t(B) * S * Hkv, Hkv, D);
  if (pq.smem == 0 || pk.smem == 0) {
    expect("one-pass plan exists", false);
    return {};
  }
  const auto side = [&](Buf<T>& x, const std::vector<float>& w, const std::vector<float>& rstd, Buf<T>& dy,
                        Buf<T>& dx, std::vector<float>& dw, int heads, const qp::PrepDwPlan& p) {
    int64_t tab = p.tab_tokens;
    if (min_table) tab = cu::ceil_div(int64_t(cu::kThreads / G) - 1, int64_t(heads)) + 1;
    const int64_t rows = int64_t(B) * S * heads;
    int64_t rpb = p.rows.rows_per_block, nblocks = p.rows.nblocks;
    if (force_rows_per_block > 0) {  // a plan onepass_plan gives only for many more rows
      rpb = force_rows_per_block;
      nblocks = cu::ceil_div(rows, rpb);
      if (!min_table) tab = cu::ceil_div(rpb - 1, int64_t(heads)) + 1;
    }
    return qp::OnePassSide<T, float>{x.p(), w.data(), rstd.data(), dy.p(), dx.p(), dw.data(), nullptr, rows, rpb,
                                     nblocks, heads, tab};
  };
  qp::OnePassSide<T, float> qs = side(q, wq, rsq, dq_out, dq, dwq, H, pq), ks = side(k, wk, rsk, dk_out, dk, dwk, Hkv, pk);
  std::vector<C> partial(size_t(qs.nblocks + ks.nblocks) * D);
  size_t smem = std::max(pq.smem, pk.smem);
  if (force_rows_per_block > 0)
    smem = sizeof(C) * size_t(cu::kThreads / G) * D + sizeof(C) * size_t(std::max(qs.tab_tokens, ks.tab_tokens)) * D;
  if (qs.nblocks > 1) qs.partial = partial.data();
  if (ks.nblocks > 1) ks.partial = partial.data() + size_t(qs.nblocks) * D;
  const dim3 grid(unsigned(qs.nblocks + ks.nblocks));
  if (!reg) {
    emu::launch(grid, dim3(cu::kThreads), smem,
                [&] { qp::qk_norm_rope_backward_onepass_kernel<G, T, float>(qs, ks, S, D, rope.freqs, rope.pos); });
  } else {  // the register path of qk_norm_rope.cu's D in {32, 64, 128}
    if constexpr (G == cu::lanes_for(32) || G == cu::lanes_for(64) || G == cu::lanes_for(128)) {
      constexpr int kD = reg_dim_of<G>();
      if (D != kD) expect("register path's head dim", false);
      emu::launch(grid, dim3(cu::kThreads), smem, [&] {
        const auto& f = rope.freqs;
        const auto& p = rope.pos;
        switch (g_prep_bwd_rows) {  // rows in flight other than the launch shape's: the same bits
          case 1: qp::qk_norm_rope_backward_onepass_reg_kernel<kD, T, float, 1>(qs, ks, S, D, f, p); break;
          case 4: qp::qk_norm_rope_backward_onepass_reg_kernel<kD, T, float, 4>(qs, ks, S, D, f, p); break;
          default: qp::qk_norm_rope_backward_onepass_reg_kernel<kD, T, float>(qs, ks, S, D, f, p); break;
        }
      });
    } else {
      expect("register path's head dim", false);
    }
  }
  if (qs.nblocks > 1 || ks.nblocks > 1)
    emu::launch(dim3(unsigned(cu::ceil_div(D, rn::kFinalCols)), 2), dim3(rn::kTreeThreads), rn::tree_smem<C>(),
                [&] { qp::qk_norm_rope_dw_tree_kernel<T, float>(qs, ks, D); });
  if (info)
    *info = "G " + std::to_string(G) + "; q: " + std::to_string(qs.nblocks) + " blocks of " +
            std::to_string(qs.rows_per_block) + " rows (" + std::to_string(qs.rows) + "), table " +
            std::to_string(qs.tab_tokens) + " tokens; k: " + std::to_string(ks.nblocks) + " blocks of " +
            std::to_string(ks.rows_per_block) + " rows (" + std::to_string(ks.rows) + "), table " +
            std::to_string(ks.tab_tokens) + " tokens";
  return {dq.floats(), dk.floats(), dwq, dwk};
}

// The fused one-pass backward against the emulated composition, bit for bit (dq, dk, dwq, dwk), under
// the schedules and with the smallest token tables; and against the CPU reference to tolerance.
template <typename T>
void prep_onepass_case(int B, int S, int H, int Hkv, int D, DType dt, double tol, bool doc_llama3 = false) {
  std::printf("qk_norm_rope one-pass backward (%s), B%d S%d H%d/%d D%d%s\n", type_name<T>(), B, S, H, Hkv, D,
              doc_llama3 ? ", llama3 frequencies at document positions" : "");
  const size_t nq = size_t(B) * S * H * D, nk = size_t(B) * S * Hkv * D;
  Buf<T> q(randn(nq, 21)), k(randn(nk, 22)), dq_out(randn(nq, 23)), dk_out(randn(nk, 24));
  std::vector<float> wq = randn(D, 25, 0.3f), wk = randn(D, 26, 0.3f);
  for (float& w : wq) w += 1.f;
  for (float& w : wk) w += 1.f;
  const float eps = 1e-5f;
  std::vector<int64_t> positions;
  const PrepRope rope = prep_rope(500.0, B, S, doc_llama3, positions);
  Buf<T> yq(nq), yk(nk), rdq(nq), rdk(nk);
  std::vector<float> rsq(nq / D), rsk(nk / D), rdwq(D), rdwk(D);
  cpu::qk_norm_rope_forward(dt, DType::Float32, q.p(), k.p(), wq.data(), wk.data(), yq.p(), yk.p(), rsq.data(),
                            rsk.data(), B, S, H, Hkv, D, eps, rope.freqs, rope.pos, nullptr);
  cpu::qk_norm_rope_backward(dt, DType::Float32, q.p(), k.p(), wq.data(), wk.data(), rsq.data(), rsk.data(),
                             dq_out.p(), dk_out.p(), rdq.p(), rdk.p(), rdwq.data(), rdwk.data(), B, S, H, Hkv, D,
                             rope.freqs, rope.pos, nullptr);
  cu::with_lanes(D, [&](auto g) {
    constexpr int G = decltype(g)::value;
    PrepGrads want;
    {
      Buf<T> cdq(nq), cdk(nk);
      std::vector<float> cdwq(D), cdwk(D);
      composed_side<G, T>(q, wq, rsq, dq_out, B, S, H, D, rope, cdq, cdwq);
      composed_side<G, T>(k, wk, rsk, dk_out, B, S, Hkv, D, rope, cdk, cdwk);
      want = {cdq.floats(), cdk.floats(), cdwq, cdwk};
    }
    std::string info;
    const bool reg = qp::prep_reg_dim(D);  // what qk_norm_rope.cu launches
    const PrepGrads got = fused_onepass<G, T>(q, k, wq, wk, rsq, rsk, dq_out, dk_out, B, S, H, Hkv, D, rope, false,
                                             reg, &info);
    std::printf("  (%s; %s kernel)\n", info.c_str(), reg ? "register" : "general");
    if (reg)
      expect("register kernel bitwise the general one",
             got == fused_onepass<G, T>(q, k, wq, wk, rsq, rsk, dq_out, dk_out, B, S, H, Hkv, D, rope, false, false,
                                        nullptr));
    if (reg)
      for (const int rb : {1, 4}) {
        g_prep_bwd_rows = rb;
        const PrepGrads r = fused_onepass<G, T>(q, k, wq, wk, rsq, rsk, dq_out, dk_out, B, S, H, Hkv, D, rope, false,
                                                true, nullptr);
        g_prep_bwd_rows = 0;
        expect("register kernel with " + std::to_string(rb) + " rows in flight bitwise the launch shape's", r == got);
      }
    expect("dq bitwise the composition", got.dq == want.dq);
    expect("dk bitwise the composition", got.dk == want.dk);
    expect("dwq bitwise the composition", got.dwq == want.dwq);
    expect("dwk bitwise the composition", got.dwk == want.dwk);
    expect_close("dq vs CPU", got.dq, rdq.floats(), tol);
    expect_close("dk vs CPU", got.dk, rdk.floats(), tol);
    expect_close("dwq vs CPU", got.dwq, rdwq, 1e-5);
    expect_close("dwk vs CPU", got.dwk, rdwk, 1e-5);
    const auto rerun = [&](emu::Schedule schedule, bool min_table) {
      emu::set_schedule(schedule);
      const PrepGrads r = fused_onepass<G, T>(q, k, wq, wk, rsq, rsk, dq_out, dk_out, B, S, H, Hkv, D, rope,
                                              min_table, reg, nullptr);
      emu::set_schedule(emu::Schedule::Lockstep);
      return r;
    };
    expect("same bits with the smallest token tables", got == rerun(emu::Schedule::Lockstep, true));
    expect("same bits, threads in reverse order", got == rerun(emu::Schedule::LockstepReversed, false));
    expect("same bits, warps one at a time", got == rerun(emu::Schedule::WarpSerialLazy, false));
    expect("same bits, reverse order, smallest tables", got == rerun(emu::Schedule::LockstepReversed, true));
    if (reg) {
      // Blocks of more rows than a batch of the register kernel holds (onepass_plan's blocks of
      // 8 * G rows and more at > 1024 * 64 / G rows): its batch loop, partial batches and table
      // refills, bit for bit against the general kernel under the same plan.
      for (const int64_t rpb : {int64_t(cu::kThreads / G) * qp::prep_shape<reg_dim_of<G>(), T>().bwd_rows + 5,
                                int64_t(200)})
        for (const bool min_table : {false, true}) {
          const auto plan_run = [&](bool use_reg, emu::Schedule schedule) {
            emu::set_schedule(schedule);
            const PrepGrads r = fused_onepass<G, T>(q, k, wq, wk, rsq, rsk, dq_out, dk_out, B, S, H, Hkv, D, rope,
                                                    min_table, use_reg, nullptr, rpb);
            emu::set_schedule(emu::Schedule::Lockstep);
            return r;
          };
          expect("blocks of " + std::to_string(rpb) + " rows" + (min_table ? ", smallest tables" : "") +
                     ": register kernel bitwise the general one",
                 plan_run(true, emu::Schedule::LockstepReversed) == plan_run(false, emu::Schedule::Lockstep));
        }
    }
  });
}

}  // namespace

// one-pass backward: one block; several with a partial last block (and a partial last round); H != Hkv
void prep_onepass_cases() {
  prep_onepass_case<float>(1, 3, 2, 1, 32, DType::Float32, 1e-5);
  prep_onepass_case<float>(2, 37, 6, 2, 32, DType::Float32, 1e-5);
  prep_onepass_case<bf16_t>(2, 37, 6, 2, 32, DType::BFloat16, 1e-2);
  prep_onepass_case<float>(1, 45, 5, 3, 64, DType::Float32, 1e-5);
  prep_onepass_case<bf16_t>(1, 45, 5, 3, 64, DType::BFloat16, 1e-2);
  prep_onepass_case<float>(1, 29, 4, 1, 128, DType::Float32, 1e-5);
  prep_onepass_case<bf16_t>(2, 21, 3, 2, 128, DType::BFloat16, 1e-2);
  // the general kernel's head dims (no register path), and the dim768 model's heads (3 blocks)
  prep_onepass_case<float>(1, 13, 3, 1, 48, DType::Float32, 1e-5);
  prep_onepass_case<bf16_t>(1, 11, 2, 2, 40, DType::BFloat16, 1e-2);
  prep_onepass_case<bf16_t>(1, 17, 24, 24, 32, DType::BFloat16, 1e-2);
  prep_onepass_case<double>(1, 9, 4, 2, 64, DType::Float64, 1e-12);
  // RoPE with Llama 3's frequencies at per-row document positions: register and general kernels
  prep_onepass_case<float>(2, 37, 6, 2, 32, DType::Float32, 1e-5, true);
  prep_onepass_case<bf16_t>(2, 21, 3, 2, 128, DType::BFloat16, 1e-2, true);
  prep_onepass_case<float>(1, 13, 3, 1, 48, DType::Float32, 1e-5, true);
}

// head preparation: the forward (both paths), and the backward of head dims without a one-pass plan
void prep_forward_cases() {
  prep_case<float>(1, 3, 2, 1, 16, DType::Float32, 1e-5);
  prep_case<float>(2, 5, 4, 2, 32, DType::Float32, 1e-5);
  prep_case<bf16_t>(2, 9, 3, 1, 64, DType::BFloat16, 1e-2);
  prep_case<float>(3, 40, 8, 8, 128, DType::Float32, 1e-5);
  // the register forward: odd token counts, H != Hkv, a partial last block, rows not a multiple
  // of the groups, the dim768 model's heads (tokens_per_block 2), one head each (many tokens)
  prep_case<bf16_t>(1, 7, 5, 1, 32, DType::BFloat16, 1e-2);
  prep_case<bf16_t>(3, 11, 24, 24, 32, DType::BFloat16, 1e-2);
  prep_case<bf16_t>(1, 150, 1, 1, 32, DType::BFloat16, 1e-2);
  prep_case<float>(1, 9, 6, 3, 64, DType::Float32, 1e-5);
  prep_case<bf16_t>(2, 5, 7, 1, 64, DType::BFloat16, 1e-2);
  prep_case<bf16_t>(1, 13, 3, 3, 128, DType::BFloat16, 1e-2);
  prep_case<bf16_t>(1, 5, 2, 2, 48, DType::BFloat16, 1e-2);
  prep_case<double>(1, 6, 3, 1, 32, DType::Float64, 1e-12);
  // RoPE with Llama 3's frequencies at per-row document positions
  prep_case<float>(2, 5, 4, 2, 32, DType::Float32, 1e-5, true);
  prep_case<bf16_t>(3, 11, 24, 24, 32, DType::BFloat16, 1e-2, true);
  prep_case<bf16_t>(2, 9, 3, 1, 64, DType::BFloat16, 1e-2, true);
  prep_case<float>(1, 9, 2, 2, 48, DType::Float32, 1e-5, true);
}

// Document starts [B, S] for documents of the given lengths, cycled (row b starts at length b).
std::vector<int32_t> doc_starts(int B, int S, const std::vector<int>& lengths) {
  std::vector<int32_t> d(size_t(B) * S);
  for (int b = 0; b < B; ++b) {
    int start = 0, next = lengths[size_t(b) % lengths.size()], i = b + 1;
    for (int s = 0; s < S; ++s) {
      if (s == next) {
        start = s;
        next += lengths[size_t(i++) % lengths.size()];
      }
      d[size_t(b) * S + s] = start;
    }
  }
  return d;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  // Attention within documents: boundaries inside and on the 64-row tiles, a document longer than
  // a tile, one-token documents, GQA; 3+ key tiles so skipped tiles shift the double buffers.
  const std::vector<Case> doc_cases = {{2, 150, 2, 1, 0, true, doc_starts(2, 150, {64, 1, 70, 9})},
                                       {1, 200, 2, 2, 0, true, doc_starts(1, 200, {130, 3, 5})}};
  // B, S, H, Hkv, (D), causal: single row, partial tiles, exact tiles, GQA 2 and 3, full attention.
  const std::vector<Case> cases = {{1, 1, 1, 1, 0, true},    {1, 7, 2, 1, 0, true},  {1, 64, 1, 1, 0, true},
                                   {2, 100, 2, 2, 0, false}, {1, 150, 3, 1, 0, true}};
  if (mode == "--schedules") {  // the schedule checks only, head_dim 32 (quick)
    tensor_core_case<32>(cases.back(), true);
  } else if (mode == "--documents") {  // attention within documents only
    for (const Case& c : doc_cases) {
      tensor_core_case<32>(c, false);
      tensor_core_case<64>(c, false);
      tensor_core_case<128>(c, false);
      Case r = c;
      r.D = 40;
      row_case<float>(r, DType::Float32, 1e-5);
    }
    tensor_core_case<64>(doc_cases[0], true);
  } else if (mode == "--prep") {  // the head preparation only
    prep_forward_cases();
    prep_onepass_cases();
    prep_dw_tree_cases();
  } else {
    for (size_t i = 0; i < cases.size(); ++i) {
      if (mode == "--quick" && i > 2) break;
      const bool last = i + 1 == cases.size();  // 3 key tiles: the double buffers are reused
      tensor_core_case<32>(cases[i], last);
      tensor_core_case<64>(cases[i], last);
      tensor_core_case<128>(cases[i], last);
    }
    row_case<float>({1, 9, 2, 1, 32, true}, DType::Float32, 1e-5);
    row_case<float>({2, 70, 4, 2, 40, false}, DType::Float32, 1e-5);
    row_case<bf16_t>({1, 33, 3, 3, 48, true}, DType::BFloat16, 1e-2);
    for (const Case& c : doc_cases) {
      tensor_core_case<64>(c, false);
      Case r = c;
      r.D = 40;
      row_case<float>(r, DType::Float32, 1e-5);
    }
    prep_forward_cases();
    prep_onepass_cases();
    prep_dw_tree_cases();
  }
  std::printf("%s: %d failure(s), %llu fiber switches\n", g_failures ? "FAILED" : "passed", g_failures,
              static_cast<unsigned long long>(emu::st().switches));
  return g_failures ? 1 : 0;
}
