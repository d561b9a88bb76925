// Bindings for csrc/dist (xtrain._C.dist): the NCCL communicator (thread-per-GPU or one rank of a
// process group), each rank's handle, and the unique id a process group starts from.
// Every call that can wait (creation, collectives, barrier, abort, close) releases the GIL, so
// rank threads and the launcher never wait on each other through it. Builds without NCCL keep
// the same names: is_available() is False and creating a Communicator raises RuntimeError.
#include "core/error.h"
#include "python/bind.h"
#ifdef XT_NCCL
#include "dist/communicator.h"
#include "dist/reducer.h"
#endif

namespace xt {

namespace {

#ifdef XT_NCCL
// What Python holds for one rank: the shared communicator plus the rank's index.
struct RankHandle {
  std::shared_ptr<dist::Communicator> comm;
  int rank;
};
#else
constexpr const char* kNoNccl =
    "xtrain was built without NCCL (xtrain._C.dist.is_available() is False): data-parallel training "
    "needs a CUDA build that found NCCL (the nvidia-nccl-cu13 wheel or a system NCCL)";
#endif

}  // namespace

#ifdef XT_NCCL
namespace {
// A Tensor or a list of them.
std::vector<Tensor> tensor_list(const py::object& o) {
  if (py::isinstance<Tensor>(o)) return {o.cast<Tensor>()};
  return o.cast<std::vector<Tensor>>();
}
}  // namespace
#endif

void init_dist(py::module_& m) {
  py::module_ d = m.def_submodule("dist", "NCCL communicator (data-parallel training)");
#ifdef XT_NCCL
  using dist::Communicator;
  d.def("is_available", [] { return true; }, "True when xtrain was built with NCCL");
  d.def("nccl_version", &dist::nccl_version, "Version of the NCCL library in use");
  d.def("unique_id", [] { return py::bytes(dist::unique_id()); },
        "A new NCCL unique id (bytes) for a process group: rank 0 makes it, every process passes it to "
        "Communicator.join");

  // Declared first so that Communicator.rank's signature names the Python type.
  py::class_<RankHandle> rank_comm(d, "RankComm", "One rank's view of a Communicator; use it from that rank's thread");
  py::class_<Communicator, std::shared_ptr<Communicator>>(
      d, "Communicator",
      "NCCL ranks this process drives: one per GPU with a host thread each (the constructor), or its one rank "
      "of a process group (join)")
      .def(py::init([](const std::vector<int>& devices, double timeout) {
             py::gil_scoped_release nogil;
             return std::make_shared<Communicator>(devices, timeout);
           }),
           py::arg("devices"), py::arg("timeout") = 600.0,
           "Create rank i on cuda:devices[i]; a collective unfinished after `timeout` s aborts all ranks")
      .def_static("join", [](int device, int world_size, int rank, const py::bytes& unique_id, double timeout) {
             std::string id = unique_id;
             py::gil_scoped_release nogil;
             return std::make_shared<Communicator>(device, world_size, rank, id, timeout);
           }, py::arg("device"), py::arg("world_size"), py::arg("rank"), py::arg("unique_id"), py::arg("timeout") = 600.0,
           "Rank `rank` of a process group on cuda:device, from rank 0's unique_id(); starts connecting and returns: "
           "call wait_ready() next (abort() from another thread ends that wait)")
      .def("wait_ready", &Communicator::wait_ready, NoGil(),
           "Sync point: wait until the ranks are connected (raises on failure, timeout or abort)")
      .def_property_readonly("ready", &Communicator::ready)
      .def_property_readonly("first_rank", &Communicator::first_rank, "Global rank of devices[0]")
      .def_property_readonly("world_size", &Communicator::world_size)
      .def_property_readonly("devices", &Communicator::devices)
      .def_property_readonly("timeout", &Communicator::timeout)
      .def_property_readonly("aborted", &Communicator::aborted)
      .def_property_readonly("error", [](const Communicator& c) -> py::object {
             std::string e = c.error();
             return e.empty() ? py::object(py::none()) : py::object(py::str(e));
           }, "Why the communicator was aborted (None while healthy)")
      .def("rank", [](const std::shared_ptr<Communicator>& c, int rank) {
             XT_CHECK(rank >= 0 && rank < c->world_size(), IndexError, "rank ", rank, " is out of range for ",
                      c->world_size(), " rank(s)");
             XT_CHECK(c->is_local(rank), IndexError, "rank ", rank, " is driven by another process");
             return RankHandle{c, rank};
           }, py::arg("rank"), "The handle rank `rank`'s thread uses")
      .def("abort", &Communicator::abort, py::arg("reason") = "aborted by the caller", NoGil(),
           "ncclCommAbort every rank (any thread): peers blocked in NCCL return, later calls raise")
      .def("close", &Communicator::close, NoGil(),
           "Orderly teardown once every rank is done (sync point; bounded by the timeout)");

  rank_comm.def_property_readonly("rank", [](const RankHandle& h) { return h.rank; })
      .def_property_readonly("world_size", [](const RankHandle& h) { return h.comm->world_size(); })
      .def_property_readonly("device", [](const RankHandle& h) { return h.comm->device_of(h.rank); },
                             "The CUDA device index this rank drives")
      .def_property_readonly("communicator", [](const RankHandle& h) { return h.comm; })
      .def("all_reduce", [](const RankHandle& h, const std::vector<Tensor>& tensors, const std::string& op) {
             const dist::ReduceOp rop = dist::parse_reduce_op(op);
             py::gil_scoped_release nogil;
             h.comm->all_reduce(h.rank, tensors, rop);
           }, py::arg("tensors"), py::arg("op") = "avg",
           "In-place all-reduce (\"avg\" or \"sum\") of float32/bfloat16 tensors on this rank's device, "
           "as one NCCL launch on this thread's stream (asynchronous)")
      .def("reduce_scatter", [](const RankHandle& h, const py::object& flats, const std::string& op,
                                const std::vector<Tensor>& extra) {
             const std::vector<Tensor> list = tensor_list(flats);
             const dist::ReduceOp rop = dist::parse_reduce_op(op);
             py::gil_scoped_release nogil;
             h.comm->reduce_scatter(h.rank, list, rop, extra);
           }, py::arg("flats"), py::arg("op") = "avg", py::arg("extra") = std::vector<Tensor>{},
           "In place, for a tensor or each of a list: this rank's chunk (numel / world_size elements, in rank "
           "order) becomes the reduction over the ranks; the other chunks are left unspecified. `extra` tensors "
           "are all-reduced in the same launch (asynchronous)")
      .def("all_gather", [](const RankHandle& h, const py::object& flats) {
             const std::vector<Tensor> list = tensor_list(flats);
             py::gil_scoped_release nogil;
             h.comm->all_gather(h.rank, list);
           }, py::arg("flats"),
           "In place, for a tensor or each of a list: chunk r becomes rank r's chunk r on every rank (one launch, "
           "asynchronous)")
      .def("broadcast", [](const RankHandle& h, const std::vector<Tensor>& tensors, int root) {
             py::gil_scoped_release nogil;
             h.comm->broadcast(h.rank, tensors, root);
           }, py::arg("tensors"), py::arg("root") = 0, "In place: every rank gets root's values (asynchronous)")
      .def("barrier", [](const RankHandle& h) {
             py::gil_scoped_release nogil;
             h.comm->barrier(h.rank);
           }, "Sync point: wait until every rank reached its barrier")
      .def("note_replay", [](const RankHandle& h) {
             py::gil_scoped_release nogil;
             h.comm->note_replay(h.rank);
           }, "After replaying a CUDA graph that holds this rank's collectives: the watchdog times the replay "
              "(collectives queued during a capture are not tracked)")
      .def("abort", [](const RankHandle& h, const std::string& reason) {
             py::gil_scoped_release nogil;
             h.comm->abort(reason);
           }, py::arg("reason") = "aborted by the caller", "Abort the whole communicator");

  using dist::GradReducer;
  py::class_<GradReducer, std::shared_ptr<GradReducer>>(
      d, "GradReducer",
      "Averages one rank's parameter gradients over the ranks while backward runs: buckets of about "
      "bucket_bytes, in reverse parameter order, each all-reduced on a side stream as soon as its "
      "gradients are final. Use from the rank's thread: arm(); loss.backward(); finish(extra)")
      .def(py::init([](const RankHandle& h, const std::vector<Tensor>& params, size_t bucket_bytes) {
             return std::make_shared<GradReducer>(h.comm, h.rank, params, bucket_bytes);
           }),
           py::arg("comm"), py::arg("params"), py::arg("bucket_bytes") = size_t(25) << 20)
      .def("arm", &GradReducer::arm, "Hook this thread's backward walks (call before backward)")
      .def("disarm", &GradReducer::disarm, "Unhook without launching anything (after a failed backward)")
      .def("finish", [](GradReducer& r, const std::vector<Tensor>& extra) {
             py::gil_scoped_release nogil;
             r.finish(extra);
           }, py::arg("extra") = std::vector<Tensor>{},
           "Unhook, launch what is left, join the side stream and average the small gradients and `extra` "
           "(asynchronous: no host wait)")
      .def_property_readonly("num_buckets", &GradReducer::num_buckets)
      .def_property_readonly("launched_during_backward", &GradReducer::launched_during_backward,
                             "Buckets the last backward launched before it ended (the overlapped ones)");
  d.attr("UNAVAILABLE_REASON") = py::none();
#else
  d.def("is_available", [] { return false; }, "True when xtrain was built with NCCL");
  d.def("nccl_version", []() -> py::object { return py::none(); }, "None: built without NCCL");
  d.def("unique_id", []() -> py::bytes { throw RuntimeError(kNoNccl); }, "Unavailable: built without NCCL");
  struct NoCommunicator {};
  py::class_<NoCommunicator>(d, "Communicator", "Unavailable: xtrain was built without NCCL")
      .def(py::init([](const py::object&, double) -> NoCommunicator { throw RuntimeError(kNoNccl); }),
           py::arg("devices"), py::arg("timeout") = 600.0)
      .def_static("join", [](int, int, int, const py::bytes&, double) -> NoCommunicator { throw RuntimeError(kNoNccl); },
                  py::arg("device"), py::arg("world_size"), py::arg("rank"), py::arg("unique_id"),
                  py::arg("timeout") = 600.0);
  d.attr("UNAVAILABLE_REASON") = kNoNccl;
#endif
}

}  // namespace xt
