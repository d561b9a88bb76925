// Development probe, not part of the product: the first step of a Hopper attention (known issue 34).
// xtrain's flash kernels use mma.sync (16 x 8 x 16 per warp, operands through ldmatrix); Hopper's
// warpgroup MMA (wgmma.mma_async, 64 x N x 16 per 4 warps) reads its operands straight from shared
// memory through 64-bit matrix descriptors (start address, leading- and stride-dimension byte
// offsets, swizzle mode; each field in units of 16 bytes). This checks, on the GPU, how those
// descriptors address a tile before a kernel depends on it, in the three forms a flash attention
// forward needs: S = Q K^T (both operands K-major in shared memory), O += P V with P in registers
// (the accumulator of S rounded to bf16, A from registers) and V as it lies in memory, [keys, D]
// row-major (B "MN-major", the instruction's transpose flag set). For each shared-memory layout
// below the host lays out the operands (bf16 integers in [-4, 4], so every product and sum is
// exact in float32), one warpgroup runs a 64 x 64 x 64 product as four k-steps of wgmma
// m64n64k16 (float32 accumulators), and C is compared exactly with the host's product. Each line:
// the form, the layout and its descriptor fields, and "ok" or the count of wrong elements.
//
//   nvcc -std=c++17 -gencode arch=compute_90a,code=sm_90a dev/wgmma_probe.cu -o /tmp/wgmma_probe && /tmp/wgmma_probe
//
// (wgmma needs the sm_90a target: the product builds sm_90, so a kernel using it needs its own
// architecture flag, known issue 34.)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "check.cuh"

