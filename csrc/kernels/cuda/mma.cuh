// Warp-level tensor-core and async-copy primitives (sm_80+, used on sm_90): the only inline PTX of
// the flash attention kernels (kernels/cuda/flash_attention.cuh).
//
//  - mma_bf16: D = A B + C, m16n8k16, bf16 inputs, float32 accumulators. Fragments (PTX ISA
//    "Matrix Fragments for mma.m16n8k16", g = lane / 4, t = lane % 4):
//      A 16x16: a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t..), a[2] = (g, 2t+8..), a[3] = (g+8, 2t+8..)
//      B 16x8 (k x n): b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g)
//      C 16x8: c[0], c[1] = (g, 2t), (g, 2t+1); c[2], c[3] = (g+8, 2t), (g+8, 2t+1)
//    two bf16 per 32-bit register, the lower column (or k) in the low half.
//  - ldsm_x4: four 8x8 b16 matrices from shared memory; lane l gives the address of row l % 8 of
//    matrix l / 8 (16 contiguous bytes) and receives r[i] = row l / 4, elements 2(l % 4), +1 of
//    matrix i. ldsm_x4_trans returns the transposes: r[i] = elements (2(l % 4), l / 4) and
//    (2(l % 4) + 1, l / 4).
//  - cp_async16/cp_async4: global -> shared copies that bypass registers; valid == false writes
//    zeros instead (src-size 0, the source is not read). Visible to the issuing thread after
//    cp_async_wait<N>() retires its group, to other threads after a __syncthreads() that follows.
//
// tests/emu (a host emulation of these primitives) compiles the kernels with XT_CUDA_EMULATION
// defined and its own definitions of everything below.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

namespace xt {
namespace kernels {
namespace cuda {

// Two floats as one register of two bf16 (lo in the low half), rounded to nearest even.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t r;
  memcpy(&r, &v, sizeof(r));
  return r;
}

#ifndef XT_CUDA_EMULATION

__device__ __forceinline__ unsigned char* dynamic_smem() {
  extern __shared__ __align__(16) unsigned char xt_dynamic_smem[];
  return xt_dynamic_smem;
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem))
               : "memory");
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem))
               : "memory");
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(valid ? 16 : 0)
               : "memory");
}

__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(valid ? 4 : 0)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

#endif  // XT_CUDA_EMULATION

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
