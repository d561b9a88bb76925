// FP8 numerics and kernels before any GPU run.
//  1. The shared conversion (kernels/fp8_math.h fp8_encode, the CPU's) against NVIDIA's own host
//     emulation of __nv_cvt_float_to_fp8(x, __NV_SATFINITE, fmt) (cuda_fp8.hpp), which the CUDA
//     cast kernel calls (the cvt.rn.satfinite instruction on the GPU): every float32 whose low 12
//     bits are one of several patterns (every exponent, every rounding position, ties and
//     sticky bits), 2^24 random floats, and every float32 with --full; fp8_decode against
//     __nv_cvt_fp8_to_halfraw for every code.
//  2. The CUDA amax and cast(+transpose) kernels (kernels/cuda/fp8_cast.cuh) under the warp/block
//     emulator against the CPU kernels (kernels/cpu/fp8.cpp), bit for bit: float32 and bf16, tiles
//     the matrix does not fill, grid-stride amax with a tail, NaN/inf/-0 in the input, every
//     schedule of the emulator.
// Not checked here: the GPU's cvt instruction itself (the GPU tests compare the CUDA op with the
// CPU op bitwise) and the cuBLASLt GEMM.
//   tests/emu/run.sh fp8 [--full]
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

// The emulator runs one block at a time and switches threads only at sync points, so a plain
// read-modify-write is atomic here (the kernel's only atomic).
inline unsigned int atomicMax(unsigned int* p, unsigned int v) {
  const unsigned int old = *p;
  if (v > old) *p = v;
  return old;
}

#include "emu_check.h"
#include "kernels/cuda/fp8_cast.cuh"
#include "kernels/fp8_math.h"

namespace {

using xt::DType;
using xt::kernels::Fp8Format;
namespace cu = xt::kernels::cuda;
namespace cpu = xt::kernels::cpu;
using bf16_t = xt::kernels::bf16_t;
using emucheck::as;
using emucheck::expect_bits;
int& g_failures = emucheck::failures;

__nv_fp8_interpretation_t nv(Fp8Format f) { return f == Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2; }

float from_bits(uint32_t u) {
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}

// fp8_encode(x) == NVIDIA's conversion for the given bit patterns; prints the first mismatch.
struct EncodeCheck {
  Fp8Format f;
  uint64_t checked = 0, wrong = 0;
  void operator()(uint32_t bits) {
    const float x = from_bits(bits);
    const uint8_t mine = xt::kernels::fp8_encode(x, f);
    const uint8_t theirs = static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, nv(f)));
    ++checked;
    if (mine != theirs && wrong++ == 0)
      std::printf("    first mismatch: x bits 0x%08x (%g): ours 0x%02x, cuda_fp8 0x%02x\n", bits, x, mine, theirs);
  }
  void report(const char* what) {
    if (wrong) ++g_failures;
    std::printf("  %-5s %-34s %s (%llu values, %llu differ)\n", xt::kernels::fp8_format_name(f), what,
                wrong ? "FAIL" : "ok", static_cast<unsigned long long>(checked), static_cast<unsigned long long>(wrong));
  }
};

void conversions(bool full) {
  std::printf("conversion against cuda_fp8.hpp\n");
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    EncodeCheck c{f};
    const uint32_t low[] = {0x000, 0x001, 0x7FF, 0x800, 0x801, 0xFFF};
    for (uint32_t hi = 0; hi < (1u << 20); ++hi)
      for (uint32_t l : low) c((hi << 12) | l);
    c.report("every exponent and rounding bit");
    EncodeCheck r{f};
    std::mt19937 gen(7);
    for (int i = 0; i < (1 << 24); ++i) r(static_cast<uint32_t>(gen()));
    r.report("2^24 random floats");
    if (full) {
      EncodeCheck a{f};
      uint32_t u = 0;
      do a(u); while (++u != 0);
      a.report("every float32");
    }
    int bad = 0;
    for (int code = 0; code < 256; ++code) {
      const float mine = xt::kernels::fp8_decode(static_cast<uint8_t>(code), f);
      const __half hv(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), nv(f)));
      const float theirs = __half2float(hv);
      const bool same = (std::isnan(mine) && std::isnan(theirs)) || (std::memcmp(&mine, &theirs, 4) == 0);
      if (!same && bad++ == 0) std::printf("    decode 0x%02x: ours %g, cuda_fp8 %g\n", code, mine, theirs);
    }
    if (bad) ++g_failures;
    std::printf("  %-5s %-34s %s\n", xt::kernels::fp8_format_name(f), "decode of every code", bad ? "FAIL" : "ok");
  }
}

std::vector<float> test_values(int64_t n, unsigned seed, bool specials) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> ud(-12.0f, 12.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& e : v) e = nd(gen) * std::exp2(ud(gen));
  if (specials && n > 8) {
    v[1] = -0.0f;
    v[2] = std::nanf("");
    v[static_cast<size_t>(n / 2)] = -std::nanf("");
    v[static_cast<size_t>(n - 1)] = 0.0f;
  }
  return v;
}

