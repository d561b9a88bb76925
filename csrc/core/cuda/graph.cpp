// CUDA graphs (core/cuda_api.h: Graph): capture of this thread's stream into a graph whose
// memory comes from a private pool of the caching allocator, and its replay.
//
//  - Capture mode is thread-local: this thread may make no unsafe call (a sync, an event query)
//    while it captures; other threads driving other devices go on. The engine's own sync points
//    and host-to-device copies raise a clear RuntimeError first (check_not_capturing).
//  - Allocations of the capture come from the graph's pool (Note [Private pools] in
//    allocator.cpp); they stay the graph's, at the same addresses, until the last graph sharing
//    the pool is destroyed.
//  - Replays run on the capturing thread's stream, so the pool's blocks (bound to that stream) and
//    the eager work around each replay are ordered by the stream alone: no host sync, no event.
//  - Before instantiation the captured memset nodes become kernel nodes writing the same bytes
//    (Note [Memset nodes as kernels] in graph_memset.cu).
#include <cuda_runtime.h>

#include <atomic>

#include "core/allocator.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/graph_memset.h"
#include "core/cuda_api.h"
#include "core/error.h"

namespace xt {
namespace cuda {

class GraphPool {
 public:
  GraphPool(int device, void* stream)
      : device(device), stream(stream), id(Allocator::get().create_pool(Device::cuda(device), stream)) {}
  ~GraphPool() { Allocator::get().release_pool(Device::cuda(device), id); }
  GraphPool(const GraphPool&) = delete;
  GraphPool& operator=(const GraphPool&) = delete;
  const int device;
  void* const stream;
  const uint64_t id;
};

namespace {

// A number per thread, never reused: a thread started after another ended may get its
// std::thread::id (the C library reuses it), so the id cannot tell the capturing thread.
std::atomic<uint64_t> g_thread_serials{0};
thread_local const uint64_t tl_thread_serial = ++g_thread_serials;

[[noreturn]] void throw_capture_error(cudaError_t err, const char* step) {
  cudaGetLastError();
  throw RuntimeError(str("CUDA graph ", step, " failed: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err),
                         ". The captured region must only queue work on this thread's stream: no host sync, no "
                         "host-to-device copy, no other stream or thread working on the device meanwhile "
                         "(docs/cuda.md, Graph capture)"));
}

}  // namespace

Graph::Graph(int device, const Graph* share_pool_with) : device_(device) {
  check_device(device);
  if (share_pool_with) {
    XT_CHECK(share_pool_with->device_ == device, ValueError, "Graph: share_pool_with is a graph of cuda:",
             share_pool_with->device_, ", this one is for cuda:", device);
    XT_CHECK(share_pool_with->pool_ != nullptr, ValueError,
             "Graph: share_pool_with has not been captured yet (capture it first)");
    pool_ = share_pool_with->pool_;
  }
}

Graph::~Graph() {
  if (capturing_) abort_capture();
  if (exec_) {
    int prev = -1;
    if (cudaGetDevice(&prev) == cudaSuccess && (prev == device_ || cudaSetDevice(device_) == cudaSuccess)) {
      // Sync point (a graph's destruction): a replay still running reads the pool's blocks. On
      // another thread than the capturing one (a graph freed by the garbage collector after its
      // rank thread ended) stream_ may be gone with that thread (its streams are destroyed at
      // thread exit, after a synchronize), so wait for the whole device instead.
      if (replays_ > 0) {
        if (tl_thread_serial == owner_) {
          cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
        } else {
          cudaDeviceSynchronize();
        }
      }
      cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
      if (prev >= 0 && prev != device_) cudaSetDevice(prev);
    }
    cudaGetLastError();  // errors here only happen at process exit
    exec_ = nullptr;
  }
  pool_.reset();  // the last graph of the pool gives its blocks back to the shared cache
}

uint64_t Graph::pool_id() const { return pool_ ? pool_->id : 0; }

void Graph::capture_begin() {
  XT_CHECK(!capturing_ && !exec_, RuntimeError,
           "Graph.capture_begin: this graph was already captured; make a new Graph to capture again");
  XT_CHECK(!cuda::capturing(), RuntimeError, "Graph.capture_begin: this thread is already capturing a graph");
  void* s = current_stream(device_);
  if (!pool_) pool_ = std::make_shared<GraphPool>(device_, s);
  XT_CHECK(pool_->stream == s, RuntimeError,
           "Graph.capture_begin: the graph shares its pool with one captured by another thread; capture both "
           "on the same thread");
  stream_ = s;
  owner_ = tl_thread_serial;
  redirect_ = std::make_unique<PoolRedirect>(PoolRedirect{Device::cuda(device_), s, pool_->id});
  prev_redirect_ = Allocator::set_redirect(redirect_.get());
  capture_depth_add(1);
  capturing_ = true;
  DeviceGuard guard(device_);
  const cudaError_t err = cudaStreamBeginCapture(static_cast<cudaStream_t>(s), cudaStreamCaptureModeThreadLocal);
  if (err != cudaSuccess) {
    end_redirect();
    throw_capture_error(err, "capture (cudaStreamBeginCapture)");
  }
}

void Graph::end_redirect() {
  Allocator::set_redirect(prev_redirect_);
  prev_redirect_ = nullptr;
  redirect_.reset();
  capture_depth_add(-1);
  capturing_ = false;
}

void Graph::capture_end() {
  XT_CHECK(capturing_, RuntimeError, "Graph.capture_end: no capture in progress (call capture_begin first)");
  DeviceGuard guard(device_);
  cudaGraph_t graph = nullptr;
  cudaError_t err = cudaStreamEndCapture(static_cast<cudaStream_t>(stream_), &graph);
  end_redirect();
  if (err != cudaSuccess || graph == nullptr) {
    if (graph) cudaGraphDestroy(graph);
    throw_capture_error(err != cudaSuccess ? err : cudaErrorStreamCaptureInvalidated, "capture");
  }
  memsets_as_kernels_ = memset_nodes_to_kernels(graph, &err);
  if (err != cudaSuccess) {
    cudaGraphDestroy(graph);
    throw_capture_error(err, "memset rewrite (Note [Memset nodes as kernels])");
  }
  size_t n = 0;
  err = cudaGraphGetNodes(graph, nullptr, &n);
  cudaGraphExec_t exec = nullptr;
  if (err == cudaSuccess) err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (err != cudaSuccess) throw_capture_error(err, "instantiation");
  err = cudaGraphUpload(exec, static_cast<cudaStream_t>(stream_));
  if (err != cudaSuccess) {
    cudaGraphExecDestroy(exec);
    throw_capture_error(err, "upload");
  }
  exec_ = exec;
  nodes_ = static_cast<int64_t>(n);
}

void Graph::abort_capture() {
  if (!capturing_) return;
  int prev = -1;
  if (cudaGetDevice(&prev) == cudaSuccess && (prev == device_ || cudaSetDevice(device_) == cudaSuccess)) {
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(static_cast<cudaStream_t>(stream_), &graph);  // the stream leaves capture mode
    if (graph) cudaGraphDestroy(graph);
    if (prev >= 0 && prev != device_) cudaSetDevice(prev);
  }
  cudaGetLastError();  // an invalidated capture's error is not sticky
  end_redirect();
}

void Graph::replay() {
  XT_CHECK(exec_ != nullptr, RuntimeError, "Graph.replay: nothing was captured");
  XT_CHECK(!cuda::capturing(), RuntimeError, "Graph.replay: this thread is capturing a graph");
  void* s = current_stream(device_);
  XT_CHECK(s == stream_, RuntimeError,
           "Graph.replay: a graph replays on the stream of the thread that captured it (its memory is bound "
           "to that stream)");
  DeviceGuard guard(device_);
  XT_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), static_cast<cudaStream_t>(s)));
  replays_++;
}

}  // namespace cuda
}  // namespace xt
