// The CUDA column sums (csrc/kernels/cuda/column_sum.cuh: sum_to over leading dims, every bias
// gradient), run on the CPU under the warp/block emulator (cuda_emu.h) as reduce.cu launches
// them, for float32, bfloat16 and float64 inputs. Checked: bit for bit against a host sum in the
// order Note [Column sums in packs] fixes (row groups, then groups in order, then interleaved
// sets of chunks, then the sets in order); the 16-byte path against the scalar one and a misaligned input (the same bits: the
// plan depends on the shape only); every emulator schedule alike; and close to a float64 sum.
// Shapes: one chunk and many, rows fewer than a block's row groups, columns that are not a
// multiple of a pack or of a block's 32 packs, GPT-2's bias widths.
//   tests/emu/run.sh column_sum      (builds with g++ against build-cpu/libxtrain_core.a)
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "emu_check.h"
#include "kernels/cuda/column_sum.cuh"

namespace {

namespace cu = xt::kernels::cuda;
namespace cs = xt::kernels::cuda::colsum;
using xt::kernels::bf16_t;
using xt::kernels::compute_t;

// The documented order on the host: float accumulators, row group g adds rows r0 + g, r0 + g + 8, ...
template <typename T>
std::vector<T> host_order(const std::vector<T>& in, int64_t rows, int64_t cols) {
  using C = compute_t<T>;
  const cs::PackedPlan plan = cs::packed_plan<T>(rows, cols);
  std::vector<T> out(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) {
    std::vector<C> chunks;
    for (int64_t k = 0; k < plan.nchunks; ++k) {
      const int64_t r0 = k * plan.rows_per_chunk, r1 = std::min(rows, r0 + plan.rows_per_chunk);
      C chunk = 0;
      for (int g = 0; g < cs::kColRowsInFlight; ++g) {
        C acc = 0;
        for (int64_t r = r0 + g; r < r1; r += cs::kColRowsInFlight) acc += xt::kernels::load(in.data(), r * cols + c);
        chunk += acc;
      }
      chunks.push_back(chunk);
    }
    C total = chunks[0];
    if (plan.nchunks > 1) {  // interleaved sets of chunks, each in order, then the sets in order
      total = 0;
      for (int g = 0; g < cs::kColRowsInFlight; ++g) {
        C set = 0;
        for (int64_t k = g; k < plan.nchunks; k += cs::kColRowsInFlight) set += chunks[k];
        total += set;
      }
    }
    xt::kernels::store(out.data(), c, total);
  }
  return out;
}

// reduce.cu's column_sum, launched under the emulator; `offset` elements into a larger buffer
// (offset 1 misaligns a 16-byte pack), kVec as the launcher chooses it unless forced scalar.
template <typename T>
std::vector<T> emulated(const std::vector<T>& in, int64_t rows, int64_t cols, int offset, bool force_scalar) {
  using C = compute_t<T>;
  const cs::PackedPlan plan = cs::packed_plan<T>(rows, cols);
  std::vector<T> buf(in.size() + 16);
  std::copy(in.begin(), in.end(), buf.begin() + offset);
  const T* src = buf.data() + offset;
  std::vector<T> out(static_cast<size_t>(cols));
  std::vector<C> partial(static_cast<size_t>(plan.nchunks * cols));
  C* part = plan.nchunks > 1 ? partial.data() : nullptr;
  const bool vec = !force_scalar && cols % cs::vec_of<T>() == 0 && cu::aligned_to(src, 16);
  const dim3 grid(static_cast<unsigned>(plan.col_blocks), static_cast<unsigned>(plan.nchunks));
  emu::launch(grid, dim3(cs::kColThreads), 0, [&] {
    if (vec) cs::column_sum_partial_kernel<T, true>(src, out.data(), part, plan);
    else cs::column_sum_partial_kernel<T, false>(src, out.data(), part, plan);
  });
  if (plan.nchunks > 1)
    emu::launch(dim3(static_cast<unsigned>(cu::ceil_div(cols, int64_t{cu::kWarp}))), dim3(cs::kColThreads), 0,
                [&] { cs::column_sum_final_kernel<T>(part, out.data(), plan); });
  return out;
}

template <typename T>
void check(const char* tname, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (auto& v : x) v = nd(rng);
  const std::vector<T> in = emucheck::as<T>(x);
  const cs::PackedPlan plan = cs::packed_plan<T>(rows, cols);
  std::printf("%s rows %lld cols %lld (chunks %lld of %lld rows, %lld column blocks)\n", tname, (long long)rows,
              (long long)cols, (long long)plan.nchunks, (long long)plan.rows_per_chunk, (long long)plan.col_blocks);
  const std::vector<T> want = host_order(in, rows, cols);
  const std::vector<T> got = emulated(in, rows, cols, 0, false);
  emucheck::expect_bits("vs the documented order", got, want);
  emucheck::expect_bits("scalar path", emulated(in, rows, cols, 0, true), want);
  emucheck::expect_bits("misaligned input", emulated(in, rows, cols, 1, false), want);
  emu::set_schedule(emu::Schedule::WarpSerialLazy);
  emucheck::expect_bits("warp-serial schedule", emulated(in, rows, cols, 0, false), want);
  emu::set_schedule(emu::Schedule::LockstepReversed);
  emucheck::expect_bits("reversed schedule", emulated(in, rows, cols, 0, false), want);
  emu::set_schedule(emu::Schedule::Lockstep);
  std::vector<float> exact(static_cast<size_t>(cols));
  const std::vector<float> xs = emucheck::floats(in);
  for (int64_t c = 0; c < cols; ++c) {
    double s = 0;
    for (int64_t r = 0; r < rows; ++r) s += xs[r * cols + c];
    exact[c] = static_cast<float>(s);
  }
  const double tol = std::is_same_v<T, bf16_t> ? 1e-2 : 1e-4;
  emucheck::expect_close("vs a float64 sum", emucheck::floats(got), exact, tol * std::sqrt(double(rows)) / 8);
}

}  // namespace

int main() {
  std::mt19937 rng(7);
  const int64_t shapes[][2] = {{1, 8}, {5, 3}, {7, 264}, {64, 256}, {100, 768}, {130, 77}, {2048, 768},
                               {3000, 3072}, {4096, 100}, {513, 2304}};
  for (const auto& s : shapes) {
    check<float>("float32", s[0], s[1], rng);
    check<bf16_t>("bf16", s[0], s[1], rng);
  }
  check<double>("float64", 700, 130, rng);
  check<double>("float64", 3, 2, rng);
  std::printf("%s (%d failures)\n", emucheck::failures ? "FAILED" : "all passed", emucheck::failures);
  return emucheck::failures ? 1 : 0;
}
