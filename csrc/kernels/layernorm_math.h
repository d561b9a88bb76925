// LayerNorm's row math, written once for the CPU and CUDA kernels (kernels/{cpu,cuda}/layernorm):
// rstd from the sum of squared deviations, an output element, and an element of dx. The sums
// themselves are each backend's own (the CPU in index order, CUDA in lane groups).
#pragma once
#include "kernels/common.h"

namespace xt {
namespace kernels {

// rstd = 1/sqrt(var + eps), var = sq / dim (the biased variance, as torch.nn.LayerNorm).
template <typename C> XT_HD C layernorm_rstd(C sq, int64_t dim, float eps) {
  return C(1) / xsqrt(sq / static_cast<C>(dim) + static_cast<C>(eps));
}

// Output element j: (x_j - mean) * rstd * w_j + b_j in the compute type, before its rounding.
template <typename T, typename W>
XT_HD compute_t<T> layernorm_scaled(const T* x, const W* w, const W* b, int64_t j, compute_t<T> mean,
                                    compute_t<T> inv) {
  using C = compute_t<T>;
  const C xhat = (load(x, j) - mean) * inv;
  return static_cast<C>(xhat * static_cast<C>(load(w, j)) + static_cast<C>(load(b, j)));
}

// dx_j = rstd * (g_j - mean(g) - xhat_j * mean(g * xhat)) with g = dy * w. The last multiply is
// rounded on its own on the device (nvcc would otherwise contract it with the `+ dres` of the
// fused residual form into one fma, and add_layer_norm's dx must be bitwise layer_norm's dx
// followed by the engine's add).
template <typename C> XT_HD C layernorm_dx(C g, C mean_g, C xhat, C mean_gx, C inv) {
  const C t = g - mean_g - xhat * mean_gx;
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(C) == 4) return __fmul_rn(inv, t);
  else return __dmul_rn(inv, t);
#else
  return inv * t;
#endif
}

}  // namespace kernels
}  // namespace xt
