// The caching allocator on CUDA devices, through the real cudaMalloc backend (core/cuda/runtime.cpp):
// reuse, exact stats, limit/OOM and recovery, a request larger than the card, per-thread streams,
// threads on one device and on two devices, a CUDA graph's private pool. Every test skips (with the reason) without a GPU.
// The global Allocator is shared by the whole binary, so tests compare stats before and after.
#ifdef XT_CUDA
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "core/cuda_api.h"
#include "core/error.h"
#include "kernels/kernels.h"

using namespace xt;

namespace {

class CudaAllocator : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device visible (" << cuda::runtime_info() << ")";
    dev_ = Device::cuda(0);
    stream_ = cuda::current_stream(0);
  }
  Device dev_;
  void* stream_ = nullptr;
};

// Fill `n` floats on the device with `value`, read them back, check them all (a sync point).
bool device_roundtrip(Device dev, void* ptr, int64_t n, float value) {
  kernels::cuda::fill(DType::Float32, ptr, n, value, cuda::current_stream(dev.index));
  std::vector<float> host(static_cast<size_t>(n), -1.0f);
  cuda::copy_bytes(host.data(), Device::cpu(), ptr, dev, static_cast<size_t>(n) * sizeof(float));
  for (float v : host)
    if (v != value) return false;
  return true;
}

int pointer_device(void* p) {
  cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) return -1;
  return attr.type == cudaMemoryTypeDevice ? attr.device : -1;
}

}  // namespace

TEST_F(CudaAllocator, ReusesAFreedBlockWithoutCallingCudaMalloc) {
  Allocator& a = Allocator::get();
  Block b1 = a.allocate(dev_, 3000, stream_);
  const MemoryStats s1 = a.stats(dev_);
  a.free(b1);
  Block b2 = a.allocate(dev_, 2900, stream_);  // same 3072-byte class
  const MemoryStats s2 = a.stats(dev_);
  EXPECT_EQ(b1.ptr, b2.ptr);
  EXPECT_EQ(s2.num_raw_alloc, s1.num_raw_alloc);
  EXPECT_EQ(s2.num_cache_hits, s1.num_cache_hits + 1);
  EXPECT_EQ(pointer_device(b2.ptr), 0);
  EXPECT_TRUE(device_roundtrip(dev_, b2.ptr, 2900 / 4, 3.5f));
  a.free(b2);
}

TEST_F(CudaAllocator, StatsAreExact) {
  Allocator& a = Allocator::get();
  a.empty_cache(dev_);
  const MemoryStats s0 = a.stats(dev_);
  Block x = a.allocate(dev_, 1000, stream_);            // 1024
  Block y = a.allocate(dev_, (1 << 20) + 1, stream_);   // 1 MiB + 1/8
  const int64_t ysize = (1 << 20) + (1 << 17);
  const MemoryStats s1 = a.stats(dev_);
  EXPECT_EQ(s1.allocated_bytes - s0.allocated_bytes, 1024 + ysize);
  EXPECT_EQ(s1.requested_bytes - s0.requested_bytes, 1000 + (1 << 20) + 1);
  EXPECT_EQ(s1.reserved_bytes - s0.reserved_bytes, 1024 + ysize);
  EXPECT_EQ(s1.num_raw_alloc - s0.num_raw_alloc, 2);
  EXPECT_GE(s1.allocated_bytes_peak, s1.allocated_bytes);
  a.free(x);
  a.free(y);
  const MemoryStats s2 = a.stats(dev_);
  EXPECT_EQ(s2.allocated_bytes, s0.allocated_bytes);
  EXPECT_EQ(s2.reserved_bytes, s1.reserved_bytes);  // cached, not returned to the driver
  a.empty_cache(dev_);
  const MemoryStats s3 = a.stats(dev_);
  EXPECT_EQ(s3.reserved_bytes, s0.reserved_bytes);
  EXPECT_EQ(s3.num_raw_free - s2.num_raw_free, 2);
}

TEST_F(CudaAllocator, LimitRaisesOutOfMemoryThenRecovers) {
  Allocator& a = Allocator::get();
  a.empty_cache(dev_);
  const MemoryStats s0 = a.stats(dev_);
  a.set_limit(dev_, s0.reserved_bytes + (8 << 20));
  bool threw = false;
  try {
    a.allocate(dev_, size_t(64) << 20, stream_);
  } catch (const OutOfMemoryError& e) {
    threw = true;
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cuda:0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("limit"), std::string::npos) << msg;
  }
  EXPECT_TRUE(threw);
  EXPECT_EQ(a.stats(dev_).num_ooms, s0.num_ooms + 1);
  Block small = a.allocate(dev_, 1 << 20, stream_);  // fits under the limit
  EXPECT_TRUE(device_roundtrip(dev_, small.ptr, (1 << 20) / 4, 1.0f));
  a.free(small);
  a.set_limit(dev_, -1);
  Block big = a.allocate(dev_, size_t(64) << 20, stream_);
  EXPECT_TRUE(device_roundtrip(dev_, big.ptr, (64 << 20) / 4, 2.0f));
  a.free(big);
  EXPECT_EQ(a.stats(dev_).allocated_bytes, s0.allocated_bytes);
}

