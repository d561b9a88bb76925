// The CUDA cross-entropy kernels (csrc/kernels/cuda/cross_entropy.cuh), run on the CPU under the
// warp/block emulator (cuda_emu.h), launched as cross_entropy.cu launches them, and compared with
// the CPU reference kernels (csrc/kernels/cpu/cross_entropy.cpp) and with a long-double reference.
// What it checks before any GPU run:
//  - forward lse and losses, the reduced loss and count, and dlogits, for float32, bfloat16 and
//    float64; vocabularies 1, 7, 1003 (not a multiple of any pack width), 4096 and 50257; ld = vocab
//    and ld padded to a multiple of 64 (padding filled with NaN: a kernel that reads it fails);
//    int32 and int64 targets, ignore_index rows (-100, and a class id as ignore_index), and an
//    out-of-range target (NaN loss, reported, zero gradient row);
//  - the backward from the CPU's lse is the CPU's dlogits bit for bit (the same element formula
//    and, on the host, the same exp), padding columns 0 included;
//  - in place (dlogits = logits) equals out of place bit for bit;
//  - the 16-byte path and the element-by-element path give the same bits (misaligned pointers
//    take the latter), and so do the emulator's thread schedules (determinism).
// Not checked: the hardware's rounding (the device's expf, fma contractions).
//   tests/emu/run.sh cross_entropy      (builds with g++ against build-cpu/libxtrain_core.a)
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "kernels/cuda/cross_entropy.cuh"
#include "kernels/kernels.h"

namespace {

using xt::DType;
namespace cu = xt::kernels::cuda;
namespace ce = xt::kernels::cuda::ce;
namespace cpu = xt::kernels::cpu;
using bf16_t = xt::kernels::bf16_t;
using xt::kernels::load;

int g_failures = 0;
constexpr int64_t kIgnore = -100;

template <typename T> constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::Float32;
  else if constexpr (std::is_same_v<T, double>) return DType::Float64;
  else return DType::BFloat16;
}
template <typename T> const char* name_of() {
  if constexpr (std::is_same_v<T, float>) return "float32";
  else if constexpr (std::is_same_v<T, double>) return "float64";
  else return "bfloat16";
}

// 64-byte aligned storage of n elements starting `offset` elements in (offset 1: rows misaligned).
template <typename T>
struct Buf {
  std::vector<unsigned char> raw;
  T* p = nullptr;
  size_t n = 0;
  Buf(size_t n_, int offset = 0) : raw((n_ + offset) * sizeof(T) + 64), n(n_) {
    uintptr_t a = reinterpret_cast<uintptr_t>(raw.data());
    a = (a + 63) / 64 * 64 + offset * sizeof(T);
    p = reinterpret_cast<T*>(a);
  }
  Buf(const Buf& o, int offset) : Buf(o.n, offset) { std::memcpy(p, o.p, n * sizeof(T)); }
  T* data() const { return p; }
  bool same_bits(const Buf& o) const { return n == o.n && std::memcmp(p, o.p, n * sizeof(T)) == 0; }
};

template <typename T>
void put(T* p, size_t i, double v) {
  if constexpr (std::is_same_v<T, bf16_t>) {
    const uint16_t bits = xt::float_to_bf16(static_cast<float>(v)).bits;
    std::memcpy(static_cast<void*>(p + i), &bits, 2);
  } else {
    p[i] = static_cast<T>(v);
  }
}

double no_extra(size_t) { return 0.0; }

// Worst of |a - b| / ((rtol + extra(i)) |b| + atol max|b|) over the entries; NaN must meet NaN.
template <typename A, typename B, typename E = double (*)(size_t)>
void expect_close(const std::string& what, const A& a, const B& b, size_t n, double rtol, double atol,
                  const E& extra = no_extra) {
  double scale = 0;
  for (size_t i = 0; i < n; ++i)
    if (std::isfinite(double(b(i)))) scale = std::max(scale, std::abs(double(b(i))));
  double worst = 0, worst_rel = 0;
  size_t at = 0;
  bool ok = true;
  for (size_t i = 0; i < n; ++i) {
    const double x = a(i), y = b(i);
    if (std::isnan(x) || std::isnan(y)) {
      if (std::isnan(x) != std::isnan(y)) ok = false, at = i;
      continue;
    }
    if (std::isinf(x) || std::isinf(y)) {
      if (x != y) ok = false, at = i;
      continue;
    }
    const double d = std::abs(x - y), r = d / ((rtol + extra(i)) * std::abs(y) + atol * scale + 1e-300);
    if (r > worst) worst = r, at = i, worst_rel = d / (std::abs(y) + 1e-300);
  }
  ok = ok && worst <= 1.0;
  if (!ok) ++g_failures;
  std::printf("    %-44s %s (worst %.2f of tolerance, rel %.2g, at %zu)\n", what.c_str(), ok ? "ok" : "FAIL", worst,
              worst_rel, at);
}