namespace {

constexpr int M = 64, N = 64, K = 64, kSteps = K / 16;
constexpr int kTileBytes = 64 * 64 * 2;  // one operand's tile, whatever the layout

// A shared-memory layout of a 64 x 64 bf16 K-major tile (row r = m or n, column k): the byte offset
// of each element, and the descriptor fields of k-step s (start offset, LBO, SBO, swizzle code).
struct Layout {
  const char* name;
  int (*offset)(int r, int k);  // K-major: (row m or n, k); MN-major (trans_b): (k, n)
  int step_start;  // bytes added to the start address per k-step of 16
  int lbo, sbo, swizzle;
  bool trans_b;    // B given MN-major ([K, N] row-major, as V [keys, D]); A stays K-major (core_k_major)
  bool a_in_regs;  // A from registers (the m16n8k16 fragment layout per warp), B from shared memory
};

// No swizzle: 8 x 8 core matrices (8 rows of 16 bytes, 128 contiguous bytes), the 8 core matrices
// of one row group along K next to each other (K-adjacent 128 bytes apart, M-adjacent 1024).
int core_k_major(int r, int k) { return ((r / 8) * (K / 8) + k / 8) * 128 + (r % 8) * 16 + (k % 8) * 2; }
// No swizzle, the 8 row groups of one K column of core matrices next to each other (M-adjacent 128
// bytes apart, K-adjacent 1024).
int core_m_major(int r, int k) { return ((k / 8) * (M / 8) + r / 8) * 128 + (r % 8) * 16 + (k % 8) * 2; }
// 128-byte swizzle: a row's 64 elements in 128 bytes, its eight 16-byte chunks permuted by XOR with
// the row's index within its group of 8 (the tile's base 1024-byte aligned).
int swizzle128(int r, int k) { return r * 128 + (((k / 8) ^ (r % 8)) * 16) + (k % 8) * 2; }
// MN-major B ([K, N] row-major): no swizzle, core matrices of 8 k-rows x 8 n (16 contiguous bytes
// per k-row), N-adjacent cores 128 bytes apart and K-adjacent 1024 (or the other way round).
int mn_cores_n_adjacent(int k, int n) { return ((k / 8) * (N / 8) + n / 8) * 128 + (k % 8) * 16 + (n % 8) * 2; }
int mn_cores_k_adjacent(int k, int n) { return ((n / 8) * (K / 8) + k / 8) * 128 + (k % 8) * 16 + (n % 8) * 2; }
// MN-major B with the 128-byte swizzle: k-row k holds the 64 n in 128 bytes, chunks XOR (k % 8)
// (what a TMA copy with the 128-byte swizzle makes of a row-major [keys, D] tile of V).
int mn_swizzle128(int k, int n) { return k * 128 + (((n / 8) ^ (k % 8)) * 16) + (n % 8) * 2; }

const Layout kLayouts[] = {
    // S = Q K^T: both K-major. LBO = K-direction core distance, SBO = M/N-direction: the reading of
    // the PTX manual; each layout also with the two fields exchanged (should fail if it is right)
    {"SS K-major: no swizzle, K-adjacent cores, LBO=128 SBO=1024", core_k_major, 256, 128, 1024, 0, false, false},
    {"SS K-major: no swizzle, K-adjacent cores, LBO=1024 SBO=128", core_k_major, 256, 1024, 128, 0, false, false},
    {"SS K-major: no swizzle, M-adjacent cores, LBO=1024 SBO=128", core_m_major, 2048, 1024, 128, 0, false, false},
    {"SS K-major: no swizzle, M-adjacent cores, LBO=128 SBO=1024", core_m_major, 2048, 128, 1024, 0, false, false},
    // 128-byte swizzle: k-step s starts 32 bytes further into the row; SBO = 8 rows of 128 bytes
    {"SS K-major: 128B swizzle, start +32 per k-step, SBO=1024", swizzle128, 32, 16, 1024, 1, false, false},
    // O += P V: A (P) from registers, B (V) K-major first (the layout above), then MN-major
    {"RS, B K-major: no swizzle, K-adjacent cores, LBO=128 SBO=1024", core_k_major, 256, 128, 1024, 0, false, true},
    {"RS, B K-major: 128B swizzle, start +32 per k-step, SBO=1024", swizzle128, 32, 16, 1024, 1, false, true},
    {"SS, B MN-major: no swizzle, N-adjacent cores, LBO=128 SBO=1024", mn_cores_n_adjacent, 2048, 128, 1024, 0, true, false},
    {"SS, B MN-major: no swizzle, N-adjacent cores, LBO=1024 SBO=128", mn_cores_n_adjacent, 2048, 1024, 128, 0, true, false},
    {"SS, B MN-major: no swizzle, K-adjacent cores, LBO=128 SBO=1024", mn_cores_k_adjacent, 256, 128, 1024, 0, true, false},
    {"SS, B MN-major: no swizzle, K-adjacent cores, LBO=1024 SBO=128", mn_cores_k_adjacent, 256, 1024, 128, 0, true, false},
    {"SS, B MN-major: 128B swizzle, start +2048 per k-step, LBO=16 SBO=1024", mn_swizzle128, 2048, 16, 1024, 1, true, false},
    {"SS, B MN-major: 128B swizzle, start +2048 per k-step, LBO=1024 SBO=16", mn_swizzle128, 2048, 1024, 16, 1, true, false},
    {"RS, B MN-major: 128B swizzle, start +2048 per k-step, LBO=16 SBO=1024", mn_swizzle128, 2048, 16, 1024, 1, true, true},
};

__device__ __forceinline__ uint64_t descriptor(uint32_t smem_addr, int lbo, int sbo, int swizzle) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((smem_addr >> 4) & 0x3FFF);
  d |= static_cast<uint64_t>((static_cast<uint32_t>(lbo) >> 4) & 0x3FFF) << 16;
  d |= static_cast<uint64_t>((static_cast<uint32_t>(sbo) >> 4) & 0x3FFF) << 32;
  d |= static_cast<uint64_t>(swizzle & 3) << 62;
  return d;
}

#define XT_ACC32                                                                                             \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),  \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),   \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),  \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define XT_D32                                                                                              \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"

// d += A B over one k-step of 16: A from shared memory (descriptor da), B from shared memory (db),
// B K-major or, with kTransB, MN-major.
template <int kTransB>
__device__ __forceinline__ void wgmma_ss(float (&d)[32], uint64_t da, uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " XT_D32 ", %32, %33, 1, 1, 1, 0, %34;\n"
               : XT_ACC32
               : "l"(da), "l"(db), "n"(kTransB)
               : "memory");
}

