// Bindings: the Tensor class, creation from numpy and by value, to numpy, generators.
//
// Note [No uninitialised Tensors]: pybind11 gives every bound class the tp_new of its base
// object, which makes an instance whose C++ value is never constructed; pybind11 then hands the
// methods raw memory (Tensor.__new__(Tensor).shape read a garbage pointer and crashed). Tensor's
// tp_new refuses instead, so a Tensor exists only when C++ made one (pybind11's own casts
// allocate through tp_alloc, not tp_new). Numbers from Python that size or fill a tensor are
// range-checked here, before they reach a C++ integer: a ValueError, never a wrapped value.
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/generator.h"
#include "kernels/kernels.h"
#include "ops/ops.h"
#include "python/bind.h"
#include "tape/engine.h"
#include "tape/node.h"

namespace xt {

DType dtype_arg(const py::object& o, DType fallback) {
  if (o.is_none()) return fallback;
  if (py::isinstance<py::str>(o)) return parse_dtype(o.cast<std::string>());
  throw TypeError(str("dtype must be a string such as 'float32' or 'bfloat16', got ",
                      py::str(py::type::of(o).attr("__name__")).cast<std::string>()));
}

Device device_arg(const py::object& o, Device fallback) {
  if (o.is_none()) return fallback;
  if (py::isinstance<py::str>(o)) return Device::parse(o.cast<std::string>());
  throw TypeError(str("device must be a string such as 'cpu' or 'cuda:0', got ",
                      py::str(py::type::of(o).attr("__name__")).cast<std::string>()));
}

namespace {

constexpr const char* kNoDirectTensor =
    "xtrain.Tensor cannot be created directly; use xtrain.tensor(data), xtrain.zeros(shape) or another creation "
    "function";

// A Python int as int64, or ValueError naming `what` when it does not fit.
int64_t int64_arg(const py::handle& o, const char* what) {
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(o.ptr(), &overflow);
  if (overflow) throw ValueError(str(what, " ", py::str(o).cast<std::string>(), " does not fit in int64"));
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  return v;
}

// fill_value/start/end for an integer tensor must be finite and inside the dtype's range (a
// double outside it has no defined conversion).
void check_integer_value(double v, DType dt, const char* what) {
  if (!is_integral(dt)) return;
  const double lim = dt == DType::Int32 ? 2147483648.0 : 9223372036854775808.0;  // 2^31, 2^63
  XT_CHECK(std::isfinite(v) && v >= -lim && v < lim, ValueError, what, " ", v, " cannot be stored in ",
           dtype_name(dt));
}

Shape shape_arg(const py::object& o) {
  Shape s;
  if (py::isinstance<py::int_>(o)) {
    s.push_back(int64_arg(o, "shape entry"));
  } else {
    for (auto item : py::iterable(o)) {
      XT_CHECK(py::isinstance<py::int_>(item), TypeError, "shape entries must be integers, got ",
               py::str(py::type::of(item).attr("__name__")).cast<std::string>());
      s.push_back(int64_arg(item, "shape entry"));
    }
  }
  for (int64_t d : s) XT_CHECK(d >= 0, ValueError, "shape entries must be >= 0, got ", shape_str(s));
  return s;
}

// numpy array -> tensor of `dtype` on `device` (always a copy; bf16 rounds to nearest even).
Tensor from_numpy(py::array arr, DType dtype, Device device) {
  Shape shape(arr.shape(), arr.shape() + arr.ndim());
  // Stage on the CPU in a numpy-representable dtype, then cast/move.
  DType stage = dtype == DType::BFloat16 ? DType::Float32 : dtype;
  py::array c = py::array::ensure(arr.attr("astype")(numpy_dtype(stage), py::arg("order") = "C", py::arg("copy") = false),
                                  py::array::c_style);
  XT_CHECK(c, TypeError, "could not convert the data to ", dtype_name(stage));
  Tensor host = Tensor::empty(shape, stage, Device::cpu());
  if (host.nbytes()) std::memcpy(host.data_ptr(), c.data(), host.nbytes());
  if (stage == dtype && device.is_cpu()) return host;
  py::gil_scoped_release nogil;
  return ops::to_forward(host, device, dtype);
}

// tensor -> numpy. CPU float32/float64/int tensors share memory with the array (it keeps the
// storage alive); bf16 tensors give float32 copies; CUDA tensors are copied (sync point).
py::array to_numpy(const Tensor& t) {
  Tensor src = t;
  if (src.device().is_cuda() || src.dtype() == DType::BFloat16) {
    py::gil_scoped_release nogil;
    src = ops::to_forward(src, Device::cpu(), src.dtype() == DType::BFloat16 ? DType::Float32 : src.dtype());
  }
  std::vector<py::ssize_t> shape(src.shape().begin(), src.shape().end());
  auto* keep = new std::shared_ptr<Storage>(src.storage());
  py::capsule base(keep, [](void* p) { delete static_cast<std::shared_ptr<Storage>*>(p); });
  return py::array(numpy_dtype(src.dtype()), shape, {}, src.data_ptr(), base);
}

py::object item(const Tensor& t) {
  XT_CHECK(t.numel() == 1, ValueError, "item() needs a one-element tensor, got shape ", shape_str(t.shape()));
  py::array a = to_numpy(t);
  return a.attr("reshape")(py::tuple()).attr("item")();
}

std::shared_ptr<Generator> generator_arg(const py::object& g) {
  if (g.is_none()) return nullptr;
  return g.cast<std::shared_ptr<Generator>>();
}

Tensor make_random(const py::object& shape, kernels::RandomKind kind, const py::object& dtype,
                   const py::object& device, const py::object& generator, bool requires_grad) {
  Shape s = shape_arg(shape);
  DType dt = dtype_arg(dtype, DType::Float32);
  Device dev = device_arg(device, Device::cpu());
  auto gen = generator_arg(generator);
  Tensor t;
  {
    py::gil_scoped_release nogil;
    t = ops::random(s, kind, dt, dev, gen);
  }
  if (requires_grad) t.set_requires_grad(true);
  return t;
}

}  // namespace

// The numpy dtype of a tensor's values (bf16: float32, numpy has none).
py::dtype numpy_dtype(DType dt) {
  switch (dt) {
    case DType::Float32: return py::dtype::of<float>();
    case DType::Float64: return py::dtype::of<double>();
    case DType::Int32: return py::dtype::of<int32_t>();
    case DType::Int64: return py::dtype::of<int64_t>();
    case DType::BFloat16: return py::dtype::of<float>();  // numpy has no bfloat16: values as float32
  }
  return py::dtype::of<float>();
}

void init_tensor(py::module_& m) {
  // Registered before Generator, so begin_capture's signature names the Python type.
  py::class_<Tensor> tensor_class(m, "Tensor", "A contiguous n-dimensional array on a device, with autograd.");

  py::class_<Generator, std::shared_ptr<Generator>>(m, "Generator",
      "Counter-based (Philox) random generator: a (seed, offset) pair.")
      .def(py::init<uint64_t>(), py::arg("seed") = Generator::kDefaultSeed)
      .def("manual_seed", &Generator::manual_seed, py::arg("seed"), "Reset to (seed, offset 0)")
      .def("get_state", [](Generator& g) { auto s = g.state(); return py::make_tuple(s.seed, s.offset); },
           "The state as a (seed, offset) tuple")
      .def("set_state", [](Generator& g, std::pair<uint64_t, uint64_t> s) { g.set_state({s.first, s.second}); },
           py::arg("state"), "Restore a state from get_state()")
      .def("begin_capture",
           [](Generator& g, const Tensor& base) {
             XT_CHECK(base.defined() && base.dtype() == DType::Int64 && base.numel() == 2, ValueError,
                      "begin_capture: base must be an int64 tensor of 2 elements (seed, offset), got ",
                      base.defined() ? base.describe() : std::string("None"));
             g.begin_capture(static_cast<const uint64_t*>(base.data_ptr()));
           },
           py::arg("base"),
           "Capture mode for a CUDA graph (Note [Random draws in captured graphs]): dropout draws offsets "
           "relative to the capture's start and reads (seed, offset) from `base` (int64 [2], on the device, "
           "kept alive by the caller), which the owner fills before each replay")
      .def("end_capture", &Generator::end_capture,
           "Leave capture mode; returns the counters the captured work draws per replay")
      .def_property_readonly("capturing", &Generator::capturing, "True between begin_capture and end_capture");

  m.def("default_generator", [](const py::object& device) { return default_generator(device_arg(device, Device::cpu())); },
        py::arg("device") = py::none(), "The default generator of a device");
  m.def("manual_seed", &manual_seed_all, py::arg("seed"), "Seed the default generator of every device");

  tensor_class.attr("__new__") = py::cpp_function([](const py::args&, const py::kwargs&) -> py::object {
    throw TypeError(kNoDirectTensor);
  });
  // After setting __new__ (which points tp_new at Python's slot wrapper): the slot itself refuses,
  // so no base class's __new__ can make one either (Note [No uninitialised Tensors]).
  reinterpret_cast<PyTypeObject*>(tensor_class.ptr())->tp_new = [](PyTypeObject*, PyObject*, PyObject*) -> PyObject* {
    PyErr_SetString(PyExc_TypeError, kNoDirectTensor);
    return nullptr;
  };
  PyType_Modified(reinterpret_cast<PyTypeObject*>(tensor_class.ptr()));
  tensor_class
      .def_property_readonly("shape", [](const Tensor& t) { return py::tuple(py::cast(t.shape())); })
      .def_property_readonly("dtype", [](const Tensor& t) { return std::string(dtype_name(t.dtype())); })
      .def_property_readonly("device", [](const Tensor& t) { return t.device().str(); })
      .def_property_readonly("ndim", &Tensor::dim)
      .def("dim", &Tensor::dim)
      .def("numel", &Tensor::numel)
      .def("size", [](const Tensor& t, const py::object& d) -> py::object {
             if (d.is_none()) return py::tuple(py::cast(t.shape()));
             XT_CHECK(py::isinstance<py::int_>(d), TypeError, "size(dim): dim must be an integer");
             return py::int_(t.size(int64_arg(d, "dim")));
           }, py::arg("dim") = py::none())
      .def_property_readonly("itemsize", &Tensor::itemsize)
      .def_property_readonly("nbytes", &Tensor::nbytes)
      .def("data_ptr", [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()); })
      .def_property("requires_grad", &Tensor::requires_grad, &Tensor::set_requires_grad)
      .def_property("grad",
                    [](const Tensor& t) -> py::object { Tensor g = t.grad(); return g.defined() ? py::cast(g) : py::none(); },
                    [](Tensor& t, const py::object& g) {
                      if (g.is_none()) { t.set_grad(Tensor()); return; }
                      XT_CHECK(py::isinstance<Tensor>(g), TypeError, "grad must be a Tensor or None, got ",
                               py::str(py::type::of(g).attr("__name__")).cast<std::string>());
                      Tensor gt = g.cast<Tensor>();
                      XT_CHECK(gt.shape() == t.shape() && gt.dtype() == t.dtype() && gt.device() == t.device(), ValueError,
                               "grad must match the tensor: tensor is ", t.describe(), ", grad is ", gt.describe());
                      t.set_grad(gt);
                    })
      .def("_storage_view", [](const Tensor& t, int64_t offset, const std::vector<int64_t>& shape) {
             return t.storage_view(offset, shape);
           }, py::arg("offset"), py::arg("shape"),
           "A view of `shape` starting `offset` elements into this tensor's storage (no history)")
      .def_property_readonly("grad_fn", [](const Tensor& t) -> py::object {
             return t.grad_fn() ? py::object(py::str(t.grad_fn()->name())) : py::object(py::none());
           })
      .def_property_readonly("is_leaf", &Tensor::is_leaf)
      .def_property_readonly("_version", &Tensor::version,
                             "How many in-place writes the engine made to this tensor's storage (shared by views)")
      .def("detach", &Tensor::detach, "A tensor sharing storage, with no history")
      .def("numpy", [](const Tensor& t) {
             py::array a = to_numpy(t);
             a.attr("setflags")(py::arg("write") = false);  // never a writable alias of the tensor's memory
             return a;
           },
           "As a read-only numpy array (shares memory for CPU float32/float64/int; bf16 -> float32 copy); "
           ".copy() it to write")
      .def("item", &item, "The value of a one-element tensor (a sync point on CUDA)")
      .def("backward", [](const Tensor& t) { backward(t); }, NoGil(),
           "Backpropagate from a one-element tensor (seed of ones)")
      .def("backward_seeded", [](const Tensor& t, const Tensor& seed) { backward_seeded(t, seed); }, py::arg("seed"),
           NoGil(), "Backpropagate from this tensor with an explicit upstream gradient of its shape")
      .def("to", [](const Tensor& t, const py::object& device, const py::object& dtype) {
             Device dev = device_arg(device, t.device());
             DType dt = dtype_arg(dtype, t.dtype());
             if (dev == t.device() && dt == t.dtype()) return t;
             py::gil_scoped_release nogil;
             return ops::to(t, dev, dt);
           }, py::arg("device") = py::none(), py::arg("dtype") = py::none(),
           "Copy to another device and/or dtype (differentiable); returns self when nothing changes")
      .def("clone", [](const Tensor& t) { return ops::clone(t); }, NoGil(), "A copy with no history")
      .def("zero_", [](Tensor& t) { ops::zero_(t); return t; }, NoGil(), "Fill with zeros in place (no autograd)")
      .def("fill_", [](Tensor& t, double v) {
             check_integer_value(v, t.dtype(), "fill_: value");
             ops::fill_(t, v);
             return t;
           }, py::arg("value"), NoGil(),
           "Fill with a value in place (no autograd)")
      .def("copy_", [](Tensor& t, const Tensor& src) {
             XT_CHECK(t.shape() == src.shape(), ValueError, "copy_: shapes differ: ", t.describe(), " vs ", src.describe());
             ops::copy_(t, src);
             return t;
           }, py::arg("src"), NoGil(), "Copy values from src (any dtype/device) in place (no autograd)")
      .def("same_storage", [](const Tensor& a, const Tensor& b) { return a.storage() == b.storage(); }, py::arg("other"),
           "True when both tensors view the same storage");

