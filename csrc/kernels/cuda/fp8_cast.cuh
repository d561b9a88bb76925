// The CUDA kernels producing FP8 operands (launched by kernels/cuda/fp8_cast.cu), in a header so
// that tests/emu/fp8_emu.cpp runs them on the CPU under the warp/block emulator.
//
//  - amax_kernel: max |x| over n elements into meta[kFp8MetaAmax], which the launcher zeroes first. Each
//    thread reads 16-byte packs (grid-stride), the warp and the block reduce with fmaxf, and one
//    thread per block folds its maximum in with an integer atomicMax on the float's bits: the
//    maxima are non-negative floats, whose order is their bits' order, and a maximum is exact and
//    independent of the order the blocks arrive in, so the result is bitwise deterministic (no
//    floating-point accumulation). NaN is ignored (fmaxf), as on the CPU.
//  - cast_kernel: a 64 x 64 tile per block of 256 threads. Each thread reads 16 elements of a row
//    (16-byte packs), scales them by 2^k (k from meta[kFp8MetaAmax], the same integer arithmetic as the CPU,
//    Note [FP8 scaling]), converts them with the hardware's cvt.rn.satfinite (cuda_fp8.h, two at a
//    time) and writes the 16 codes as one 16-byte store; with out_t, the tile goes through shared
//    memory and each thread writes 16 codes of a column of x as a row of out_t. Block (0, 0)
//    writes meta[kFp8MetaScale] = 2^-k. Rows and cols are multiples of 16 (the launcher checks), so a 16-wide
//    chunk is wholly inside the matrix or wholly outside.
#pragma once
#include <cuda_fp8.h>

#include "kernels/cuda/common.cuh"
#include "kernels/fp8_math.h"

