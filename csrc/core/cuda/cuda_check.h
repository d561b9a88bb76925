// Private helpers of the CUDA backend (core/cuda/runtime.cpp and kernels/cuda/*.cu only):
// the error-check macro, a device guard, and which device a stream of this thread belongs to.
//
// Every CUDA runtime call in the backend goes through XT_CUDA_CHECK, so a failure surfaces as
// xt::RuntimeError carrying the CUDA error name and string, the failing call and its location.
#pragma once
#include <cuda_runtime.h>

#include "core/error.h"

namespace xt {
namespace cuda {

// Clears the (non-sticky) error state and throws RuntimeError describing `err`.
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line);

// The device a stream returned by current_stream() belongs to (this thread's table first,
// the driver otherwise); nullptr (the legacy default stream) means the current device.
int stream_device(void* stream);

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

}  // namespace cuda
}  // namespace xt

#define XT_CUDA_CHECK(expr)                                                        \
  do {                                                                             \
    const cudaError_t xt_err_ = (expr);                                            \
    if (xt_err_ != cudaSuccess) ::xt::cuda::throw_cuda_error(xt_err_, #expr, __FILE__, __LINE__); \
  } while (0)
