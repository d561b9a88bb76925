// Note [Memset nodes as kernels]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// cuBLAS zeroes a few bytes of its workspace with cudaMemsetAsync before each GEMM of its
// cooperative Hopper kernels (nvjet ..._coopA/_coopB): 60 memsets in a dim768 batch-32 step, 203
// at batch 128. Captured, each is a memset node, and a replayed graph pays for the switch between
// a memset node and a kernel node on both sides: the H200 profiles of 8e90d58's step show ~1.4 us
// idle before every memset and 2.5-5 us after it, against ~0.05 us between two kernel nodes —
// 0.29 of the 0.32 ms of idle inside a b32 step and ~0.78 of 0.83 ms at b128.
//
// So before instantiation every memset node is replaced by a kernel node that writes the same bytes
// (same destination, pitch, element size, value, width and height), wired to the same dependencies
// and dependents. A memset's result is fully determined by its parameters, so the replay's bits
// are unchanged; only the node type differs. A contiguous, 16-byte aligned memset whose length is a
// multiple of 16 bytes is written in 16-byte words; any other in its own element size, row by row.
// A memset node joined by an edge that carries data (programmatic launch ports) is left as it is.
#include "core/cuda/graph_memset.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace xt {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 1024;

__global__ void memset_words16_kernel(uint4* __restrict__ dst, uint4 word, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = word;
}

template <typename T>
__global__ void memset_rows_kernel(char* __restrict__ dst, size_t pitch, T value, size_t width, size_t height) {
  const size_t n = width * height;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t row = i / width;
    reinterpret_cast<T*>(dst + row * pitch)[i - row * width] = value;
  }
}

unsigned blocks_for(size_t n) { return static_cast<unsigned>(std::clamp<size_t>((n + kThreads - 1) / kThreads, 1, kMaxBlocks)); }

// True when every edge in `edges` is a plain dependency (what stream capture records).
bool plain(const std::vector<cudaGraphEdgeData>& edges) {
  for (const cudaGraphEdgeData& e : edges)
    if (e.type != cudaGraphDependencyTypeDefault || e.from_port != 0 || e.to_port != 0) return false;
  return true;
}

// One memset node -> one kernel node; false (and nothing changed) when its edges carry data.
bool replace(cudaGraph_t graph, cudaGraphNode_t node, cudaError_t* err) {
  cudaMemsetParams p{};
  if ((*err = cudaGraphMemsetNodeGetParams(node, &p)) != cudaSuccess) return false;
  size_t nd = 0, nt = 0;
  if ((*err = cudaGraphNodeGetDependencies(node, nullptr, nullptr, &nd)) != cudaSuccess) return false;
  if ((*err = cudaGraphNodeGetDependentNodes(node, nullptr, nullptr, &nt)) != cudaSuccess) return false;
  std::vector<cudaGraphNode_t> deps(nd), dependents(nt);
  std::vector<cudaGraphEdgeData> dep_edges(nd), out_edges(nt);
  if (nd && (*err = cudaGraphNodeGetDependencies(node, deps.data(), dep_edges.data(), &nd)) != cudaSuccess) return false;
  if (nt && (*err = cudaGraphNodeGetDependentNodes(node, dependents.data(), out_edges.data(), &nt)) != cudaSuccess)
    return false;
  if (!plain(dep_edges) || !plain(out_edges)) return false;

  const size_t es = p.elementSize;
  const uint32_t v = es == 1 ? (p.value & 0xFFu) : es == 2 ? (p.value & 0xFFFFu) : p.value;
  const uint32_t word = es == 1 ? v * 0x01010101u : es == 2 ? (v | (v << 16)) : v;
  const size_t bytes = p.width * p.height * es;
  const bool contiguous = p.height <= 1 || p.pitch == p.width * es;

  cudaKernelNodeParams kp{};
  kp.blockDim = dim3(kThreads);
  // argument storage: live until cudaGraphAddKernelNode has copied it
  uint4 w16 = make_uint4(word, word, word, word);
  uint4* d16 = static_cast<uint4*>(p.dst);
  size_t n16 = bytes / 16;
  char* rows = static_cast<char*>(p.dst);
  size_t pitch = p.pitch, width = p.width, height = p.height;
  uint8_t v1 = static_cast<uint8_t>(v);
  uint16_t v2 = static_cast<uint16_t>(v);
  uint32_t v4 = v;
  void* args16[] = {&d16, &w16, &n16};
  void* args1[] = {&rows, &pitch, &v1, &width, &height};
  void* args2[] = {&rows, &pitch, &v2, &width, &height};
  void* args4[] = {&rows, &pitch, &v4, &width, &height};
  if (contiguous && reinterpret_cast<uintptr_t>(p.dst) % 16 == 0 && bytes % 16 == 0) {
    kp.func = reinterpret_cast<void*>(&memset_words16_kernel);
    kp.gridDim = dim3(blocks_for(n16));
    kp.kernelParams = args16;
  } else {
    kp.gridDim = dim3(blocks_for(width * height));
    if (es == 1) {
      kp.func = reinterpret_cast<void*>(&memset_rows_kernel<uint8_t>);
      kp.kernelParams = args1;
    } else if (es == 2) {
      kp.func = reinterpret_cast<void*>(&memset_rows_kernel<uint16_t>);
      kp.kernelParams = args2;
    } else {
      kp.func = reinterpret_cast<void*>(&memset_rows_kernel<uint32_t>);
      kp.kernelParams = args4;
    }
  }
  cudaGraphNode_t k = nullptr;
  if ((*err = cudaGraphAddKernelNode(&k, graph, deps.data(), nd, &kp)) != cudaSuccess) return false;
  if (nt) {
    std::vector<cudaGraphNode_t> from(nt, k);
    if ((*err = cudaGraphAddDependencies(graph, from.data(), dependents.data(), nullptr, nt)) != cudaSuccess) return false;
  }
  *err = cudaGraphDestroyNode(node);  // and its edges
  return *err == cudaSuccess;
}

}  // namespace

int64_t memset_nodes_to_kernels(cudaGraph_t graph, cudaError_t* err) {
  *err = cudaSuccess;
  size_t n = 0;
  if ((*err = cudaGraphGetNodes(graph, nullptr, &n)) != cudaSuccess) return 0;
  std::vector<cudaGraphNode_t> nodes(n);
  if (n && (*err = cudaGraphGetNodes(graph, nodes.data(), &n)) != cudaSuccess) return 0;
  int64_t replaced = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    if ((*err = cudaGraphNodeGetType(node, &type)) != cudaSuccess) return replaced;
    if (type != cudaGraphNodeTypeMemset) continue;
    if (replace(graph, node, err)) {
      replaced++;
    } else if (*err != cudaSuccess) {
      return replaced;
    }
  }
  return replaced;
}

}  // namespace cuda
}  // namespace xt
