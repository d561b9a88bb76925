// The CUDA kernels of decode_attention (csrc/kernels/cuda/decode_attention.cuh) run on the CPU
// under the warp/block emulator (cuda_emu.h), launched as decode_attention.cu launches them: the
// one-kernel path (decode_attention_kernel: the chunks' partials, then the group's last block to
// arrive combines them, Note [Decode attention in one kernel]) bit for bit against the two-kernel
// path (decode_partial_kernel + decode_combine_kernel), and both against the CPU reference kernel
// (csrc/kernels/cpu/decode_attention.cpp) within tolerance. What it checks before any GPU run:
// lengths of one chunk, several chunks and a partial last chunk, a length of 0 and a bad length
// (zeros), G = H / Hkv > 1 with more and fewer (g, d) items than threads, batch 1..8, 16-byte and
// scalar key loads, float64, the scratch partials starting as garbage (NaN), and that the arrival
// counters are all zero again after every launch: a sequence of launches with different lengths
// reuses one counter buffer, as graph replays do. Under two schedules. Not checked: the
// hardware's memory ordering (the emulation runs blocks one after another) nor its rounding.
//   tests/emu/run.sh decode_attention      (builds with g++ against build-cpu/libxtrain_core.a)
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "kernels/cuda/decode_attention.cuh"
#include "kernels/kernels.h"

namespace {

using xt::DType;
namespace cu = xt::kernels::cuda;
namespace da = xt::kernels::cuda::decode;
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

struct Shape {
  int64_t B, L, H, Hkv, D;
};

// decode_attention.cu's launcher, with <<<>>> replaced by emu::launch; arrivals: nullptr for the
// two-kernel path.
template <typename T>
void cuda_decode_attention(const Shape& s, const T* q, const T* k, const T* v, const int64_t* len, T* out,
                           int* arrivals, double scale) {
  using C = xt::kernels::compute_t<T>;
  const int64_t G = s.H / s.Hkv;
  const int chunk = da::decode_chunk(s.B, s.L, s.Hkv, G, s.D, sizeof(C));
  const int64_t nchunks = cu::ceil_div(s.L, chunk);
  const int64_t rows = s.B * s.H;
  // The scratch partials start as NaN: a chunk read but never written shows in the output.
  std::vector<C> part(static_cast<size_t>(rows * (nchunks > 0 ? nchunks : 1) * (s.D + 2)), NAN);
  C* po = part.data();
  C* pm = po + rows * nchunks * s.D;
  C* pl = pm + rows * nchunks;
  const int H = int(s.H), Hkv = int(s.Hkv), D = int(s.D), nch = int(nchunks);
  const C qscale = static_cast<C>(scale * 1.4426950408889634);
  const bool vec = s.D % (16 / int64_t(sizeof(T))) == 0 && cu::aligned_to(k, 16);
  const dim3 grid(unsigned(s.B * s.Hkv), unsigned(nchunks)), block(da::kDecodeThreads);
  const size_t smem = da::decode_smem_bytes(G, s.D, chunk, sizeof(C));
  if (arrivals) {
    emu::launch(grid, block, smem, [&] {
      if (vec) da::decode_attention_kernel<true, T>(q, k, v, len, po, pm, pl, out, arrivals, s.L, H, Hkv, D, chunk,
                                                    nch, qscale, nullptr);
      else da::decode_attention_kernel<false, T>(q, k, v, len, po, pm, pl, out, arrivals, s.L, H, Hkv, D, chunk, nch,
                                                 qscale, nullptr);
    });
    return;
  }
  emu::launch(grid, block, smem, [&] {
    if (vec) da::decode_partial_kernel<true, T>(q, k, v, len, po, pm, pl, s.L, H, Hkv, D, chunk, nch, qscale, nullptr);
    else da::decode_partial_kernel<false, T>(q, k, v, len, po, pm, pl, s.L, H, Hkv, D, chunk, nch, qscale, nullptr);
  });
  const int threads = int(cu::ceil_div(s.D, 32) * 32);
  emu::launch(dim3(unsigned(rows)), dim3(unsigned(threads)), 0,
              [&] { da::decode_combine_kernel<T>(po, pm, pl, len, out, s.L, H, D, chunk, nch); });
}

// Several launches over one cache (lengths[i] one launch's lengths), all with one counter buffer.
template <typename T>
void one_case(const Shape& s, const std::vector<std::vector<int64_t>>& lengths, DType dt, double tol) {
  const int64_t G = s.H / s.Hkv;
  const int chunk = da::decode_chunk(s.B, s.L, s.Hkv, G, s.D, sizeof(xt::kernels::compute_t<T>));
  std::printf("B %lld, L %lld, H %lld, H_kv %lld, D %lld, %s: chunk %d, %lld chunks\n", (long long)s.B,
              (long long)s.L, (long long)s.H, (long long)s.Hkv, (long long)s.D, xt::dtype_name(dt), chunk,
              (long long)cu::ceil_div(s.L, chunk));
  std::mt19937 gen(static_cast<unsigned>(s.B * 131 + s.L * 7 + s.H * 3 + s.D));
  std::normal_distribution<float> nd(0.f, 1.f);
  const size_t nq = size_t(s.B * s.H * s.D), nkv = size_t(s.B * s.L * s.Hkv * s.D);
  std::vector<T> q(nq), k(nkv), v(nkv);
  for (auto& x : q) x = from_float<T>(nd(gen));
  for (auto& x : k) x = from_float<T>(nd(gen));
  for (auto& x : v) x = from_float<T>(nd(gen));
  const double scale = 1.0 / std::sqrt(double(s.D));
  std::vector<int> arrivals(size_t(s.B * s.Hkv), 0);
  for (const auto& len : lengths) {
    std::string what = "lengths";
    for (int64_t n : len) what += " " + std::to_string(n);
    std::printf("  %s\n", what.c_str());
    std::vector<T> two(nq, from_float<T>(NAN)), ref(nq, from_float<T>(NAN));
    cuda_decode_attention<T>(s, q.data(), k.data(), v.data(), len.data(), two.data(), nullptr, scale);
    // The CUDA kernels read a bad length as 0 (and report it); the CPU op rejects it before its kernel.
    std::vector<int64_t> len_ok(len);
    for (auto& n : len_ok)
      if (n < 0 || n > s.L) n = 0;
    cpu::decode_attention(dt, q.data(), k.data(), v.data(), len_ok.data(), ref.data(), s.B, s.L, s.H, s.Hkv, s.D,
                          scale, nullptr);
    for (emu::Schedule sch : {emu::Schedule::Lockstep, emu::Schedule::WarpSerialLazy}) {
      emu::set_schedule(sch);
      std::vector<T> one(nq, from_float<T>(NAN));
      cuda_decode_attention<T>(s, q.data(), k.data(), v.data(), len.data(), one.data(), arrivals.data(), scale);
      const bool same = std::memcmp(one.data(), two.data(), nq * sizeof(T)) == 0;
      bool zero = true;
      for (int a : arrivals) zero = zero && a == 0;
      if (!same || !zero) ++g_failures;
      std::printf("    one kernel vs two, %-14s %s; counters %s\n",
                  sch == emu::Schedule::Lockstep ? "lockstep:" : "warp-serial:",
                  same ? "bitwise equal" : "FAIL (bits differ)", zero ? "back to 0" : "FAIL (not reset)");
    }
    emu::set_schedule(emu::Schedule::Lockstep);
    double worst = 0;
    for (size_t i = 0; i < nq; ++i) {
      const double d = std::abs(as_double(two[i]) - as_double(ref[i])) / (1.0 + std::abs(as_double(ref[i])));
      if (!(d <= worst)) worst = d;
    }
    const bool ok = worst <= tol;
    if (!ok) ++g_failures;
    std::printf("    two kernels vs CPU reference: max rel diff %.3g %s\n", worst, ok ? "ok" : "FAIL");
  }
}

}  // namespace

