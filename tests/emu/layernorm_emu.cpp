// The CUDA kernels of LayerNorm (csrc/kernels/cuda/layernorm.cuh) run on the CPU under the
// warp/block emulator (cuda_emu.h), launched as layernorm.cu launches them, and compared with the
// CPU reference kernels (csrc/kernels/cpu/layernorm.cpp): the forward with and without the fused
// residual add (h bitwise the CPU's add), and the backwards with and without dres: the one-pass
// kernel (dx, dw, db from one read; one block, and several with the final tree), the wide one
// (bf16 rows of 256/512/768 in 16-byte packs) and the two-pass form (dx, then dw, db from the
// ordered column sums: one chunk, and several with the final pass), the lane-strided one-pass
// and two-pass dx bitwise each other's. What it checks before any GPU run: the row ranges of the groups
// (rows that do not fill the last block, where the shuffles must still see every lane), the
// mean/rstd stores, the layout of the partial rows (dw's, then db's), and that the emulator's
// schedules give the same bits. Not checked: the hardware's rounding, nor nvcc's contraction of
// a * b + c into fma.
//   tests/emu/run.sh layernorm      (builds with g++ against build-cpu/libxtrain_core.a)
#include <cmath>
#include <cstdio>
#include <cstring>
#include <type_traits>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "emu_check.h"
#include "kernels/cuda/layernorm.cuh"
#include "kernels/kernels.h"

