// The CUDA kernel of linear_rows (csrc/kernels/cuda/linear_rows.cuh) run on the CPU under the
// warp/block emulator (cuda_emu.h), launched as linear_rows.cu launches it, and compared with the
// CPU reference kernel (csrc/kernels/cpu/linear_rows.cpp). What it checks before any GPU run: the
// column -> weight mapping over the concatenated weights (several weights, empty ones, more than
// one launch's worth), the output blocks' layout, K not a multiple of the 16-byte chunk, the
// staging of x in shared memory, warps past the last column, and that the four paths (16-byte or
// scalar loads, x staged or read from global memory), an unaligned x and the thread schedules all
// give the same bits. Not checked: the hardware's rounding (nvcc contracts the products into fmas).
// The fused norm + products kernel (norm_linear_rows_kernel, rms_norm_linear_rows) runs against
// the composition the unfused decode step ran on the GPU, itself emulated: the group-per-row
// add_rms_norm (or rms_norm) kernel, linear_rows_kernel on its y, and swiglu_value of the rounded
// gate and up; bit for bit in h and the outputs, with and without 16-byte loads, under three
// schedules; and against the CPU reference (kernels/cpu/linear_rows.cpp) within tolerance.
//   tests/emu/run.sh linear_rows      (builds with g++ against build-cpu/libxtrain_core.a)
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "kernels/cuda/linear_rows.cuh"
#include "kernels/cuda/rmsnorm.cuh"
#include "kernels/kernels.h"

namespace {

using xt::DType;
namespace cu = xt::kernels::cuda;
namespace lr = xt::kernels::cuda::rows;
namespace rn = xt::kernels::cuda::rmsnorm;
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
                      T* out, Path path, bool rows8 = false) {
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
      // R = 1 for one row, as the launcher picks; R = 8 otherwise (rows8 forces it for M = 1)
      const auto run = [&](auto r) {
        constexpr int R = decltype(r)::value;
        emu::launch(grid, block, smem, [&] {
          if (vec && smem_x) lr::linear_rows_kernel<true, true, R, T>(x, ws, o, M, K);
          else if (vec) lr::linear_rows_kernel<true, false, R, T>(x, ws, o, M, K);
          else if (smem_x) lr::linear_rows_kernel<false, true, R, T>(x, ws, o, M, K);
          else lr::linear_rows_kernel<false, false, R, T>(x, ws, o, M, K);
        });
      };
      if (M == 1 && !rows8) run(std::integral_constant<int, 1>{});
      else run(std::integral_constant<int, lr::kMaxRows>{});
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

// The weights of one case in one buffer, each [n, K] starting at a multiple of 8 elements (16
// bytes for bf16), drawn N(0, 0.05^2) in order.
template <typename T>
struct Weights {
  std::vector<T> buf;
  std::vector<const T*> ptrs;
  Weights(const std::vector<int64_t>& N, int64_t K, std::mt19937& gen, std::normal_distribution<float>& nd) {
    std::vector<size_t> off;
    size_t size = 0;
    for (int64_t n : N) {
      off.push_back(size);
      size += (static_cast<size_t>(n * K) + 7) / 8 * 8;
    }
    buf.resize(size + 8);
    for (auto& v : buf) v = from_float<T>(nd(gen) * 0.05f);
    for (size_t o : off) ptrs.push_back(buf.data() + o);
  }
};

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
  const Weights<T> wts(N, K, gen, nd);
  const std::vector<const T*>& w = wts.ptrs;

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
  if (M == 1) {  // the kernel compiled for 8 rows, run with one
    std::vector<T> other(n_out, from_float<T>(-7.0f));
    cuda_linear_rows<T>(x, M, K, w, N, other.data(), Path::Auto, true);
    expect_bits("compiled for 8 rows", other, got);
  }
  for (const emu::Schedule s : {emu::Schedule::LockstepReversed, emu::Schedule::WarpSerialLazy}) {
    std::vector<T> other(n_out, from_float<T>(-7.0f));
    emu::set_schedule(s);
    cuda_linear_rows<T>(x, M, K, w, N, other.data(), Path::Auto);
    expect_bits("other schedule", other, got);
  }
  emu::set_schedule(emu::Schedule::Lockstep);
}

