// Development harness, not part of the product: the flash attention kernels with Hopper's
// warpgroup MMA (kernels/cuda/flash_wgmma.cuh, Note [Warpgroup products]) against the mma.sync
// kernels of kernels/cuda/flash_attention.cuh on the same inputs, in one binary (known issue 34):
// forward, dq and dk/dv at D = 64 and 128, their outputs (out, lse, delta, dq, dk, dv) compared bit
// for bit and both timed. Shapes: GPT-2 d12, Llama-3.2-1B and Qwen3-1.7B attention at their
// training sizes, Qwen3-1.7B with ~400-token documents, and small checks with GQA and documents.
// The forward also in the dev variant of dev/flash_fwd_overlap.cuh ("wgmma-overlap": the two
// products overlapped), checked against mma.sync's bits and timed beside the product's.
// Output per shape: each kernel's ms and TFLOP/s (causal FLOPs without documents), the largest
// difference of the outputs and the fraction bitwise equal, and a float64 host check of a few
// forward rows. Exit status 2 if any output differs from mma.sync's bits (or a forward is not
// close to float64).
//
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -DXT_CUDA \
//     -I csrc -I $(python3 -c "import nvidia.cu13;print(list(nvidia.cu13.__path__)[0])")/include \
//     dev/wgmma_flash.cu -o /tmp/wgmma_flash && /tmp/wgmma_flash
#include "flash_fwd_overlap.cuh"  // includes kernels/cuda/flash_wgmma.cuh
#include "check.cuh"

#include <cmath>
#include <cstdio>
#include <vector>

namespace fl = xt::kernels::cuda::flash;
namespace wg = xt::kernels::cuda::flash::wg;
namespace wgo = xt::kernels::cuda::flash::wgo;
using bf16_t = __nv_bfloat16;

