// Note [Memset nodes as kernels] (core/cuda/graph_memset.cu): a graph's memset nodes of every
// element size, with and without a pitch, aligned and not, become kernel nodes that write the same
// bytes in the same order relative to the other nodes, and leave the bytes between rows alone.
// Every test skips (with the reason) without a GPU.
#ifdef XT_CUDA
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/cuda/graph_memset.h"
#include "core/cuda_api.h"

using namespace xt;

namespace {

#define CK(x) ASSERT_EQ((x), cudaSuccess) << #x

class GraphMemset : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device visible (" << cuda::runtime_info() << ")";
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  }
};

// The host's picture of one memset on `bytes`.
void host_memset(std::vector<uint8_t>& bytes, size_t offset, const cudaMemsetParams& p) {
  for (size_t r = 0; r < p.height; r++)
    for (size_t c = 0; c < p.width; c++)
      for (size_t b = 0; b < p.elementSize; b++)
        bytes[offset + r * p.pitch + c * p.elementSize + b] = static_cast<uint8_t>(p.value >> (8 * b));
}

int count_type(cudaGraph_t g, cudaGraphNodeType want) {
  size_t n = 0;
  cudaGraphGetNodes(g, nullptr, &n);
  std::vector<cudaGraphNode_t> nodes(n);
  cudaGraphGetNodes(g, nodes.data(), &n);
  int k = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t;
    cudaGraphNodeGetType(node, &t);
    k += t == want;
  }
  return k;
}

TEST_F(GraphMemset, EveryShapeWritesTheSameBytesInTheSameOrder) {
  constexpr size_t kBytes = 1 << 16;
  uint8_t* buf = nullptr;
  CK(cudaMalloc(&buf, kBytes));
  // (offset, params): 16-byte words; bytes at an odd address; 2- and 4-byte elements with a
  // pitch wider than a row; a large contiguous run; then one overlapping the first two, ordered
  // after them by edges (its bytes must win).
  struct Set {
    size_t offset;
    cudaMemsetParams p;
  };
  std::vector<Set> sets = {
      {0, {nullptr, 0, 0x0u, 1, 4096, 1}},
      {4097, {nullptr, 0, 0x1ABu, 1, 1001, 1}},       // value keeps its low byte: 0xAB
      {8192, {nullptr, 100, 0x12345u, 2, 33, 5}},     // low half: 0x2345
      {12288, {nullptr, 256, 0x89ABCDEFu, 4, 37, 7}},  // 148 bytes of each 256
      {16384, {nullptr, 0, 0x01020304u, 4, 8192, 1}},  // 32 KiB, 16-byte words
      {4000, {nullptr, 0, 0x5Au, 1, 200, 1}},          // overwrites the end of the first, start of the second
  };
  cudaGraph_t g = nullptr;
  CK(cudaGraphCreate(&g, 0));
  std::vector<cudaGraphNode_t> nodes;
  for (size_t i = 0; i < sets.size(); i++) {
    sets[i].p.dst = buf + sets[i].offset;
    if (sets[i].p.height == 1) sets[i].p.pitch = sets[i].p.width * sets[i].p.elementSize;
    cudaGraphNode_t n = nullptr;
    const bool last = i + 1 == sets.size();
    CK(cudaGraphAddMemsetNode(&n, g, last ? nodes.data() : nullptr, last ? 2 : 0, &sets[i].p));
    nodes.push_back(n);
  }
  // a copy after the last memset: the rewritten node keeps its dependents
  uint8_t* copy = nullptr;
  CK(cudaMalloc(&copy, 256));
  cudaGraphNode_t cp = nullptr;
  CK(cudaGraphAddMemcpyNode1D(&cp, g, &nodes.back(), 1, copy, buf + 4000, 256, cudaMemcpyDeviceToDevice));

  cudaError_t err = cudaErrorUnknown;
  EXPECT_EQ(cuda::memset_nodes_to_kernels(g, &err), static_cast<int64_t>(sets.size()));
  CK(err);
  EXPECT_EQ(count_type(g, cudaGraphNodeTypeMemset), 0);
  EXPECT_EQ(count_type(g, cudaGraphNodeTypeKernel), static_cast<int>(sets.size()));
  size_t deps = 0;
  CK(cudaGraphNodeGetDependencies(cp, nullptr, nullptr, &deps));
  EXPECT_EQ(deps, 1u);

  cudaGraphExec_t exec = nullptr;
  CK(cudaGraphInstantiate(&exec, g, 0));
  std::vector<uint8_t> want(kBytes, 0x77);
  for (const Set& s : sets) host_memset(want, s.offset, s.p);
  for (int rep = 0; rep < 2; rep++) {  // a replay writes the same bytes again
    CK(cudaMemset(buf, 0x77, kBytes));
    CK(cudaGraphLaunch(exec, 0));
    CK(cudaDeviceSynchronize());
    std::vector<uint8_t> got(kBytes), got_copy(256);
    CK(cudaMemcpy(got.data(), buf, kBytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(got_copy.data(), copy, 256, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < kBytes; i++) ASSERT_EQ(got[i], want[i]) << "byte " << i << " replay " << rep;
    EXPECT_EQ(std::memcmp(got_copy.data(), want.data() + 4000, 256), 0);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  cudaFree(copy);
  cudaFree(buf);
}

// Through cuda::Graph: a captured cudaMemsetAsync replays as a kernel node, writing the same bytes.
TEST_F(GraphMemset, ACapturedMemsetReplaysAsAKernel) {
  uint8_t* buf = nullptr;
  CK(cudaMalloc(&buf, 1000));
  void* s = cuda::current_stream(0);
  {
    cuda::Graph g(0);
    g.capture_begin();
    CK(cudaMemsetAsync(buf + 3, 0xC3, 990, static_cast<cudaStream_t>(s)));
    g.capture_end();
    EXPECT_EQ(g.memsets_as_kernels(), 1);
    EXPECT_EQ(g.num_nodes(), 1);
    CK(cudaMemset(buf, 0, 1000));
    CK(cudaDeviceSynchronize());
    g.replay();
    CK(cudaStreamSynchronize(static_cast<cudaStream_t>(s)));
    std::vector<uint8_t> got(1000);
    CK(cudaMemcpy(got.data(), buf, 1000, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < 1000; i++) ASSERT_EQ(got[i], i >= 3 && i < 993 ? 0xC3 : 0) << "byte " << i;
  }
  cudaFree(buf);
}

}  // namespace
#endif  // XT_CUDA
