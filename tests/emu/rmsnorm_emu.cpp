// The CUDA kernels of RMSNorm's one-pass backward and of the fused residual add + RMSNorm forward
// (csrc/kernels/cuda/rmsnorm.cuh), run on the CPU under the warp/block emulator (cuda_emu.h),
// launched as rmsnorm.cu launches them, and compared with the CPU reference kernels
// (csrc/kernels/cpu/rmsnorm.cpp); and the few-row forward (a block per row, Note [Few rows: a block
// per row]) against the group-per-row forward kernels, bit for bit. What it checks before any GPU
// run: the row ranges of the blocks and groups (rows that do not fill the last block or the last
// round of groups, where the warp's shuffles must still see every lane), the shared-memory rows and
// the ordered final pass, dres, and that the schedules of the threads give the same bits. Not
// checked: the hardware's rounding, nor nvcc's contraction of a * b + c into fma (the few-row
// kernel writes each sum and product with the same expression as the kernel it matches).
//   tests/emu/run.sh rmsnorm      (builds with g++ against build-cpu/libxtrain_core.a)
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "emu_check.h"
#include "kernels/cuda/rmsnorm.cuh"
#include "kernels/cuda/static_switch.h"
#include "kernels/kernels.h"

namespace {

using xt::DType;
namespace cu = xt::kernels::cuda;
namespace rn = xt::kernels::cuda::rmsnorm;
namespace cpu = xt::kernels::cpu;
using bf16_t = xt::kernels::bf16_t;

using emucheck::as;
using emucheck::expect_bits;
using emucheck::expect_close;
using emucheck::floats;
int& g_failures = emucheck::failures;
int g_few_rows_runs = 0;

// The CUDA backward as rmsnorm.cu's backward_typed launches it (one-pass plan only).
template <int G, typename T>
void cuda_backward(const std::vector<T>& x, const std::vector<float>& w, const std::vector<float>& rstd,
                   const std::vector<T>& dy, const std::vector<T>* dres, std::vector<T>& dx, std::vector<float>& dw,
                   int64_t rows, int64_t dim) {
  using C = xt::kernels::compute_t<T>;
  const rn::OnePassPlan plan = rn::onepass_plan<G, C>(rows, dim);
  if (plan.smem == 0) {
    std::printf("  (no one-pass plan for dim %lld)\n", static_cast<long long>(dim));
    ++g_failures;
    return;
  }
  std::vector<C> partial(static_cast<size_t>(plan.nblocks * dim));
  const T* pres = dres ? dres->data() : nullptr;
  emu::launch(dim3(unsigned(plan.nblocks)), dim3(cu::kThreads), plan.smem, [&] {
    rn::rmsnorm_backward_onepass_kernel<G, T, float>(x.data(), w.data(), rstd.data(), dy.data(), pres, dx.data(),
                                                     dw.data(), plan.nblocks == 1 ? nullptr : partial.data(), rows,
                                                     dim, plan.rows_per_block);
  });
  if (plan.nblocks > 1)
    emu::launch(dim3(unsigned(cu::ceil_div(dim, rn::kFinalCols))), dim3(rn::kTreeThreads), rn::tree_smem<C>(),
                [&] { rn::rmsnorm_dw_tree_kernel<C, float>(partial.data(), plan.nblocks, dw.data(), dim); });
  std::printf("  (G %d, %lld blocks of %lld rows)\n", G, static_cast<long long>(plan.nblocks),
              static_cast<long long>(plan.rows_per_block));
}

template <int G, typename T>
void one_case(int64_t rows, int64_t dim, DType dt, double tol) {
  std::printf("rows %lld, dim %lld, %s\n", static_cast<long long>(rows), static_cast<long long>(dim),
              dt == DType::Float32 ? "float32" : "bfloat16");
  std::mt19937 gen(static_cast<unsigned>(rows * 131 + dim));
  std::normal_distribution<float> nd;
  std::vector<float> xf(rows * dim), rf(rows * dim), dyf(rows * dim), dhf(rows * dim), w(dim);
  for (auto* v : {&xf, &rf, &dyf, &dhf, &w})
    for (float& e : *v) e = nd(gen);
  const std::vector<T> x = as<T>(xf), r = as<T>(rf), dy = as<T>(dyf), dh = as<T>(dhf);
  const size_t n = static_cast<size_t>(rows * dim);

  // forward: h = x + r, y = rmsnorm(h)
  std::vector<T> h(n), y(n), h_ref(n), y_ref(n);
  std::vector<float> rstd(rows), rstd_ref(rows);
  cpu::add_rmsnorm_forward(dt, DType::Float32, x.data(), r.data(), w.data(), h_ref.data(), y_ref.data(),
                           rstd_ref.data(), rows, dim, 1e-6f, nullptr);
  emu::launch(dim3(unsigned(cu::ceil_div(rows, cu::rows_per_block<G>()))), dim3(cu::kThreads), 0, [&] {
    rn::add_rmsnorm_forward_kernel<G, T, float>(x.data(), r.data(), w.data(), h.data(), y.data(), rstd.data(), rows,
                                                dim, 1e-6f);
  });
  expect_bits("add_rms_norm h", h, h_ref);
  expect_close("add_rms_norm y", floats(y), floats(y_ref), tol);
  expect_close("add_rms_norm rstd", rstd, rstd_ref, 1e-6);

  // backward, plain and with dres, against the CPU; then the other schedules bit for bit
  for (const bool with_res : {false, true}) {
    const std::string tag = with_res ? "add_rms_norm " : "rms_norm ";
    std::vector<T> dx_ref(n), dx(n);
    std::vector<float> dw_ref(dim), dw(dim);
    if (with_res)
      cpu::add_rmsnorm_backward(dt, DType::Float32, h_ref.data(), w.data(), rstd_ref.data(), dy.data(), dh.data(),
                                dx_ref.data(), dw_ref.data(), rows, dim, nullptr);
    else
      cpu::rmsnorm_backward(dt, DType::Float32, h_ref.data(), w.data(), rstd_ref.data(), dy.data(), dx_ref.data(),
                            dw_ref.data(), rows, dim, nullptr);
    emu::set_schedule(emu::Schedule::Lockstep);
    cuda_backward<G, T>(h_ref, w, rstd_ref, dy, with_res ? &dh : nullptr, dx, dw, rows, dim);
    expect_close(tag + "dx", floats(dx), floats(dx_ref), tol);
    expect_close(tag + "dw", dw, dw_ref, 1e-5 * std::sqrt(double(rows)));
    for (const emu::Schedule s : {emu::Schedule::LockstepReversed, emu::Schedule::WarpSerialLazy}) {
      std::vector<T> dx2(n);
      std::vector<float> dw2(dim);
      emu::set_schedule(s);
      cuda_backward<G, T>(h_ref, w, rstd_ref, dy, with_res ? &dh : nullptr, dx2, dw2, rows, dim);
      expect_bits(tag + "dx, other schedule", dx2, dx);
      expect_bits(tag + "dw, other schedule", dw2, dw);
    }
    emu::set_schedule(emu::Schedule::Lockstep);
  }
}

// ------------------------------------------------------------------ few rows: a block per row

constexpr emu::Schedule kSchedules[] = {emu::Schedule::Lockstep, emu::Schedule::LockstepReversed,
                                        emu::Schedule::WarpSerialLazy, emu::Schedule::WarpSerialEager};
const char* schedule_name(emu::Schedule s) {
  switch (s) {
    case emu::Schedule::Lockstep: return "lockstep";
    case emu::Schedule::LockstepReversed: return "lockstep reversed";
    case emu::Schedule::WarpSerialLazy: return "warp-serial lazy";
    case emu::Schedule::WarpSerialEager: return "warp-serial eager";
  }
  return "?";
}

// Outputs filled with NaN bits before a run: an element the kernel does not write shows as a
// difference.
template <typename T>
struct Poisoned {
  std::vector<T> h, y;
  std::vector<float> rstd;
  Poisoned(size_t n, int64_t rows) : h(n), y(n), rstd(static_cast<size_t>(rows)) {
    std::memset(static_cast<void*>(h.data()), 0xFF, n * sizeof(T));
    std::memset(static_cast<void*>(y.data()), 0xFF, n * sizeof(T));
    std::memset(rstd.data(), 0xFF, rstd.size() * sizeof(float));
  }
};

template <typename T> const char* dtype_label() {
  if constexpr (std::is_same_v<T, float>) return "float32";
  else if constexpr (std::is_same_v<T, double>) return "float64";
  else return "bfloat16";
}

// Values of T: normal, with a sprinkle of large and tiny ones (so h = x + res rounds, and the sum
// of squares spans magnitudes); float64 draws in double so its sums use all 53 bits.
template <typename T>
std::vector<T> draw(size_t n, std::mt19937& gen) {
  std::normal_distribution<double> nd;
  std::uniform_int_distribution<int> pick(0, 15);
  std::vector<T> v(n);
  for (auto& e : v) {
    double d = nd(gen);
    const int k = pick(gen);
    if (k == 0) d *= 300;
    else if (k == 1) d *= 1e-3;
    if constexpr (std::is_same_v<T, bf16_t>) {
      const uint16_t bits = xt::float_to_bf16(static_cast<float>(d)).bits;
      std::memcpy(static_cast<void*>(&e), &bits, 2);
    } else {
      e = static_cast<T>(d);
    }
  }
  return v;
}

// rms_norm (kAdd false) and add_rms_norm forward for (rows, dim): the group-per-row kernel as
// rmsnorm.cu launches it with more rows, then rmsnorm_rows_kernel with and without 16-byte packs
// (packs only when dim allows them) under every schedule; h, y and rstd must be the same bits.
template <bool kAdd, typename T, typename W>
void few_rows_case(int64_t rows, int64_t dim, bool all_schedules) {
  const size_t n = static_cast<size_t>(rows * dim);
  std::mt19937 gen(static_cast<unsigned>(rows * 7919 + dim * 31 + kAdd));
  const std::vector<T> x = draw<T>(n, gen), res = draw<T>(n, gen);
  const std::vector<W> w = draw<W>(static_cast<size_t>(dim), gen);
  std::vector<T> h_ref(n), y_ref(n);
  std::vector<float> rstd_ref(rows);
  cu::with_lanes(dim, [&](auto g) {
    constexpr int G = decltype(g)::value;
    emu::set_schedule(emu::Schedule::Lockstep);
    emu::launch(dim3(unsigned(cu::ceil_div(rows, cu::rows_per_block<G>()))), dim3(cu::kThreads), 0, [&] {
      if constexpr (kAdd)
        rn::add_rmsnorm_forward_kernel<G, T, W>(x.data(), res.data(), w.data(), h_ref.data(), y_ref.data(),
                                                rstd_ref.data(), rows, dim, 1e-6f);
      else
        rn::rmsnorm_forward_kernel<G, T, W>(x.data(), w.data(), y_ref.data(), rstd_ref.data(), rows, dim, 1e-6f);
    });
  });
  constexpr int64_t V = 16 / static_cast<int64_t>(sizeof(T));
  int failed = 0, runs = 0;
  for (const bool vec : {true, false}) {
    const rn::FewRowsPlan plan = rn::few_rows_plan<T>(rows, dim, vec);
    if (!plan.use || plan.vec != (vec && dim % V == 0)) {
      std::printf("  rows %lld dim %lld: unexpected plan (use %d vec %d)\n", static_cast<long long>(rows),
                  static_cast<long long>(dim), plan.use, plan.vec);
      ++failed;
      continue;
    }
    if (vec && !plan.vec) continue;  // no packs for this dim: the scalar run below covers it
    for (const emu::Schedule s : kSchedules) {
      if (!all_schedules && s != emu::Schedule::Lockstep && s != emu::Schedule::WarpSerialLazy) continue;
      Poisoned<T> out(n, rows);
      std::vector<T>& h = out.h;
      std::vector<T>& y = out.y;
      std::vector<float>& rstd = out.rstd;
      emu::set_schedule(s);
      cu::with_lanes(dim, [&](auto g) {
        constexpr int G = decltype(g)::value;
        emu::launch(dim3(unsigned(rows)), dim3(unsigned(plan.threads)), plan.smem, [&] {
          if (plan.vec)
            rn::rmsnorm_rows_kernel<G, kAdd, true, T, W>(x.data(), kAdd ? res.data() : nullptr, w.data(),
                                                         kAdd ? h.data() : nullptr, y.data(), rstd.data(), dim, 1e-6f);
          else
            rn::rmsnorm_rows_kernel<G, kAdd, false, T, W>(x.data(), kAdd ? res.data() : nullptr, w.data(),
                                                          kAdd ? h.data() : nullptr, y.data(), rstd.data(), dim, 1e-6f);
        });
      });
      ++runs;
      const bool same = std::memcmp(y.data(), y_ref.data(), n * sizeof(T)) == 0 &&
                        std::memcmp(rstd.data(), rstd_ref.data(), rows * sizeof(float)) == 0 &&
                        (!kAdd || std::memcmp(h.data(), h_ref.data(), n * sizeof(T)) == 0);
      if (!same) {
        ++failed;
        std::printf("  %s rows %lld dim %lld %s/%s %s, %s: FAIL (bits differ)\n", kAdd ? "add_rms_norm" : "rms_norm",
                    static_cast<long long>(rows), static_cast<long long>(dim), dtype_label<T>(), dtype_label<W>(),
                    plan.vec ? "16-byte packs" : "scalar", schedule_name(s));
      }
    }
  }
  emu::set_schedule(emu::Schedule::Lockstep);
  g_failures += failed;
  if (failed == 0) g_few_rows_runs += runs;
}

// The wide bf16 backward (Note [Wide RMSNorm backward], and for 1024 and 2048 Note [Wide RMSNorm
// backward, long rows]) as rmsnorm.cu's backward_wide launches it: against the CPU reference,
// plain and with dres, then other schedules bit for bit; float32 and bf16 weights.
template <typename W>
void wide_case(int64_t rows, int64_t dim) {
  const int nc_long = rn::wide_long_chunks(dim);
  const int nc = nc_long > 0 ? nc_long : rn::wide_chunks(dim);
  std::printf("wide backward%s: rows %lld, dim %lld, %s w (%d chunks)\n", nc_long > 0 ? " (long rows)" : "",
              static_cast<long long>(rows), static_cast<long long>(dim),
              std::is_same_v<W, float> ? "float32" : "bfloat16", nc);
  if (nc == 0) {
    ++g_failures;
    std::printf("  FAIL: no wide plan\n");
    return;
  }
  std::mt19937 gen(static_cast<unsigned>(rows * 977 + dim));
  const size_t n = static_cast<size_t>(rows * dim);
  const std::vector<bf16_t> x = draw<bf16_t>(n, gen), dy = draw<bf16_t>(n, gen), dh = draw<bf16_t>(n, gen);
  std::vector<W> w = draw<W>(static_cast<size_t>(dim), gen);
  std::vector<float> rstd(rows);
  for (auto& r : rstd) r = 0.5f + std::uniform_real_distribution<float>(0, 1)(gen);
  const DType wdt = std::is_same_v<W, float> ? DType::Float32 : DType::BFloat16;
  const rn::OnePassPlan plan =
      rn::onepass_plan<cu::kWarp, float>(rows, dim, rn::wide_long_smem(rn::kWideLongMaxChunks));
  const size_t smem = nc_long > 0 ? rn::wide_long_smem(nc_long) : plan.smem;
  const auto run = [&](const bf16_t* pres, std::vector<bf16_t>& dx, std::vector<W>& dw) {
    std::vector<float> partial(static_cast<size_t>(plan.nblocks * dim));
    float* part = plan.nblocks == 1 ? nullptr : partial.data();
    emu::launch(dim3(unsigned(plan.nblocks)), dim3(cu::kThreads), smem, [&] {
      if (nc_long == 4)
        rn::rmsnorm_backward_wide_long_kernel<4, W>(x.data(), w.data(), rstd.data(), dy.data(), pres, dx.data(),
                                                    dw.data(), part, rows, plan.rows_per_block);
      else if (nc_long == 8)
        rn::rmsnorm_backward_wide_long_kernel<8, W>(x.data(), w.data(), rstd.data(), dy.data(), pres, dx.data(),
                                                    dw.data(), part, rows, plan.rows_per_block);
      else switch (nc) {
        case 1:
          rn::rmsnorm_backward_wide_kernel<1, W>(x.data(), w.data(), rstd.data(), dy.data(), pres, dx.data(),
                                                 dw.data(), plan.nblocks == 1 ? nullptr : partial.data(), rows,
                                                 plan.rows_per_block);
          break;
        case 2:
          rn::rmsnorm_backward_wide_kernel<2, W>(x.data(), w.data(), rstd.data(), dy.data(), pres, dx.data(),
                                                 dw.data(), plan.nblocks == 1 ? nullptr : partial.data(), rows,
                                                 plan.rows_per_block);
          break;
        default:
          rn::rmsnorm_backward_wide_kernel<3, W>(x.data(), w.data(), rstd.data(), dy.data(), pres, dx.data(),
                                                 dw.data(), plan.nblocks == 1 ? nullptr : partial.data(), rows,
                                                 plan.rows_per_block);
      }
    });
    if (plan.nblocks > 1)
      emu::launch(dim3(unsigned(cu::ceil_div(dim, rn::kFinalCols))), dim3(rn::kTreeThreads), rn::tree_smem<float>(),
                  [&] { rn::rmsnorm_dw_tree_kernel<float, W>(partial.data(), plan.nblocks, dw.data(), dim); });
  };
  for (const bool with_res : {false, true}) {
    const std::string tag = with_res ? "add_rms_norm " : "rms_norm ";
    std::vector<bf16_t> dx_ref(n), dx(n);
    std::vector<W> dw_ref(dim), dw(dim);
    if (with_res)
      cpu::add_rmsnorm_backward(DType::BFloat16, wdt, x.data(), w.data(), rstd.data(), dy.data(), dh.data(),
                                dx_ref.data(), dw_ref.data(), rows, dim, nullptr);
    else
      cpu::rmsnorm_backward(DType::BFloat16, wdt, x.data(), w.data(), rstd.data(), dy.data(), dx_ref.data(),
                            dw_ref.data(), rows, dim, nullptr);
    emu::set_schedule(emu::Schedule::Lockstep);
    std::memset(static_cast<void*>(dx.data()), 0xFF, n * sizeof(bf16_t));  // an unwritten element shows
    run(with_res ? dh.data() : nullptr, dx, dw);
    // two bf16 ulps: the dot's order differs from the CPU's, which can move dx by one ulp before
    // the rounded dx + dres rounds again (inputs with outliers x300, draw()); with dres, relative
    // to dres too (dx + dres may cancel to 0 where one bf16 ulp of dres is 1 or 2)
    std::vector<float> got = floats(dx), want = floats(dx_ref);
    if (with_res)
      for (size_t i = 0; i < n; ++i) {
        const float s = 1.0f + std::abs(static_cast<float>(dh[i]));
        got[i] /= s;
        want[i] /= s;
      }
    expect_close(tag + "dx", got, want, 2e-2);
    const double dw_tol = std::is_same_v<W, float> ? 1e-5 * std::sqrt(double(rows)) * 300 : 1e-2;
    expect_close(tag + "dw", floats(dw), floats(dw_ref), dw_tol);
    for (const emu::Schedule s : {emu::Schedule::LockstepReversed, emu::Schedule::WarpSerialLazy}) {
      std::vector<bf16_t> dx2(n);
      std::vector<W> dw2(dim);
      emu::set_schedule(s);
      run(with_res ? dh.data() : nullptr, dx2, dw2);
      expect_bits(tag + "dx, other schedule", dx2, dx);
      expect_bits(tag + "dw, other schedule", dw2, dw);
    }
    emu::set_schedule(emu::Schedule::Lockstep);
  }
}

// The wide forward (Note [Wide RMSNorm forward]) as rmsnorm.cu launches it, with and without
// 16-byte packs, rms_norm and add_rms_norm: bit for bit the group-per-row kernels (which take the
// wide order for these rows) under the schedules, and close to the CPU reference.
template <bool kAdd, typename W>
void wide_forward_case(int64_t rows, int64_t dim) {
  using T = bf16_t;
  const size_t n = static_cast<size_t>(rows * dim);
  std::mt19937 gen(static_cast<unsigned>(rows * 104729 + dim * 17 + kAdd));
  const std::vector<T> x = draw<T>(n, gen), res = draw<T>(n, gen);
  const std::vector<W> w = draw<W>(static_cast<size_t>(dim), gen);
  const DType wdt = std::is_same_v<W, float> ? DType::Float32 : DType::BFloat16;
  std::vector<T> h_ref(n), y_ref(n), h_cpu(n), y_cpu(n);
  std::vector<float> rstd_ref(rows), rstd_cpu(rows);
  emu::set_schedule(emu::Schedule::Lockstep);
  emu::launch(dim3(unsigned(cu::ceil_div(rows, cu::rows_per_block<32>()))), dim3(cu::kThreads), 0, [&] {
    if constexpr (kAdd)
      rn::add_rmsnorm_forward_kernel<32, T, W>(x.data(), res.data(), w.data(), h_ref.data(), y_ref.data(),
                                               rstd_ref.data(), rows, dim, 1e-6f);
    else
      rn::rmsnorm_forward_kernel<32, T, W>(x.data(), w.data(), y_ref.data(), rstd_ref.data(), rows, dim, 1e-6f);
  });
  if constexpr (kAdd)
    cpu::add_rmsnorm_forward(DType::BFloat16, wdt, x.data(), res.data(), w.data(), h_cpu.data(), y_cpu.data(),
                             rstd_cpu.data(), rows, dim, 1e-6f, nullptr);
  else
    cpu::rmsnorm_forward(DType::BFloat16, wdt, x.data(), w.data(), y_cpu.data(), rstd_cpu.data(), rows, dim, 1e-6f,
                         nullptr);
  const std::string what = std::string(kAdd ? "add_rms_norm" : "rms_norm") + " wide, rows " + std::to_string(rows) +
                           ", dim " + std::to_string(dim) + ", " + dtype_label<W>() + " w";
  if (kAdd) expect_bits(what + ": h against the CPU", h_ref, h_cpu);
  expect_close(what + ": y against the CPU", floats(y_ref), floats(y_cpu), 1e-2);
  expect_close(what + ": rstd against the CPU", rstd_ref, rstd_cpu, 1e-5);
  const int nc = rn::wide_forward_chunks<T>(dim);
  if (nc == 0) {
    std::printf("  %s: not a wide row\n", what.c_str());
    ++g_failures;
    return;
  }
  for (const bool vec : {true, false})
    for (const emu::Schedule s : kSchedules) {
      Poisoned<T> got(n, rows);
      emu::set_schedule(s);
      XT_INT_SWITCH(nc, NC, (1, 2, 3, 4, 8), [&] {
        const auto kernel = vec ? rn::rmsnorm_forward_wide_kernel<NC, kAdd, true, W>
                                : rn::rmsnorm_forward_wide_kernel<NC, kAdd, false, W>;
        emu::launch(dim3(unsigned(cu::ceil_div(rows, int64_t(cu::kThreads / cu::kWarp)))), dim3(cu::kThreads), 0,
                    [&] {
                      kernel(x.data(), res.data(), w.data(), got.h.data(), got.y.data(), got.rstd.data(), rows, 1e-6f);
                    });
      });
      const std::string tag = what + (vec ? ", 16-byte packs" : ", scalar") + ", " + schedule_name(s);
      if (kAdd) expect_bits(tag + ": h", got.h, h_ref);
      expect_bits(tag + ": y", got.y, y_ref);
      expect_bits(tag + ": rstd", got.rstd, rstd_ref);
    }
  emu::set_schedule(emu::Schedule::Lockstep);
}

template <typename T, typename W>
void few_rows_sweep(const std::vector<int64_t>& dims) {
  const int64_t row_counts[] = {1, 2, 3, 5, 8, 13, 16};
  const int before = g_failures, runs_before = g_few_rows_runs;
  for (size_t i = 0; i < dims.size(); ++i) {
    // every dim with one row (the decode case, all schedules) and with a row count from 2..16
    const int64_t rows = row_counts[1 + i % 6];
    few_rows_case<true, T, W>(1, dims[i], true);
    few_rows_case<false, T, W>(1, dims[i], true);
    few_rows_case<true, T, W>(rows, dims[i], false);
    few_rows_case<false, T, W>(rows, dims[i], false);
  }
  std::printf("few rows %s x, %s w: %zu dims, %d kernel runs bitwise equal, %s\n", dtype_label<T>(), dtype_label<W>(),
              dims.size(), g_few_rows_runs - runs_before, g_failures == before ? "ok" : "FAIL");
}

}  // namespace