// rms_norm_linear_rows' launcher (linear_rows.cu), with <<<>>> replaced by emu::launch; scalar
// forces the scalar loads, rows8 the shared-memory kernel compiled for 8 rows (where M = 1 takes
// the one compiled for one row, or the register one: Note [A lone row's norm in registers]).
template <typename T, typename W>
void cuda_norm_rows(const T* x, const T* res, const W* nw, T* h, int M, int64_t K, const std::vector<const T*>& w,
                    const std::vector<int64_t>& N, bool glu, T* out, bool scalar, bool rows8 = false,
                    bool* used_registers = nullptr) {
  using C = xt::kernels::compute_t<T>;
  constexpr int V = lr::chunk_elems<T>();
  const bool io_vec = !scalar && K % V == 0 && cu::aligned_to(x, 16) &&
                      (res == nullptr || (cu::aligned_to(res, 16) && cu::aligned_to(h, 16)));
  lr::RowsNorm nm{res, nw, nullptr, 1e-6f, cu::lanes_for(K), std::is_same_v<W, float>};
  T* o = out;
  const int n_w = static_cast<int>(w.size());
  for (int i0 = 0; i0 < n_w; i0 += lr::kRowsMaxWeights) {
    lr::Weights ws{};
    ws.n = std::min(n_w - i0, lr::kRowsMaxWeights);
    bool vec = io_vec;
    for (int j = 0; j < ws.n; ++j) {
      ws.w[j] = w[i0 + j];
      ws.col0[j + 1] = ws.col0[j] + N[i0 + j];
      vec = vec && cu::aligned_to(w[i0 + j], 16);
    }
    nm.h = i0 == 0 && res != nullptr ? h : nullptr;
    const int64_t cols = glu ? ws.col0[1] : ws.col0[ws.n];
    const size_t smem = xt::kernels::norm_rows_smem_bytes(sizeof(T), sizeof(C), M, K);
    if (smem > xt::kernels::kNormRowsSmemMax) {
      std::printf("    FAIL: %zu bytes of shared memory\n", smem);
      ++g_failures;
      return;
    }
    const dim3 grid(unsigned(cols > 0 ? cu::ceil_div(cols, lr::kRowsWarps) : 1)), block(lr::kRowsThreads);
    bool in_registers = false;
    if constexpr (std::is_same_v<T, bf16_t>) {
      const int nc = M == 1 ? rn::wide_forward_chunks<bf16_t>(K) : 0;
      const auto go = [&](auto ncw) {
        constexpr int NC = decltype(ncw)::value;
        emu::launch(grid, block, 0, [&] {
          if (glu && res != nullptr) lr::norm_linear_row_kernel<NC, true, true, W>(x, nm, ws, o);
          else if (glu) lr::norm_linear_row_kernel<NC, true, false, W>(x, nm, ws, o);
          else if (res != nullptr) lr::norm_linear_row_kernel<NC, false, true, W>(x, nm, ws, o);
          else lr::norm_linear_row_kernel<NC, false, false, W>(x, nm, ws, o);
        });
      };
      in_registers = vec && !rows8 && nc > 0 && nc <= rn::kWideFwdRegisterChunks && nm.G == cu::kWarp &&
                     cu::aligned_to(nw, 16);
      if (in_registers) {
        if (nc == 1) go(std::integral_constant<int, 1>{});
        else if (nc == 2) go(std::integral_constant<int, 2>{});
        else if (nc == 3) go(std::integral_constant<int, 3>{});
        else go(std::integral_constant<int, 4>{});
      }
    }
    if (used_registers != nullptr) *used_registers = in_registers;
    const auto run = [&](auto r) {
      constexpr int R = decltype(r)::value;
      emu::launch(grid, block, smem, [&] {
        if (glu) {
          if (vec) lr::norm_linear_rows_kernel<true, true, R, T>(x, nm, ws, o, M, K);
          else lr::norm_linear_rows_kernel<false, true, R, T>(x, nm, ws, o, M, K);
        } else {
          if (vec) lr::norm_linear_rows_kernel<true, false, R, T>(x, nm, ws, o, M, K);
          else lr::norm_linear_rows_kernel<false, false, R, T>(x, nm, ws, o, M, K);
        }
      });
    };
    if (in_registers) {
      // launched above
    } else if (M == 1 && !rows8) {
      run(std::integral_constant<int, 1>{});
    } else {
      run(std::integral_constant<int, lr::kMaxRows>{});
    }
    o += M * cols;
  }
}