namespace xt {
namespace kernels {
namespace cuda {
namespace fp8 {

constexpr int kAmaxThreads = 256;
constexpr int64_t kAmaxMaxBlocks = 1024;  // grid-stride beyond: each block folds in once
constexpr int kTile = 64;                 // cast: a kTile x kTile tile per block
constexpr int kCastThreads = 256;
constexpr int kChunk = 16;               // elements (and codes) per thread and row piece
constexpr int kTilePad = 4;              // bytes of padding per shared-memory tile row

__device__ __forceinline__ __nv_fp8_interpretation_t interpretation(Fp8Format f) {
  return f == Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2;
}

// A 16-byte load or store seen as its elements (a union: nvcc and gcc keep the punning defined).
template <typename T>
union Pack16 {
  uint4 v;
  T e[16 / sizeof(T)];
};

// 16 elements of x (T: float or bf16) at p (16-byte aligned) into v, as float.
template <typename T>
__device__ __forceinline__ void load16(const T* p, float (&v)[kChunk]) {
  constexpr int kPerPack = 16 / sizeof(T);
#pragma unroll
  for (int j = 0; j < kChunk / kPerPack; ++j) {
    Pack16<T> pack;
    pack.v = reinterpret_cast<const uint4*>(p)[j];
#pragma unroll
    for (int i = 0; i < kPerPack; ++i) v[j * kPerPack + i] = load(pack.e, i);
  }
}

// Where a kernel folds its outputs' max |value| into: p[j] == nullptr leaves output j out.
template <int NO>
struct OutAmax {
  float* p[NO];
};

// The block's maxima m[j] (each thread's) folded into am.p[j]: fmaxf across the warp and the
// block, then one integer atomicMax per block and output on the float's bits. The maxima are
// non-negative floats, ordered as their bits, and a maximum is exact and independent of the order
// the blocks arrive in: bitwise deterministic, no floating-point accumulation. NaN is ignored
// (fmaxf). Every thread of the kBlock-wide block calls it. amax_kernel's, and the producers' that
// take their operand's amax as they write it (elementwise.cu's map kernel, for swiglu).
template <int kBlock, int NO>
__device__ __forceinline__ void fold_block_amax(float (&m)[NO], const OutAmax<NO>& am) {
  __shared__ float warp_max[NO][kBlock / kWarp];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
#pragma unroll
  for (int j = 0; j < NO; ++j) {
#pragma unroll
    for (int off = kWarp / 2; off > 0; off /= 2) m[j] = fmaxf(m[j], __shfl_xor_sync(0xffffffffu, m[j], off));
    if (lane == 0) warp_max[j][warp] = m[j];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
#pragma unroll
    for (int j = 0; j < NO; ++j) {
      if (am.p[j] == nullptr) continue;
      float b = warp_max[j][0];
      for (int w = 1; w < kBlock / kWarp; ++w) b = fmaxf(b, warp_max[j][w]);
      atomicMax(reinterpret_cast<unsigned int*>(am.p[j]), fp8_float_bits(b));
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kAmaxThreads) amax_kernel(const T* __restrict__ x, int64_t n, float* meta) {
  constexpr int64_t kPerPack = 16 / sizeof(T);
  const int64_t packs = n / kPerPack;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float m = 0.0f;
  for (int64_t i = tid; i < packs; i += stride) {
    Pack16<T> pack;
    pack.v = reinterpret_cast<const uint4*>(x)[i];
#pragma unroll
    for (int j = 0; j < kPerPack; ++j) m = fmaxf(m, fabsf(load(pack.e, j)));
  }
  for (int64_t i = packs * kPerPack + tid; i < n; i += stride) m = fmaxf(m, fabsf(load(x, i)));
  float mm[1] = {m};
  fold_block_amax<kAmaxThreads>(mm, OutAmax<1>{{meta + kFp8MetaAmax}});
}

template <typename T>
__global__ void __launch_bounds__(kCastThreads)
    cast_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, Fp8Format f, float* meta,
                uint8_t* __restrict__ out, uint8_t* __restrict__ out_t) {
  __shared__ __align__(16) uint8_t tile[kTile][kTile + kTilePad];
  const int k = fp8_scale_exponent(meta[kFp8MetaAmax], f);
  const float scale = fp8_pow2(k);
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile, c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int lr = threadIdx.x / (kTile / kChunk), lc = (threadIdx.x % (kTile / kChunk)) * kChunk;
  const int64_t r = r0 + lr, c = c0 + lc;
  if (r < rows && c < cols) {
    float v[kChunk];
    load16(x + r * cols + c, v);
    Pack16<uint8_t> codes;
#pragma unroll
    for (int i = 0; i < kChunk; i += 2) {
      float2 pair;
      pair.x = v[i] * scale;
      pair.y = v[i + 1] * scale;
      const __nv_fp8x2_storage_t two = __nv_cvt_float2_to_fp8x2(pair, __NV_SATFINITE, interpretation(f));
      codes.e[i] = static_cast<uint8_t>(two & 0xFFu);
      codes.e[i + 1] = static_cast<uint8_t>(two >> 8);
    }
    *reinterpret_cast<uint4*>(out + r * cols + c) = codes.v;
    if (out_t) {
#pragma unroll
      for (int i = 0; i < kChunk; ++i) tile[lr][lc + i] = codes.e[i];
    }
  }
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) meta[kFp8MetaScale] = fp8_pow2(-k);
  if (!out_t) return;  // uniform over the block
  __syncthreads();
  // out_t row c0 + tc holds column c0 + tc of x: 16 codes of rows r0 + tr .. + 15 per thread
  const int tc = threadIdx.x / (kTile / kChunk), tr = (threadIdx.x % (kTile / kChunk)) * kChunk;
  if (c0 + tc < cols && r0 + tr < rows) {
    Pack16<uint8_t> codes;
#pragma unroll
    for (int i = 0; i < kChunk; ++i) codes.e[i] = tile[tr + i][tc];
    *reinterpret_cast<uint4*>(out_t + (c0 + tc) * rows + r0 + tr) = codes.v;
  }
}

}  // namespace fp8
}  // namespace cuda
}  // namespace kernels
}  // namespace xt
