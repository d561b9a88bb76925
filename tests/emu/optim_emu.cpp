// The CUDA optimizer kernels (csrc/kernels/cuda/optim.cuh: AdamW over ranges, the global norm's
// partials), run on the CPU under the warp/block emulator (cuda_emu.h), launched as optim.cu
// launches them, and compared bit for bit with the kernels they replaced (copied below as they
// were: scalar loads, one launch per weight-decay group) and with the CPU reference
// (kernels/cpu/optim.cpp). What it checks before any GPU run: the chunk -> range mapping, the
// 16-byte paths and their fallbacks (partial chunks, misaligned ranges, chunks across tensors),
// the grid-stride loop, the per-range weight decay, guard / clip / hyper, and that the norm's
// staged chunks give the partials of the element-by-element kernel under every schedule. Not
// checked here: the hardware's rounding and nvcc's contraction into fma (adamw_element's device
// form spells out the former kernel's roundings as its PTX shows them; the norm's `acc += x * x`
// compiles to the same fma.rn.f64 in both: compared in the PTX of the two versions).
//   tests/emu/run.sh optim      (builds with g++ against build-cpu/libxtrain_core.a)
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/optim.cuh"
#include "kernels/kernels.h"

namespace {

namespace cu = xt::kernels::cuda;
namespace op = xt::kernels::cuda::optim;
namespace cpu = xt::kernels::cpu;
using xt::kernels::AdamWParams;

int g_failures = 0;

// ------------------------------------------------------------------ the kernels before (c3cd0de)

namespace before {

struct TensorList {
  int n = 0;
  int64_t start[op::kMaxTensors + 1];
  float* a[op::kMaxTensors];
  const float* g[op::kMaxTensors];
  float* m[op::kMaxTensors];
  float* v[op::kMaxTensors];
};

int advance(const TensorList& L, int t, int64_t i) {
  while (t + 1 < L.n && i >= L.start[t + 1]) ++t;
  return t;
}

int find_tensor(const TensorList& L, int64_t i) {
  int lo = 0, hi = L.n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (L.start[mid] <= i) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

struct AdamWConsts {
  float beta1, beta2, eps, decay, step_size, bc2_sqrt;
};

void adamw_kernel(TensorList L, AdamWConsts k, const float* guard, const float* clip_norm, float max_norm,
                  const float* hyper) {
  if (guard && !std::isfinite(*guard)) return;
  const float coef = clip_norm ? fminf(1.0f, max_norm / (*clip_norm + 1e-6f)) : 1.0f;
  const float decay = hyper ? hyper[0] : k.decay;
  const float step_size = hyper ? hyper[1] : k.step_size;
  const float bc2_sqrt = hyper ? hyper[2] : k.bc2_sqrt;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * op::kChunk;
  const int64_t c1 = std::min(L.start[L.n], c0 + op::kChunk);
  int t = find_tensor(L, c0);
  for (int64_t i = c0 + threadIdx.x; i < c1; i += blockDim.x) {
    t = advance(L, t, i);
    const int64_t j = i - L.start[t];
    const float gi = clip_norm ? L.g[t][j] * coef : L.g[t][j];
    const float mi = k.beta1 * L.m[t][j] + (1.0f - k.beta1) * gi;
    const float vi = k.beta2 * L.v[t][j] + (1.0f - k.beta2) * gi * gi;
    L.m[t][j] = mi;
    L.v[t][j] = vi;
    const float denom = sqrtf(vi) / bc2_sqrt + k.eps;
    L.a[t][j] = L.a[t][j] * decay - step_size * (mi / denom);
  }
}

void sumsq_partial_kernel(TensorList L, double* partial) {
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * op::kChunk;
  const int64_t c1 = std::min(L.start[L.n], c0 + op::kChunk);
  int t = find_tensor(L, c0);
  double acc = 0.0;
  for (int64_t i = c0 + threadIdx.x; i < c1; i += blockDim.x) {
    t = advance(L, t, i);
    const double x = L.a[t][i - L.start[t]];
    acc += x * x;
  }
  acc = cu::block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

}  // namespace before

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

void expect(const std::string& what, bool ok) {
  if (!ok) ++g_failures;
  std::printf("  %-58s %s\n", what.c_str(), ok ? "ok" : "FAIL");
}

// ------------------------------------------------------------------ AdamW

// One test layout: tensors (size, offset in floats from a 16-byte boundary, decays) in four
// buffers; offsets != 0 make a range misaligned (the scalar path).
struct Spec {
  int64_t size;
  int offset;
  bool decays;
};

struct Buffers {
  std::vector<float> p, g, m, v;
  std::vector<int64_t> at;  // start of each tensor in the buffers
};

Buffers make_buffers(const std::vector<Spec>& specs, unsigned seed) {
  Buffers b;
  int64_t total = 0;
  for (const Spec& s : specs) {
    total = (total + 63) / 64 * 64 + s.offset;  // 256-byte aligned starts, plus the offset
    b.at.push_back(total);
    total += s.size;
  }
  std::mt19937 gen(seed);
  std::normal_distribution<float> nd;
  for (auto* v : {&b.p, &b.g, &b.m, &b.v}) v->assign(static_cast<size_t>(total + 64), 0.0f);
  for (size_t i = 0; i < b.p.size(); ++i) {
    b.p[i] = nd(gen);
    b.g[i] = nd(gen) * 0.1f;
    b.m[i] = nd(gen) * 0.01f;
    b.v[i] = std::abs(nd(gen)) * 1e-4f;
  }
  return b;
}

// vector storage is 16-byte aligned (operator new) here; the offsets above decide each range's
// alignment. Checked, so a platform that aligns less fails loudly instead of testing less.
void check_aligned(const Buffers& b) {
  for (const auto* v : {&b.p, &b.g, &b.m, &b.v})
    if (!cu::aligned_to(v->data(), 16)) {
      std::printf("  buffers not 16-byte aligned\n");
      ++g_failures;
    }
}

struct Options {
  bool clip, hyper, guard_nan;
  unsigned grid;  // 0: the launcher's grid
};

AdamWParams params_for(float wd) {
  AdamWParams hp;
  hp.lr = 3e-3f;
  hp.beta1 = 0.9f;
  hp.beta2 = 0.95f;
  hp.eps = 1e-8f;
  hp.weight_decay = wd;
  hp.bias_correction1 = 1.0f - 0.9f * 0.9f * 0.9f;  // step 3
  hp.bias_correction2 = 1.0f - 0.95f * 0.95f * 0.95f;
  return hp;
}

// The new kernel: one launch over every tensor, as adamw_step (kernels/cuda/optim.cu) builds it.
void run_new(const std::vector<Spec>& specs, Buffers& b, const Options& o, const float* clip_norm,
             const float* guard, const float* hyper) {
  const AdamWParams hp = params_for(0.1f);
  const op::AdamWConsts k = op::adamw_kernel_consts(hp);
  op::AdamWList L;
  L.chunk0[0] = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].size == 0) continue;
    const int64_t a = b.at[i];
    op::push_range(L, b.p.data() + a, b.g.data() + a, b.m.data() + a, b.v.data() + a, specs[i].size,
                   specs[i].decays);
  }
  const unsigned grid = o.grid ? o.grid : op::adamw_blocks(L);
  emu::launch(dim3(grid), dim3(op::kOptThreads), 0,
              [&] { op::adamw_kernel(L, k, guard, clip_norm, o.clip ? 1.0f : 0.0f, hyper); });
}