TEST_F(CudaAllocator, RequestLargerThanTheCardIsOutOfMemoryAndTheDeviceStillWorks) {
  Allocator& a = Allocator::get();
  const MemoryStats s0 = a.stats(dev_);
  bool threw = false;
  try {
    a.allocate(dev_, size_t(1) << 42, stream_);  // 4 TiB
  } catch (const OutOfMemoryError& e) {
    threw = true;
    const std::string msg = e.what();
    EXPECT_NE(msg.find("driver reports"), std::string::npos) << msg;
  }
  EXPECT_TRUE(threw);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // the failed cudaMalloc left no error behind
  const MemoryStats s1 = a.stats(dev_);
  EXPECT_EQ(s1.allocated_bytes, s0.allocated_bytes);
  EXPECT_EQ(s1.num_ooms, s0.num_ooms + 1);
  Block b = a.allocate(dev_, 4096, stream_);
  EXPECT_TRUE(device_roundtrip(dev_, b.ptr, 1024, 7.0f));
  a.free(b);
}

TEST_F(CudaAllocator, RawBackendReturnsNullOnOutOfMemory) {
  RawBackend* be = cuda::raw_backend();
  EXPECT_EQ(be->raw_alloc(0, size_t(1) << 44), nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_NE(be->describe_failure(0).find("free of"), std::string::npos);
  void* p = be->raw_alloc(0, 1 << 20);
  ASSERT_NE(p, nullptr);
  be->raw_free(0, p, 1 << 20);
}

TEST_F(CudaAllocator, CopiesAndMemsetRoundTrip) {
  Allocator& a = Allocator::get();
  const int n = 10000;
  std::vector<float> src(n), back(n, 0.0f);
  for (int i = 0; i < n; ++i) src[i] = static_cast<float>(i) * 0.5f;
  Block d1 = a.allocate(dev_, n * sizeof(float), stream_);
  Block d2 = a.allocate(dev_, n * sizeof(float), stream_);
  cuda::copy_bytes(d1.ptr, dev_, src.data(), Device::cpu(), n * sizeof(float));
  cuda::copy_bytes(d2.ptr, dev_, d1.ptr, dev_, n * sizeof(float));
  cuda::copy_bytes(back.data(), Device::cpu(), d2.ptr, dev_, n * sizeof(float));
  EXPECT_EQ(std::memcmp(src.data(), back.data(), n * sizeof(float)), 0);
  cuda::memset_zero(d2.ptr, dev_, n * sizeof(float));
  cuda::copy_bytes(back.data(), Device::cpu(), d2.ptr, dev_, n * sizeof(float));
  for (float v : back) ASSERT_EQ(v, 0.0f);
  a.free(d1);
  a.free(d2);
}

TEST_F(CudaAllocator, EachThreadHasItsOwnStreamAndDevice) {
  void* mine = cuda::current_stream(0);
  EXPECT_EQ(mine, cuda::current_stream(0));  // stable within a thread
  void* theirs = nullptr;
  int their_device = -1;
  std::thread t([&] {
    theirs = cuda::current_stream(0);
    their_device = cuda::current_device();
  });
  t.join();
  EXPECT_NE(theirs, nullptr);
  EXPECT_NE(mine, theirs);
  EXPECT_EQ(their_device, 0);
}

TEST_F(CudaAllocator, AbsentDeviceIsAClearRuntimeError) {
  const int n = cuda::device_count();
  try {
    cuda::check_device(n);
    FAIL() << "check_device(" << n << ") did not throw";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:" + std::to_string(n)), std::string::npos) << e.what();
  }
}

TEST_F(CudaAllocator, ManyThreadsOnOneDevice) {
  Allocator& a = Allocator::get();
  const MemoryStats s0 = a.stats(dev_);
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      cuda::set_device(0);
      void* s = cuda::current_stream(0);
      for (int it = 0; it < 50; ++it) {
        const size_t n = 512 * static_cast<size_t>(1 + (it * 7 + t) % 16);
        Block b = a.allocate(Device::cuda(0), n, s);
        if (b.stream != s) bad++;
        if (it % 10 == 0 && !device_roundtrip(Device::cuda(0), b.ptr, static_cast<int64_t>(n / 4), float(t + it)))
          bad++;
        a.free(b);
      }
      cuda::synchronize(0);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(a.stats(dev_).allocated_bytes, s0.allocated_bytes);
}

TEST_F(CudaAllocator, ThreadsOnTwoDevicesDoNotShareMemoryOrStreams) {
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs two CUDA devices, found " << cuda::device_count();
  Allocator& a = Allocator::get();
  const MemoryStats s0 = a.stats(Device::cuda(0)), s1 = a.stats(Device::cuda(1));
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int d = 0; d < 2; ++d) {
    threads.emplace_back([&, d] {
      cuda::set_device(d);
      void* s = cuda::current_stream(d);
      for (int it = 0; it < 40; ++it) {
        Block b = a.allocate(Device::cuda(d), size_t(1) << (12 + it % 8), s);
        if (pointer_device(b.ptr) != d) bad++;
        if (it % 8 == 0 && !device_roundtrip(Device::cuda(d), b.ptr, 1024, float(d * 100 + it))) bad++;
        a.free(b);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(a.stats(Device::cuda(0)).allocated_bytes, s0.allocated_bytes);
  EXPECT_EQ(a.stats(Device::cuda(1)).allocated_bytes, s1.allocated_bytes);
  // A copy between the two devices, ordered by events, no host wait until the final read.
  Block x = a.allocate(Device::cuda(0), 4096, cuda::current_stream(0));
  Block y = a.allocate(Device::cuda(1), 4096, cuda::current_stream(1));
  kernels::cuda::fill(DType::Float32, x.ptr, 1024, 5.0f, cuda::current_stream(0));
  cuda::copy_bytes(y.ptr, Device::cuda(1), x.ptr, Device::cuda(0), 4096);
  std::vector<float> back(1024);
  cuda::copy_bytes(back.data(), Device::cpu(), y.ptr, Device::cuda(1), 4096);
  for (float v : back) ASSERT_EQ(v, 5.0f);
  a.free(x);
  a.free(y);
}

// CUDA graphs (core/cuda/graph.cpp): a captured fill replays into the same block; the block is the
// graph's (eager allocations never get it) until the graph is destroyed; refusals inside a capture.
TEST_F(CudaAllocator, GraphCaptureUsesAPrivatePoolAndReplays) {
  Allocator& a = Allocator::get();
  const MemoryStats before = a.stats(dev_);
  const int64_t n = 1 << 16;
  Block out;
  {
    cuda::Graph g(0);
    g.capture_begin();
    EXPECT_TRUE(cuda::capturing());
    out = a.allocate(dev_, n * sizeof(float), stream_);
    EXPECT_NE(out.pool, 0u);
    Block tmp = a.allocate(dev_, 4096, stream_);
    kernels::cuda::fill(DType::Float32, out.ptr, n, 3.0f, stream_);
    a.free(tmp);  // back into the graph's pool, not the shared cache
    // a sync point inside the capture raises, and the capture goes on
    std::vector<float> host(4);
    EXPECT_THROW(cuda::copy_bytes(host.data(), Device::cpu(), out.ptr, dev_, sizeof(float) * 4), RuntimeError);
    EXPECT_THROW(cuda::synchronize(0), RuntimeError);
    g.capture_end();
    EXPECT_FALSE(cuda::capturing());
    EXPECT_GE(g.num_nodes(), 1);
    EXPECT_EQ(a.stats(dev_).num_pools, before.num_pools + 1);
    Block eager = a.allocate(dev_, 4096, stream_);  // never the pool's freed block
    EXPECT_NE(eager.ptr, tmp.ptr);
    a.free(eager);
    kernels::cuda::fill(DType::Float32, out.ptr, n, -1.0f, stream_);
    g.replay();
    std::vector<float> back(static_cast<size_t>(n));
    cuda::copy_bytes(back.data(), Device::cpu(), out.ptr, dev_, back.size() * sizeof(float));
    for (float v : back) ASSERT_EQ(v, 3.0f);
    EXPECT_EQ(g.replays(), 1);
  }  // destroyed: its stream synchronised, the pool released
  const MemoryStats after = a.stats(dev_);
  EXPECT_EQ(after.num_pools, before.num_pools);
  EXPECT_EQ(after.pool_bytes, before.pool_bytes);
  a.free(out);  // a live block of a released pool goes to the shared cache
  Block again = a.allocate(dev_, n * sizeof(float), stream_);
  EXPECT_EQ(again.ptr, out.ptr);
  EXPECT_EQ(again.pool, 0u);
  a.free(again);
}

TEST_F(CudaAllocator, AFailedCaptureLeavesTheStreamUsable) {
  cuda::Graph g(0);
  g.capture_begin();
  g.abort_capture();
  EXPECT_FALSE(cuda::capturing());
  EXPECT_THROW(g.replay(), RuntimeError);
  Block b = Allocator::get().allocate(dev_, 1024, stream_);
  EXPECT_EQ(b.pool, 0u);
  EXPECT_TRUE(device_roundtrip(dev_, b.ptr, 256, 2.0f));
  Allocator::get().free(b);
}

#endif  // XT_CUDA