namespace {

struct Shape {
  const char* name;
  int B, H, Hkv, S;
  int doc_len;  // documents of about this many tokens (attention within documents), 0: none
};

float bf(bf16_t x) { return __bfloat162float(x); }

// The largest |a - b| of two bf16 outputs and how many of their elements are bitwise equal.
struct Diff {
  double max = 0;
  int64_t same = 0;
};
Diff compare(const std::vector<bf16_t>& a, const std::vector<bf16_t>& b) {
  Diff d;
  for (size_t i = 0; i < a.size(); ++i) {
    d.max = std::fmax(d.max, std::fabs(bf(a[i]) - bf(b[i])));
    d.same += bf(a[i]) == bf(b[i]);
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
  bf16_t *q, *k, *v, *o1, *o2;
  float *l1, *l2;
  const int64_t nl = static_cast<int64_t>(sh.B) * sh.H * sh.S;
  CK(cudaMalloc(&q, nq * 2));
  CK(cudaMalloc(&k, nkv * 2));
  CK(cudaMalloc(&v, nkv * 2));
  CK(cudaMalloc(&o1, nq * 2));
  CK(cudaMalloc(&o2, nq * 2));
  CK(cudaMalloc(&l1, nl * 4));
  CK(cudaMalloc(&l2, nl * 4));
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
  auto launch_old = [&] {
    fl::flash_forward_kernel<D><<<fl::forward_grid(n), fl::kBlockThreads, smem_old>>>(q, k, v, o1, l1, n);
  };
  // the wgmma kernels read q, k, v (and dO) through tensor maps (Note [Tiles by the Tensor Memory
  // Accelerator]), made here as flash_attention.cu makes them
  const char* form = "wgmma";
  CUtensorMap tq{}, tk{}, tv{}, tdo{};
  if (!(wg::make_head_map(&tq, q, sh.B, sh.S, sh.H, D) && wg::make_head_map(&tk, k, sh.B, sh.S, sh.Hkv, D) &&
        wg::make_head_map(&tv, v, sh.B, sh.S, sh.Hkv, D))) {
    std::printf("%-10s D=%3d: no tensor map (the driver's encoder refused)\n", sh.name, D);
    return 2;
  }
  auto launch_new = [&] {
    wg::flash_forward_wgmma_kernel<D><<<fl::forward_grid(n), fl::kBlockThreads, smem_new>>>(tq, tk, tv, o2, l2, n);
  };
  launch_old();
  launch_new();
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<bf16_t> a(nq), b(nq);
  std::vector<float> la(nl), lb(nl);
  CK(cudaMemcpy(a.data(), o1, nq * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(b.data(), o2, nq * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(la.data(), l1, nl * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(lb.data(), l2, nl * 4, cudaMemcpyDeviceToHost));
  const Diff fwd = compare(a, b);
  const double max_o = fwd.max;
  int64_t same = fwd.same;
  double max_l = 0;
  for (int64_t i = 0; i < nl; ++i) max_l = std::fmax(max_l, std::fabs(la[i] - lb[i]));
  // float64 reference for a few rows of (b = 0, h = 0) and the last (b, h)
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
  std::printf("%-10s D=%3d: %s forward |new - old| max %.3g (bitwise equal %.4f of elements), lse max %.3g; "
              "|new - float64| max %.3g over 8 rows\n",
              sh.name, D, form, max_o, static_cast<double>(same) / nq, max_l, max_ref);
  int64_t lse_same = 0;
  for (int64_t i = 0; i < nl; ++i) lse_same += la[i] == lb[i];
  const bool ok = max_ref < 2e-2 && same == nq && lse_same == nl;
  if (timed && ok) {
    const double flops = 4.0 * sh.B * sh.H * static_cast<double>(sh.S) * sh.S * D / 2;
    for (int which = 0; which < 2; ++which) {
      const float ms = which ? time_ms(launch_new) : time_ms(launch_old);
      std::printf("%-10s D=%3d %-22s %8.3f ms  %6.1f TFLOP/s\n", sh.name, D,
                  which ? (std::string(form) + " forward").c_str() : "mma.sync forward", ms, flops / (ms * 1e-3) / 1e12);
    }
  }
  // the dev variant (dev/flash_fwd_overlap.cuh): its outputs against mma.sync's bits, then timed
  bool ov_ok = true;
  {
    constexpr int smem_ov = wg::fwd_smem<D>();
    CK(cudaFuncSetAttribute(wgo::flash_forward_overlap_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            smem_ov));
    auto launch_ov = [&] {
      wgo::flash_forward_overlap_kernel<D><<<fl::forward_grid(n), fl::kBlockThreads, smem_ov>>>(tq, tk, tv, o2, l2, n);
    };
    CK(cudaMemset(o2, 0, nq * 2));
    launch_ov();
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(b.data(), o2, nq * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(lb.data(), l2, nl * 4, cudaMemcpyDeviceToHost));
    const Diff ov = compare(a, b);
    int64_t lse_ov = 0;
    for (int64_t i = 0; i < nl; ++i) lse_ov += la[i] == lb[i];
    ov_ok = ov.same == nq && lse_ov == nl;
    std::printf("%-10s D=%3d: wgmma-overlap forward |new - old| max %.3g (bitwise equal %.4f of elements), lse "
                "bitwise equal %.4f\n", sh.name, D, ov.max, static_cast<double>(ov.same) / nq,
                static_cast<double>(lse_ov) / nl);
    if (timed && ov_ok) {
      const double flops = 4.0 * sh.B * sh.H * static_cast<double>(sh.S) * sh.S * D / 2;
      const float ms = time_ms(launch_ov);
      std::printf("%-10s D=%3d %-22s %8.3f ms  %6.1f TFLOP/s\n", sh.name, D, "wgmma-overlap forward", ms,
                  flops / (ms * 1e-3) / 1e12);
    }
  }
  // dq: dO random; out and lse from the mma.sync forward (o1, l1); each dq kernel writes its delta
  std::vector<bf16_t> hdo(nq);
  for (auto& e : hdo) e = __float2bfloat16(uni());
  bf16_t *dO, *dq1, *dq2;
  float *delta1, *delta2;
  CK(cudaMalloc(&dO, nq * 2));
  CK(cudaMalloc(&dq1, nq * 2));
  CK(cudaMalloc(&dq2, nq * 2));
  CK(cudaMalloc(&delta1, nl * 4));
  CK(cudaMalloc(&delta2, nl * 4));
  CK(cudaMemcpy(dO, hdo.data(), nq * 2, cudaMemcpyHostToDevice));
  constexpr int dq_old = fl::dq_smem<D>(), dq_new = wg::dq_smem<D>();
  CK(cudaFuncSetAttribute(fl::flash_backward_dq_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, dq_old));
  CK(cudaFuncSetAttribute(wg::flash_backward_dq_wgmma_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, dq_new));
  auto dq_launch_old = [&] {
    fl::flash_backward_dq_kernel<D><<<fl::forward_grid(n), fl::kBlockThreads, dq_old>>>(q, k, v, o1, dO, l1, delta1, dq1, n);
  };
  if (!wg::make_head_map(&tdo, dO, sh.B, sh.S, sh.H, D)) return 2;
  auto dq_launch_new = [&] {
    wg::flash_backward_dq_wgmma_kernel<D><<<fl::forward_grid(n), fl::kBlockThreads, dq_new>>>(tq, tk, tv, tdo, o1, dO,
                                                                                            l1, delta2, dq2, n);
  };
  dq_launch_old();
  dq_launch_new();
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(a.data(), dq1, nq * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(b.data(), dq2, nq * 2, cudaMemcpyDeviceToHost));
  double max_dq = 0, max_ref_dq = 0;
  same = 0;
  for (int64_t i = 0; i < nq; ++i) {
    max_dq = std::fmax(max_dq, std::fabs(bf(a[i]) - bf(b[i])));
    max_ref_dq = std::fmax(max_ref_dq, std::fabs(bf(a[i])));
    same += bf(a[i]) == bf(b[i]);
  }
  std::vector<float> d1(nl), d2(nl);
  CK(cudaMemcpy(d1.data(), delta1, nl * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(d2.data(), delta2, nl * 4, cudaMemcpyDeviceToHost));
  int64_t delta_same = 0;
  for (int64_t i = 0; i < nl; ++i) delta_same += d1[i] == d2[i];
  const bool dq_ok = max_dq <= 2e-2 * max_ref_dq && same == nq && delta_same == nl;
  std::printf("%-10s D=%3d: %s dq |new - old| max %.3g of max |dq| %.3g (bitwise equal %.4f of elements); "
              "delta bitwise equal %.4f\n", sh.name, D, form, max_dq, max_ref_dq, static_cast<double>(same) / nq,
              static_cast<double>(delta_same) / nl);
  if (timed && dq_ok) {
    // dq's own work: three products per tile (S, dP, dq), 3 x 2 B H S^2 D, halved by the causal mask
    const double flops = 3.0 * 2.0 * sh.B * sh.H * static_cast<double>(sh.S) * sh.S * D / 2;
    for (int which = 0; which < 2; ++which) {
      const float ms = which ? time_ms(dq_launch_new) : time_ms(dq_launch_old);
      std::printf("%-10s D=%3d %-22s %8.3f ms  %6.1f TFLOP/s (its three products)\n", sh.name, D,
                  which ? (std::string(form) + " dq (+delta)").c_str() : "mma.sync dq (+delta)", ms,
                  flops / (ms * 1e-3) / 1e12);
    }
  }
  // dk, dv: the same inputs, delta as each dq kernel wrote it
  bf16_t *dk1, *dk2, *dv1, *dv2;
  CK(cudaMalloc(&dk1, nkv * 2));
  CK(cudaMalloc(&dk2, nkv * 2));
  CK(cudaMalloc(&dv1, nkv * 2));
  CK(cudaMalloc(&dv2, nkv * 2));
  constexpr int kBR = fl::dkdv_rows<D>();
  constexpr int kv_old = fl::dkdv_smem<D>(), kv_new = wg::dkdv_smem<D>();
  CK(cudaFuncSetAttribute(fl::flash_backward_dkdv_kernel<D, kBR>, cudaFuncAttributeMaxDynamicSharedMemorySize, kv_old));
  CK(cudaFuncSetAttribute(wg::flash_backward_dkdv_wgmma_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, kv_new));
  auto kv_launch_old = [&] {
    fl::flash_backward_dkdv_kernel<D, kBR><<<fl::dkdv_grid(n), fl::kBlockThreads, kv_old>>>(q, k, v, dO, l1, delta1,
                                                                                           dk1, dv1, n);
  };
  auto kv_launch_new = [&] {
    wg::flash_backward_dkdv_wgmma_kernel<D><<<fl::dkdv_grid(n), fl::kBlockThreads, kv_new>>>(tq, tk, tv, tdo, l1,
                                                                                            delta2, dk2, dv2, n);
  };
  kv_launch_old();
  kv_launch_new();
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  bool kv_ok = true;
  for (int which = 0; which < 2; ++which) {
    std::vector<bf16_t> ga(nkv), gb(nkv);
    CK(cudaMemcpy(ga.data(), which ? dv1 : dk1, nkv * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gb.data(), which ? dv2 : dk2, nkv * 2, cudaMemcpyDeviceToHost));
    double diff = 0, mag = 0;
    int64_t eq = 0;
    for (int64_t i = 0; i < nkv; ++i) {
      diff = std::fmax(diff, std::fabs(bf(ga[i]) - bf(gb[i])));
      mag = std::fmax(mag, std::fabs(bf(ga[i])));
      eq += bf(ga[i]) == bf(gb[i]);
    }
    kv_ok = kv_ok && diff <= 2e-2 * mag && eq == nkv;
    std::printf("%-10s D=%3d: %s %s |new - old| max %.3g of max %.3g (bitwise equal %.4f of elements)\n", sh.name,
                D, form, which ? "dv" : "dk", diff, mag, static_cast<double>(eq) / nkv);
  }
  if (timed && kv_ok) {
    // four products per tile (P^T, dv, dP^T, dk), 4 x 2 B H S^2 D, halved by the causal mask
    const double flops = 4.0 * 2.0 * sh.B * sh.H * static_cast<double>(sh.S) * sh.S * D / 2;
    for (int which = 0; which < 2; ++which) {
      const float ms = which ? time_ms(kv_launch_new) : time_ms(kv_launch_old);
      std::printf("%-10s D=%3d %-22s %8.3f ms  %6.1f TFLOP/s (its four products)\n", sh.name, D,
                  which ? (std::string(form) + " dk/dv").c_str() : "mma.sync dk/dv", ms, flops / (ms * 1e-3) / 1e12);
    }
  }
  cudaFree(dk1); cudaFree(dk2); cudaFree(dv1); cudaFree(dv2);
  cudaFree(dO); cudaFree(dq1); cudaFree(dq2); cudaFree(delta1); cudaFree(delta2); cudaFree(doc);
  cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(o1); cudaFree(o2); cudaFree(l1); cudaFree(l2);
  return ok && ov_ok && dq_ok && kv_ok ? 0 : 2;
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