// d += A B over one k-step of 16 with A from registers (a: the m16n8k16 A fragment of this warp's 16
// rows) and B from shared memory.
template <int kTransB>
__device__ __forceinline__ void wgmma_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " XT_D32
               ", {%32, %33, %34, %35}, %36, 1, 1, 1, %37;\n"
               : XT_ACC32
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(kTransB)
               : "memory");
}

struct Desc {
  int step_start, lbo, sbo, swizzle;
};

__device__ __forceinline__ uint32_t pack2(const __nv_bfloat16* p) {  // p[0] in the low half
  return static_cast<uint32_t>(__bfloat16_as_ushort(p[0])) | (static_cast<uint32_t>(__bfloat16_as_ushort(p[1])) << 16);
}

// C [64, 64] (float32, row-major) = A B^T, one warpgroup of 128 threads: A from the shared-memory
// image a_img (layout ad) or, with kRegA, from registers loaded from a_rows ([64, 64] row-major
// bf16); B from the image b_img (layout bd; MN-major with kTransB).
template <int kTransB, bool kRegA>
__global__ void __launch_bounds__(128) probe_kernel(const uint8_t* a_img, const __nv_bfloat16* a_rows,
                                                      const uint8_t* b_img, float* c, Desc ad, Desc bd) {
  __shared__ __align__(1024) uint8_t sa[kTileBytes];
  __shared__ __align__(1024) uint8_t sb[kTileBytes];
  const int t = threadIdx.x, w = t / 32, lane = t % 32;
  for (int i = t * 16; i < kTileBytes; i += 128 * 16) {
    *reinterpret_cast<uint4*>(sa + i) = *reinterpret_cast<const uint4*>(a_img + i);
    *reinterpret_cast<uint4*>(sb + i) = *reinterpret_cast<const uint4*>(b_img + i);
  }
  // the generic-proxy stores above must be visible to wgmma's async proxy
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();

  uint32_t a[kSteps][4];  // with kRegA: rows 16w + lane / 4 (+ 8), columns 16s + 2 (lane % 4) (+ 8), pairs
  if constexpr (kRegA) {
    const int r = 16 * w + lane / 4;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const int col = 16 * s + 2 * (lane % 4);
      a[s][0] = pack2(a_rows + r * K + col);
      a[s][1] = pack2(a_rows + (r + 8) * K + col);
      a[s][2] = pack2(a_rows + r * K + col + 8);
      a[s][3] = pack2(a_rows + (r + 8) * K + col + 8);
    }
  }
  float d[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) d[i] = 0.f;
  const uint32_t a0 = static_cast<uint32_t>(__cvta_generic_to_shared(sa));
  const uint32_t b0 = static_cast<uint32_t>(__cvta_generic_to_shared(sb));
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    const uint64_t db = descriptor(b0 + s * bd.step_start, bd.lbo, bd.sbo, bd.swizzle);
    if constexpr (kRegA)
      wgmma_rs<kTransB>(d, a[s], db);
    else
      wgmma_ss<kTransB>(d, descriptor(a0 + s * ad.step_start, ad.lbo, ad.sbo, ad.swizzle), db);
  }
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");

  // Accumulator layout (as mma.sync's m16n8 fragment, repeated): warp w holds rows 16w .. 16w + 15;
  // d[4j + e] is row 16w + lane / 4 + 8 (e / 2), column 8j + 2 (lane % 4) + e % 2.
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = 16 * w + lane / 4 + 8 * (e / 2), col = 8 * j + 2 * (lane % 4) + e % 2;
      c[row * N + col] = d[4 * j + e];
    }
}

}  // namespace

