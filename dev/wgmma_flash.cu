// Development harness, not part of the product: the flash attention kernels with Hopper's
// warpgroup MMA (kernels/cuda/flash_wgmma.cuh, Note [Warpgroup products]) and their variant with
// overlapped products (dev/flash_wgmma_pipe.cuh, "wgmma-pipe"; the forward also with two warpgroups per
// block, "wgmma-pipe2") against the mma.sync kernels of
// kernels/cuda/flash_attention.cuh on the same inputs, in one binary (known issue 34): forward, dq
// and dk/dv at D = 64 and 128, their outputs (out, lse, delta, dq, dk, dv) compared bit for bit
// and all three forms timed. Shapes: GPT-2 d12, Llama-3.2-1B and Qwen3-1.7B attention at their
// training sizes, Qwen3-1.7B with ~400-token documents, and small checks with GQA and documents.
// Output per shape: each kernel's ms and TFLOP/s (causal FLOPs without documents), the largest
// difference of the outputs and the fraction bitwise equal, and a float64 host check of a few
// forward rows. Exit status 2 if any output differs from mma.sync's bits (or a forward is not
// close to float64).
//
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -DXT_CUDA \
//     -I csrc -I $(python3 -c "import nvidia.cu13;print(list(nvidia.cu13.__path__)[0])")/include \
//     dev/wgmma_flash.cu -o /tmp/wgmma_flash && /tmp/wgmma_flash
#include "flash_wgmma_pipe.cuh"  // includes kernels/cuda/flash_wgmma.cuh
#include "check.cuh"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace fl = xt::kernels::cuda::flash;
namespace wg = xt::kernels::cuda::flash::wg;
namespace wgp = xt::kernels::cuda::flash::wgp;
using bf16_t = __nv_bfloat16;

namespace {

struct Shape {
  const char* name;
  int B, H, Hkv, S;
  int doc_len;  // documents of about this many tokens (attention within documents), 0: none
};

float bf(bf16_t x) { return __bfloat162float(x); }
float val(bf16_t x) { return bf(x); }
float val(float x) { return x; }

// Mean milliseconds of 20 launches after 3 warm-up ones (CUDA events), negative on a CUDA error.
template <class F>
float time_ms(F&& launch) {
  constexpr int kReps = 20;
  cudaEvent_t e0, e1;
  if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) return -1.f;
  for (int w = 0; w < 3; ++w) launch();
  cudaEventRecord(e0);
  for (int r = 0; r < kReps; ++r) launch();
  cudaEventRecord(e1);
  float ms = -1.f;
  if (cudaEventSynchronize(e1) != cudaSuccess || cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess) ms = -kReps;
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ms / kReps;
}

// The forms compared with mma.sync: the product's wgmma kernels and dev/flash_wgmma_pipe.cuh's.
// The forward has a third, wgmma-pipe2 (two warpgroups per block).
constexpr int kForms = 2, kFwdForms = 3;
const char* const kFormName[kFwdForms] = {"wgmma", "wgmma-pipe", "wgmma-pipe2"};