namespace {

using xt::DType;
namespace cu = xt::kernels::cuda;
namespace ln = xt::kernels::cuda::layernorm;
namespace rn = xt::kernels::cuda::rmsnorm;
namespace cpu = xt::kernels::cpu;
using bf16_t = xt::kernels::bf16_t;

using emucheck::as;
using emucheck::expect_bits;
using emucheck::expect_close;
using emucheck::floats;
int& g_failures = emucheck::failures;

// The forward as layernorm.cu launches it (res null: layer_norm).
template <int G, typename T>
void cuda_forward(const std::vector<T>& x, const std::vector<T>* res, const std::vector<float>& w,
                  const std::vector<float>& b, std::vector<T>& h, std::vector<T>& y, std::vector<float>& mean,
                  std::vector<float>& rstd, int64_t rows, int64_t dim) {
  emu::launch(dim3(unsigned(cu::ceil_div(rows, cu::rows_per_block<G>()))), dim3(cu::kThreads), 0, [&] {
    ln::layernorm_forward_kernel<G, T, float>(x.data(), res ? res->data() : nullptr, w.data(), b.data(),
                                              res ? h.data() : nullptr, y.data(), mean.data(), rstd.data(), rows,
                                              dim, 1e-5f);
  });
}

// The backward as layernorm.cu's backward_typed launches it.
template <int G, typename T>
void cuda_backward(const std::vector<T>& x, const std::vector<float>& w, const std::vector<float>& mean,
                   const std::vector<float>& rstd, const std::vector<T>& dy, const std::vector<T>* dres,
                   std::vector<T>& dx, std::vector<float>& dw, std::vector<float>& db, int64_t rows, int64_t dim) {
  emu::launch(dim3(unsigned(cu::ceil_div(rows, cu::rows_per_block<G>()))), dim3(cu::kThreads), 0, [&] {
    ln::layernorm_dx_kernel<G, T, float>(x.data(), w.data(), mean.data(), rstd.data(), dy.data(),
                                         dres ? dres->data() : nullptr, dx.data(), rows, dim);
  });
  const cu::ColumnSumPlan plan = cu::column_sum_plan(rows, dim);
  const dim3 grid(unsigned(plan.col_blocks), unsigned(plan.nchunks));
  std::vector<float> partial(plan.nchunks > 1 ? size_t(2 * plan.nchunks * dim) : 0);
  emu::launch(grid, dim3(unsigned(plan.threads)), 0, [&] {
    ln::layernorm_dwdb_partial_kernel<T, float>(x.data(), mean.data(), rstd.data(), dy.data(), dw.data(), db.data(),
                                                plan.nchunks > 1 ? partial.data() : nullptr, rows, dim,
                                                plan.rows_per_chunk);
  });
  if (plan.nchunks > 1)
    emu::launch(dim3(grid.x), dim3(unsigned(plan.threads)), 0, [&] {
      ln::layernorm_dwdb_final_kernel<float, float>(partial.data(), int(plan.nchunks), dw.data(), db.data(), dim);
    });
  std::printf("  (G %d, %lld chunks of %lld rows)\n", G, static_cast<long long>(plan.nchunks),
              static_cast<long long>(plan.rows_per_chunk));
}

// The one-pass backward as layernorm.cu's backward_typed launches it (plan.smem != 0).
template <int G, typename T>
void cuda_backward_onepass(const std::vector<T>& x, const std::vector<float>& w, const std::vector<float>& mean,
                           const std::vector<float>& rstd, const std::vector<T>& dy, const std::vector<T>* dres,
                           std::vector<T>& dx, std::vector<float>& dw, std::vector<float>& db, int64_t rows,
                           int64_t dim) {
  const rn::OnePassPlan plan = ln::onepass_plan<G, float>(rows, dim);
  if (plan.smem == 0) {
    std::printf("FAIL: dim %lld has no one-pass plan\n", static_cast<long long>(dim));
    ++g_failures;
    return;
  }
  std::vector<float> partial(plan.nblocks > 1 ? size_t(2 * plan.nblocks * dim) : 0);
  emu::launch(dim3(unsigned(plan.nblocks)), dim3(cu::kThreads), plan.smem, [&] {
    ln::layernorm_backward_onepass_kernel<G, T, float>(x.data(), w.data(), mean.data(), rstd.data(), dy.data(),
                                                       dres ? dres->data() : nullptr, dx.data(), dw.data(), db.data(),
                                                       plan.nblocks > 1 ? partial.data() : nullptr, rows, dim,
                                                       plan.rows_per_block);
  });
  if (plan.nblocks > 1)
    for (int k = 0; k < 2; ++k)
      emu::launch(dim3(unsigned(cu::ceil_div(dim, rn::kFinalCols))), dim3(rn::kTreeThreads), rn::tree_smem<float>(),
                  [&] {
                    rn::rmsnorm_dw_tree_kernel<float, float>(partial.data() + k * plan.nblocks * dim, plan.nblocks,
                                                             k == 0 ? dw.data() : db.data(), dim);
                  });
  std::printf("  (one pass: G %d, %lld blocks of %lld rows)\n", G, static_cast<long long>(plan.nblocks),
              static_cast<long long>(plan.rows_per_block));
}

// The wide backward as layernorm.cu's backward_wide launches it (bf16 rows of 256, 512, 768).
template <typename T>
void cuda_backward_wide(const std::vector<T>& x, const std::vector<float>& w, const std::vector<float>& mean,
                        const std::vector<float>& rstd, const std::vector<T>& dy, const std::vector<T>* dres,
                        std::vector<T>& dx, std::vector<float>& dw, std::vector<float>& db, int64_t rows, int64_t dim) {
  if constexpr (std::is_same_v<T, bf16_t>) {
    const rn::OnePassPlan plan = ln::onepass_plan<cu::kWarp, float>(rows, dim);
    std::vector<float> partial(plan.nblocks > 1 ? size_t(2 * plan.nblocks * dim) : 0);
    float* part = plan.nblocks > 1 ? partial.data() : nullptr;
    const auto run = [&](auto nc) {
      emu::launch(dim3(unsigned(plan.nblocks)), dim3(cu::kThreads), plan.smem, [&] {
        ln::layernorm_backward_wide_kernel<decltype(nc)::value, float>(
            x.data(), w.data(), mean.data(), rstd.data(), dy.data(), dres ? dres->data() : nullptr, dx.data(),
            dw.data(), db.data(), part, rows, plan.rows_per_block);
      });
    };
    switch (rn::wide_chunks(dim)) {
      case 1: run(std::integral_constant<int, 1>()); break;
      case 2: run(std::integral_constant<int, 2>()); break;
      case 3: run(std::integral_constant<int, 3>()); break;
      default: std::printf("FAIL: dim %lld is not a wide row\n", static_cast<long long>(dim)); ++g_failures; return;
    }
    if (plan.nblocks > 1)
      for (int k = 0; k < 2; ++k)
        emu::launch(dim3(unsigned(cu::ceil_div(dim, rn::kFinalCols))), dim3(rn::kTreeThreads),
                    rn::tree_smem<float>(), [&] {
                      rn::rmsnorm_dw_tree_kernel<float, float>(partial.data() + k * plan.nblocks * dim, plan.nblocks,
                                                               k == 0 ? dw.data() : db.data(), dim);
                    });
    std::printf("  (wide: %lld blocks of %lld rows)\n", static_cast<long long>(plan.nblocks),
                static_cast<long long>(plan.rows_per_block));
  }
}

template <int G, typename T>
void one_case(int64_t rows, int64_t dim, DType dt, double tol) {
  std::printf("rows %lld, dim %lld, %s\n", static_cast<long long>(rows), static_cast<long long>(dim),
              dt == DType::Float32 ? "float32" : "bfloat16");
  std::mt19937 gen(static_cast<unsigned>(rows * 131 + dim));
  std::normal_distribution<float> nd;
  std::vector<float> xf(rows * dim), rf(rows * dim), dyf(rows * dim), dhf(rows * dim), w(dim), b(dim);
  for (auto* v : {&xf, &rf, &dyf, &dhf, &w, &b})
    for (float& e : *v) e = nd(gen);
  for (float& e : xf) e = 2 * e + 1;  // a mean away from zero
  const std::vector<T> x = as<T>(xf), r = as<T>(rf), dy = as<T>(dyf), dh = as<T>(dhf);
  const size_t n = static_cast<size_t>(rows * dim);

  for (const bool with_res : {false, true}) {
    const std::string tag = with_res ? "add_layer_norm " : "layer_norm ";
    std::vector<T> h(n), y(n), h_ref(n), y_ref(n);
    std::vector<float> mean(rows), rstd(rows), mean_ref(rows), rstd_ref(rows);
    cpu::layernorm_forward(dt, DType::Float32, x.data(), with_res ? r.data() : nullptr, w.data(), b.data(),
                           with_res ? h_ref.data() : nullptr, y_ref.data(), mean_ref.data(), rstd_ref.data(), rows,
                           dim, 1e-5f, nullptr);
    emu::set_schedule(emu::Schedule::Lockstep);
    cuda_forward<G, T>(x, with_res ? &r : nullptr, w, b, h, y, mean, rstd, rows, dim);
    if (with_res) expect_bits(tag + "h", h, h_ref);
    expect_close(tag + "y", floats(y), floats(y_ref), tol);
    expect_close(tag + "mean", mean, mean_ref, 1e-6);
    expect_close(tag + "rstd", rstd, rstd_ref, 1e-6);
    const std::vector<T>& xin = with_res ? h_ref : x;
    std::vector<T> dx_ref(n), dx(n);
    std::vector<float> dw_ref(dim), db_ref(dim), dw(dim), db(dim);
    cpu::layernorm_backward(dt, DType::Float32, xin.data(), w.data(), mean_ref.data(), rstd_ref.data(), dy.data(),
                            with_res ? dh.data() : nullptr, dx_ref.data(), dw_ref.data(), db_ref.data(), rows, dim,
                            nullptr);
    cuda_backward<G, T>(xin, w, mean_ref, rstd_ref, dy, with_res ? &dh : nullptr, dx, dw, db, rows, dim);
    expect_close(tag + "dx", floats(dx), floats(dx_ref), tol);
    expect_close(tag + "dw", dw, dw_ref, 1e-5 * std::sqrt(double(rows)));
    expect_close(tag + "db", db, db_ref, 1e-5 * std::sqrt(double(rows)));
    const bool onepass = ln::onepass_plan<G, float>(rows, dim).smem != 0;
    std::vector<T> dx1(n);
    std::vector<float> dw1(dim), db1(dim);
    if (onepass) {
      cuda_backward_onepass<G, T>(xin, w, mean_ref, rstd_ref, dy, with_res ? &dh : nullptr, dx1, dw1, db1, rows, dim);
      expect_bits(tag + "one-pass dx (the two-pass dx)", dx1, dx);
      expect_close(tag + "one-pass dw", dw1, dw_ref, 1e-5 * std::sqrt(double(rows)));
      expect_close(tag + "one-pass db", db1, db_ref, 1e-5 * std::sqrt(double(rows)));
    }
    const bool wide = std::is_same_v<T, bf16_t> && rn::wide_chunks(dim) > 0;
    std::vector<T> dxw(n);
    std::vector<float> dww(dim), dbw(dim);
    if (wide) {
      cuda_backward_wide<T>(xin, w, mean_ref, rstd_ref, dy, with_res ? &dh : nullptr, dxw, dww, dbw, rows, dim);
      expect_close(tag + "wide dx", floats(dxw), floats(dx_ref), tol);
      expect_close(tag + "wide dw", dww, dw_ref, 1e-5 * std::sqrt(double(rows)));
      expect_close(tag + "wide db", dbw, db_ref, 1e-5 * std::sqrt(double(rows)));
    }
    for (const emu::Schedule s : {emu::Schedule::LockstepReversed, emu::Schedule::WarpSerialLazy}) {
      emu::set_schedule(s);
      if (wide) {
        std::vector<T> dx4(n);
        std::vector<float> dw4(dim), db4(dim);
        cuda_backward_wide<T>(xin, w, mean_ref, rstd_ref, dy, with_res ? &dh : nullptr, dx4, dw4, db4, rows, dim);
        expect_bits(tag + "wide dx, other schedule", dx4, dxw);
        expect_bits(tag + "wide dw, other schedule", dw4, dww);
        expect_bits(tag + "wide db, other schedule", db4, dbw);
      }
      std::vector<T> h2(n), y2(n), dx2(n);
      std::vector<float> mean2(rows), rstd2(rows), dw2(dim), db2(dim);
      cuda_forward<G, T>(x, with_res ? &r : nullptr, w, b, h2, y2, mean2, rstd2, rows, dim);
      cuda_backward<G, T>(xin, w, mean_ref, rstd_ref, dy, with_res ? &dh : nullptr, dx2, dw2, db2, rows, dim);
      expect_bits(tag + "y, other schedule", y2, y);
      expect_bits(tag + "dx, other schedule", dx2, dx);
      expect_bits(tag + "dw, other schedule", dw2, dw);
      expect_bits(tag + "db, other schedule", db2, db);
      if (onepass) {
        std::vector<T> dx3(n);
        std::vector<float> dw3(dim), db3(dim);
        cuda_backward_onepass<G, T>(xin, w, mean_ref, rstd_ref, dy, with_res ? &dh : nullptr, dx3, dw3, db3, rows,
                                    dim);
        expect_bits(tag + "one-pass dx, other schedule", dx3, dx1);
        expect_bits(tag + "one-pass dw, other schedule", dw3, dw1);
        expect_bits(tag + "one-pass db, other schedule", db3, db1);
      }
    }
  }
}

}  // namespace

