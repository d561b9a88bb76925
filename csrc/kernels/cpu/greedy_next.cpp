// greedy_next on the CPU, as a plain loop: the reference the CUDA kernel is tested against
// (kernels/cuda/greedy_next.cu). A scan of each row for its first maximum (kernels/common.h's
// greedy_beats), then the row's state update (greedy_take).
#include "kernels/common.h"
#include "kernels/kernels.h"

namespace xt {
namespace kernels {
namespace cpu {

void greedy_next(DType dt, const void* logits_, int64_t B, int64_t V, int64_t* state, int64_t* ring, int64_t R,
                 int64_t stop, void* /*stream*/) {
  XT_DISPATCH_FLOAT(dt, "greedy_next", T, {
    using C = compute_t<T>;
    const T* logits = static_cast<const T*>(logits_);
    for (int64_t b = 0; b < B; ++b) {
      int64_t best = 0;
      C best_v = load(logits, b * V);
      for (int64_t i = 1; i < V; ++i) {
        const C x = load(logits, b * V + i);
        if (greedy_beats(x, i, best_v, best)) best = i, best_v = x;
      }
      greedy_take(state, B, b, best, ring, R, stop);
    }
  });
}

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
