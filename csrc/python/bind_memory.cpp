// Bindings: allocator stats and limits, CUDA runtime queries.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/bf16.h"
#include "core/cuda_api.h"
#include "core/error.h"
#include "kernels/kernels.h"
#include "ops/ops.h"
#include "python/bind.h"

namespace xt {

namespace {

// One-element tensors read without waiting for the stream (cuda::HostRead): a CPU tensor's value
// is taken at once, a CUDA tensor's copy is queued; wait() gives the values as Python numbers.
class PendingValues {
 public:
  explicit PendingValues(const std::vector<Tensor>& tensors) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      const Tensor& t = tensors[i];
      XT_CHECK(t.defined() && t.numel() == 1, ValueError, "read_async: tensors[", i,
               "] must be a one-element tensor, got ", t.defined() ? t.describe() : std::string("an undefined one"));
      dtypes_.push_back(t.dtype());
      if (t.device().is_cuda()) {
        reads_.push_back(std::make_unique<cuda::HostRead>(t.data_ptr(), t.device().index, t.itemsize()));
        cpu_.emplace_back();
      } else {
        reads_.push_back(nullptr);
        cpu_.emplace_back(static_cast<const char*>(t.data_ptr()), static_cast<const char*>(t.data_ptr()) + t.itemsize());
      }
    }
  }
  PendingValues(const PendingValues&) = delete;
  PendingValues& operator=(const PendingValues&) = delete;
  bool ready() const {
    for (const auto& r : reads_)
      if (r && !r->ready()) return false;
    return true;
  }
  py::list wait() {
    std::vector<const void*> bytes(reads_.size());
    {
      py::gil_scoped_release nogil;
      for (size_t i = 0; i < reads_.size(); ++i) bytes[i] = reads_[i] ? reads_[i]->wait() : cpu_[i].data();
    }
    py::list out;
    for (size_t i = 0; i < bytes.size(); ++i) out.append(scalar(dtypes_[i], bytes[i]));
    return out;
  }

 private:
  static py::object scalar(DType dt, const void* p) {
    switch (dt) {
      case DType::Float32: return py::float_(*static_cast<const float*>(p));
      case DType::Float64: return py::float_(*static_cast<const double*>(p));
      case DType::BFloat16: return py::float_(bf16_to_float(*static_cast<const bf16*>(p)));
      case DType::Int32: return py::int_(*static_cast<const int32_t*>(p));
      default: return py::int_(*static_cast<const int64_t*>(p));
    }
  }
  std::vector<DType> dtypes_;
  std::vector<std::unique_ptr<cuda::HostRead>> reads_;
  std::vector<std::vector<char>> cpu_;
};

// A whole tensor read without waiting for the stream (cuda::HostRead of its bytes): the copy of a
// CUDA tensor is queued behind the work queued so far, a CPU tensor's bytes are taken at once;
// wait() gives a numpy array of the tensor's shape and dtype (a copy). bf16 has no numpy dtype:
// TypeError (cast first).
class PendingArray {
 public:
  explicit PendingArray(const Tensor& t) : dtype_(t.dtype()), shape_(t.shape().begin(), t.shape().end()) {
    XT_CHECK(t.defined(), ValueError, "read_array_async: the tensor is undefined");
    XT_CHECK(t.dtype() != DType::BFloat16, TypeError,
             "read_array_async: numpy has no bfloat16; cast the tensor first (to float32)");
    nbytes_ = static_cast<size_t>(t.nbytes());
    if (t.device().is_cuda()) {
      read_ = std::make_unique<cuda::HostRead>(t.data_ptr(), t.device().index, nbytes_);
    } else {
      const char* p = static_cast<const char*>(t.data_ptr());
      cpu_.assign(p, p + nbytes_);
    }
  }
  PendingArray(const PendingArray&) = delete;
  PendingArray& operator=(const PendingArray&) = delete;
  bool ready() const { return !read_ || read_->ready(); }
  py::array wait() {
    const void* bytes = nullptr;
    {
      py::gil_scoped_release nogil;
      bytes = read_ ? read_->wait() : cpu_.data();
    }
    py::array out(numpy_dtype(dtype_), shape_);
    if (nbytes_) std::memcpy(out.mutable_data(), bytes, nbytes_);
    return out;
  }