int main() {
  // G = lanes_for(dim): 2 (dim < 16), 8 (32..63), 16 (64..127), 32 (>= 128). Row counts that fill
  // one block, several, and leave the last round of groups partly empty.
  one_case<2, float>(1, 7, DType::Float32, 1e-5);
  one_case<2, float>(257, 7, DType::Float32, 1e-5);
  one_case<8, bf16_t>(33, 40, DType::BFloat16, 1e-2);
  one_case<16, float>(70, 100, DType::Float32, 1e-5);
  one_case<32, float>(300, 200, DType::Float32, 1e-5);
  one_case<32, bf16_t>(41, 768, DType::BFloat16, 1e-2);

  // The wide bf16 backward: one block, several, a last round of warps partly empty.
  wide_case<float>(5, 256);
  wide_case<float>(41, 768);
  wide_case<bf16_t>(300, 512);
  wide_case<float>(2000, 768);
  // long rows: one block, several with a partly empty last round of warps
  wide_case<float>(6, 1024);
  wide_case<bf16_t>(70, 1024);
  wide_case<float>(37, 2048);
  wide_case<float>(2100, 2048);

  // The wide forward: every width, rows that fill no block, one, several and a partial last one.
  for (const int64_t dim : {256, 512, 768, 1024, 2048})
    for (const int64_t rows : {1, 7, 9, 300}) {
      wide_forward_case<true, float>(rows, dim);
      wide_forward_case<false, float>(rows, dim);
    }
  wide_forward_case<true, bf16_t>(33, 768);
  wide_forward_case<false, bf16_t>(33, 768);
  std::printf("wide forward: %s\n", g_failures == 0 ? "ok" : "FAIL");

  // The few-row forward: dims across every G, odd ones, ones not a multiple of a pack (8 bf16,
  // 4 float32, 2 float64), up to kFewRowsMaxDim; each with 1 row and with 2..16 rows.
  const std::vector<int64_t> dims = {1,   2,   3,    4,    5,    7,    8,    9,    15,   16,   17,  24,  31,  32,  33,
                                     48,  63,  64,   65,   96,   100,  127,  128,  129,  200,  255, 256, 257, 384, 511,
                                     512, 513, 766,  768,  769,  1000, 1023, 1024, 1026, 1536, 2047,
                                     2048, 3001, 4094, 4096};
  few_rows_sweep<float, float>(dims);
  few_rows_sweep<bf16_t, float>(dims);
  few_rows_sweep<bf16_t, bf16_t>(dims);
  few_rows_sweep<double, double>(dims);
  few_rows_sweep<double, float>(dims);
  // The plan's bounds: more rows or longer rows take the group-per-row kernels.
  const bool bounds = rn::few_rows_plan<float>(rn::kFewRowsMax, rn::kFewRowsMaxDim, true).use &&
                      !rn::few_rows_plan<float>(rn::kFewRowsMax + 1, 768, true).use &&
                      !rn::few_rows_plan<float>(1, rn::kFewRowsMaxDim + 1, true).use;
  if (!bounds) ++g_failures;
  std::printf("few rows plan bounds: %s\n", bounds ? "ok" : "FAIL");
  std::printf("%s: %d failure(s)\n", g_failures ? "FAILED" : "passed", g_failures);
  return g_failures ? 1 : 0;
}