// The kernels before: one launch per weight-decay group (weight_decay 0 for the other group).
void run_before(const std::vector<Spec>& specs, Buffers& b, const Options& o, const float* clip_norm,
                const float* guard, const float* hyper_decay, const float* hyper_no_decay) {
  for (const bool group : {true, false}) {
    const AdamWParams hp = params_for(group ? 0.1f : 0.0f);
    const xt::kernels::AdamWStepConsts c = xt::kernels::adamw_step_consts(hp);
    const before::AdamWConsts k{hp.beta1, hp.beta2, hp.eps, c.decay, c.step_size, c.bc2_sqrt};
    before::TensorList L;
    L.start[0] = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].size == 0 || specs[i].decays != group) continue;
      const int64_t a = b.at[i];
      L.a[L.n] = b.p.data() + a;
      L.g[L.n] = b.g.data() + a;
      L.m[L.n] = b.m.data() + a;
      L.v[L.n] = b.v.data() + a;
      L.start[L.n + 1] = L.start[L.n] + specs[i].size;
      L.n++;
    }
    if (L.n == 0) continue;
    const float* hyper = o.hyper ? (group ? hyper_decay : hyper_no_decay) : nullptr;
    emu::launch(dim3(unsigned(cu::ceil_div(L.start[L.n], op::kChunk))), dim3(op::kOptThreads), 0,
                [&] { before::adamw_kernel(L, k, guard, clip_norm, o.clip ? 1.0f : 0.0f, hyper); });
  }
}