 private:
  DType dtype_;
  std::vector<py::ssize_t> shape_;
  size_t nbytes_ = 0;
  std::unique_ptr<cuda::HostRead> read_;
  std::vector<char> cpu_;
};

py::dict stats_dict(const MemoryStats& s) {
  py::dict d;
  d["allocated_bytes.current"] = s.allocated_bytes;
  d["allocated_bytes.peak"] = s.allocated_bytes_peak;
  d["requested_bytes.current"] = s.requested_bytes;
  d["requested_bytes.peak"] = s.requested_bytes_peak;
  d["reserved_bytes.current"] = s.reserved_bytes;
  d["reserved_bytes.peak"] = s.reserved_bytes_peak;
  d["num_alloc_calls"] = s.num_alloc_calls;
  d["num_free_calls"] = s.num_free_calls;
  d["num_cache_hits"] = s.num_cache_hits;
  d["num_raw_alloc"] = s.num_raw_alloc;
  d["num_raw_free"] = s.num_raw_free;
  d["num_ooms"] = s.num_ooms;
  d["pool_bytes.current"] = s.pool_bytes;  // reserved by CUDA graphs' private pools
  d["num_pools"] = s.num_pools;
  d["limit_bytes"] = s.limit_bytes >= 0 ? py::object(py::int_(s.limit_bytes)) : py::object(py::none());
  return d;
}
}  // namespace