int main() {
  int dev = 0, major = 0, minor = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  std::printf("compute capability %d.%d\n", major, minor);
  if (major != 9) {
    std::printf("wgmma needs compute capability 9.0 (Hopper)\n");
    return 1;
  }
  // A [M, K], B [N, K]: small integers, exact in bf16 and in every float32 partial sum
  std::vector<float> A(M * K), B(N * K), want(M * N, 0.f);
  uint32_t x = 12345u;
  auto next = [&x]() { x = x * 1664525u + 1013904223u; return static_cast<float>(static_cast<int>(x >> 28) % 9 - 4); };
  for (auto& v : A) v = next();
  for (auto& v : B) v = next();
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      float s = 0.f;
      for (int k = 0; k < K; ++k) s += A[m * K + k] * B[n * K + k];
      want[m * N + n] = s;
    }
  uint8_t *a_img = nullptr, *b_img = nullptr;
  __nv_bfloat16* a_rows = nullptr;
  float* c = nullptr;
  CK(cudaMalloc(&a_img, kTileBytes));
  CK(cudaMalloc(&b_img, kTileBytes));
  CK(cudaMalloc(&a_rows, M * K * sizeof(__nv_bfloat16)));
  CK(cudaMalloc(&c, M * N * sizeof(float)));
  std::vector<__nv_bfloat16> ha_rows(M * K);
  for (int i = 0; i < M * K; ++i) ha_rows[i] = __float2bfloat16(A[i]);
  CK(cudaMemcpy(a_rows, ha_rows.data(), M * K * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
  const Desc a_k_major{256, 128, 1024, 0};  // A's layout beside an MN-major B: core_k_major, the first row's reading
  int n_ok = 0;
  for (const Layout& l : kLayouts) {
    // A: this layout when B is K-major too, else core_k_major; B: element (n, k) of B [N, K] at
    // offset(n, k), or MN-major at offset(k, n). The expected C is the same for every form.
    std::vector<uint8_t> ha(kTileBytes, 0), hb(kTileBytes, 0);
    for (int r = 0; r < 64; ++r)
      for (int k = 0; k < K; ++k) {
        const __nv_bfloat16 va = __float2bfloat16(A[r * K + k]), vb = __float2bfloat16(B[r * K + k]);
        std::memcpy(ha.data() + (l.trans_b ? core_k_major(r, k) : l.offset(r, k)), &va, 2);
        std::memcpy(hb.data() + (l.trans_b ? l.offset(k, r) : l.offset(r, k)), &vb, 2);
      }
    CK(cudaMemcpy(a_img, ha.data(), kTileBytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b_img, hb.data(), kTileBytes, cudaMemcpyHostToDevice));
    CK(cudaMemset(c, 0xFF, M * N * sizeof(float)));  // NaN: an element left unwritten shows
    const Desc bd{l.step_start, l.lbo, l.sbo, l.swizzle};
    const Desc ad = l.trans_b ? a_k_major : bd;
    if (l.trans_b && l.a_in_regs)
      probe_kernel<1, true><<<1, 128>>>(a_img, a_rows, b_img, c, ad, bd);
    else if (l.trans_b)
      probe_kernel<1, false><<<1, 128>>>(a_img, a_rows, b_img, c, ad, bd);
    else if (l.a_in_regs)
      probe_kernel<0, true><<<1, 128>>>(a_img, a_rows, b_img, c, ad, bd);
    else
      probe_kernel<0, false><<<1, 128>>>(a_img, a_rows, b_img, c, ad, bd);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<float> got(M * N);
    CK(cudaMemcpy(got.data(), c, M * N * sizeof(float), cudaMemcpyDeviceToHost));
    int bad = 0, first = -1;
    for (int i = 0; i < M * N; ++i)
      if (!(got[i] == want[i])) {
        if (first < 0) first = i;
        ++bad;
      }
    n_ok += bad == 0;
    if (bad == 0)
      std::printf("%-72s ok\n", l.name);
    else
      std::printf("%-72s %d of %d wrong (first [%d, %d]: %g, want %g)\n", l.name, bad, M * N, first / N, first % N,
                  got[first], want[first]);
  }
  std::printf("%d of %zu layouts exact\n", n_ok, sizeof(kLayouts) / sizeof(kLayouts[0]));
  return 0;
}