// The CPU reference, with the per-tensor flags.
void run_cpu(const std::vector<Spec>& specs, Buffers& b, const Options& o, const float* clip_norm,
             const float* guard, const float* hyper) {
  std::vector<float*> p, m, v;
  std::vector<const float*> g;
  std::vector<int64_t> sizes;
  std::unique_ptr<bool[]> decays(new bool[specs.size()]);
  for (size_t i = 0; i < specs.size(); ++i) {
    const int64_t a = b.at[i];
    p.push_back(b.p.data() + a);
    g.push_back(b.g.data() + a);
    m.push_back(b.m.data() + a);
    v.push_back(b.v.data() + a);
    sizes.push_back(specs[i].size);
    decays[i] = specs[i].decays;
  }
  AdamWParams hp = params_for(0.1f);
  hp.hyper = hyper;
  cpu::adamw_step(static_cast<int>(specs.size()), p.data(), g.data(), m.data(), v.data(), sizes.data(),
                  decays.get(), hp, guard, clip_norm, o.clip ? 1.0f : 0.0f, nullptr);
}

void adamw_case(const std::string& name, const std::vector<Spec>& specs, const Options& o) {
  std::printf("adamw: %s%s%s%s%s\n", name.c_str(), o.clip ? ", clip" : "", o.hyper ? ", hyper" : "",
              o.guard_nan ? ", NaN guard" : "", o.grid ? (", grid " + std::to_string(o.grid)).c_str() : "");
  const Buffers start = make_buffers(specs, static_cast<unsigned>(specs.size() * 977 + o.grid));
  check_aligned(start);
  const float clip_value = 3.7f;  // the clip coefficient is 1 / (3.7 + 1e-6): it scales
  const float guard_value = o.guard_nan ? NAN : 1.0f;
  // hyper: the step's constants as AdamW._write_hyper stores them (from adamw_step_consts)
  const xt::kernels::AdamWStepConsts hd = xt::kernels::adamw_step_consts(params_for(0.1f));
  const xt::kernels::AdamWStepConsts hn = xt::kernels::adamw_step_consts(params_for(0.0f));
  // different values from the launch's (another lr), so a kernel ignoring hyper fails
  const float hyper_decay[3] = {hd.decay * 0.5f + 0.5f, hd.step_size * 0.5f, hd.bc2_sqrt};
  const float hyper_no_decay[3] = {hn.decay, hn.step_size * 0.5f, hn.bc2_sqrt};
  const float* clip_norm = o.clip ? &clip_value : nullptr;
  const float* guard = &guard_value;

  Buffers got = start, want = start, ref = start;
  run_new(specs, got, o, clip_norm, guard, o.hyper ? hyper_decay : nullptr);
  run_before(specs, want, o, clip_norm, guard, hyper_decay, hyper_no_decay);
  run_cpu(specs, ref, o, clip_norm, guard, o.hyper ? hyper_decay : nullptr);
  const bool same = same_bits(got.p, want.p) && same_bits(got.m, want.m) && same_bits(got.v, want.v);
  expect("p, m, v bitwise the kernels before (two launches)", same);
  expect("p, m, v bitwise the CPU kernel", same_bits(got.p, ref.p) && same_bits(got.m, ref.m) &&
                                               same_bits(got.v, ref.v));
  const bool untouched = same_bits(got.p, start.p) && same_bits(got.m, start.m) && same_bits(got.v, start.v);
  expect(o.guard_nan ? "nothing written (guard)" : "every tensor updated", o.guard_nan == untouched);
  if (!o.guard_nan) {  // and nothing outside the tensors (the gaps and the tail keep their values)
    bool outside = true;
    std::vector<bool> inside(start.p.size(), false);
    for (size_t i = 0; i < specs.size(); ++i)
      for (int64_t j = 0; j < specs[i].size; ++j) inside[static_cast<size_t>(start.at[i] + j)] = true;
    for (size_t j = 0; j < inside.size(); ++j)
      if (!inside[j] && (got.p[j] != start.p[j] || got.m[j] != start.m[j] || got.v[j] != start.v[j])) outside = false;
    expect("nothing written outside the tensors", outside);
  }
}

// ------------------------------------------------------------------ global norm