void expect(const std::string& what, bool ok) {
  if (!ok) ++g_failures;
  std::printf("    %-44s %s\n", what.c_str(), ok ? "ok" : "FAIL");
}

// dlogits tolerance against the long-double reference (rtol, atol relative to the largest value):
// tests/test_linear_cross_entropy.py's CUDA_TOL; float64 to float32's rounding, because lse is
// float32 by the contract (test_cross_entropy_float64_matches_torch's 1e-6).
template <typename T> std::pair<double, double> grad_tol() {
  if constexpr (std::is_same_v<T, float>) return {1e-5, 1e-6};
  else if constexpr (std::is_same_v<T, double>) return {1e-6, 1e-8};
  else return {2e-2, 1e-3};
}

struct Launch {
  emu::Schedule schedule = emu::Schedule::Lockstep;
  int offset = 0;  // elements: 1 makes every pointer misaligned (the element-by-element path)
};

// The forward as cross_entropy.cu launches it.
template <typename T>
void cuda_forward(const T* x, const void* tg, bool t64, float* losses, float* lse, int64_t rows, int64_t vocab,
                  int64_t ld, xt::cuda::IndexErrorRecord* err, bool* vec_out = nullptr) {
  const dim3 grid(static_cast<unsigned>(rows)), block(ce::row_threads<T>(vocab));
  const bool vec = ce::rows_vectorizable<T>(x, ld);
  if (vec_out) *vec_out = vec;
  emu::launch(grid, block, 0, [&] {
    if (vec) ce::ce_forward_kernel<T, true>(x, tg, t64, losses, lse, vocab, ld, kIgnore, err);
    else ce::ce_forward_kernel<T, false>(x, tg, t64, losses, lse, vocab, ld, kIgnore, err);
  });
}

template <typename T>
void cuda_backward(const T* x, const float* lse, const void* tg, bool t64, const float* dloss, const float* count,
                   T* dx, int64_t rows, int64_t vocab, int64_t ld, bool* vec_out = nullptr) {
  const dim3 grid(static_cast<unsigned>(rows)), block(ce::row_threads<T>(vocab));
  const bool vec = ce::rows_vectorizable<T>(x, ld) && ce::rows_vectorizable<T>(dx, ld);
  if (vec_out) *vec_out = vec;
  emu::launch(grid, block, 0, [&] {
    if (vec) ce::ce_backward_kernel<T, true>(x, lse, tg, t64, dloss, count, dx, vocab, ld, kIgnore);
    else ce::ce_backward_kernel<T, false>(x, lse, tg, t64, dloss, count, dx, vocab, ld, kIgnore);
  });
}

