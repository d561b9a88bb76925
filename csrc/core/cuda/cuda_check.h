// Private helpers of the CUDA backend (core/cuda/runtime.cpp and kernels/cuda/*.cu only):
// the error-check macro, a device guard, which device a stream of this thread belongs to, and
// the record through which kernels report out-of-range indices.
//
// Every CUDA runtime call in the backend goes through XT_CUDA_CHECK, so a failure surfaces as
// xt::RuntimeError carrying the CUDA error name and string, the failing call and its location.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"

namespace xt {
namespace cuda {

// Clears the (non-sticky) error state and throws RuntimeError describing `err`.
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line);

// The device a stream returned by current_stream() belongs to (this thread's table first,
// the driver otherwise); nullptr (the legacy default stream) means the current device.
int stream_device(void* stream);

// This thread's graph capture depth (core/cuda/graph.cpp), read by capturing().
void capture_depth_add(int delta);

// Makes `device` the runtime's current device for a scope and restores the previous one.
// A no-op (one cudaGetDevice) when it is already current: cheap enough for every launch.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

// Note [Device-side index checks]
// Embedding ids, cross-entropy targets and KV cache positions/lengths are checked by the kernels
// that read them, not by the host (that would need a sync per step). A kernel that meets an index
// outside its range reads nothing for it (a zero row, a skipped row, a NaN loss: each kernel says which) and writes the
// index into its device's IndexErrorRecord, which lives in pinned host memory the device reaches
// directly (unified addressing): no copy and no sync is needed to fill it. Every sync point on the host (synchronize,
// a copy into host memory: item(), numpy(), to("cpu")) then calls check_index_errors, which
// raises IndexError from the record and clears it, so the process keeps working. Limitations:
// the error surfaces at the next sync point, not at the op; with several bad indices in flight
// one of them is reported; a record is per device, so any thread's sync point on that device
// may be the one that reports it.
enum class IndexSite : int32_t { Embedding = 1, EmbeddingBackward = 2, CrossEntropy = 3, KvCacheWrite = 4,
                                  DecodeAttention = 5, DecodePrep = 6 };
struct IndexErrorRecord {
  int32_t flag;          // 0: nothing to report; 1: the fields below are complete
  int32_t site;          // IndexSite: which kernel found it
  int64_t value;         // an offending index
  int64_t bound;         // valid indices are [0, bound)
  int64_t ignore_index;  // cross_entropy's ignore_index (accepted as well)
};
// The record of `device`, for its kernels (pinned host memory at the same address on host and
// device; allocated on first use, never freed).
IndexErrorRecord* index_error_record(int device);
// IndexError if a kernel on `device` recorded an out-of-range index since the last check; clears it.
void check_index_errors(int device);

}  // namespace cuda
}  // namespace xt

#define XT_CUDA_CHECK(expr)                                                        \
  do {                                                                             \
    const cudaError_t xt_err_ = (expr);                                            \
    if (xt_err_ != cudaSuccess) ::xt::cuda::throw_cuda_error(xt_err_, #expr, __FILE__, __LINE__); \
  } while (0)