// partials of both kernels over `tensors` (one launch: at most kMaxTensors tensors), under `s`
void norm_case(const std::string& name, const std::vector<std::pair<float*, int64_t>>& tensors) {
  std::printf("global norm: %s\n", name.c_str());
  op::TensorList L;
  before::TensorList B;
  L.start[0] = B.start[0] = 0;
  for (const auto& [ptr, size] : tensors) {
    L.a[L.n] = B.a[B.n] = ptr;
    L.start[L.n + 1] = B.start[B.n + 1] = L.start[L.n] + size;
    L.n++;
    B.n++;
  }
  const int64_t blocks = cu::ceil_div(L.start[L.n], op::kChunk);
  std::vector<double> want(static_cast<size_t>(blocks));
  emu::set_schedule(emu::Schedule::Lockstep);
  emu::launch(dim3(unsigned(blocks)), dim3(op::kOptThreads), 0, [&] { before::sumsq_partial_kernel(B, want.data()); });
  int64_t staged = 0;  // chunks the fast path takes: inside one aligned tensor, full
  for (int64_t c = 0; c < blocks; ++c) {
    const int t = cu::find_start(L.start, L.n, c * op::kChunk);
    if ((c + 1) * op::kChunk <= L.start[t + 1] && cu::aligned_to(L.a[t] + (c * op::kChunk - L.start[t]), 16)) ++staged;
  }
  for (const emu::Schedule s : {emu::Schedule::Lockstep, emu::Schedule::LockstepReversed,
                                emu::Schedule::WarpSerialLazy, emu::Schedule::WarpSerialEager}) {
    std::vector<double> got(static_cast<size_t>(blocks), -1.0);
    emu::set_schedule(s);
    emu::launch(dim3(unsigned(blocks)), dim3(op::kOptThreads), 0, [&] { op::sumsq_partial_kernel(L, got.data()); });
    expect("partials bitwise the kernel before (schedule " + std::to_string(int(s)) + ", " +
               std::to_string(staged) + "/" + std::to_string(blocks) + " chunks staged)",
           same_bits(got, want));
  }
  emu::set_schedule(emu::Schedule::Lockstep);
  // the final pass and the CPU's sequential sum agree to rounding
  float out = 0.0f, ref = 0.0f;
  emu::launch(dim3(1), dim3(1024), 0, [&] { op::norm_final_kernel(want.data(), blocks, &out); });
  std::vector<const float*> ptrs;
  std::vector<int64_t> sizes;
  for (const auto& [ptr, size] : tensors) ptrs.push_back(ptr), sizes.push_back(size);
  cpu::global_norm(static_cast<int>(ptrs.size()), ptrs.data(), sizes.data(), &ref, nullptr);
  expect("norm within 1e-6 of the CPU's", std::abs(out - ref) <= 1e-6f * ref);
}

}  // namespace

int main() {
  // AdamW: the store's shape (long aligned ranges, groups alternating, a partial last chunk),
  // misaligned ranges, tiny ones, an empty one, and a grid smaller than the chunks
  const std::vector<Spec> store = {{5 * op::kChunk + 100, 0, true}, {2 * op::kChunk, 0, false},
                                   {3 * op::kChunk, 0, true}, {777, 0, false}};
  const std::vector<Spec> mixed = {{op::kChunk + 3, 1, true}, {5, 0, false}, {0, 0, true},
                                   {2 * op::kChunk, 2, false}, {1, 3, true}, {op::kChunk * 2 + 4, 0, true}};
  for (const auto& [name, specs] : {std::pair{"store ranges", store}, std::pair{"mixed", mixed}}) {
    adamw_case(name, specs, {false, false, false, 0});
    adamw_case(name, specs, {true, false, false, 0});
    adamw_case(name, specs, {true, true, false, 0});
    adamw_case(name, specs, {false, true, false, 3});
    adamw_case(name, specs, {true, false, true, 0});
  }

  // the norm: store regions (multiples of kChunk, aligned), tensors whose chunks cross them,
  // a misaligned tensor, a partial last chunk
  std::mt19937 gen(7);
  std::normal_distribution<float> nd;
  std::vector<float> buf(40 * op::kChunk + 64);
  for (float& x : buf) x = nd(gen) * (gen() % 16 == 0 ? 300.0f : 1.0f);
  norm_case("store regions", {{buf.data(), 6 * op::kChunk}, {buf.data() + 8 * op::kChunk, 3 * op::kChunk}});
  norm_case("tensors across chunks", {{buf.data(), 1000}, {buf.data() + 1024, 3 * op::kChunk - 7},
                                      {buf.data() + 4 * op::kChunk, 2 * op::kChunk + 1000}});
  norm_case("misaligned, partial", {{buf.data() + 1, 3 * op::kChunk}, {buf.data() + 20 * op::kChunk, 4 * op::kChunk},
                                    {buf.data() + 30 * op::kChunk + 2, 555}});

  std::printf(g_failures ? "%d FAILED\n" : "all passed\n", g_failures);
  return g_failures ? 1 : 0;
}
