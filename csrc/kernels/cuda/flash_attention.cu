// CUDA flash attention (forward, deterministic backward): the launchers. The kernels and the
// design notes are in flash_attention.cuh.
//
//  - Path: bf16 with D in {32, 64, 128} and 16-byte aligned pointers runs the tensor-core kernels;
//    anything else (float32, float64, other D <= 256) the one-warp-per-row fallback. The choice
//    depends only on dtype, D and alignment, so a given call always runs the same kernels.
//  - Backward: delta = rowsum(dO * O) into a scratch [B, H, S] (compute type), then dq and dk/dv
//    kernels; on the tensor-core path the dq kernel computes delta itself, so 2 launches there, 3
//    on the fallback. Every output is written with `=`, no atomics, no memset.
//  - Launch shapes depend only on the problem sizes (never on the GPU), so the bits do too. On a
//    compute capability 9.0 device with sm_90a code in the library (XT_FLASH_SM90A) the
//    tensor-core kernels at D = 64 / 128 are the wgmma forms (Note [Warpgroup products],
//    flash_wgmma.cuh): the same blocks and sums, the same bits. They load their tiles through
//    tensor maps made here per call (Note [Tiles by the Tensor Memory Accelerator]); where the
//    driver cannot make them the mma.sync kernels run (the same bits again).
#include <atomic>
#include <initializer_list>

#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/flash_wgmma.cuh"
#include "kernels/cuda/static_switch.h"

