// CPU basic kernels against naive loops: broadcast binary, sum_to, permute, gemm (every
// transpose combination, bf16 inputs with a float32 C and beta, K = 0, explicit leading
// dimensions bitwise equal to packed), embedding backward, out-of-range ids reading nothing,
// accumulate, dropout's mask.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "core/philox.h"
#include "kernels/kernels.h"

namespace xt {
namespace {

using namespace kernels;

std::vector<float> random_vec(size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

TEST(KernelsBasic, BinaryBroadcastMatchesIndexMath) {
  // out [2, 3, 4] = a [2, 1, 4] * b [3, 1], without merging dims
  auto a = random_vec(8, 1), b = random_vec(3, 2);
  Broadcast bc;
  bc.ndim = 3;
  int64_t shape[3] = {2, 3, 4}, as[3] = {4, 0, 1}, bs[3] = {0, 1, 0};
  for (int d = 0; d < 3; ++d) {
    bc.shape[d] = shape[d];
    bc.astride[d] = as[d];
    bc.bstride[d] = bs[d];
  }
  std::vector<float> out(24);
  cpu::binary(BinaryOp::Mul, DType::Float32, a.data(), b.data(), out.data(), 24, &bc, nullptr);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) EXPECT_EQ(out[(i * 3 + j) * 4 + k], a[i * 4 + k] * b[j]);
}

TEST(KernelsBasic, SumToMatchesNaive) {
  // in [3, 5, 2] -> out [5, 1] (bstride: dim 0 reduced, dim 2 reduced)
  auto in = random_vec(30, 3);
  Broadcast bc;
  bc.ndim = 3;
  int64_t shape[3] = {3, 5, 2}, is[3] = {10, 2, 1}, os[3] = {0, 1, 0};
  for (int d = 0; d < 3; ++d) {
    bc.shape[d] = shape[d];
    bc.astride[d] = is[d];
    bc.bstride[d] = os[d];
  }
  std::vector<float> out(5, -1.0f);
  cpu::sum_to(DType::Float32, in.data(), out.data(), 5, &bc, nullptr);
  for (int j = 0; j < 5; ++j) {
    double ref = 0;
    for (int i = 0; i < 3; ++i)
      for (int k = 0; k < 2; ++k) ref += in[i * 10 + j * 2 + k];
    EXPECT_FLOAT_EQ(out[j], static_cast<float>(ref));
  }
}

TEST(KernelsBasic, PermuteMatchesNaive) {
  const int64_t shape[4] = {2, 3, 4, 5};
  const int perm[4] = {3, 1, 0, 2};  // out [5, 3, 2, 4]
  std::vector<int64_t> x(120), out(120);
  for (int i = 0; i < 120; ++i) x[i] = i;
  cpu::permute(DType::Int64, x.data(), out.data(), 4, shape, perm, nullptr);
  int64_t o = 0;
  for (int l = 0; l < 5; ++l)
    for (int j = 0; j < 3; ++j)
      for (int i = 0; i < 2; ++i)
        for (int k = 0; k < 4; ++k) EXPECT_EQ(out[o++], ((i * 3 + j) * 4 + k) * 5 + l);
}

// Reference C = op(A) @ op(B) in double; A stored MxK (KxM when ta), B KxN (NxK when tb).
std::vector<double> naive_gemm(bool ta, bool tb, int M, int N, int K, const std::vector<float>& A,
                               const std::vector<float>& B) {
  std::vector<double> C(M * N, 0.0);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < K; ++k)
        C[m * N + n] += double(ta ? A[k * M + m] : A[m * K + k]) * double(tb ? B[n * K + k] : B[k * N + n]);
  return C;
}

TEST(KernelsBasic, GemmEveryTransposeCombination) {
  const int M = 5, N = 7, K = 9, batch = 2;
  auto A = random_vec(batch * M * K, 4), B = random_vec(batch * K * N, 5);
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      std::vector<float> C(batch * M * N);
      cpu::gemm(DType::Float32, DType::Float32, ta, tb, M, N, K, 1.0f, A.data(), B.data(), 0.0f, C.data(), batch,
                M * K, K * N, M * N, nullptr);
      for (int b = 0; b < batch; ++b) {
        std::vector<float> Ab(A.begin() + b * M * K, A.begin() + (b + 1) * M * K);
        std::vector<float> Bb(B.begin() + b * K * N, B.begin() + (b + 1) * K * N);
        auto ref = naive_gemm(ta, tb, M, N, K, Ab, Bb);
        for (int i = 0; i < M * N; ++i) EXPECT_NEAR(C[b * M * N + i], ref[i], 1e-4) << ta << tb;
      }
    }
}

