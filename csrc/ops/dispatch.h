// XT_KERNEL(device, name, args...): call kernels::cuda::name on a CUDA device and
// kernels::cpu::name on the CPU. In a CPU-only build the CUDA branch raises the "built
// without CUDA" error instead (the cuda:: kernels do not exist there). Pass the stream as the
// last argument: ops::stream_for(device).
#pragma once
#include "core/cuda_api.h"
#include "kernels/kernels.h"
#include "ops/ops.h"

#ifdef XT_CUDA
#define XT_KERNEL(dev, name, ...) \
  ((dev).is_cuda() ? ::xt::kernels::cuda::name(__VA_ARGS__) : ::xt::kernels::cpu::name(__VA_ARGS__))
#else
#define XT_KERNEL(dev, name, ...) \
  ((dev).is_cuda() ? ::xt::cuda::check_device((dev).index) : ::xt::kernels::cpu::name(__VA_ARGS__))
#endif
