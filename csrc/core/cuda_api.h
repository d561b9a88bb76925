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
#include <string>

#include "core/dtype.h"

namespace xt {
class RawBackend;
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
constexpr size_t kHostReadMax = 64;  // bytes per HostRead: a few scalars
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
  int device_ = 0;
};

}  // namespace cuda
}  // namespace xt
