// The CUDA kernel of linear_rows (csrc/kernels/cuda/linear_rows.cuh) run on the CPU under the
// warp/block emulator (cuda_emu.h), launched as linear_rows.cu launches it, and compared with the
// CPU reference kernel (csrc/kernels/cpu/linear_rows.cpp). What it checks before any GPU run: the
// column -> weight mapping over the concatenated weights (several weights, empty ones, more than
// one launch's worth), the output blocks' layout, K not a multiple of the 16-byte chunk, the
// staging of x in shared memory, warps past the last column, and that the four paths (16-byte or
// scalar loads, x staged or read from global memory), an unaligned x and the thread schedules all
// give the same bits. Not checked: the hardware's rounding (nvcc contracts the products into fmas).
//   tests/emu/run.sh linear_rows      (builds with g++ against build-cpu/libxtrain_core.a)
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "kernels/cuda/linear_rows.cuh"
#include "kernels/kernels.h"

namespace {

using xt::DType;
namespace cu = xt::kernels::cuda;
namespace lr = xt::kernels::cuda::rows;
namespace cpu = xt::kernels::cpu;
using bf16_t = xt::kernels::bf16_t;

int g_failures = 0;

template <typename T>
T from_float(float f) {
  if constexpr (std::is_same_v<T, bf16_t>) {
    const uint16_t bits = xt::float_to_bf16(f).bits;
    T v;
    std::memcpy(static_cast<void*>(&v), &bits, 2);
    return v;
  } else {
    return static_cast<T>(f);
  }
}

template <typename T>
double as_double(T v) {
  return static_cast<double>(xt::kernels::to_compute(v));
}

// How the launcher may run: its own choice, or one path forced (where the data allow it).
enum class Path { Auto, Scalar, VecGlobal, ScalarGlobal };

// linear_rows.cu's launcher, with <<<>>> replaced by emu::launch.
template <typename T>
void cuda_linear_rows(const T* x, int M, int64_t K, const std::vector<const T*>& w, const std::vector<int64_t>& N,
                      T* out, Path path) {
  constexpr int V = lr::chunk_elems<T>();
  const bool smem_x =
      path != Path::VecGlobal && path != Path::ScalarGlobal && size_t(M * K) * sizeof(T) <= lr::kRowsSmemBytes;
  T* o = out;
  const int n_w = static_cast<int>(w.size());
  for (int i0 = 0; i0 < n_w; i0 += lr::kRowsMaxWeights) {
    lr::Weights ws{};
    ws.n = std::min(n_w - i0, lr::kRowsMaxWeights);
    bool vec = K % V == 0 && cu::aligned_to(x, 16) && path != Path::Scalar && path != Path::ScalarGlobal;
    for (int j = 0; j < ws.n; ++j) {
      ws.w[j] = w[i0 + j];
      ws.col0[j + 1] = ws.col0[j] + N[i0 + j];
      vec = vec && cu::aligned_to(w[i0 + j], 16);
    }
    const int64_t total = ws.col0[ws.n];
    if (total > 0) {
      const size_t smem = smem_x ? size_t(M) * size_t(K) * sizeof(T) : 0;
      const dim3 grid(unsigned(cu::ceil_div(total, lr::kRowsWarps))), block(lr::kRowsThreads);
      emu::launch(grid, block, smem, [&] {
        if (vec && smem_x) lr::linear_rows_kernel<true, true, T>(x, ws, o, M, K);
        else if (vec) lr::linear_rows_kernel<true, false, T>(x, ws, o, M, K);
        else if (smem_x) lr::linear_rows_kernel<false, true, T>(x, ws, o, M, K);
        else lr::linear_rows_kernel<false, false, T>(x, ws, o, M, K);
      });
    }
    o += M * total;
  }
}

template <typename T>
void expect_bits(const std::string& what, const std::vector<T>& a, const std::vector<T>& b) {
  const bool ok = a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
  if (!ok) ++g_failures;
  std::printf("    %-34s %s\n", what.c_str(), ok ? "bitwise equal" : "FAIL (bits differ)");
}

template <typename T>
void one_case(int M, int64_t K, const std::vector<int64_t>& N, DType dt, double tol, bool all_paths) {
  int64_t total = 0;
  for (int64_t n : N) total += n;
  std::printf("M %d, K %lld, %zu weights, %lld columns, %s\n", M, static_cast<long long>(K), N.size(),
              static_cast<long long>(total), xt::dtype_name(dt));
  std::mt19937 gen(static_cast<unsigned>(M * 7919 + K * 31 + total));
  std::normal_distribution<float> nd;
  // x with one spare element in front (the unaligned copy starts there + 1); the weights in one
  // 16-byte aligned buffer, each starting at a multiple of 8 elements (16 bytes for bf16).
  std::vector<T> xbuf(static_cast<size_t>(M * K + 8));
  for (auto& v : xbuf) v = from_float<T>(nd(gen));
  const T* x = xbuf.data();
  std::vector<size_t> woff;
  size_t wsize = 0;
  for (int64_t n : N) {
    woff.push_back(wsize);
    wsize += (static_cast<size_t>(n * K) + 7) / 8 * 8;
  }
  std::vector<T> wbuf(wsize + 8);
  for (auto& v : wbuf) v = from_float<T>(nd(gen) * 0.05f);
  std::vector<const T*> w;
  for (size_t i = 0; i < N.size(); ++i) w.push_back(wbuf.data() + woff[i]);

  const size_t n_out = static_cast<size_t>(M * total);
  std::vector<T> ref(n_out), got(n_out, from_float<T>(-7.0f));
  std::vector<const void*> wv(w.begin(), w.end());
  cpu::linear_rows(dt, x, M, K, static_cast<int>(N.size()), wv.data(), N.data(), ref.data(), nullptr);
  emu::set_schedule(emu::Schedule::Lockstep);
  cuda_linear_rows<T>(x, M, K, w, N, got.data(), Path::Auto);

  // against the CPU reference, and a float64 sum for scale
  double worst = 0;
  size_t at = 0;
  int64_t off = 0;
  for (size_t i = 0; i < N.size(); ++i) {
    for (int m = 0; m < M; ++m)
      for (int64_t n = 0; n < N[i]; ++n) {
        double exact = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double p = as_double(x[m * K + k]) * as_double(w[i][n * K + k]);
          exact += p;
          mag += std::abs(p);
        }
        const size_t j = static_cast<size_t>(off + m * N[i] + n);
        const double d = std::abs(as_double(got[j]) - as_double(ref[j])) / (mag + 1e-30);
        const double e = std::abs(as_double(got[j]) - exact) / (mag + 1e-30);
        if (!(std::max(d, e) <= worst)) worst = std::max(d, e), at = j;
      }
    off += M * N[i];
  }
  const bool ok = worst <= tol;
  if (!ok) ++g_failures;
  std::printf("    %-34s %s (worst %.3g of sum |x w| at %zu)\n", "vs CPU reference and float64", ok ? "ok" : "FAIL",
              worst, at);

