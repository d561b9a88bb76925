// xtrain._C.ops binding of greedy_next_, greedy decoding's token pick and state advance on the
// device (generation's replayed decode steps).
#include <optional>

#include "core/error.h"
#include "ops/ops.h"
#include "python/op_registry.h"

XT_BIND_OPS(greedy_next, m) {
  using namespace xt;
  m.def("greedy_next_", [](const Tensor& logits, const Tensor& state, const Tensor& ring,
                           std::optional<int64_t> stop_token) {
          XT_CHECK(!stop_token || *stop_token >= 0, ValueError,
                   "greedy_next_: stop_token must be a token id >= 0 or None, got ", *stop_token);
          py::gil_scoped_release nogil;
          ops::greedy_next_(logits, state, ring, stop_token ? *stop_token : -1);
        }, py::arg("logits"), py::arg("state"), py::arg("ring"), py::arg("stop_token") = py::none(),
        "Greedy decoding on the device: row b's most likely token of logits [B, V] (the first of equal maxima, NaN "
        "first) advances its state int64 [6, B] = (token, position, length, limit, done, count) when the row is "
        "not done and position + 1 < limit (done after stop_token); ring [R, B][count % R, b] gets the token "
        "taken or -1; count += 1. In place, not differentiable");
}