void init_memory(py::module_& m) {
  const Device cpu = Device::cpu();
  m.def("memory_stats", [cpu](const py::object& device) { return stats_dict(Allocator::get().stats(device_arg(device, cpu))); },
        py::arg("device") = py::none(),
        "Caching-allocator statistics of a device (PyTorch's names where it has one)");
  m.def("reset_peak_memory_stats", [cpu](const py::object& device) { Allocator::get().reset_peak(device_arg(device, cpu)); },
        py::arg("device") = py::none(), "Set the peaks to the current values");
  m.def("empty_cache", [cpu](const py::object& device) { Allocator::get().empty_cache(device_arg(device, cpu)); },
        py::arg("device") = py::none(), NoGil(), "Return cached free blocks to the system / driver");
  m.def("record_memory_history", [cpu](bool enabled, const py::object& device) {
          Allocator::get().record_history(device_arg(device, cpu), enabled);
        }, py::arg("enabled") = true, py::arg("device") = py::none(),
        "Record every allocation the caching allocator takes from the device from now on (forgetting "
        "what it recorded before), or stop recording; memory_history() reads them");
  m.def("memory_history", [cpu](const py::object& device) {
          py::list out;
          for (const MemoryEvent& e : Allocator::get().history(device_arg(device, cpu))) {
            py::dict d;
            d["requested"] = e.requested;
            d["size"] = e.size;
            d["pool"] = e.pool;
            d["allocated_bytes"] = e.allocated_bytes;
            d["requested_bytes"] = e.requested_bytes;
            d["reserved_bytes"] = e.reserved_bytes;
            d["owner_free_bytes"] = e.owner_free_bytes;
            d["owner_largest_free"] = e.owner_largest_free;
            d["owner_free_blocks"] = e.owner_free_blocks;
            out.append(d);
          }
          return out;
        }, py::arg("device") = py::none(),
        "The allocations the caching allocator took from the device since record_memory_history(True), in "
        "order: requested and size (bytes asked for and taken), pool (the CUDA graph's private pool served, 0 for "
        "the shared cache), the allocator's allocated/requested/reserved bytes just before, and the free bytes, "
        "largest free block and free block count of the cache or pool that could not serve the request");
  m.def("memory_segments", [cpu](const py::object& device) {
          py::list out;
          for (const MemorySegment& seg : Allocator::get().segments(device_arg(device, cpu))) {
            py::list pieces;
            for (const MemorySegment::Piece& p : seg.pieces) {
              py::dict d;
              d["offset"] = p.offset;
              d["size"] = p.size;
              d["free"] = p.free;
              d["pool"] = p.pool;
              pieces.append(d);
            }
            py::dict d;
            d["size"] = seg.size;
            d["pieces"] = pieces;
            out.append(d);
          }
          return out;
        }, py::arg("device") = py::none(),
        "The caching allocator's large allocations on a device (1 MiB and up) and the pieces each is split "
        "into now: offset, size, free, and for a free piece the private pool that owns it (0: the shared cache)");
  m.def("get_num_threads", &kernels::cpu::num_threads,
        "Threads of the CPU backend: OpenBLAS's pool for the matrix multiplies, and as many for the CPU kernels "
        "that split rows or elements (their bits do not depend on the count)");
  m.def("set_num_threads", [](const py::object& n) {
          XT_CHECK(py::isinstance<py::int_>(n) && !py::isinstance<py::bool_>(n), TypeError,
                   "set_num_threads: the thread count must be an int, got ",
                   py::str(py::type::of(n).attr("__name__")).cast<std::string>());
          int overflow = 0;  // an int beyond long long is out of range too, not a cast error
          const long long v = PyLong_AsLongLongAndOverflow(n.ptr(), &overflow);
          XT_CHECK(overflow == 0 && v >= 1 && v <= 1024, ValueError,
                   "set_num_threads: the thread count must be in 1..1024, got ", py::str(n).cast<std::string>());
          kernels::cpu::set_num_threads(static_cast<int>(v));
        }, py::arg("n"),
        "Set the CPU backend's matrix-multiply threads (as OPENBLAS_NUM_THREADS at start-up); on a machine "
        "whose cores are shared with other work, fewer threads than cores avoid oversubscription. A GEMM's "
        "bits may depend on the count: results repeat at a fixed count");
  m.def("set_memory_limit", [cpu](const py::object& nbytes, const py::object& device) {
          int64_t limit = -1;
          if (!nbytes.is_none()) {
            XT_CHECK(py::isinstance<py::int_>(nbytes), TypeError, "set_memory_limit: bytes must be an int or None");
            limit = nbytes.cast<int64_t>();
            XT_CHECK(limit >= 0, ValueError, "set_memory_limit: bytes must be >= 0, got ", limit);
          }
          Allocator::get().set_limit(device_arg(device, cpu), limit);
        }, py::arg("nbytes"), py::arg("device") = py::none(),
        "Cap the bytes the allocator may reserve on a device (None lifts the cap)");

  py::module_ c = m.def_submodule("cuda", "CUDA runtime queries");
  c.def("is_built", &cuda::is_built, "True when the CUDA backend was compiled in");
  c.def("is_available", &cuda::is_available, "True when the CUDA backend is built and a GPU is visible");
  c.def("device_count", &cuda::device_count, "Number of visible GPUs");
  c.def("current_device", &cuda::current_device, "This thread's current device");
  c.def("set_device", &cuda::set_device, py::arg("device"), "Set this thread's current device");
  c.def("synchronize", [](const py::object& device) {
          if (device.is_none()) cuda::synchronize_all();
          else cuda::synchronize(device_arg(device, Device::cuda(0)).index);
        }, py::arg("device") = py::none(), NoGil(), "Wait for this thread's work on a device (all when None)");
  c.def("device_name", &cuda::device_name, py::arg("device") = 0);
  py::class_<PendingValues>(c, "PendingValues",
                            "Values of one-element tensors on their way to the host (read_async)")
      .def("ready", &PendingValues::ready, "True once every value has landed (never waits)")
      .def("wait", &PendingValues::wait, "The values as Python numbers; waits for them (a sync point)");
  c.def("read_async", [](const std::vector<Tensor>& tensors) { return new PendingValues(tensors); },
        py::arg("tensors"),
        "Queue copies of one-element tensors to the host without waiting for the stream; "
        ".wait() returns their values (and waits only for the work queued before this call)");
  py::class_<PendingArray>(c, "PendingArray", "A tensor's values on their way to the host (read_array_async)")
      .def("ready", &PendingArray::ready, "True once the copy has landed (never waits)")
      .def("wait", &PendingArray::wait, "The values as a numpy array (a copy); waits for them (a sync point)");
  c.def("read_array_async", [](const Tensor& t) { return new PendingArray(t); }, py::arg("tensor"),
        "Queue a copy of a whole tensor (not bfloat16) to the host without waiting for the stream; "
        ".wait() returns it as a numpy array and waits only for the work queued before this call");
  py::class_<cuda::Event>(c, "Event",
                          "A timing event on this thread's stream of one CUDA device: record() queues it, "
                          "elapsed_ms_since(start) waits for it and returns the device time since start (ms)")
      .def(py::init<int>(), py::arg("device") = 0, "device: the CUDA device index")
      .def("record", &cuda::Event::record,
           "Queue the event on this thread's stream (not while capturing a graph: record between replays)")
      .def("ready", &cuda::Event::ready, "True once the device has passed the event, or when never recorded (never waits)")
      .def("elapsed_ms_since", &cuda::Event::elapsed_ms_since, py::arg("start"), NoGil(),
           "Milliseconds of device time from `start` to this event; waits for this event (a sync point)")
      .def_property_readonly("device", &cuda::Event::device)
      .def_property_readonly("recorded", &cuda::Event::recorded);
  c.def("runtime_info", &cuda::runtime_info, "Driver, runtime and cuBLAS versions");
  py::class_<cuda::Graph>(c, "Graph",
                          "A CUDA graph of the work this thread queues on its stream of one device between "
                          "capture_begin() and capture_end(); replay() launches it again (docs/cuda.md)")
      .def(py::init<int, const cuda::Graph*>(), py::arg("device") = 0, py::arg("share_pool_with") = nullptr,
           "device: the CUDA device index. share_pool_with: a graph captured before this one on this thread, "
           "always replayed before it: both use one private memory pool")
      .def("capture_begin", &cuda::Graph::capture_begin,
           "Start capturing this thread's stream; allocations come from the graph's private pool")
      .def("capture_end", &cuda::Graph::capture_end,
           "End the capture and instantiate the graph; RuntimeError when the captured region was not capturable")
      .def("abort_capture", &cuda::Graph::abort_capture, "Discard a capture in progress (never raises)")
      .def("replay", &cuda::Graph::replay, NoGil(), "Launch the graph on this thread's stream (no host sync)")
      .def_property_readonly("capturing", &cuda::Graph::capturing)
      .def_property_readonly("captured", &cuda::Graph::captured)
      .def_property_readonly("num_nodes", &cuda::Graph::num_nodes,
                             "Nodes of the graph: kernels, copies and memsets, i.e. the launches one replay saves")
      .def_property_readonly("memsets_as_kernels", &cuda::Graph::memsets_as_kernels,
                             "Captured memsets written as kernel nodes (Note [Memset nodes as kernels])")
      .def_property_readonly("replays", &cuda::Graph::replays)
      .def_property_readonly("device", &cuda::Graph::device)
      .def_property_readonly("pool_id", &cuda::Graph::pool_id, "The private pool's id (0 before the capture)");
  c.def("is_capturing", &cuda::capturing, "True while this thread captures a CUDA graph");
  c.def("set_early_launch", &cuda::set_early_launch, py::arg("on"),
        "Let this thread's launches of the decode step's kernels start before the kernel ahead of them "
        "finishes (programmatic dependent launch, sm_90+); returns the "
        "previous setting. The caller promises that what those kernels read before their wait is not "
        "written by the launch just before them (Note [Early launch of the decode step's kernels])");
  c.def("early_launch", &cuda::early_launch, py::arg("device") = 0,
        "Whether a launch on that device starts early now (asked for by this thread, sm_90+)");
  c.def("set_allow_tf32", &ops::set_allow_tf32, py::arg("allow"),
        "Let float32 GEMMs use TF32 tensor cores (off by default: true float32)");
  c.def("allow_tf32", &ops::allow_tf32, "Whether float32 GEMMs may use TF32");
}

}  // namespace xt
