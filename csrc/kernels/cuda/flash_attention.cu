// CUDA flash attention (forward, deterministic backward): the launchers. The kernels and the
// design notes are in flash_attention.cuh.
//
//  - Path: bf16 with D in {32, 64, 128} and 16-byte aligned pointers runs the tensor-core kernels;
//    anything else (float32, float64, other D <= 256) the one-warp-per-row fallback. The choice
//    depends only on dtype, D and alignment, so a given call always runs the same kernels.
//  - Backward: delta = rowsum(dO * O) into a scratch [B, H, S] (compute type), then dq and dk/dv
//    kernels; on the tensor-core path the dq kernel computes delta itself, so 2 launches there, 3
//    on the fallback. Every output is written with `=`, no atomics, no memset.
//  - Launch shapes depend only on the problem sizes (never on the GPU), so the bits do too.
#include <atomic>
#include <initializer_list>

#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/static_switch.h"

namespace xt {
namespace kernels {
namespace cuda {

namespace {

using flash::Dims;
using flash::RowDims;

constexpr int kDefaultSmem = 48 * 1024;

bool aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (!aligned_to(p, 16)) return false;
  return true;
}

bool tensor_core_path(DType dt, int64_t D, std::initializer_list<const void*> ptrs) {
  return dt == DType::BFloat16 && (D == 32 || D == 64 || D == 128) && aligned16(ptrs);
}

// Kernel's dynamic shared memory above the default 48 KB needs an opt-in, once per device.
template <auto Kernel>
void allow_smem(int bytes, int device) {
  static std::atomic<uint64_t> done{0};
  if (bytes <= kDefaultSmem || device >= 64 || (done.load() >> device & 1)) return;
  XT_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  done.fetch_or(uint64_t(1) << device);
}

void check_sizes(int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t D) {
  XT_CHECK(B * H <= INT32_MAX && S <= int64_t(65535) * flash::kTile && B * S * H <= INT32_MAX &&
               D <= flash::kMaxRowD,
           ValueError, "flash_attention: shape too large for CUDA: B=", B, ", S=", S, ", H=", H, ", H_kv=", Hkv,
           ", D=", D);
}

RowDims row_dims(int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t D, double scale, bool causal) {
  return RowDims{static_cast<int>(B), static_cast<int>(S), static_cast<int>(H), static_cast<int>(Hkv),
                 static_cast<int>(D), scale, causal};
}

}  // namespace

void flash_attention_forward(DType dt, const void* q, const void* k, const void* v, void* out, void* lse, int64_t B,
                             int64_t S, int64_t H, int64_t Hkv, int64_t D, double scale, bool causal, void* stream) {
  if (B * S * H == 0) return;
  check_sizes(B, S, H, Hkv, D);
  OnStream on(stream);
  if (tensor_core_path(dt, D, {q, k, v, out})) {
    const Dims n = flash::make_dims(B, S, H, Hkv, scale, causal);
    XT_INT_SWITCH(D, kD, (32, 64, 128), [&] {
      constexpr int smem = flash::fwd_smem<kD>();
      allow_smem<flash::flash_forward_kernel<kD>>(smem, on.device);
      flash::flash_forward_kernel<kD><<<flash::forward_grid(n), flash::kBlockThreads, smem, on.s>>>(
          static_cast<const bf16_t*>(q), static_cast<const bf16_t*>(k), static_cast<const bf16_t*>(v),
          static_cast<bf16_t*>(out), static_cast<float*>(lse), n);
      XT_LAUNCH_CHECK();
    });
    return;
  }
  const RowDims n = row_dims(B, S, H, Hkv, D, scale, causal);
  XT_DISPATCH_FLOAT(dt, "flash_attention_forward", T, {
    flash::row_forward_kernel<T><<<flash::row_grid(n, n.H), flash::kRowWarps * kWarp, 0, on.s>>>(
        static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(out),
        static_cast<compute_t<T>*>(lse), n);
    XT_LAUNCH_CHECK();
  });
}

void flash_attention_backward(DType dt, const void* q, const void* k, const void* v, const void* out,
                              const void* dout, const void* lse, void* dq, void* dk, void* dv, int64_t B, int64_t S,
                              int64_t H, int64_t Hkv, int64_t D, double scale, bool causal, void* stream) {
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
        const Dims n = flash::make_dims(B, S, H, Hkv, scale, causal);
        XT_INT_SWITCH(D, kD, (32, 64, 128), [&] {
          // Each kernel's form and occupancy per D: Notes [A fragments kept in registers] and
          // [Backward occupancy] (flash_attention.cuh).
          constexpr int kBR = flash::dkdv_rows<kD>();
          constexpr int dq_smem = flash::dq_smem<kD>(), dkdv_smem = flash::dkdv_smem<kD>();
          allow_smem<flash::flash_backward_dq_kernel<kD>>(dq_smem, on.device);
          allow_smem<flash::flash_backward_dkdv_kernel<kD, kBR>>(dkdv_smem, on.device);
          flash::flash_backward_dq_kernel<kD><<<flash::forward_grid(n), flash::kBlockThreads, dq_smem, on.s>>>(
              static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
              static_cast<const T*>(out), static_cast<const T*>(dout), static_cast<const float*>(lse),
              delta.as<float>(), static_cast<T*>(dq), n);
          XT_LAUNCH_CHECK();
          flash::flash_backward_dkdv_kernel<kD, kBR><<<flash::dkdv_grid(n), flash::kBlockThreads, dkdv_smem, on.s>>>(
              static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
              static_cast<const T*>(dout), static_cast<const float*>(lse), delta.as<float>(), static_cast<T*>(dk),
              static_cast<T*>(dv), n);
          XT_LAUNCH_CHECK();
        });
        return;
      }
    }
    const RowDims n = row_dims(B, S, H, Hkv, D, scale, causal);
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

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