namespace xt {
namespace kernels {
namespace cuda {

namespace {

using flash::Dims;
using flash::RowDims;

bool aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (!aligned_to(p, 16)) return false;
  return true;
}

bool tensor_core_path(DType dt, int64_t D, std::initializer_list<const void*> ptrs) {
  return dt == DType::BFloat16 && (D == 32 || D == 64 || D == 128) && aligned16(ptrs);
}

// Whether the tensor-core kernels at head dim D take their warpgroup-MMA forms (Note [Warpgroup
// products]): sm_90a code in this file, a 9.0 device, D = 64 or 128.
bool use_wgmma(int device, int64_t D) {
#ifdef XT_FLASH_SM90A
  static std::atomic<int> cc[64];  // per device: 0 unknown, else major * 10 + minor
  int c = device < 64 ? cc[device].load() : 0;
  if (c == 0) {
    int major = 0, minor = 0;
    XT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    XT_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    c = major * 10 + minor;
    if (device < 64) cc[device].store(c);
  }
  return c == 90 && (D == 64 || D == 128);
#else
  (void)device;
  (void)D;
  return false;
#endif
}

// The tensor maps of the wgmma kernels' [B, S, heads, D] operands (flash::wg::make_head_map), all
// or none: false when the driver refuses one (the caller then runs the mma.sync kernels).
struct HeadMaps {
  CUtensorMap q, k, v, dout;
};
template <int D>
bool head_maps(HeadMaps& m, const void* q, const void* k, const void* v, const void* dout, int64_t B, int64_t S,
               int64_t H, int64_t Hkv) {
  return flash::wg::make_head_map(&m.q, q, B, S, H, D) && flash::wg::make_head_map(&m.k, k, B, S, Hkv, D) &&
         flash::wg::make_head_map(&m.v, v, B, S, Hkv, D) &&
         (dout == nullptr || flash::wg::make_head_map(&m.dout, dout, B, S, H, D));
}

void check_sizes(int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t D) {
  XT_CHECK(B * H <= INT32_MAX && S <= int64_t(65535) * flash::kTile && B * S * H <= INT32_MAX &&
               D <= flash::kMaxRowD,
           ValueError, "flash_attention: shape too large for CUDA: B=", B, ", S=", S, ", H=", H, ", H_kv=", Hkv,
           ", D=", D);
}

RowDims row_dims(int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t D, double scale, bool causal,
                 const int32_t* doc) {
  return RowDims{static_cast<int>(B), static_cast<int>(S), static_cast<int>(H), static_cast<int>(Hkv),
                 static_cast<int>(D), scale, causal, doc};
}

// document_starts: one block per row; each thread scans a contiguous run of positions for the
// last document start in it, a block-wide max-scan over the threads' runs carries the start in,
// then each thread writes its run.
constexpr int kDocThreads = 256;

template <typename I>
__global__ void __launch_bounds__(kDocThreads)
    document_starts_kernel(const I* __restrict__ ids, int32_t* __restrict__ out, int S, int64_t sep) {
  __shared__ int32_t carry[kDocThreads];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * S;
  const int per = (S + kDocThreads - 1) / kDocThreads;
  const int s0 = static_cast<int>(threadIdx.x) * per, s1 = s0 + per < S ? s0 + per : S;
  int32_t last = 0;  // the last document start at or before this run's end (0: none in the run)
  for (int s = s0; s < s1; ++s)
    if (s > 0 && static_cast<int64_t>(ids[row + s - 1]) == sep) last = s;
  carry[threadIdx.x] = last;
  __syncthreads();
  for (int off = 1; off < kDocThreads; off *= 2) {  // inclusive max-scan over the runs
    const int32_t other = threadIdx.x >= static_cast<unsigned>(off) ? carry[threadIdx.x - off] : 0;
    __syncthreads();
    carry[threadIdx.x] = max(carry[threadIdx.x], other);
    __syncthreads();
  }
  int32_t start = threadIdx.x > 0 ? carry[threadIdx.x - 1] : 0;
  for (int s = s0; s < s1; ++s) {
    if (s > 0 && static_cast<int64_t>(ids[row + s - 1]) == sep) start = s;
    out[row + s] = start;
  }
}

}  // namespace

void flash_attention_forward(DType dt, const void* q, const void* k, const void* v, void* out, void* lse, int64_t B,
                             int64_t S, int64_t H, int64_t Hkv, int64_t D, double scale, bool causal,
                             const int32_t* doc_start, void* stream) {
  if (B * S * H == 0) return;
  check_sizes(B, S, H, Hkv, D);
  OnStream on(stream);
  if (tensor_core_path(dt, D, {q, k, v, out})) {
    const Dims n = flash::make_dims(B, S, H, Hkv, scale, causal, doc_start);
    const auto* q_ = static_cast<const bf16_t*>(q);
    const auto* k_ = static_cast<const bf16_t*>(k);
    const auto* v_ = static_cast<const bf16_t*>(v);
    XT_INT_SWITCH(D, kD, (32, 64, 128), [&] {
      if constexpr (kD >= 64) {
        HeadMaps maps;  // Hopper (Note [Warpgroup products], flash_wgmma.cuh)
        if (use_wgmma(on.device, kD) && head_maps<kD>(maps, q, k, v, nullptr, B, S, H, Hkv)) {
          constexpr int smem = flash::wg::fwd_smem<kD>();
          allow_smem<flash::wg::flash_forward_wgmma_kernel<kD>>(smem, on.device);
          flash::wg::flash_forward_wgmma_kernel<kD><<<flash::forward_grid(n), flash::kBlockThreads, smem, on.s>>>(
              maps.q, maps.k, maps.v, static_cast<bf16_t*>(out), static_cast<float*>(lse), n);
          XT_LAUNCH_CHECK();
          return;
        }
      }
      constexpr int smem = flash::fwd_smem<kD>();
      allow_smem<flash::flash_forward_kernel<kD>>(smem, on.device);
      flash::flash_forward_kernel<kD><<<flash::forward_grid(n), flash::kBlockThreads, smem, on.s>>>(
          q_, k_, v_, static_cast<bf16_t*>(out), static_cast<float*>(lse), n);
      XT_LAUNCH_CHECK();
    });
    return;
  }
  const RowDims n = row_dims(B, S, H, Hkv, D, scale, causal, doc_start);
  XT_DISPATCH_FLOAT(dt, "flash_attention_forward", T, {
    flash::row_forward_kernel<T><<<flash::row_grid(n, n.H), flash::kRowWarps * kWarp, 0, on.s>>>(
        static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(out),
        static_cast<compute_t<T>*>(lse), n);
    XT_LAUNCH_CHECK();
  });
}

void flash_attention_backward(DType dt, const void* q, const void* k, const void* v, const void* out,
                              const void* dout, const void* lse, void* dq, void* dk, void* dv, int64_t B, int64_t S,
                              int64_t H, int64_t Hkv, int64_t D, double scale, bool causal,
                              const int32_t* doc_start, void* stream) {
  if (B * S * H == 0) return;
  check_sizes(B, S, H, Hkv, D);
  OnStream on(stream);
  const bool tc = tensor_core_path(dt, D, {q, k, v, out, dout, dq, dk, dv});
  XT_DISPATCH_FLOAT(dt, "flash_attention_backward", T, {
    using C = compute_t<T>;
    const int64_t rows = B * S * H;
    Scratch delta(sizeof(C) * static_cast<size_t>(rows), on);
    // The tensor-core dq kernel writes delta itself (Note [delta inside the dq kernel]).
    if (!tc) with_lanes(D, [&](auto g) {
      constexpr int G = decltype(g)::value;
      flash::delta_kernel<G, T><<<static_cast<unsigned>(ceil_div(rows, rows_per_block<G>())), kThreads, 0, on.s>>>(
          static_cast<const T*>(out), static_cast<const T*>(dout), delta.as<C>(), rows, static_cast<int>(S),
          static_cast<int>(H), static_cast<int>(D));
      XT_LAUNCH_CHECK();
    });
    if constexpr (std::is_same_v<T, bf16_t>) {
      if (tc) {
        const Dims n = flash::make_dims(B, S, H, Hkv, scale, causal, doc_start);
        XT_INT_SWITCH(D, kD, (32, 64, 128), [&] {
          // Each kernel's form and occupancy per D: Notes [A fragments kept in registers] and
          // [Backward occupancy] (flash_attention.cuh); on Hopper the warpgroup-MMA forms (Note
          // [Warpgroup products], flash_wgmma.cuh).
          const auto* q_ = static_cast<const T*>(q);
          const auto* k_ = static_cast<const T*>(k);
          const auto* v_ = static_cast<const T*>(v);
          const auto* o_ = static_cast<const T*>(out);
          const auto* do_ = static_cast<const T*>(dout);
          const auto* lse_ = static_cast<const float*>(lse);
          auto* dq_ = static_cast<T*>(dq);
          auto* dk_ = static_cast<T*>(dk);
          auto* dv_ = static_cast<T*>(dv);
          float* delta_ = delta.as<float>();
          if constexpr (kD >= 64) {
            HeadMaps maps;
            if (use_wgmma(on.device, kD) && head_maps<kD>(maps, q, k, v, dout, B, S, H, Hkv)) {
              constexpr int dq_smem = flash::wg::dq_smem<kD>(), dkdv_smem = flash::wg::dkdv_smem<kD>();
              allow_smem<flash::wg::flash_backward_dq_wgmma_kernel<kD>>(dq_smem, on.device);
              allow_smem<flash::wg::flash_backward_dkdv_wgmma_kernel<kD>>(dkdv_smem, on.device);
              flash::wg::flash_backward_dq_wgmma_kernel<kD><<<flash::forward_grid(n), flash::kBlockThreads, dq_smem,
                                                             on.s>>>(maps.q, maps.k, maps.v, maps.dout, o_, do_, lse_,
                                                                     delta_, dq_, n);
              XT_LAUNCH_CHECK();
              flash::wg::flash_backward_dkdv_wgmma_kernel<kD><<<flash::dkdv_grid(n), flash::kBlockThreads, dkdv_smem,
                                                               on.s>>>(maps.q, maps.k, maps.v, maps.dout, lse_, delta_,
                                                                       dk_, dv_, n);
              XT_LAUNCH_CHECK();
              return;
            }
          }
          constexpr int kBR = flash::dkdv_rows<kD>();
          constexpr int dq_smem = flash::dq_smem<kD>(), dkdv_smem = flash::dkdv_smem<kD>();
          allow_smem<flash::flash_backward_dq_kernel<kD>>(dq_smem, on.device);
          allow_smem<flash::flash_backward_dkdv_kernel<kD, kBR>>(dkdv_smem, on.device);
          flash::flash_backward_dq_kernel<kD><<<flash::forward_grid(n), flash::kBlockThreads, dq_smem, on.s>>>(
              q_, k_, v_, o_, do_, lse_, delta_, dq_, n);
          XT_LAUNCH_CHECK();
          flash::flash_backward_dkdv_kernel<kD, kBR><<<flash::dkdv_grid(n), flash::kBlockThreads, dkdv_smem, on.s>>>(
              q_, k_, v_, do_, lse_, delta_, dk_, dv_, n);
          XT_LAUNCH_CHECK();
        });
        return;
      }
    }
    const RowDims n = row_dims(B, S, H, Hkv, D, scale, causal, doc_start);
    const auto* lse_c = static_cast<const C*>(lse);
    flash::row_backward_dq_kernel<T><<<flash::row_grid(n, n.H), flash::kRowWarps * kWarp, 0, on.s>>>(
        static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<const T*>(dout),
        lse_c, delta.as<C>(), static_cast<T*>(dq), n);
    XT_LAUNCH_CHECK();
    flash::row_backward_dkdv_kernel<T><<<flash::row_grid(n, n.Hkv), flash::kRowWarps * kWarp, 0, on.s>>>(
        static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<const T*>(dout),
        lse_c, delta.as<C>(), static_cast<T*>(dk), static_cast<T*>(dv), n);
    XT_LAUNCH_CHECK();
  });
}

void document_starts(DType id_dt, const void* ids, int32_t* doc_start, int64_t B, int64_t S, int64_t sep,
                     void* stream) {
  if (B * S == 0) return;
  XT_CHECK(B <= INT32_MAX && S <= INT32_MAX, ValueError, "document_starts: shape too large for CUDA: B=", B, ", S=", S);
  OnStream on(stream);
  XT_DISPATCH_ALL(id_dt, "document_starts", I, {
    if constexpr (std::is_integral_v<I>) {
      document_starts_kernel<I><<<static_cast<unsigned>(B), kDocThreads, 0, on.s>>>(
          static_cast<const I*>(ids), doc_start, static_cast<int>(S), sep);
      XT_LAUNCH_CHECK();
    }
  });
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
