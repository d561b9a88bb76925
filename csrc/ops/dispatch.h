// XT_KERNEL(device, name, args...): call kernels::cuda::name on a CUDA device and
// kernels::cpu::name on the CPU. In a CPU-only build the CUDA branch raises the "built
// without CUDA" error instead (the cuda:: kernels do not exist there). Pass the stream as the
// last argument: ops::stream_for(device).
// The CPU branch runs under the CPU profile's timer (core/cpu_profile.h): the kernel's name and
// its wall time are recorded when the profile is on; off, the cost is one relaxed atomic load.
#pragma once
#include "core/cpu_profile.h"
#include "core/cuda_api.h"
#include "kernels/kernels.h"
#include "ops/ops.h"

#define XT_CPU_KERNEL(name, ...) \
  ::xt::cpu_profile::timed(#name, false, [&]() -> decltype(auto) { return ::xt::kernels::cpu::name(__VA_ARGS__); })
#ifdef XT_CUDA
#define XT_KERNEL(dev, name, ...) \
  ((dev).is_cuda() ? ::xt::kernels::cuda::name(__VA_ARGS__) : XT_CPU_KERNEL(name, __VA_ARGS__))
#else
#define XT_KERNEL(dev, name, ...) \
  ((dev).is_cuda() ? ::xt::cuda::check_device((dev).index) : XT_CPU_KERNEL(name, __VA_ARGS__))
#endif