  m.def("_from_numpy", [](py::array arr, const py::object& dtype, const py::object& device) {
          DType dt = dtype_arg(dtype, DType::Float32);
          return from_numpy(arr, dt, device_arg(device, Device::cpu()));
        }, py::arg("array"), py::arg("dtype"), py::arg("device") = py::none(),
        "Copy a numpy array into a new tensor (used by xtrain.tensor)");
  m.def("full", [](const py::object& shape, double value, const py::object& dtype, const py::object& device) {
          Shape s = shape_arg(shape);
          DType dt = dtype_arg(dtype, DType::Float32);
          Device dev = device_arg(device, Device::cpu());
          check_integer_value(value, dt, "full: fill_value");
          py::gil_scoped_release nogil;
          return ops::full(s, value, dt, dev);
        }, py::arg("shape"), py::arg("fill_value"), py::arg("dtype") = py::none(), py::arg("device") = py::none(),
        "A tensor filled with a value");
  m.def("empty", [](const py::object& shape, const py::object& dtype, const py::object& device) {
          return ops::empty(shape_arg(shape), dtype_arg(dtype, DType::Float32), device_arg(device, Device::cpu()));
        }, py::arg("shape"), py::arg("dtype") = py::none(), py::arg("device") = py::none(),
        "An uninitialised tensor from the caching allocator");
  m.def("arange", [](double start, double end, double step, const py::object& dtype, const py::object& device) {
          DType dt = dtype_arg(dtype, DType::Int64);
          Device dev = device_arg(device, Device::cpu());
          // ops::arange converts the count to int64: bound it first (2^62 elements is already
          // far past any memory); an integer dtype must also hold both ends.
          const double count = std::ceil((end - start) / step);
          XT_CHECK(!(std::isfinite(count) && count > 4.611686018427388e18), ValueError, "arange(", start, ", ", end,
                   ", ", step, ") would have ", count, " elements");
          check_integer_value(start, dt, "arange: start");
          check_integer_value(end, dt, "arange: end");
          py::gil_scoped_release nogil;
          return ops::arange(start, end, step, dt, dev);
        }, py::arg("start"), py::arg("end"), py::arg("step") = 1.0, py::arg("dtype") = py::none(),
        py::arg("device") = py::none(), "Values start, start+step, ... below end");
  m.def("rand", [](const py::object& shape, const py::object& dtype, const py::object& device,
                   const py::object& generator, bool requires_grad) {
          return make_random(shape, kernels::RandomKind::Uniform, dtype, device, generator, requires_grad);
        }, py::arg("shape"), py::arg("dtype") = py::none(), py::arg("device") = py::none(),
        py::arg("generator") = py::none(), py::arg("requires_grad") = false, "Uniform samples in [0, 1)");
  m.def("randn", [](const py::object& shape, const py::object& dtype, const py::object& device,
                    const py::object& generator, bool requires_grad) {
          return make_random(shape, kernels::RandomKind::Normal, dtype, device, generator, requires_grad);
        }, py::arg("shape"), py::arg("dtype") = py::none(), py::arg("device") = py::none(),
        py::arg("generator") = py::none(), py::arg("requires_grad") = false, "Standard normal samples");
}

}  // namespace xt
