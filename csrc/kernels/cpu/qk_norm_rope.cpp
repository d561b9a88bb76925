// The fused q/k head preparation on the CPU (qk_norm_rope_forward, qk_norm_rope_backward): the
// CPU's rmsnorm_forward then rope (backward: rope's inverse rotation, then rmsnorm_backward)
// through a temporary: the composition itself, so the fused op is bitwise equal to it
// (tests/test_flash_attention.py checks it); the CUDA kernels (kernels/cuda/qk_norm_rope.cu) fuse
// it for real.
#include <memory>

#include "kernels/kernels.h"

namespace xt {
namespace kernels {
namespace cpu {

namespace {

// The head preparation of one side (q, or k) in the CPU kernels of the composition, through a
// temporary of x's shape and dtype: the very arithmetic and rounding of rms_norm followed by rope.
struct PrepSide {
  int64_t B, S, heads, D;
  std::unique_ptr<unsigned char[]> tmp;  // not zeroed: every element is written before it is read
  PrepSide(DType dt, int64_t B_, int64_t S_, int64_t heads_, int64_t D_)
      : B(B_), S(S_), heads(heads_), D(D_),
        tmp(new unsigned char[static_cast<size_t>(B_ * S_ * heads_ * D_) * dtype_size(dt)]) {}
  int64_t rows() const { return B * S * heads; }
};

}  // namespace

void qk_norm_rope_forward(DType dt, DType w_dt, const void* q, const void* k, const void* wq, const void* wk,
                          void* q_out, void* k_out, float* rstd_q, float* rstd_k, int64_t B, int64_t S, int64_t H,
                          int64_t Hkv, int64_t D, float eps, const RopeFreqs& freqs, RopePositions pos,
                          void* stream) {
  const auto side = [&](const void* x, const void* w, void* y, float* rstd, int64_t heads) {
    PrepSide p(dt, B, S, heads, D);
    rmsnorm_forward(dt, w_dt, x, w, p.tmp.get(), rstd, p.rows(), D, eps, stream);
    rope(dt, p.tmp.get(), y, pos, B, S, heads, D, freqs, /*inverse=*/false, stream);
  };
  if (H > 0) side(q, wq, q_out, rstd_q, H);
  if (Hkv > 0) side(k, wk, k_out, rstd_k, Hkv);
}

void qk_norm_rope_backward(DType dt, DType w_dt, const void* q, const void* k, const void* wq, const void* wk,
                           const float* rstd_q, const float* rstd_k, const void* dq_out, const void* dk_out, void* dq,
                           void* dk, void* dwq, void* dwk, int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t D,
                           const RopeFreqs& freqs, RopePositions pos, void* stream) {
  const auto side = [&](const void* x, const void* w, const float* rstd, const void* dy, void* dx, void* dw,
                        int64_t heads) {
    PrepSide p(dt, B, S, heads, D);
    rope(dt, dy, p.tmp.get(), pos, B, S, heads, D, freqs, /*inverse=*/true, stream);
    rmsnorm_backward(dt, w_dt, x, w, rstd, p.tmp.get(), dx, dw, p.rows(), D, stream);
  };
  if (H > 0) side(q, wq, rstd_q, dq_out, dq, dwq, H);
  if (Hkv > 0) side(k, wk, rstd_k, dk_out, dk, dwk, Hkv);
}

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