  if (all_paths) {
    for (const Path p : {Path::Scalar, Path::VecGlobal, Path::ScalarGlobal}) {
      std::vector<T> other(n_out, from_float<T>(-7.0f));
      cuda_linear_rows<T>(x, M, K, w, N, other.data(), p);
      expect_bits(p == Path::Scalar ? "scalar loads" : p == Path::VecGlobal ? "x from global" : "scalar, x global",
                  other, got);
    }
    // x one element off 16 bytes: the launcher falls back to the scalar path
    std::vector<T> xs(xbuf.begin(), xbuf.begin() + M * K);
    std::copy(xs.begin(), xs.end(), xbuf.begin() + 1);
    std::vector<T> other(n_out, from_float<T>(-7.0f));
    cuda_linear_rows<T>(xbuf.data() + 1, M, K, w, N, other.data(), Path::Auto);
    expect_bits("unaligned x", other, got);
    std::copy(xs.begin(), xs.end(), xbuf.begin());
  }
  for (const emu::Schedule s : {emu::Schedule::LockstepReversed, emu::Schedule::WarpSerialLazy}) {
    std::vector<T> other(n_out, from_float<T>(-7.0f));
    emu::set_schedule(s);
    cuda_linear_rows<T>(x, M, K, w, N, other.data(), Path::Auto);
    expect_bits("other schedule", other, got);
  }
  emu::set_schedule(emu::Schedule::Lockstep);
}

}  // namespace

int main() {
  // Relative to sum |x w|: float32 ~K * 2^-24; bf16 outputs round to bf16 (two roundings of
  // different float sums may land one bf16 ulp apart: 2^-7 of the value, which sum |x w| bounds);
  // float64 ~K * 2^-53.
  one_case<float>(1, 768, {96, 32, 32}, DType::Float32, 1e-5, true);          // q/k/v-like, one launch
  one_case<bf16_t>(1, 768, {64, 16, 16}, DType::BFloat16, 8e-3, true);
  one_case<bf16_t>(8, 256, {20, 0, 13}, DType::BFloat16, 8e-3, true);         // an empty weight
  one_case<bf16_t>(3, 100, {9, 7}, DType::BFloat16, 8e-3, true);              // K % 8 != 0: scalar
  one_case<float>(5, 2050, {6}, DType::Float32, 1e-5, true);                  // K % 4 != 0, x staged (41 KB)
  one_case<float>(8, 2048, {5, 3}, DType::Float32, 1e-5, true);               // 64 KB of x: from global
  one_case<bf16_t>(2, 4096 + 8, {3}, DType::BFloat16, 8e-3, true);            // several rounds of chunks
  one_case<double>(4, 130, {7, 5}, DType::Float64, 1e-14, true);              // 2 per chunk
  one_case<double>(1, 131, {3}, DType::Float64, 1e-14, true);
  one_case<float>(2, 64, {3, 1, 4, 1, 5, 9, 2, 6, 5, 3}, DType::Float32, 1e-5, true);  // two launches
  one_case<float>(7, 0, {5, 2}, DType::Float32, 0, false);                   // K = 0: zeros
  one_case<float>(1, 7, {1}, DType::Float32, 1e-5, true);                    // shorter than one warp's chunks
  std::printf("%s: %d failure(s)\n", g_failures ? "FAILED" : "passed", g_failures);
  return g_failures ? 1 : 0;
}
