// The development probes' CUDA error check: print the error and its place, return 1 from main.
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