// One problem: rows x vocab with row stride ld; t64 picks int64 targets; bad_row >= 0 gets an
// out-of-range target (vocab + 3 or -5, not ignore_index).
template <typename T>
void one_case(int64_t rows, int64_t vocab, int64_t ld, bool t64, int64_t bad_row, unsigned seed) {
  using C = xt::kernels::compute_t<T>;
  std::printf("%s rows %lld vocab %lld ld %lld, int%d targets%s: %d threads\n", name_of<T>(),
              static_cast<long long>(rows), static_cast<long long>(vocab), static_cast<long long>(ld), t64 ? 64 : 32,
              bad_row >= 0 ? ", one out of range" : "", ce::row_threads<T>(vocab));
  const DType dt = dtype_of<T>(), tdt = t64 ? DType::Int64 : DType::Int32;
  const size_t n = static_cast<size_t>(rows * ld);
  std::mt19937 gen(seed);
  std::normal_distribution<double> nd;
  std::uniform_int_distribution<int64_t> cls(0, vocab - 1);

  // Logits: noise of scale 3; row 1 rises along the row (the running max grows at every pack,
  // so every pack rescales), row 2 sits near -1000 with one peak (large |logits|), row 3 has one
  // dominant logit. Padding columns hold NaN.
  Buf<T> x(n);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < ld; ++j) {
      double v = 3.0 * nd(gen);
      if (r % 8 == 1) v = 0.01 * static_cast<double>(j) + 0.5 * nd(gen);
      if (r % 8 == 2) v = -1000.0 + (j == vocab / 2 ? 20.0 : nd(gen));
      if (r % 8 == 3 && j == vocab / 3) v = 40.0;
      put(x.data(), static_cast<size_t>(r * ld + j), j < vocab ? v : std::nan(""));
    }
  // Targets: random classes; every 5th row ignored.
  std::vector<int64_t> t(rows);
  for (int64_t r = 0; r < rows; ++r) t[r] = r % 5 == 4 ? kIgnore : cls(gen);
  if (bad_row >= 0) t[bad_row] = bad_row % 2 ? -5 : vocab + 3;
  std::vector<int32_t> t32(t.begin(), t.end());
  const void* tg = t64 ? static_cast<const void*>(t.data()) : static_cast<const void*>(t32.data());

  // CPU reference kernels
  std::vector<float> lse_cpu(rows), losses_cpu(rows), loss_cpu(1), count_cpu(1);
  cpu::cross_entropy_forward(dt, x.data(), tdt, tg, losses_cpu.data(), lse_cpu.data(), rows, vocab, ld, kIgnore,
                             nullptr);
  cpu::cross_entropy_reduce(losses_cpu.data(), tdt, tg, loss_cpu.data(), count_cpu.data(), rows, kIgnore, nullptr);
  const float dloss = 0.75f;  // an upstream gradient other than 1
  Buf<T> dx_cpu(n);
  cpu::cross_entropy_backward(dt, x.data(), lse_cpu.data(), tdt, tg, &dloss, count_cpu.data(), dx_cpu.data(), rows,
                              vocab, ld, kIgnore, nullptr);

  // long-double reference from the same (rounded) inputs
  std::vector<long double> lse_ref(rows), loss_ref(rows), dx_ref(n, 0.0L);
  long double sum_ref = 0, cnt_ref = 0;
  for (int64_t r = 0; r < rows; ++r) {
    long double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < vocab; ++j) m = std::max<long double>(m, load(x.data(), r * ld + j));
    for (int64_t j = 0; j < vocab; ++j) s += std::exp(static_cast<long double>(load(x.data(), r * ld + j)) - m);
    lse_ref[r] = m + std::log(s);
    const bool ign = t[r] == kIgnore, bad = !ign && (t[r] < 0 || t[r] >= vocab);
    loss_ref[r] = ign ? 0.0L : bad ? NAN : lse_ref[r] - static_cast<long double>(load(x.data(), r * ld + t[r]));
    if (!ign) sum_ref += loss_ref[r], cnt_ref += 1;
  }
  for (int64_t r = 0; r < rows; ++r) {
    if (t[r] == kIgnore || t[r] < 0 || t[r] >= vocab) continue;
    for (int64_t j = 0; j < vocab; ++j) {
      const long double p = std::exp(static_cast<long double>(load(x.data(), r * ld + j)) - lse_ref[r]);
      dx_ref[r * ld + j] = (p - (j == t[r] ? 1.0L : 0.0L)) * dloss / std::max<long double>(cnt_ref, 1);
    }
  }

  // CUDA forward + reduce
  xt::cuda::IndexErrorRecord err{};
  std::vector<float> lse(rows, -1.f), losses(rows, -1.f), loss(1), count(1);
  bool vec = false;
  emu::set_schedule(emu::Schedule::Lockstep);
  cuda_forward<T>(x.data(), tg, t64, losses.data(), lse.data(), rows, vocab, ld, &err, &vec);
  emu::launch(dim3(1), dim3(ce::kReduceThreads), 0, [&] {
    ce::ce_reduce_kernel(losses.data(), tg, t64, loss.data(), count.data(), rows, kIgnore);
  });
  const int W = ce::pack_width<T>();
  expect(std::string("16-byte path taken iff ld % ") + std::to_string(W) + " == 0", vec == (ld % W == 0));
  // losses and lse are float32 whatever the dtype: the float32 tolerance of tests/ophelp.py
  // (2e-5, 2e-5), absolute part relative to the largest value.
  auto at = [](const auto& v) { return [&v](size_t i) { return static_cast<double>(v[i]); }; };
  expect_close("lse vs CPU", at(lse), at(lse_cpu), rows, 2e-5, 2e-5);
  expect_close("losses vs CPU", at(losses), at(losses_cpu), rows, 2e-5, 2e-5);
  expect_close("lse vs long double", at(lse), at(lse_ref), rows, 2e-5, 2e-5);
  expect_close("losses vs long double", at(losses), at(loss_ref), rows, 2e-5, 2e-5);
  expect("count == CPU's", count[0] == count_cpu[0] && count[0] == static_cast<float>(cnt_ref));
  if (bad_row >= 0) {
    expect("bad target: loss NaN, as the CPU's", std::isnan(loss[0]) && std::isnan(loss_cpu[0]));
    expect("bad target reported (site, value, bound)", err.flag == 1 &&
                                                           err.site == int32_t(xt::cuda::IndexSite::CrossEntropy) &&
                                                           err.value == t[bad_row] && err.bound == vocab);
  } else {
    // The CPU sums each row's exps one by one in float32 (relative error growing with vocab,
    // ~3e-6 at 50257); these kernels sum per thread, then in a tree, closer to the long double.
    expect_close("mean loss vs CPU", [&](size_t) { return double(loss[0]); },
                 [&](size_t) { return double(loss_cpu[0]); }, 1, 2e-5, 0);
    expect_close("mean loss vs long double", [&](size_t) { return double(loss[0]); },
                 [&](size_t) { return double(sum_ref / std::max<long double>(cnt_ref, 1)); }, 1, 2e-6, 0);
    expect("nothing reported", err.flag == 0);
  }

  // determinism: other schedules, and the element-by-element path, give the same bits
  for (const Launch l : {Launch{emu::Schedule::LockstepReversed, 0}, Launch{emu::Schedule::WarpSerialLazy, 0},
                         Launch{emu::Schedule::Lockstep, 1}}) {
    emu::set_schedule(l.schedule);
    Buf<T> x2(x, l.offset);
    std::vector<float> lse2(rows, -2.f), losses2(rows, -2.f);
    xt::cuda::IndexErrorRecord err2{};
    bool vec2 = true;
    cuda_forward<T>(x2.data(), tg, t64, losses2.data(), lse2.data(), rows, vocab, ld, &err2, &vec2);
    const std::string tag = l.offset ? "misaligned rows (element path)" : "other schedule";
    expect("forward, " + tag + ": same bits",
           std::memcmp(lse2.data(), lse.data(), rows * 4) == 0 && std::memcmp(losses2.data(), losses.data(), rows * 4) == 0 &&
               (!l.offset || !vec2));
  }
  emu::set_schedule(emu::Schedule::Lockstep);

  // backward from the CPU's lse and count: the CPU's dlogits bit for bit; padding 0.
  {
    Buf<T> dx(n);
    std::memset(static_cast<void*>(dx.data()), 0xFF, n * sizeof(T));  // NaN: every element must be written
    cuda_backward<T>(x.data(), lse_cpu.data(), tg, t64, &dloss, count_cpu.data(), dx.data(), rows, vocab, ld);
    expect("backward from the CPU's lse == CPU bitwise", dx.same_bits(dx_cpu));
  }
  // backward from this kernel's lse: against the long-double reference; in place; schedules
  Buf<T> dx(n);
  std::memset(static_cast<void*>(dx.data()), 0xFF, n * sizeof(T));
  cuda_backward<T>(x.data(), lse.data(), tg, t64, &dloss, count.data(), dx.data(), rows, vocab, ld, &vec);
  expect("backward took the 16-byte path iff ld allows", vec == (ld % W == 0));
  const auto [grtol, gatol] = grad_tol<T>();
  // lse is float32 by the contract: an error of up to ~2 of its ulps, |lse| 2^-23, is an error of
  // that relative size in every softmax value of the row (rows near -1000: 6e-5), for the CPU too.
  expect_close("dlogits vs long double", [&](size_t i) { return double(load(dx.data(), i)); },
               [&](size_t i) { return double(dx_ref[i]); }, n, grtol, gatol,
               [&](size_t i) { return std::abs(double(lse_ref[i / ld])) * std::ldexp(1.0, -23); });
  bool pad0 = true, bad0 = true;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < ld; ++j) {
      const C v = load(dx.data(), r * ld + j);
      if (j >= vocab && !(v == 0 && !std::signbit(v))) pad0 = false;
      if (r == bad_row && v != 0) bad0 = false;
    }
  expect("padding columns written 0", pad0);
  if (bad_row >= 0) expect("bad target: zero gradient row", bad0);
  for (const Launch l : {Launch{emu::Schedule::LockstepReversed, 0}, Launch{emu::Schedule::WarpSerialLazy, 0},
                         Launch{emu::Schedule::Lockstep, 1}}) {
    emu::set_schedule(l.schedule);
    Buf<T> inplace(x, l.offset);  // dlogits written over (a copy of) the logits
    bool vec2 = true;
    cuda_backward<T>(inplace.data(), lse.data(), tg, t64, &dloss, count.data(), inplace.data(), rows, vocab, ld,
                     &vec2);
    const std::string tag = l.offset ? "misaligned rows (element path)" : "other schedule";
    expect("backward in place, " + tag + ": same bits", inplace.same_bits(dx) && (!l.offset || !vec2));
  }
  emu::set_schedule(emu::Schedule::Lockstep);
}