int main() {
  // G = lanes_for(dim): 2 (dim < 16), 8 (32..63), 16 (64..127), 32 (>= 128). Row counts that fill
  // one block, several, and leave the last round of groups partly empty; enough rows for several
  // column-sum chunks and several one-pass blocks (16 rows a block at G = 32).
  one_case<2, float>(1, 7, DType::Float32, 1e-5);
  one_case<2, float>(257, 7, DType::Float32, 1e-5);
  one_case<8, bf16_t>(33, 40, DType::BFloat16, 1e-2);
  one_case<16, float>(70, 100, DType::Float32, 1e-5);
  one_case<32, float>(300, 200, DType::Float32, 1e-5);
  one_case<32, bf16_t>(41, 768, DType::BFloat16, 1e-2);
  one_case<32, float>(2000, 768, DType::Float32, 1e-5);
  one_case<32, bf16_t>(1500, 768, DType::BFloat16, 1e-2);  // one-pass and wide: several blocks, the last one short
  one_case<32, bf16_t>(7, 256, DType::BFloat16, 1e-2);     // wide, one block: dw and db written directly
  one_case<32, bf16_t>(300, 512, DType::BFloat16, 1e-2);   // wide, two chunks
  one_case<32, float>(100, 1000, DType::Float32, 1e-5);    // too wide for the one-pass plan: two passes only
  std::printf("%s\n", g_failures == 0 ? "all ok" : "FAILURES");
  return g_failures == 0 ? 0 : 1;
}