// Fraction of elements bitwise equal, largest |a - b| and largest |a| of two device arrays.
template <typename T>
struct Diff {
  double max_diff = 0, max_abs = 0;
  int64_t same = 0, n = 0;
  bool equal() const { return same == n; }
  double frac() const { return n ? static_cast<double>(same) / n : 1.0; }
};
template <typename T>
Diff<T> diff(const T* da, const T* db, int64_t n) {
  std::vector<T> a(n), b(n);
  if (cudaMemcpy(a.data(), da, n * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess ||
      cudaMemcpy(b.data(), db, n * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess) {
    std::printf("CUDA error copying outputs back: %s\n", cudaGetErrorString(cudaGetLastError()));
    std::exit(1);
  }
  Diff<T> d;
  d.n = n;
  for (int64_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(val(a[i])), y = static_cast<double>(val(b[i]));
    d.max_diff = std::fmax(d.max_diff, std::fabs(x - y));
    d.max_abs = std::fmax(d.max_abs, std::fabs(x));
    d.same += x == y;
  }
  return d;
}

template <int D>
int run(const Shape& sh, bool timed) {
  const int64_t nq = static_cast<int64_t>(sh.B) * sh.S * sh.H * D, nkv = static_cast<int64_t>(sh.B) * sh.S * sh.Hkv * D;
  std::vector<bf16_t> hq(nq), hk(nkv), hv(nkv);
  uint32_t x = 2024u + sh.S;
  auto uni = [&x]() { x = x * 1664525u + 1013904223u; return (static_cast<float>(x >> 8) / 16777216.f) * 2.f - 1.f; };
  for (auto& e : hq) e = __float2bfloat16(uni());
  for (auto& e : hk) e = __float2bfloat16(uni());
  for (auto& e : hv) e = __float2bfloat16(uni());
  const int64_t nl = static_cast<int64_t>(sh.B) * sh.H * sh.S;
  // [0]: mma.sync, [1 + f]: form f
  bf16_t *q, *k, *v, *o[kFwdForms + 1];
  float* l[kFwdForms + 1];
  CK(cudaMalloc(&q, nq * 2));
  CK(cudaMalloc(&k, nkv * 2));
  CK(cudaMalloc(&v, nkv * 2));
  for (int f = 0; f <= kFwdForms; ++f) {
    CK(cudaMalloc(&o[f], nq * 2));
    CK(cudaMalloc(&l[f], nl * 4));
  }
  CK(cudaMemcpy(q, hq.data(), nq * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(k, hk.data(), nkv * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(v, hv.data(), nkv * 2, cudaMemcpyHostToDevice));
  // document starts per row: lengths doc_len / 2 .. 3 doc_len / 2, a different cut per row
  std::vector<int32_t> hdoc(static_cast<size_t>(sh.B) * sh.S, 0);
  int32_t* doc = nullptr;
  if (sh.doc_len > 0) {
    for (int b_ = 0; b_ < sh.B; ++b_)
      for (int s = 0, start = 0, next = 0; s < sh.S; ++s) {
        if (s == next) {
          start = s;
          next = s + sh.doc_len / 2 + static_cast<int>((s * 7919u + b_ * 104729u) % static_cast<unsigned>(sh.doc_len + 1));
        }
        hdoc[static_cast<size_t>(b_) * sh.S + s] = start;
      }
    CK(cudaMalloc(&doc, hdoc.size() * 4));
    CK(cudaMemcpy(doc, hdoc.data(), hdoc.size() * 4, cudaMemcpyHostToDevice));
  }
  const fl::Dims n = fl::make_dims(sh.B, sh.S, sh.H, sh.Hkv, 1.0 / std::sqrt(static_cast<double>(D)), true, doc);
  constexpr int smem_old = fl::fwd_smem<D>(), smem_new = wg::fwd_smem<D>();
  CK(cudaFuncSetAttribute(fl::flash_forward_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_old));
  CK(cudaFuncSetAttribute(wg::flash_forward_wgmma_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_new));
  CK(cudaFuncSetAttribute(wgp::flash_forward_pipe_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_new));
  constexpr int smem_pair = wgp::fwd_pair_smem<D>();
  CK(cudaFuncSetAttribute(wgp::flash_forward_pair_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_pair));
  auto fwd = [&](int f) {
    if (f == 0) fl::flash_forward_kernel<D><<<fl::forward_grid(n), fl::kBlockThreads, smem_old>>>(q, k, v, o[0], l[0], n);
    else if (f == 1)
      wg::flash_forward_wgmma_kernel<D><<<fl::forward_grid(n), fl::kBlockThreads, smem_new>>>(q, k, v, o[1], l[1], n);
    else if (f == 2)
      wgp::flash_forward_pipe_kernel<D><<<fl::forward_grid(n), fl::kBlockThreads, smem_new>>>(q, k, v, o[2], l[2], n);
    else
      wgp::flash_forward_pair_kernel<D><<<wgp::forward_pair_grid(n), wgp::kPairThreads, smem_pair>>>(q, k, v, o[3], l[3], n);
  };
  for (int f = 0; f <= kFwdForms; ++f) fwd(f);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  bool ok = true;
  std::vector<bool> fwd_ok(kFwdForms + 1, true);
  for (int f = 1; f <= kFwdForms; ++f) {
    const auto od = diff(o[0], o[f], nq);
    const auto ld = diff(l[0], l[f], nl);
    // float64 reference for a few rows of (b = 0, h = 0) and the last (b, h)
    std::vector<bf16_t> b(nq);
    CK(cudaMemcpy(b.data(), o[f], nq * 2, cudaMemcpyDeviceToHost));
    double max_ref = 0;
    const int rows[] = {0, 1, sh.S / 2, sh.S - 1};
    for (int bh = 0; bh < 2; ++bh) {
      const int b_ = bh ? sh.B - 1 : 0, h_ = bh ? sh.H - 1 : 0, hk_ = h_ / (sh.H / sh.Hkv);
      for (int i : rows) {
        const int lo = hdoc[static_cast<size_t>(b_) * sh.S + i];
        std::vector<double> sc(i + 1, -INFINITY);
        double mx = -1e300;
        for (int jj = lo; jj <= i; ++jj) {
          double d = 0;
          for (int c = 0; c < D; ++c)
            d += static_cast<double>(bf(hq[((static_cast<int64_t>(b_) * sh.S + i) * sh.H + h_) * D + c])) *
                 bf(hk[((static_cast<int64_t>(b_) * sh.S + jj) * sh.Hkv + hk_) * D + c]);
          sc[jj] = d / std::sqrt(static_cast<double>(D));
          mx = std::fmax(mx, sc[jj]);
        }
        double den = 0;
        for (auto& e : sc) den += (e = std::exp(e - mx));  // exp(-inf) = 0 before the document
        for (int c = 0; c < D; ++c) {
          double acc = 0;
          for (int jj = 0; jj <= i; ++jj)
            acc += sc[jj] * bf(hv[((static_cast<int64_t>(b_) * sh.S + jj) * sh.Hkv + hk_) * D + c]);
          const double got = bf(b[((static_cast<int64_t>(b_) * sh.S + i) * sh.H + h_) * D + c]);
          max_ref = std::fmax(max_ref, std::fabs(got - acc / den));
        }
      }
    }
    std::printf("%-10s D=%3d: %s forward |new - old| max %.3g (bitwise equal %.4f of elements), lse max %.3g "
                "(bitwise equal %.4f); |new - float64| max %.3g over 8 rows\n",
                sh.name, D, kFormName[f - 1], od.max_diff, od.frac(), ld.max_diff, ld.frac(), max_ref);
    fwd_ok[f] = max_ref < 2e-2 && od.equal() && ld.equal();
    ok = ok && fwd_ok[f];
  }
  if (timed) {
    const double flops = 4.0 * sh.B * sh.H * static_cast<double>(sh.S) * sh.S * D / 2;
    for (int f = 0; f <= kFwdForms; ++f) {
      if (!fwd_ok[f]) continue;
      const float ms = time_ms([&] { fwd(f); });
      std::printf("%-10s D=%3d %-22s %8.3f ms  %6.1f TFLOP/s\n", sh.name, D,
                  (std::string(f ? kFormName[f - 1] : "mma.sync") + " forward").c_str(), ms, flops / (ms * 1e-3) / 1e12);
    }
  }
  // dq: dO random; out and lse from the mma.sync forward (o[0], l[0]); each dq kernel writes its delta
  std::vector<bf16_t> hdo(nq);
  for (auto& e : hdo) e = __float2bfloat16(uni());
  bf16_t *dO, *dq[kForms + 1];
  float* delta[kForms + 1];
  CK(cudaMalloc(&dO, nq * 2));
  CK(cudaMemcpy(dO, hdo.data(), nq * 2, cudaMemcpyHostToDevice));
  for (int f = 0; f <= kForms; ++f) {
    CK(cudaMalloc(&dq[f], nq * 2));
    CK(cudaMalloc(&delta[f], nl * 4));
  }
  constexpr int dq_old = fl::dq_smem<D>(), dq_new = wg::dq_smem<D>();
  CK(cudaFuncSetAttribute(fl::flash_backward_dq_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, dq_old));
  CK(cudaFuncSetAttribute(wg::flash_backward_dq_wgmma_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, dq_new));
  CK(cudaFuncSetAttribute(wgp::flash_backward_dq_pipe_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, dq_new));
  auto dqk = [&](int f) {
    const dim3 g = fl::forward_grid(n);
    if (f == 0) fl::flash_backward_dq_kernel<D><<<g, fl::kBlockThreads, dq_old>>>(q, k, v, o[0], dO, l[0], delta[0], dq[0], n);
    else if (f == 1)
      wg::flash_backward_dq_wgmma_kernel<D><<<g, fl::kBlockThreads, dq_new>>>(q, k, v, o[0], dO, l[0], delta[1], dq[1], n);
    else wgp::flash_backward_dq_pipe_kernel<D><<<g, fl::kBlockThreads, dq_new>>>(q, k, v, o[0], dO, l[0], delta[2], dq[2], n);
  };
  for (int f = 0; f <= kForms; ++f) dqk(f);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<bool> dq_ok(kForms + 1, true);
  for (int f = 1; f <= kForms; ++f) {
    const auto d = diff(dq[0], dq[f], nq);
    const auto dd = diff(delta[0], delta[f], nl);
    dq_ok[f] = d.max_diff <= 2e-2 * d.max_abs && d.equal() && dd.equal();
    ok = ok && dq_ok[f];
    std::printf("%-10s D=%3d: %s dq |new - old| max %.3g of max |dq| %.3g (bitwise equal %.4f of elements); "
                "delta bitwise equal %.4f\n", sh.name, D, kFormName[f - 1], d.max_diff, d.max_abs, d.frac(), dd.frac());
  }
  if (timed) {
    // dq's own work: three products per tile (S, dP, dq), 3 x 2 B H S^2 D, halved by the causal mask
    const double flops = 3.0 * 2.0 * sh.B * sh.H * static_cast<double>(sh.S) * sh.S * D / 2;
    for (int f = 0; f <= kForms; ++f) {
      if (!dq_ok[f]) continue;
      const float ms = time_ms([&] { dqk(f); });
      std::printf("%-10s D=%3d %-22s %8.3f ms  %6.1f TFLOP/s (its three products)\n", sh.name, D,
                  (std::string(f ? kFormName[f - 1] : "mma.sync") + " dq (+delta)").c_str(), ms,
                  flops / (ms * 1e-3) / 1e12);
    }
  }
  // dk, dv: the same inputs, delta as the mma.sync dq kernel wrote it
  bf16_t *dk[kForms + 1], *dv[kForms + 1];
  for (int f = 0; f <= kForms; ++f) {
    CK(cudaMalloc(&dk[f], nkv * 2));
    CK(cudaMalloc(&dv[f], nkv * 2));
  }
  constexpr int kBR = fl::dkdv_rows<D>();
  constexpr int kv_old = fl::dkdv_smem<D>(), kv_new = wg::dkdv_smem<D>();
  CK(cudaFuncSetAttribute(fl::flash_backward_dkdv_kernel<D, kBR>, cudaFuncAttributeMaxDynamicSharedMemorySize, kv_old));
  CK(cudaFuncSetAttribute(wg::flash_backward_dkdv_wgmma_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, kv_new));
  CK(cudaFuncSetAttribute(wgp::flash_backward_dkdv_pipe_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, kv_new));
  auto kvk = [&](int f) {
    const dim3 g = fl::dkdv_grid(n);
    if (f == 0)
      fl::flash_backward_dkdv_kernel<D, kBR><<<g, fl::kBlockThreads, kv_old>>>(q, k, v, dO, l[0], delta[0], dk[0], dv[0], n);
    else if (f == 1)
      wg::flash_backward_dkdv_wgmma_kernel<D><<<g, fl::kBlockThreads, kv_new>>>(q, k, v, dO, l[0], delta[0], dk[1], dv[1], n);
    else
      wgp::flash_backward_dkdv_pipe_kernel<D><<<g, fl::kBlockThreads, kv_new>>>(q, k, v, dO, l[0], delta[0], dk[2], dv[2], n);
  };
  for (int f = 0; f <= kForms; ++f) kvk(f);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<bool> kv_ok(kForms + 1, true);
  for (int f = 1; f <= kForms; ++f)
    for (int which = 0; which < 2; ++which) {
      const auto d = which ? diff(dv[0], dv[f], nkv) : diff(dk[0], dk[f], nkv);
      kv_ok[f] = kv_ok[f] && d.max_diff <= 2e-2 * d.max_abs && d.equal();
      std::printf("%-10s D=%3d: %s %s |new - old| max %.3g of max %.3g (bitwise equal %.4f of elements)\n", sh.name, D,
                  kFormName[f - 1], which ? "dv" : "dk", d.max_diff, d.max_abs, d.frac());
    }
  for (int f = 1; f <= kForms; ++f) ok = ok && kv_ok[f];
  if (timed) {
    // four products per tile (P^T, dv, dP^T, dk), 4 x 2 B H S^2 D, halved by the causal mask
    const double flops = 4.0 * 2.0 * sh.B * sh.H * static_cast<double>(sh.S) * sh.S * D / 2;
    for (int f = 0; f <= kForms; ++f) {
      if (!kv_ok[f]) continue;
      const float ms = time_ms([&] { kvk(f); });
      std::printf("%-10s D=%3d %-22s %8.3f ms  %6.1f TFLOP/s (its four products)\n", sh.name, D,
                  (std::string(f ? kFormName[f - 1] : "mma.sync") + " dk/dv").c_str(), ms, flops / (ms * 1e-3) / 1e12);
    }
  }
  for (int f = 0; f <= kFwdForms; ++f) {
    cudaFree(o[f]);
    cudaFree(l[f]);
  }
  for (int f = 0; f <= kForms; ++f) {
    cudaFree(dq[f]); cudaFree(delta[f]); cudaFree(dk[f]); cudaFree(dv[f]);
  }
  cudaFree(dO); cudaFree(doc); cudaFree(q); cudaFree(k); cudaFree(v);
  return ok ? 0 : 2;
}

}  // namespace

int main() {
  int rc = 0;
  rc |= run<64>({"check", 2, 4, 2, 200, 0}, false);
  rc |= run<128>({"check", 2, 4, 2, 200, 0}, false);
  rc |= run<64>({"check-doc", 2, 4, 2, 333, 70}, false);
  rc |= run<128>({"check-doc", 2, 4, 1, 333, 70}, false);
  rc |= run<64>({"gpt2-d12", 32, 12, 12, 1024, 0}, true);
  rc |= run<64>({"llama-1b", 4, 32, 8, 4096, 0}, true);
  rc |= run<128>({"qwen3-1.7b", 4, 16, 8, 4096, 0}, true);
  rc |= run<128>({"q1.7b-doc", 4, 16, 8, 4096, 400}, true);
  std::printf(rc ? "FAILED: an output differs from mma.sync's bits, or a forward is not close to float64 (see above)\n"
                 : "every output bitwise the mma.sync kernels', the forwards close to float64\n");
  return rc;
}