template <typename T>
void vocab_cases(int64_t vocab, int64_t rows, unsigned seed) {
  const int64_t padded = (vocab + 63) / 64 * 64;
  one_case<T>(rows, vocab, vocab, false, -1, seed);
  one_case<T>(rows, vocab, padded, true, rows > 2 ? rows / 2 : -1, seed + 1);
}

// ignore_index as a valid class id (2): rows with target 2 count as ignored, the others as usual
template <typename T>
void class_id_ignore_case() {
  std::printf("%s ignore_index = 2 (a class id), vocab 9, 6 rows\n", name_of<T>());
  const int64_t rows = 6, vocab = 9, ld = 64;
  Buf<T> x(rows * ld);
  std::mt19937 gen(7);
  std::normal_distribution<double> nd;
  for (int64_t i = 0; i < rows * ld; ++i) put(x.data(), i, nd(gen));
  const std::vector<int64_t> t = {2, 0, 8, 2, 5, -100};  // -100 is a bad target here
  std::vector<float> lse(rows), losses(rows), lse_c(rows), losses_c(rows), loss(1), count(1), loss_c(1), count_c(1);
  xt::cuda::IndexErrorRecord err{};
  emu::launch(dim3(rows), dim3(ce::row_threads<T>(vocab)), 0, [&] {
    ce::ce_forward_kernel<T, true>(x.data(), t.data(), true, losses.data(), lse.data(), vocab, ld, 2, &err);
  });
  emu::launch(dim3(1), dim3(ce::kReduceThreads), 0,
              [&] { ce::ce_reduce_kernel(losses.data(), t.data(), true, loss.data(), count.data(), rows, 2); });
  cpu::cross_entropy_forward(dtype_of<T>(), x.data(), DType::Int64, t.data(), losses_c.data(), lse_c.data(), rows,
                             vocab, ld, 2, nullptr);
  cpu::cross_entropy_reduce(losses_c.data(), DType::Int64, t.data(), loss_c.data(), count_c.data(), rows, 2, nullptr);
  auto at = [](const auto& v) { return [&v](size_t i) { return static_cast<double>(v[i]); }; };
  expect_close("losses vs CPU", at(losses), at(losses_c), rows, 2e-5, 2e-5);
  expect("ignored rows 0, count 4, -100 reported", losses[0] == 0 && losses[3] == 0 && count[0] == 4 &&
                                                        count_c[0] == 4 && err.flag == 1 && err.value == -100 &&
                                                        err.ignore_index == 2 && std::isnan(losses[5]));
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  // vocab 1 and 7: less than a pack (one thread's partial pack); 1003: a partial last pack for
  // every dtype; 4096 and 50257: the sizes the models use (128/256/512 threads, several packs per
  // thread and the unrolled loop); rows 1..64.
  vocab_cases<float>(1, 3, 11);
  vocab_cases<bf16_t>(7, 9, 12);
  vocab_cases<double>(7, 5, 13);
  vocab_cases<float>(1003, 17, 14);
  vocab_cases<bf16_t>(1003, 64, 15);
  vocab_cases<double>(1003, 6, 16);
  vocab_cases<bf16_t>(4096, quick ? 8 : 33, 17);
  vocab_cases<float>(4096, 8, 18);
  vocab_cases<bf16_t>(50257, quick ? 3 : 10, 19);
  if (!quick) {
    vocab_cases<float>(50257, 4, 20);
    vocab_cases<double>(4096, 3, 21);
    one_case<bf16_t>(1, 50257, 50304, true, -1, 22);
  }
  class_id_ignore_case<float>();
  class_id_ignore_case<bf16_t>();
  std::printf("%s: %d failure(s)\n", g_failures ? "FAILED" : "passed", g_failures);
  return g_failures ? 1 : 0;
}