// The fused kernel against the emulated unfused composition (bitwise) and the CPU reference.
template <typename T, typename W>
void norm_case(int M, int64_t K, const std::vector<int64_t>& N, bool add, bool glu, DType dt, DType w_dt, double tol) {
  int64_t total = 0;
  for (int64_t n : N) total += n;
  std::printf("norm%s%s: M %d, K %lld, %zu weights, %lld columns, %s, weight %s\n", add ? " + add" : "",
              glu ? " + swiglu" : "", M, static_cast<long long>(K), N.size(), static_cast<long long>(total),
              xt::dtype_name(dt), xt::dtype_name(w_dt));
  std::mt19937 gen(static_cast<unsigned>(M * 7919 + K * 31 + total + add * 5 + glu * 3));
  std::normal_distribution<float> nd;
  const size_t n_x = static_cast<size_t>(M * K);
  std::vector<T> x(n_x), res(n_x);
  for (auto& v : x) v = from_float<T>(nd(gen));
  for (auto& v : res) v = from_float<T>(nd(gen));
  std::vector<W> nw(static_cast<size_t>(K));
  for (auto& v : nw) v = from_float<W>(1.0f + 0.1f * nd(gen));
  const Weights<T> wts(N, K, gen, nd);
  const std::vector<const T*>& w = wts.ptrs;
  const int64_t n_cols = glu ? N[0] : total;
  const size_t n_out = static_cast<size_t>(M * n_cols);

  // The unfused steps, emulated: the group-per-row norm kernel, linear_rows_kernel, swiglu.
  emu::set_schedule(emu::Schedule::Lockstep);
  std::vector<T> h_ref(n_x), y_ref(n_x), prod(static_cast<size_t>(M * total)), ref(n_out);
  std::vector<float> rstd(static_cast<size_t>(M));
  cu::with_lanes(K, [&](auto g) {
    constexpr int G = decltype(g)::value;
    emu::launch(dim3(unsigned(cu::ceil_div(M, cu::rows_per_block<G>()))), dim3(cu::kThreads), 0, [&] {
      if (add)
        rn::add_rmsnorm_forward_kernel<G, T, W>(x.data(), res.data(), nw.data(), h_ref.data(), y_ref.data(),
                                                rstd.data(), M, K, 1e-6f);
      else
        rn::rmsnorm_forward_kernel<G, T, W>(x.data(), nw.data(), y_ref.data(), rstd.data(), M, K, 1e-6f);
    });
  });
  cuda_linear_rows<T>(y_ref.data(), M, K, w, N, prod.data(), Path::Auto);
  if (glu) {
    for (size_t j = 0; j < n_out; ++j)
      ref[j] = xt::kernels::from_compute<T>(xt::kernels::swiglu_value(xt::kernels::to_compute(prod[j]),
                                                                      xt::kernels::to_compute(prod[n_out + j])));
  } else {
    ref = prod;
  }

  for (const bool scalar : {false, true}) {
    for (const emu::Schedule s : {emu::Schedule::Lockstep, emu::Schedule::LockstepReversed,
                                  emu::Schedule::WarpSerialLazy}) {
      std::vector<T> h(n_x, from_float<T>(-7.0f)), got(n_out, from_float<T>(-7.0f));
      emu::set_schedule(s);
      cuda_norm_rows<T, W>(x.data(), add ? res.data() : nullptr, nw.data(), add ? h.data() : nullptr, M, K, w, N, glu,
                           got.data(), scalar);
      const std::string what = std::string(scalar ? "scalar" : "16-byte") + ", schedule " + std::to_string(int(s));
      expect_bits(what + ": out", got, ref);
      if (add) expect_bits(what + ": h", h, h_ref);
    }
  }
  emu::set_schedule(emu::Schedule::Lockstep);
  if (M == 1) {  // the kernel compiled for 8 rows, run with one
    std::vector<T> h(n_x, from_float<T>(-7.0f)), got(n_out, from_float<T>(-7.0f));
    cuda_norm_rows<T, W>(x.data(), add ? res.data() : nullptr, nw.data(), add ? h.data() : nullptr, M, K, w, N, glu,
                         got.data(), false, true);
    expect_bits("compiled for 8 rows: out", got, ref);
    bool in_registers = false;  // which kernel the 16-byte runs above took
    std::vector<T> h2(n_x, from_float<T>(-7.0f)), got2(n_out, from_float<T>(-7.0f));
    cuda_norm_rows<T, W>(x.data(), add ? res.data() : nullptr, nw.data(), add ? h2.data() : nullptr, M, K, w, N, glu,
                         got2.data(), false, false, &in_registers);
    std::printf("    %-34s %s\n", "norm in registers", in_registers ? "yes" : "no");
  }

  // The CPU reference (its own norm's summation order): within tolerance of the output's scale.
  std::vector<T> cpu_h(n_x), cpu_out(n_out);
  std::vector<const void*> wv(w.begin(), w.end());
  cpu::rms_norm_linear_rows(dt, w_dt, x.data(), add ? res.data() : nullptr, nw.data(), add ? cpu_h.data() : nullptr,
                            1e-6f, M, K, static_cast<int>(N.size()), wv.data(), N.data(), glu, cpu_out.data(), nullptr);
  double worst = 0, scale = 1e-30;
  for (size_t j = 0; j < n_out; ++j) scale = std::max(scale, std::abs(as_double(ref[j])));
  for (size_t j = 0; j < n_out; ++j) worst = std::max(worst, std::abs(as_double(cpu_out[j]) - as_double(ref[j])) / scale);
  const bool ok = worst <= tol && (!add || std::memcmp(cpu_h.data(), h_ref.data(), n_x * sizeof(T)) == 0);
  if (!ok) ++g_failures;
  std::printf("    %-34s %s (worst %.3g of max |out|)\n", "vs CPU reference", ok ? "ok" : "FAIL", worst);
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
  // The decode step's fused norms: dim 768 (q/k/v; gate/up with swiglu; the head), every M,
  // float32 and bf16 norm weights, K not a multiple of the chunk, G < 32 (K < 128), several
  // launches, the first layer's norm without residual.
  norm_case<bf16_t, float>(1, 768, {96, 32, 32}, true, false, DType::BFloat16, DType::Float32, 2e-2);
  norm_case<bf16_t, bf16_t>(1, 768, {40, 40}, true, true, DType::BFloat16, DType::BFloat16, 2e-2);
  norm_case<bf16_t, float>(8, 768, {24, 24}, true, true, DType::BFloat16, DType::Float32, 2e-2);
  norm_case<bf16_t, float>(1, 768, {70}, false, false, DType::BFloat16, DType::Float32, 2e-2);
  norm_case<float, float>(3, 200, {9, 7, 5}, true, false, DType::Float32, DType::Float32, 1e-5);
  norm_case<float, float>(5, 50, {13, 13}, true, true, DType::Float32, DType::Float32, 1e-5);   // G 8, K % 4 != 0
  norm_case<bf16_t, float>(2, 100, {3, 1, 4, 1, 5, 9, 2, 6, 5, 3}, true, false, DType::BFloat16, DType::Float32, 2e-2);
  norm_case<double, double>(4, 130, {7, 5}, true, false, DType::Float64, DType::Float64, 1e-13);
  norm_case<double, float>(1, 31, {6, 6}, false, true, DType::Float64, DType::Float32, 1e-13);  // G 4, odd K
  norm_case<float, float>(2, 64, {0}, true, false, DType::Float32, DType::Float32, 1e-5);        // no columns: h only
  // The lone row's norm in registers (bf16, M = 1, K = 256 * NC): every width, both norm weight
  // types, with and without the residual, swiglu, several launches, a grid of one block with
  // idle warps, no columns (h only).
  norm_case<bf16_t, bf16_t>(1, 256, {7, 3}, true, false, DType::BFloat16, DType::BFloat16, 2e-2);
  norm_case<bf16_t, float>(1, 512, {33, 33}, true, true, DType::BFloat16, DType::Float32, 2e-2);
  norm_case<bf16_t, bf16_t>(1, 1024, {9}, false, false, DType::BFloat16, DType::BFloat16, 2e-2);
  norm_case<bf16_t, float>(1, 1024, {21, 21}, false, true, DType::BFloat16, DType::Float32, 2e-2);
  norm_case<bf16_t, float>(1, 256, {3, 1, 4, 1, 5, 9, 2, 6, 5, 3}, true, false, DType::BFloat16, DType::Float32, 2e-2);
  norm_case<bf16_t, float>(1, 768, {0}, true, false, DType::BFloat16, DType::Float32, 2e-2);
  // 2048 (the wide order's NC = 8): the lone row takes the shared-memory path, in the same order
  norm_case<bf16_t, float>(1, 2048, {16, 16}, true, true, DType::BFloat16, DType::Float32, 2e-2);
  norm_case<bf16_t, bf16_t>(2, 2048, {24, 24}, false, true, DType::BFloat16, DType::BFloat16, 2e-2);
  std::printf("%s: %d failure(s)\n", g_failures ? "FAILED" : "passed", g_failures);
  return g_failures ? 1 : 0;
}
