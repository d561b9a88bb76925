// Bindings: grad mode, checkpoint with a Python segment, and gradient slots.
#include "core/error.h"
#include "python/bind.h"
#include "tape/checkpoint.h"
#include "tape/engine.h"
#include "tape/grad_slots.h"
#include "tape/node.h"

namespace xt {

void init_autograd(py::module_& m) {
  m.def("is_grad_enabled", &grad_enabled, "Whether ops record the tape on this thread");
  m.def("set_grad_enabled", &set_grad_enabled, py::arg("enabled"), "Turn tape recording on/off for this thread");
  m.def("backward_many", [](const std::vector<Tensor>& roots, const std::vector<Tensor>& seeds) {
          run_backward(roots, seeds);
        }, py::arg("roots"), py::arg("seeds"), NoGil(),
        "One backward walk from several roots, each with its upstream gradient (ops with several outputs)");
  m.def("last_backward_batched_casts", &last_backward_batched_casts,
        "How many gradient conversions into parameter-store slots the last backward walk on this thread ran "
        "in one batch at its end (Note [Batched gradient casts])");
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
  py::class_<GradSlots>(m, "GradSlots",
                        "The gradient slots of a parameter store: while this object lives, each leaf's gradient "
                        "lands in its slot (a view of one flat buffer), which becomes its .grad")
      .def(py::init<const std::vector<Tensor>&, const std::vector<Tensor>&>(), py::arg("leaves"), py::arg("slots"))
      .def("sync", &GradSlots::sync, NoGil(),
           "Put every .grad into its slot (one assigned by hand is copied in); the indices of leaves without one")
      .def("clear", &GradSlots::clear, "Set every leaf's .grad to None (the slots keep their memory)")
      .def("__len__", &GradSlots::size);
}

}  // namespace xt
