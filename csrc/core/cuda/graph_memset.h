// Memset nodes of a captured graph become kernel nodes before instantiation (graph.cpp,
// Note [Memset nodes as kernels] in graph_memset.cu). Internal to core/cuda and its tests.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace xt {
namespace cuda {

// Replaces every memset node of `graph` by a kernel node writing the same bytes, with the same
// dependencies and dependents. Returns how many were replaced; sets *err to the first failing
// CUDA call (the graph is then only partly rewritten and must not be instantiated).
int64_t memset_nodes_to_kernels(cudaGraph_t graph, cudaError_t* err);

}  // namespace cuda
}  // namespace xt
