// greedy_next_(logits, state, ring, stop): the greedy pick of a decode step, argument checks and
// dispatch to kernels/{cpu,cuda}/greedy_next. It picks each row's most likely token on the device
// and advances the row's decode state (token, position, length), so a greedy decode loop needs no
// host round trip per token (generation's replayed steps read the ring every R tokens). Inference
// only: no history. State's counts are checked on the CPU; on CUDA a check would sync every step.
#include <utility>

#include "core/error.h"
#include "ops/dispatch.h"

namespace xt {
namespace ops {

void greedy_next_(const Tensor& logits, const Tensor& state, const Tensor& ring, int64_t stop) {
  const char* op = "greedy_next_";
  check_floating(logits, op, "logits");
  XT_CHECK(logits.dim() == 2 && logits.size(1) >= 1, ValueError, op,
           ": logits must be [B, V] with V >= 1, got ", logits.describe());
  const int64_t B = logits.size(0);
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{state, "state"}, {ring, "ring"}}) {
    check_defined(t, name);
    XT_CHECK(t.dtype() == DType::Int64, TypeError, op, ": ", name, " must be int64, got ", t.describe());
    check_same_device(logits, t, op, "logits", name);
  }
  XT_CHECK((state.shape() == Shape{6, B}), ValueError, op, ": state must be [6, B] (token, position, length, limit, done, "
           "count per row) for logits ", logits.describe(), ", got ", state.describe());
  XT_CHECK(ring.dim() == 2 && ring.size(0) >= 1 && ring.size(1) == B, ValueError, op,
           ": ring must be [R, B] with R >= 1 for logits ", logits.describe(), ", got ", ring.describe());
  if (!state.device().is_cuda()) {
    const int64_t* c = state.data<int64_t>() + 5 * B;
    for (int64_t b = 0; b < B; ++b)
      XT_CHECK(c[b] >= 0, ValueError, op, ": state's count[", b, "] must be >= 0, got ", c[b]);
  }
  state.bump_version();
  ring.bump_version();
  if (B == 0) return;
  XT_KERNEL(logits.device(), greedy_next, logits.dtype(), logits.data_ptr(), B, logits.size(1),
            state.data<int64_t>(), ring.data<int64_t>(), ring.size(0), stop, stream_for(logits.device()));
}

}  // namespace ops
}  // namespace xt