template <typename T>
void kernel_case(Fp8Format f, int64_t rows, int64_t cols, bool transposed, bool with_inf, unsigned amax_blocks) {
  const char* tname = std::is_same_v<T, float> ? "float32" : "bf16";
  const DType dt = std::is_same_v<T, float> ? DType::Float32 : DType::BFloat16;
  std::printf("%s %s rows %lld cols %lld%s%s, amax over %u blocks\n", xt::kernels::fp8_format_name(f), tname,
              static_cast<long long>(rows), static_cast<long long>(cols), transposed ? ", transposed" : "",
              with_inf ? ", with inf" : "", amax_blocks);
  const int64_t n = rows * cols;
  std::vector<float> xf = test_values(n, static_cast<unsigned>(rows * 7 + cols), true);
  if (with_inf) xf[5] = -INFINITY;
  const std::vector<T> x = as<T>(xf);
  std::vector<float> meta_ref(2, -1.0f), meta(2, -1.0f);
  std::vector<uint8_t> out_ref(n), t_ref(n), out(n, 0xAB), t(n, 0xAB);
  cpu::fp8_amax(dt, x.data(), n, meta_ref.data(), nullptr);
  cpu::fp8_cast(dt, f, x.data(), rows, cols, meta_ref.data(), out_ref.data(), transposed ? t_ref.data() : nullptr,
                nullptr);
  for (emu::Schedule s : {emu::Schedule::Lockstep, emu::Schedule::LockstepReversed, emu::Schedule::WarpSerialLazy}) {
    emu::set_schedule(s);
    meta.assign(2, -1.0f);
    meta[xt::kernels::kFp8MetaAmax] = 0.0f;  // the launcher's cudaMemsetAsync
    emu::launch(dim3(amax_blocks), dim3(cu::fp8::kAmaxThreads), 0,
                [&] { cu::fp8::amax_kernel<T>(x.data(), n, meta.data()); });
    const dim3 grid(static_cast<unsigned>(cu::ceil_div(cols, cu::fp8::kTile)),
                    static_cast<unsigned>(cu::ceil_div(rows, cu::fp8::kTile)));
    std::fill(out.begin(), out.end(), 0xAB);
    std::fill(t.begin(), t.end(), 0xAB);
    // the emulator runs 1-D blocks: a 2-D grid of them is what the launcher asks for
    emu::launch(grid, dim3(cu::fp8::kCastThreads), 0, [&] {
      cu::fp8::cast_kernel<T>(x.data(), rows, cols, f, meta.data(), out.data(), transposed ? t.data() : nullptr);
    });
    const std::string sched = std::to_string(static_cast<int>(s));
    expect_bits("2^-k, amax (schedule " + sched + ")", meta, meta_ref);
    expect_bits("codes", out, out_ref);
    if (transposed) expect_bits("transposed codes", t, t_ref);
  }
}

void amax_tail_case() {
  // n not a multiple of the 16-byte pack, a grid smaller than the packs (grid-stride loop)
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(1003), int64_t(70001)}) {
    std::vector<float> xf = test_values(n, static_cast<unsigned>(n), n > 8);
    xf[static_cast<size_t>(n - 1)] = 1e6f;  // the largest in the tail
    std::vector<float> ref(2, 0.0f), got(2, 0.0f);
    cpu::fp8_amax(DType::Float32, xf.data(), n, ref.data(), nullptr);
    emu::set_schedule(emu::Schedule::Lockstep);
    emu::launch(dim3(3), dim3(cu::fp8::kAmaxThreads), 0,
                [&] { cu::fp8::amax_kernel<float>(xf.data(), n, got.data()); });
    const int a = xt::kernels::kFp8MetaAmax;
    expect_bits("amax n=" + std::to_string(n), std::vector<float>{got[a]}, std::vector<float>{ref[a]});
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool full = argc > 1 && std::string(argv[1]) == "--full";
  conversions(full);
  kernel_case<bf16_t>(Fp8Format::E4M3, 64, 64, true, false, 1);
  kernel_case<bf16_t>(Fp8Format::E4M3, 48, 80, true, false, 2);
  kernel_case<float>(Fp8Format::E4M3, 80, 144, true, true, 3);
  kernel_case<bf16_t>(Fp8Format::E5M2, 144, 32, true, false, 4);
  kernel_case<float>(Fp8Format::E5M2, 16, 16, false, false, 1);
  kernel_case<bf16_t>(Fp8Format::E4M3, 128, 48, false, true, 2);
  amax_tail_case();
  std::printf(g_failures ? "%d FAILED\n" : "all passed\n", g_failures);
  return g_failures ? 1 : 0;
}
