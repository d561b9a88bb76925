// Development harness, not part of the product (known issue 34): the wgmma flash forward timed
// whole and with its copies and/or its softmax taken out (dev/flash_ablate.cuh), at the Qwen3-1.7B,
// Llama-3.2-1B and GPT-2 d12 training shapes. Prints ms per launch for each form.
//
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -DXT_CUDA \
//     -I csrc -I $(python3 -c "import nvidia.cu13;print(list(nvidia.cu13.__path__)[0])")/include \
//     dev/flash_ablate.cu -o /tmp/flash_ablate && /tmp/flash_ablate
#include "flash_ablate.cuh"
#include "check.cuh"

#include <cstdio>
#include <vector>

namespace fl = xt::kernels::cuda::flash;
namespace ab = xt::kernels::cuda::flash::ablate;
using bf16_t = __nv_bfloat16;

namespace {

template <int D, bool kLoads, bool kSoftmax>
int time_form(const char* shape, const char* form, const fl::Dims& n, const bf16_t* q, const bf16_t* k,
              const bf16_t* v, bf16_t* o, float* l) {
  constexpr int smem = fl::wg::fwd_smem<D>();
  CK(cudaFuncSetAttribute(ab::forward_kernel<D, kLoads, kSoftmax>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const float ms = time_ms([&] {
    ab::forward_kernel<D, kLoads, kSoftmax><<<fl::forward_grid(n), fl::kBlockThreads, smem>>>(q, k, v, o, l, n);
  });
  CK(cudaGetLastError());
  const double flops = 4.0 * n.B * n.H * static_cast<double>(n.S) * n.S * D / 2;
  std::printf("%-10s D=%3d %-26s %8.3f ms  %6.1f TFLOP/s\n", shape, D, form, ms, flops / (ms * 1e-3) / 1e12);
  return 0;
}

template <int D>
int run(const char* shape, int B, int H, int Hkv, int S) {
  const int64_t nq = static_cast<int64_t>(B) * S * H * D, nkv = static_cast<int64_t>(B) * S * Hkv * D;
  std::vector<bf16_t> h(nq);
  uint32_t x = 7u;
  for (auto& e : h) {
    x = x * 1664525u + 1013904223u;
    e = __float2bfloat16((static_cast<float>(x >> 8) / 16777216.f) * 2.f - 1.f);
  }
  bf16_t *q, *k, *v, *o;
  float* l;
  CK(cudaMalloc(&q, nq * 2));
  CK(cudaMalloc(&k, nkv * 2));
  CK(cudaMalloc(&v, nkv * 2));
  CK(cudaMalloc(&o, nq * 2));
  CK(cudaMalloc(&l, static_cast<int64_t>(B) * H * S * 4));
  CK(cudaMemcpy(q, h.data(), nq * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(k, h.data(), nkv * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(v, h.data(), nkv * 2, cudaMemcpyHostToDevice));
  const fl::Dims n = fl::make_dims(B, S, H, Hkv, 1.0 / std::sqrt(static_cast<double>(D)), true);
  int rc = 0;
  rc |= time_form<D, true, true>(shape, "whole (the product's)", n, q, k, v, o, l);
  rc |= time_form<D, false, true>(shape, "no copies in the loop", n, q, k, v, o, l);
  rc |= time_form<D, true, false>(shape, "no softmax", n, q, k, v, o, l);
  rc |= time_form<D, false, false>(shape, "products only", n, q, k, v, o, l);
  cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(o); cudaFree(l);
  return rc;
}

}  // namespace

int main() {
  int rc = 0;
  rc |= run<128>("qwen3-1.7b", 4, 16, 8, 4096);
  rc |= run<64>("llama-1b", 4, 32, 8, 4096);
  rc |= run<64>("gpt2-d12", 32, 12, 12, 1024);
  return rc;
}
