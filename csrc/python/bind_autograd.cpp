// Bindings: grad mode and checkpoint with a Python segment.
#include "core/error.h"
#include "python/bind.h"
#include "tape/checkpoint.h"
#include "tape/engine.h"
#include "tape/node.h"

namespace xt {

void init_autograd(py::module_& m) {
  m.def("is_grad_enabled", &grad_enabled, "Whether ops record the tape on this thread");
  m.def("set_grad_enabled", &set_grad_enabled, py::arg("enabled"), "Turn tape recording on/off for this thread");
  m.def("checkpoint", [](py::function fn, const Tensor& x, const std::vector<Tensor>& params) {
          // The callable is called and destroyed from engine threads that hold no GIL: take it.
          auto* held = new py::function(std::move(fn));
          std::shared_ptr<py::function> pyfn(held, [](py::function* f) {
            py::gil_scoped_acquire gil;
            delete f;
          });
          auto seg = std::shared_ptr<SegmentFn>(new SegmentFn([pyfn](const Tensor& xs, const std::vector<Tensor>& ps) {
            py::gil_scoped_acquire gil;
            py::object out = (*pyfn)(xs, py::cast(ps));
            if (!py::isinstance<Tensor>(out))
              throw TypeError(str("checkpoint: segment_fn must return an xtrain.Tensor, got ",
                                  py::str(py::type::of(out).attr("__name__")).cast<std::string>()));
            return out.cast<Tensor>();
          }), [](SegmentFn* f) {
            py::gil_scoped_acquire gil;  // the closure owns a Python reference
            delete f;
          });
          py::gil_scoped_release nogil;
          return checkpoint(seg, x, params);
        }, py::arg("segment_fn"), py::arg("x"), py::arg("params"),
        "Run segment_fn(x, params) without keeping its activations; recompute them in backward");
}

}  // namespace xt
