// The development probes' CUDA error check (print the error and its place, return 1 from main) and
// the harnesses' kernel timer.
#pragma once
#include <cstdio>

#include <cuda_runtime.h>

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);    \
      return 1;                                                                                \
    }                                                                                          \
  } while (0)

// Mean milliseconds of 20 launches after 3 warm-up ones (CUDA events), negative on a CUDA error.
template <class F>
float time_ms(F&& launch) {
  constexpr int kReps = 20;
  cudaEvent_t e0, e1;
  if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) return -1.f;
  for (int w = 0; w < 3; ++w) launch();
  cudaEventRecord(e0);
  for (int r = 0; r < kReps; ++r) launch();
  cudaEventRecord(e1);
  float ms = -1.f;
  if (cudaEventSynchronize(e1) != cudaSuccess || cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess) ms = -kReps;
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ms / kReps;
}