TEST(KernelsBasic, GemmBf16InputsFloatOutputWithBeta) {
  const int M = 3, N = 4, K = 33;
  auto Af = random_vec(M * K, 6), Bf = random_vec(K * N, 7);
  std::vector<bf16> A(M * K), B(K * N);
  for (int i = 0; i < M * K; ++i) {
    A[i] = float_to_bf16(Af[i]);
    Af[i] = bf16_to_float(A[i]);
  }
  for (int i = 0; i < K * N; ++i) {
    B[i] = float_to_bf16(Bf[i]);
    Bf[i] = bf16_to_float(B[i]);
  }
  std::vector<float> C(M * N, 1.0f);
  cpu::gemm(DType::BFloat16, DType::Float32, false, false, M, N, K, 2.0f, A.data(), B.data(), 0.5f, C.data(), 1, 0,
            0, 0, nullptr);
  auto ref = naive_gemm(false, false, M, N, K, Af, Bf);
  for (int i = 0; i < M * N; ++i) EXPECT_NEAR(C[i], 2.0 * ref[i] + 0.5, 1e-4);
  // K = 0: C = beta * C
  cpu::gemm(DType::Float32, DType::Float32, false, false, M, N, 0, 1.0f, Af.data(), Bf.data(), 0.0f, C.data(), 1, 0,
            0, 0, nullptr);
  for (float c : C) EXPECT_EQ(c, 0.0f);
}

// Copy a packed rows x cols matrix of T into rows of stride ld; the padding holds `pad`.
template <typename T>
std::vector<T> with_ld(const std::vector<T>& packed, int rows, int cols, int ld, T pad) {
  std::vector<T> out(static_cast<size_t>(rows) * ld, pad);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) out[r * ld + c] = packed[r * cols + c];
  return out;
}

template <typename T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// gemm_ld on matrices with padded rows (NaN padding in A and B, which must never be read; a
// sentinel in C's padding, which must never be written) gives the packed gemm's bits, for every
// transpose combination, beta 0 and beta != 0, in the compute type T with C in CT.
template <typename T, typename CT>
void check_gemm_ld(DType ab_dt, DType c_dt, T (*from_float)(float), CT (*c_from_float)(float)) {
  const int M = 5, N = 7, K = 9, pad = 3;
  const T nan_t = from_float(std::nanf(""));
  const CT sentinel = c_from_float(-12345.0f);
  auto Af = random_vec(M * K, 11), Bf = random_vec(K * N, 12), Cf = random_vec(M * N, 13);
  std::vector<T> A(M * K), B(K * N);
  std::vector<CT> C0(M * N);
  for (int i = 0; i < M * K; ++i) A[i] = from_float(Af[i]);
  for (int i = 0; i < K * N; ++i) B[i] = from_float(Bf[i]);
  for (int i = 0; i < M * N; ++i) C0[i] = c_from_float(Cf[i]);
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 0.5f}) {
        const int a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
        const int lda = a_cols + pad, ldb = b_cols + 2 * pad, ldc = N + pad;
        std::vector<CT> packed = C0;
        cpu::gemm(ab_dt, c_dt, ta, tb, M, N, K, 1.5f, A.data(), B.data(), beta, packed.data(), 1, M * K, K * N, M * N,
                  nullptr);
        auto As = with_ld(A, a_rows, a_cols, lda, nan_t), Bs = with_ld(B, b_rows, b_cols, ldb, nan_t);
        auto Cs = with_ld(C0, M, N, ldc, sentinel);
        cpu::gemm_ld(ab_dt, c_dt, ta, tb, M, N, K, 1.5f, As.data(), lda, Bs.data(), ldb, beta, Cs.data(), ldc, 1,
                     a_rows * lda, b_rows * ldb, M * ldc, nullptr);
        for (int m = 0; m < M; ++m) {
          for (int n = 0; n < N; ++n)
            EXPECT_TRUE(same_bits(Cs[m * ldc + n], packed[m * N + n])) << ta << tb << beta << " at " << m << "," << n;
          for (int n = N; n < ldc; ++n) EXPECT_TRUE(same_bits(Cs[m * ldc + n], sentinel)) << "padding written";
        }
      }
  // K = 0: C = beta * C on the first N columns only.
  auto Cs = with_ld(C0, M, N, N + pad, sentinel);
  cpu::gemm_ld(ab_dt, c_dt, false, false, M, N, 0, 1.0f, A.data(), 0, B.data(), N, 0.0f, Cs.data(), N + pad, 1, 0,
               0, 0, nullptr);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N + pad; ++n)
      EXPECT_TRUE(same_bits(Cs[m * (N + pad) + n], n < N ? c_from_float(0.0f) : sentinel));
  // A leading dimension below the stored width is refused.
  std::vector<CT> C(M * N);
  EXPECT_THROW(cpu::gemm_ld(ab_dt, c_dt, false, false, M, N, K, 1.0f, A.data(), K - 1, B.data(), N, 0.0f, C.data(),
                            N, 1, 0, 0, 0, nullptr),
               ValueError);
  EXPECT_THROW(cpu::gemm_ld(ab_dt, c_dt, false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C.data(),
                            N - 1, 1, 0, 0, 0, nullptr),
               ValueError);
}