int main() {
  // dim768's decode step: 24 heads of 32, batch 1, one chunk, several, a partial last chunk, 0.
  one_case<bf16_t>({1, 300, 24, 24, 32}, {{300}, {1}, {33}, {0}, {290}}, DType::BFloat16, 8e-3);
  // G = 4 (256 items per block, more than the threads), batch 3, a bad length (zeros).
  one_case<bf16_t>({3, 200, 8, 2, 64}, {{200, 5, 64}, {1, 201, 130}, {7, 7, 7}}, DType::BFloat16, 8e-3);
  // G = 4 of D = 16 (64 items: two subgroups of threads), batch 8, float32.
  one_case<float>({8, 100, 4, 1, 16}, {{100, 1, 0, 31, 32, 33, 64, 99}, {2, 3, 5, 7, 11, 13, 17, 19}},
                  DType::Float32, 1e-5);
  // Scalar key loads (D % 4 != 0), G = 2.
  one_case<float>({2, 90, 6, 3, 10}, {{90, 45}, {0, 89}}, DType::Float32, 1e-5);
  // float64, odd D: scalar.
  one_case<double>({2, 70, 4, 2, 9}, {{70, 3}, {35, 0}}, DType::Float64, 1e-12);
  // 32 chunks of 32 keys at batch 2, G = 2, D = 24.
  one_case<bf16_t>({2, 1024, 4, 2, 24}, {{1024, 1000}, {512, 17}}, DType::BFloat16, 8e-3);
  std::printf("%s: %d failure(s)\n", g_failures ? "FAILED" : "passed", g_failures);
  return g_failures ? 1 : 0;
}
