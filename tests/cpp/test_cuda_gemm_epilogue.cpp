// kernels::cuda::gemm_epilogue (kernels/cuda/gemm_lt.cu, cuBLASLt) against a host reference on the
// same inputs: Bias (float32, bf16), GeluAuxBias (aux the biased accumulator, C its tanh-GELU) and
// DGelu (the product times GELU's derivative at aux) in bf16, each in both transposes the ops use;
// two calls give the same bits; calls it does not run (aux ld not a multiple of 8, float64, GELU in
// float32) return false and write nothing. Every test skips (with the reason) without a GPU.
#ifdef XT_CUDA
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/bf16.h"
#include "core/cuda_api.h"
#include "kernels/kernels.h"

using namespace xt;
using kernels::GemmEpilogue;

namespace {

#define CK(x) ASSERT_EQ((x), cudaSuccess) << #x

class GemmEpilogueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device visible (" << cuda::runtime_info() << ")";
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    for (void* p : buffers_) cudaFree(p);
    if (stream_) cudaStreamDestroy(stream_);
  }
  // A device copy of host values stored as dt (bf16 rounded to nearest even).
  void* upload(const std::vector<float>& v, DType dt) {
    void* p = nullptr;
    const size_t n = v.size();
    EXPECT_EQ(cudaMalloc(&p, n * 4 + 16), cudaSuccess);
    buffers_.push_back(p);
    if (dt == DType::Float32) {
      EXPECT_EQ(cudaMemcpy(p, v.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    } else {
      std::vector<uint16_t> h(n);
      for (size_t i = 0; i < n; ++i) h[i] = float_to_bf16(v[i]).bits;
      EXPECT_EQ(cudaMemcpy(p, h.data(), n * 2, cudaMemcpyHostToDevice), cudaSuccess);
    }
    return p;
  }
  void* zeros(size_t n) { return upload(std::vector<float>(n, 0.0f), DType::Float32); }
  std::vector<float> download(const void* p, size_t n, DType dt) {
    std::vector<float> out(n);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    if (dt == DType::Float32) {
      EXPECT_EQ(cudaMemcpy(out.data(), p, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    } else {
      std::vector<uint16_t> h(n);
      EXPECT_EQ(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      for (size_t i = 0; i < n; ++i) out[i] = bf16_to_float(bf16{h[i]});
    }
    return out;
  }
  cudaStream_t stream_ = nullptr;
  std::vector<void*> buffers_;
};

std::vector<float> randn(size_t n, unsigned seed, float scale, DType dt) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd;
  std::vector<float> v(n);
  for (float& e : v) {
    e = scale * nd(g);
    if (dt == DType::BFloat16) e = bf16_to_float(float_to_bf16(e));  // the values the GPU sees
  }
  return v;
}

double gelu(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
double dgelu(double x) {
  const double t = std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
}

// Row-major C = op(A) @ op(B) in double: A [M, K] (ta: stored [K, M]), B [K, N] (tb: stored [N, K]).
std::vector<double> product(const std::vector<float>& A, const std::vector<float>& B, bool ta, bool tb, int M, int N,
                            int K) {
  std::vector<double> C(static_cast<size_t>(M) * N, 0.0);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = 0;
      for (int k = 0; k < K; ++k)
        s += double(ta ? A[k * M + i] : A[i * K + k]) * double(tb ? B[j * K + k] : B[k * N + j]);
      C[static_cast<size_t>(i) * N + j] = s;
    }
  return C;
}

void expect_near_all(const std::vector<float>& got, const std::vector<double>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (std::fabs(want[i]) + scale * 0.1)) << what << " at " << i;
}

TEST_F(GemmEpilogueTest, EveryEpilogueMatchesTheHostReference) {
  const int M = 96, N = 64, K = 48;
  for (const DType dt : {DType::Float32, DType::BFloat16}) {
    const double tol = dt == DType::Float32 ? 1e-5 : 3e-2;
    for (const bool tb : {true, false}) {
      const std::vector<float> a = randn(size_t(M) * K, 1, 1.0f, dt), b = randn(size_t(K) * N, 2, 0.3f, dt),
                               bias = randn(N, 3, 0.5f, dt);
      void* dA = upload(a, dt);
      void* dB = upload(b, dt);
      void* dbias = upload(bias, dt);
      void* dC = zeros(size_t(M) * N);
      void* daux = zeros(size_t(M) * N);
      const std::vector<double> ab = product(a, b, false, tb, M, N, K);
      // Bias
      ASSERT_TRUE(kernels::cuda::gemm_epilogue(dt, GemmEpilogue::Bias, false, tb, M, N, K, dA, dB, dC, dbias, nullptr,
                                               stream_));
      std::vector<double> want(ab.size());
      for (size_t i = 0; i < ab.size(); ++i) want[i] = ab[i] + bias[i % N];
      expect_near_all(download(dC, ab.size(), dt), want, tol, "bias");
      if (dt == DType::Float32) continue;  // the GELU epilogues run in bf16 only
      // GeluAuxBias: aux = AB + bias, C = gelu(aux)
      ASSERT_TRUE(kernels::cuda::gemm_epilogue(dt, GemmEpilogue::GeluAuxBias, false, tb, M, N, K, dA, dB, dC, dbias,
                                               daux, stream_));
      expect_near_all(download(daux, ab.size(), dt), want, tol, "aux");
      std::vector<double> want_gelu(ab.size());
      for (size_t i = 0; i < ab.size(); ++i) want_gelu[i] = gelu(want[i]);
      expect_near_all(download(dC, ab.size(), dt), want_gelu, tol, "gelu");
      // DGelu: C = AB * gelu'(aux), with the aux just written
      const std::vector<float> aux = download(daux, ab.size(), dt);
      ASSERT_TRUE(kernels::cuda::gemm_epilogue(dt, GemmEpilogue::DGelu, false, tb, M, N, K, dA, dB, dC, nullptr, daux,
                                               stream_));
      std::vector<double> want_d(ab.size());
      for (size_t i = 0; i < ab.size(); ++i) want_d[i] = ab[i] * dgelu(aux[i]);
      expect_near_all(download(dC, ab.size(), dt), want_d, tol, "dgelu");
    }
  }
}

TEST_F(GemmEpilogueTest, TwoCallsGiveTheSameBits) {
  const int M = 4096, N = 3072, K = 768;  // GPT-2 d12's c_fc at 4096 rows
  const DType dt = DType::BFloat16;
  void* dA = upload(randn(size_t(M) * K, 4, 1.0f, dt), dt);
  void* dB = upload(randn(size_t(N) * K, 5, 0.05f, dt), dt);
  void* dbias = upload(randn(N, 6, 0.5f, dt), dt);
  std::vector<std::vector<float>> outs;
  for (int run = 0; run < 2; ++run) {
    void* dC = zeros(size_t(M) * N);
    void* daux = zeros(size_t(M) * N);
    ASSERT_TRUE(kernels::cuda::gemm_epilogue(dt, GemmEpilogue::GeluAuxBias, false, true, M, N, K, dA, dB, dC, dbias,
                                             daux, stream_));
    outs.push_back(download(dC, size_t(M) * N, dt));
    outs.push_back(download(daux, size_t(M) * N, dt));
  }
  ASSERT_EQ(0, std::memcmp(outs[0].data(), outs[2].data(), outs[0].size() * 4)) << "C differs run to run";
  ASSERT_EQ(0, std::memcmp(outs[1].data(), outs[3].data(), outs[1].size() * 4)) << "aux differs run to run";
}

TEST_F(GemmEpilogueTest, QueriesWithoutAnAlgorithmWriteNothing) {
  const int M = 16, N = 20, K = 16;  // aux ld 20: not a multiple of 8
  const DType dt = DType::BFloat16;
  void* dA = upload(randn(size_t(M) * K, 7, 1.0f, dt), dt);
  void* dB = upload(randn(size_t(N) * K, 8, 1.0f, dt), dt);
  void* dbias = upload(randn(N, 9, 1.0f, dt), dt);
  void* dC = zeros(size_t(M) * N);
  void* daux = zeros(size_t(M) * N);
  EXPECT_FALSE(kernels::cuda::gemm_epilogue(dt, GemmEpilogue::GeluAuxBias, false, true, M, N, K, dA, dB, dC, dbias,
                                            daux, stream_));
  EXPECT_FALSE(kernels::cuda::gemm_epilogue(DType::Float64, GemmEpilogue::Bias, false, true, M, N, K, dA, dB, dC,
                                            dbias, nullptr, stream_));
  EXPECT_FALSE(kernels::cuda::gemm_epilogue(DType::Float32, GemmEpilogue::GeluAuxBias, false, true, M, 16, K, dA, dB,
                                            dC, dbias, daux, stream_));
  for (float v : download(dC, size_t(M) * N, DType::Float32)) ASSERT_EQ(v, 0.0f);
}

}  // namespace
#endif  // XT_CUDA
