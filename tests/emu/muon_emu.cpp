// The CUDA Muon kernels (csrc/kernels/cuda/muon.cuh: momentum, normalisation, apply), run on the
// CPU under the warp/block emulator (cuda_emu.h), launched as muon.cu launches them, and compared
// bit for bit with the CPU kernels (kernels/cpu/muon.cpp), which evaluate the same element
// formulas (kernels/muon_math.h). What it checks before any GPU run: the element -> matrix mapping
// over chunks that cross matrices, the transposed operand of tall matrices, the per-matrix norm's
// block reduction (under every schedule), the guard (nothing written), the clip factor, and
// hyper read instead of the launch's [decay, lr]. Not checked: the hardware's rounding and
// nvcc's contraction into fma.
//   tests/emu/run.sh muon      (builds with g++ against build-cpu/libxtrain_core.a)
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/muon.cuh"
#include "kernels/kernels.h"

namespace {

namespace cu = xt::kernels::cuda;
namespace mu = xt::kernels::cuda::muon;
namespace cpu = xt::kernels::cpu;
using xt::kernels::bf16_t;
using xt::kernels::MuonParams;

int g_failures = 0;

void expect(const std::string& what, bool ok) {
  if (!ok) ++g_failures;
  std::printf("  %-58s %s\n", what.c_str(), ok ? "ok" : "FAIL");
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Matrices laid end to end in one buffer per array (as parameter views are), their bf16
// operands likewise.
struct Case {
  std::vector<int64_t> rows, cols, sizes;
  std::vector<float> p, g, buf, scales;
  std::vector<bf16_t> x;
  std::vector<int64_t> at;  // first element of each matrix

  Case(const std::vector<std::pair<int64_t, int64_t>>& shapes, unsigned seed) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> nd;
    int64_t total = 0;
    for (const auto& [r, c] : shapes) {
      rows.push_back(r);
      cols.push_back(c);
      sizes.push_back(r * c);
      at.push_back(total);
      scales.push_back(0.2f * std::sqrt(static_cast<float>(r > c ? r : c)));
      total += r * c;
    }
    for (auto* v : {&p, &g, &buf}) {
      v->resize(static_cast<size_t>(total));
      for (float& e : *v) e = nd(gen);
    }
    x.assign(static_cast<size_t>(total), xt::kernels::bf16_round(0.0f));
  }
  template <typename T>
  std::vector<T*> ptrs(std::vector<T>& v) {
    std::vector<T*> out;
    for (int64_t a : at) out.push_back(v.data() + a);
    return out;
  }
};

MuonParams params() {
  MuonParams hp;
  hp.momentum = 0.95f;
  hp.one_minus_momentum = static_cast<float>(1.0 - 0.95);
  hp.nesterov = true;
  hp.lr = 3e-3f;
  hp.decay = static_cast<float>(1.0 - 3e-3 * 0.1);
  return hp;
}

// The emulated launches, as kernels/cuda/muon.cu makes them (one list: the cases stay under
// kMaxMatrices); fill(L, slot, i) sets the pointers of matrix i.
template <typename Fill>
mu::MatrixList list_of(const Case& c, Fill&& fill) {
  mu::MatrixList L;
  L.start[0] = 0;
  for (size_t i = 0; i < c.at.size(); ++i) {
    L.rows[L.n] = c.rows[i];
    L.cols[L.n] = c.cols[i];
    fill(L, L.n, i);
    L.start[L.n + 1] = L.start[L.n] + c.sizes[i];
    ++L.n;
  }
  return L;
}

void momentum_emu(Case& c, const MuonParams& hp, const float* guard, const float* clip, float max_norm) {
  const mu::MatrixList L = list_of(c, [&](mu::MatrixList& l, int s, size_t i) {
    l.g[s] = c.g.data() + c.at[i];
    l.f[s] = c.buf.data() + c.at[i];
    l.x[s] = c.x.data() + c.at[i];
  });
  emu::launch(dim3(unsigned(cu::ceil_div(L.start[L.n], mu::kChunk))), dim3(mu::kMuonThreads), 0,
              [&] { mu::muon_momentum_kernel(L, hp, guard, clip, max_norm); });
}

void normalize_emu(Case& c, float eps) {
  const mu::MatrixList L = list_of(c, [&](mu::MatrixList& l, int s, size_t i) { l.x[s] = c.x.data() + c.at[i]; });
  emu::launch(dim3(unsigned(L.n)), dim3(mu::kNormThreads), 0, [&] { mu::muon_normalize_kernel(L, eps); });
}

void apply_emu(Case& c, const MuonParams& hp, const float* guard) {
  const mu::MatrixList L = list_of(c, [&](mu::MatrixList& l, int s, size_t i) {
    l.f[s] = c.p.data() + c.at[i];
    l.x[s] = c.x.data() + c.at[i];
    l.scale[s] = c.scales[i];
  });
  emu::launch(dim3(unsigned(cu::ceil_div(L.start[L.n], mu::kChunk))), dim3(mu::kMuonThreads), 0,
              [&] { mu::muon_apply_kernel(L, hp, guard); });
}

void step_cpu(Case& c, const MuonParams& hp, const float* guard, const float* clip, float max_norm) {
  auto g = c.ptrs(c.g);
  std::vector<const float*> gc(g.begin(), g.end());
  auto bufs = c.ptrs(c.buf);
  auto ps = c.ptrs(c.p);
  auto xs = c.ptrs(c.x);
  std::vector<void*> x(xs.begin(), xs.end());
  std::vector<const void*> xc(xs.begin(), xs.end());
  const int n = static_cast<int>(c.at.size());
  cpu::muon_momentum(n, gc.data(), bufs.data(), x.data(), c.rows.data(), c.cols.data(), hp, guard, clip, max_norm,
                     nullptr);
  cpu::muon_normalize(n, x.data(), c.sizes.data(), 1e-7f, nullptr);
  cpu::muon_apply(n, ps.data(), xc.data(), c.rows.data(), c.cols.data(), c.scales.data(), hp, guard, nullptr);
}

void step_emu(Case& c, const MuonParams& hp, const float* guard, const float* clip, float max_norm) {
  momentum_emu(c, hp, guard, clip, max_norm);
  normalize_emu(c, 1e-7f);
  apply_emu(c, hp, guard);
}

void muon_case(const std::string& name, const std::vector<std::pair<int64_t, int64_t>>& shapes, bool clip,
               bool use_hyper, bool guard_nan) {
  std::printf("%s%s%s%s\n", name.c_str(), clip ? ", clipped" : "", use_hyper ? ", hyper" : "",
              guard_nan ? ", NaN guard" : "");
  Case want(shapes, 3), got(shapes, 3);
  const Case before(shapes, 3);
  const float clip_norm = 4.0f, guard = guard_nan ? NAN : 1.0f;
  // hyper holds another step's [decay, lr] than the launch's: a kernel ignoring it fails
  const float hyper[2] = {static_cast<float>(1.0 - 1e-3 * 0.1), 1e-3f};
  MuonParams hp = params();
  MuonParams ref = hp;
  if (use_hyper) {
    hp.hyper = hyper;
    ref.decay = hyper[0];
    ref.lr = hyper[1];
  }
  step_cpu(want, ref, &guard, clip ? &clip_norm : nullptr, 1.0f);
  emu::set_schedule(emu::Schedule::Lockstep);
  step_emu(got, hp, &guard, clip ? &clip_norm : nullptr, 1.0f);
  expect("weights bitwise the CPU kernels", same_bits(got.p, want.p));
  expect("momentum bitwise the CPU kernels", same_bits(got.buf, want.buf));
  expect("normalised bf16 operands bitwise (tall ones transposed)", same_bits(got.x, want.x));
  if (guard_nan)
    expect("a NaN guard writes neither weights nor momentum",
           same_bits(got.p, before.p) && same_bits(got.buf, before.buf));
  else
    expect("the step changed the weights", !same_bits(got.p, before.p));
  // the normalisation's block sum under the other schedules
  for (const emu::Schedule s : {emu::Schedule::LockstepReversed, emu::Schedule::WarpSerialLazy}) {
    Case other(shapes, 3);
    emu::set_schedule(s);
    step_emu(other, hp, &guard, clip ? &clip_norm : nullptr, 1.0f);
    expect("the same bits under another schedule", same_bits(other.p, got.p) && same_bits(other.x, got.x));
  }
  emu::set_schedule(emu::Schedule::Lockstep);
}

}  // namespace

int main() {
  // wide, tall (transposed operand), square, a pair of one shape; chunks crossing matrices
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{24, 40}, {40, 24}, {24, 40}, {33, 33}, {3, 700}};
  muon_case("mixed shapes", shapes, false, false, false);
  muon_case("mixed shapes", shapes, true, false, false);
  muon_case("mixed shapes", shapes, true, true, false);
  muon_case("mixed shapes", shapes, false, false, true);
  std::printf(g_failures ? "%d FAILED\n" : "all passed\n", g_failures);
  return g_failures ? 1 : 0;
}
