// The CUDA runtime as the rest of the engine sees it: devices, per-thread streams, copies.
//
// Declared for every build; a CPU-only build links core/cuda_stub.cpp, where is_built() is
// false, device_count() is 0 and everything that needs a GPU raises RuntimeError. The CUDA
// build links core/cuda/runtime.cpp. Kernels and ops include this, never cuda_runtime.h
// directly, unless they are CUDA files themselves.
//
// Streams: each (host thread, device) pair has its own stream, created on first use, so
// threads driving different GPUs never serialise. The current device is per thread too.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "core/dtype.h"

namespace xt {
class RawBackend;
struct PoolRedirect;
namespace cuda {

bool is_built();
int device_count();  // devices the runtime sees (0 when not built or no driver)
bool is_available();
void check_device(int index);  // RuntimeError if CUDA is not built or the device is absent
int current_device();          // this thread's current device (default 0)
void set_device(int index);    // this thread's current device
void* current_stream(int device);  // this thread's stream on that device (cudaStream_t)
void synchronize(int device);      // sync point: waits for this thread's stream on device
void synchronize_all();            // sync point: every stream of this thread
RawBackend* raw_backend();         // cudaMalloc/cudaFree backend for the caching allocator
std::string device_name(int device);
std::string runtime_info();        // driver/runtime/cuBLAS versions, for logs

// Byte copies between any two devices on this thread's stream of the CUDA side. A copy that
// lands in host memory waits for the stream (documented sync point: numpy(), item(), to("cpu")).
void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes);
void memset_zero(void* dst, Device dev, size_t nbytes);  // async on the current stream

// An asynchronous read of a few device bytes (the training loop's per-step loss and norm): the
// copy into pinned host memory is queued on this thread's stream with an event after it, so the
// host does not wait when it asks. wait() is the sync point: it blocks until the event (not the
// whole stream: work queued later keeps the GPU busy), raises what the device-side index checks
// found, and returns the bytes.
// Any size: the pinned slots are pooled by capacity (the greedy decode loop reads its token ring,
// R x B int64, this way).
constexpr size_t kHostReadMax = 64;  // bytes of the smallest slot: a few scalars
class HostRead {
 public:
  HostRead(const void* src, int device, size_t nbytes);
  ~HostRead();
  HostRead(const HostRead&) = delete;
  HostRead& operator=(const HostRead&) = delete;
  bool ready() const;   // the copy has landed (never blocks)
  const void* wait();   // sync point
 private:
  void* host_ = nullptr;
  void* event_ = nullptr;
  size_t bytes_ = 0;  // the slot's capacity
  int device_ = 0;
};

// A timing event on this thread's stream of one device (the training loop's step time: an event
// before the step's first launch and one after its last, read one step late). record() queues it
// and refuses while the thread captures a graph (record between replays instead: a replay is one
// launch). elapsed_ms_since(start) is a sync point: it waits for this event, then returns the
// device time between the two, in milliseconds (cudaEventElapsedTime; ~0.5 us resolution).
// ready() never waits. Both events must have been recorded on the same device.
class Event {
 public:
  explicit Event(int device);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record();
  bool recorded() const { return recorded_; }
  bool ready() const;
  double elapsed_ms_since(const Event& start);
  int device() const { return device_; }
 private:
  void* event_ = nullptr;  // cudaEvent_t
  int device_ = 0;
  bool recorded_ = false;
};

// ---- CUDA graphs (core/cuda/graph.cpp; docs/cuda.md "Graph capture")
//
// Graph captures the work this thread queues on its stream of `device` between capture_begin()
// and capture_end(), and replay() launches it again on that stream, with the same kernels,
// arguments and addresses. While capturing:
//  - the caching allocator serves this thread's allocations on the stream from the graph's
//    private pool, and blocks freed there join it (Note [Private pools] in allocator.cpp), so the
//    addresses the graph uses belong to it until it is destroyed;
//  - sync points (copies to the host, synchronize(), read_async) and host-to-device copies
//    (their source would be frozen into the graph) raise RuntimeError naming the operation;
//  - raw allocations run in relaxed capture mode; the cache is never released.
// A failed capture raises RuntimeError and leaves the stream usable (abort_capture() is called
// for the caller when capture_end fails). Destroying a replayed graph synchronises its stream
// (a sync point), then gives its pool back to the shared cache.
class GraphPool;
class Graph {
 public:
  // share_pool_with: a graph captured before this one, on the same thread and device, whose
  // replays always come before this one's (e.g. forward+backward, then the optimizer step):
  // both draw from one pool, so memory the first frees is reused by the second.
  explicit Graph(int device, const Graph* share_pool_with = nullptr);
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  void capture_begin();
  void capture_end();         // instantiates; RuntimeError (capture aborted) when capture failed
  void abort_capture();       // ends a capture in progress and discards it; never throws
  void replay();              // on this thread's stream of the device; no host sync
  bool capturing() const { return capturing_; }
  bool captured() const { return exec_ != nullptr; }
  int64_t num_nodes() const { return nodes_; }  // kernels, copies, memsets of the graph
  // memset nodes written as kernel nodes (Note [Memset nodes as kernels] in graph_memset.cu)
  int64_t memsets_as_kernels() const { return memsets_as_kernels_; }
  int64_t replays() const { return replays_; }
  int device() const { return device_; }
  uint64_t pool_id() const;

 private:
  void end_redirect();
  int device_ = 0;
  void* stream_ = nullptr;
  uint64_t owner_ = 0;  // serial number of the thread that captured it (stream_ is that thread's stream)
  void* exec_ = nullptr;  // cudaGraphExec_t
  bool capturing_ = false;
  int64_t nodes_ = 0;
  int64_t memsets_as_kernels_ = 0;
  int64_t replays_ = 0;
  std::shared_ptr<GraphPool> pool_;
  std::unique_ptr<PoolRedirect> redirect_;  // this capture's allocator redirect
  const PoolRedirect* prev_redirect_ = nullptr;
};

// True while this thread captures a graph (on any device).
bool capturing();
// RuntimeError when this thread is capturing: `what` cannot run inside a CUDA graph.
void check_not_capturing(const char* what);

// ---- Early launch (Note [Early launch of the decode step's kernels], kernels/cuda/common.cuh)
//
// set_early_launch(true) lets this thread's launches of the kernels that support it start before
// the kernel queued ahead of them has finished (programmatic dependent launch); it returns the
// previous setting. The caller promises that nothing such a kernel reads before its wait (its
// weights, its norm weights and residual, the KV cache's earlier slots, positions and lengths)
// is written by the launch just before it: the generator's decode step keeps that promise.
// early_launch(device): whether a launch on that device starts early now: asked for by this
// thread, and the device is sm_90 or later.
bool set_early_launch(bool on);
bool early_launch(int device);

}  // namespace cuda
}  // namespace xt