float f32(float v) { return v; }
double f64(float v) { return v; }

TEST(KernelsBasic, GemmLeadingDimensionsMatchPacked) {
  check_gemm_ld<float, float>(DType::Float32, DType::Float32, f32, f32);
  check_gemm_ld<double, double>(DType::Float64, DType::Float64, f64, f64);
  check_gemm_ld<bf16, bf16>(DType::BFloat16, DType::BFloat16, float_to_bf16, float_to_bf16);
  check_gemm_ld<bf16, float>(DType::BFloat16, DType::Float32, float_to_bf16, f32);
}

TEST(KernelsBasic, EmbeddingBackwardSumsInOrderAndRoundsOnce) {
  const int64_t ids[6] = {2, 0, 2, 2, 3, 0};
  const int vocab = 5, dim = 3;
  auto dout = random_vec(6 * dim, 8);
  std::vector<bf16> dout_bf(dout.size());
  for (size_t i = 0; i < dout.size(); ++i) dout_bf[i] = float_to_bf16(dout[i]);
  std::vector<bf16> dtable(vocab * dim, float_to_bf16(7.0f));
  cpu::embedding_backward(DType::BFloat16, DType::Int64, ids, dout_bf.data(), dtable.data(), 6, vocab, dim, false,
                          nullptr);
  for (int v = 0; v < vocab; ++v)
    for (int j = 0; j < dim; ++j) {
      float acc = 0.0f;
      for (int i = 0; i < 6; ++i)
        if (ids[i] == v) acc += bf16_to_float(dout_bf[i * dim + j]);
      EXPECT_EQ(dtable[v * dim + j].bits, float_to_bf16(acc).bits) << v << "," << j;
    }
}

TEST(KernelsBasic, EmbeddingIdsOutOfRangeReadNothing) {
  const int32_t ids[4] = {1, -1, 3, 7};  // vocab 3: -1, 3 and 7 are out of range
  const int vocab = 3, dim = 2;
  const std::vector<float> table = {1, 2, 3, 4, 5, 6};
  std::vector<float> out(4 * dim, 9.0f);
  cpu::embedding_forward(DType::Float32, table.data(), DType::Int32, ids, out.data(), 4, vocab, dim, nullptr);
  EXPECT_EQ(out, (std::vector<float>{3, 4, 0, 0, 0, 0, 0, 0}));
  const std::vector<float> dout = {1, 1, 2, 2, 3, 3, 4, 4};
  std::vector<float> dtable(vocab * dim, 9.0f);
  cpu::embedding_backward(DType::Float32, DType::Int32, ids, dout.data(), dtable.data(), 4, vocab, dim, false, nullptr);
  EXPECT_EQ(dtable, (std::vector<float>{0, 0, 1, 1, 0, 0}));
}

TEST(KernelsBasic, EmbeddingBackwardAccumulatesAsAnAddAfterwards) {
  // accumulate: each element is held + the row's sum made from zero, the bits of writing the
  // gradient and adding it to the held values; rows no id points at are held + 0.
  const int64_t ids[6] = {2, 0, 2, 2, 3, 0};
  const int vocab = 5, dim = 3;
  const auto dout = random_vec(6 * dim, 11);
  const auto held = random_vec(vocab * dim, 12);
  std::vector<float> written(vocab * dim), summed = held;
  cpu::embedding_backward(DType::Float32, DType::Int64, ids, dout.data(), written.data(), 6, vocab, dim, false,
                          nullptr);
  cpu::embedding_backward(DType::Float32, DType::Int64, ids, dout.data(), summed.data(), 6, vocab, dim, true,
                          nullptr);
  for (int k = 0; k < vocab * dim; ++k) EXPECT_EQ(summed[k], held[k] + written[k]) << k;
}

TEST(KernelsBasic, AccumulateAndDropout) {
  auto a = random_vec(100, 9), b = random_vec(100, 10);
  auto acc = a;
  cpu::accumulate(DType::Float32, acc.data(), b.data(), 100, -0.5, nullptr);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(acc[i], a[i] + -0.5f * b[i]);

  std::vector<double> x(1000, 3.0), y(1000);
  const float p = 0.25f;
  cpu::dropout(DType::Float64, x.data(), y.data(), 1000, p, 42, 17, nullptr, nullptr);
  for (int i = 0; i < 1000; ++i) {
    const bool dropped = philox_uniform(42, 17 + i) < p;
    EXPECT_EQ(y[i], dropped ? 0.0 : 3.0 / (1.0 - 0.25)) << i;
  }
  // With device words (a captured graph's): their seed, their offset plus the relative one.
  const uint64_t base[2] = {42, 10};
  std::vector<double> z(1000);
  cpu::dropout(DType::Float64, x.data(), z.data(), 1000, p, 999, 7, base, nullptr);
  EXPECT_EQ(z, y);
}

}  // namespace
}  // namespace xt
