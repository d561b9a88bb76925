// Caching allocator policy on the CPU pool: reuse, rounding, exact stats, limit/OOM and
// recovery, many threads. The same DevicePool class serves every GPU.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "core/error.h"

using namespace xt;

namespace {

// A fresh pool on a counting backend, so each test sees exact numbers.
class CountingBackend : public RawBackend {
 public:
  void* raw_alloc(int, size_t n) override {
    allocs++;
    return std::malloc(n);
  }
  void raw_free(int, void* p, size_t) override {
    frees++;
    std::free(p);
  }
  std::atomic<int> allocs{0}, frees{0};
};

}  // namespace

TEST(AllocatorPolicy, RoundsSmallRequestsTo512) {
  EXPECT_EQ(round_size(0), 512u);
  EXPECT_EQ(round_size(1), 512u);
  EXPECT_EQ(round_size(512), 512u);
  EXPECT_EQ(round_size(513), 1024u);
  EXPECT_EQ(round_size((1 << 20) - 1), size_t(1) << 20);
}

TEST(AllocatorPolicy, RoundsLargeRequestsToEighthOctaves) {
  const size_t mib = 1 << 20;
  EXPECT_EQ(round_size(mib), mib);
  EXPECT_EQ(round_size(mib + 1), mib + mib / 8);
  EXPECT_EQ(round_size(3 * mib), 3 * mib);
  // Waste is bounded by 1/8 of the request.
  for (size_t n = mib; n < 64 * mib; n += 12345) {
    size_t r = round_size(n);
    EXPECT_GE(r, n);
    EXPECT_LE(r - n, n / 8 + 1);
  }
}

TEST(AllocatorPolicy, ReusesFreedBlockOfSameClass) {
  CountingBackend be;
  DevicePool pool(Device::cpu());
  Block a = pool.allocate(1000, nullptr, &be);
  pool.free(a);
  Block b = pool.allocate(900, nullptr, &be);  // same 1024-byte class
  EXPECT_EQ(a.ptr, b.ptr);
  EXPECT_EQ(be.allocs.load(), 1);
  Block c = pool.allocate(5000, nullptr, &be);  // another class: a miss
  EXPECT_NE(c.ptr, b.ptr);
  EXPECT_EQ(be.allocs.load(), 2);
  pool.free(b);
  pool.free(c);
  pool.empty_cache(&be);
}

TEST(AllocatorPolicy, BlocksAreBoundToTheirStream) {
  CountingBackend be;
  DevicePool pool(Device::cpu());
  int s1 = 0, s2 = 0;
  Block a = pool.allocate(100, &s1, &be);
  pool.free(a);
  Block b = pool.allocate(100, &s2, &be);  // another stream must not get s1's block
  EXPECT_NE(a.ptr, b.ptr);
  EXPECT_EQ(be.allocs.load(), 2);
  pool.free(b);
  pool.empty_cache(&be);
}

TEST(AllocatorPolicy, StatsAreExactAfterAKnownSequence) {
  CountingBackend be;
  DevicePool pool(Device::cpu());
  Block a = pool.allocate(100, nullptr, &be);    // 512
  Block b = pool.allocate(2000, nullptr, &be);   // 2048
  MemoryStats s = pool.stats();
  EXPECT_EQ(s.allocated_bytes, 512 + 2048);
  EXPECT_EQ(s.requested_bytes, 2100);
  EXPECT_EQ(s.reserved_bytes, 512 + 2048);
  EXPECT_EQ(s.num_raw_alloc, 2);
  pool.free(a);
  s = pool.stats();
  EXPECT_EQ(s.allocated_bytes, 2048);
  EXPECT_EQ(s.reserved_bytes, 512 + 2048);  // cached, not returned
  EXPECT_EQ(s.allocated_bytes_peak, 512 + 2048);
  Block c = pool.allocate(300, nullptr, &be);  // hit
  s = pool.stats();
  EXPECT_EQ(s.num_cache_hits, 1);
  EXPECT_EQ(s.num_raw_alloc, 2);
  EXPECT_EQ(s.num_alloc_calls, 3);
  pool.free(b);
  pool.free(c);
  pool.reset_peak();
  s = pool.stats();
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.allocated_bytes_peak, 0);
  pool.empty_cache(&be);
  s = pool.stats();
  EXPECT_EQ(s.reserved_bytes, 0);
  EXPECT_EQ(s.num_raw_free, 2);
  EXPECT_EQ(be.frees.load(), 2);
}

TEST(AllocatorPolicy, LimitRaisesOutOfMemoryThenRecovers) {
  CountingBackend be;
  DevicePool pool(Device::cpu());
  pool.set_limit(4096, &be);
  Block a = pool.allocate(3000, nullptr, &be);  // 3072
  try {
    pool.allocate(2000, nullptr, &be);  // 2048 more would pass 4096
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("tried to allocate"), std::string::npos) << msg;
    EXPECT_NE(msg.find("allocated"), std::string::npos) << msg;
    EXPECT_NE(msg.find("reserved"), std::string::npos) << msg;
    EXPECT_NE(msg.find("limit 4.00 KiB"), std::string::npos) << msg;
  }
  MemoryStats s = pool.stats();
  EXPECT_EQ(s.num_ooms, 1);
  EXPECT_EQ(s.allocated_bytes, 3072);
  EXPECT_EQ(s.reserved_bytes, 3072);
  pool.free(a);
  Block b = pool.allocate(2000, nullptr, &be);  // the cached 3072 block is released to make room
  s = pool.stats();
  EXPECT_EQ(s.allocated_bytes, 2048);
  EXPECT_EQ(s.reserved_bytes, 2048);
  EXPECT_EQ(s.num_raw_free, 1);
  pool.free(b);
  pool.set_limit(-1, &be);
  pool.empty_cache(&be);
}

TEST(AllocatorPolicy, BackendFailureBecomesOutOfMemory) {
  class FailingBackend : public RawBackend {
   public:
    void* raw_alloc(int, size_t) override { return nullptr; }
    void raw_free(int, void*, size_t) override {}
  } be;
  DevicePool pool(Device::cpu());
  EXPECT_THROW(pool.allocate(100, nullptr, &be), OutOfMemoryError);
  EXPECT_EQ(pool.stats().allocated_bytes, 0);
  EXPECT_EQ(pool.stats().num_ooms, 1);
}

TEST(AllocatorPolicy, ManyThreadsAllocateAndFreeWithoutCorruption) {
  CountingBackend be;
  DevicePool pool(Device::cpu());
  constexpr int kThreads = 8, kIters = 2000;
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<Block> live;
      for (int i = 0; i < kIters; ++i) {
        size_t n = 64 + static_cast<size_t>((i * 7919 + t * 104729) % 20000);
        Block b = pool.allocate(n, nullptr, &be);
        std::memset(b.ptr, t + 1, n);  // each thread stamps its blocks
        live.push_back(b);
        if (live.size() > 8) {
          Block old = live.front();
          live.erase(live.begin());
          const unsigned char* p = static_cast<const unsigned char*>(old.ptr);
          for (size_t k = 0; k < old.requested; ++k)
            if (p[k] != static_cast<unsigned char>(t + 1)) { bad++; break; }
          pool.free(old);
        }
      }
      for (const Block& b : live) pool.free(b);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  MemoryStats s = pool.stats();
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.num_alloc_calls, kThreads * kIters);
  EXPECT_EQ(s.num_free_calls, kThreads * kIters);
  EXPECT_EQ(s.num_cache_hits + s.num_raw_alloc, kThreads * kIters);
  pool.empty_cache(&be);
  EXPECT_EQ(be.allocs.load(), be.frees.load());
}

TEST(AllocatorGlobal, CpuTensorsGoThroughTheCache) {
  Allocator& a = Allocator::get();
  Block b1 = a.allocate(Device::cpu(), 777);
  a.free(b1);
  MemoryStats before = a.stats(Device::cpu());
  Block b2 = a.allocate(Device::cpu(), 777);
  MemoryStats after = a.stats(Device::cpu());
  EXPECT_EQ(b1.ptr, b2.ptr);
  EXPECT_EQ(after.num_cache_hits, before.num_cache_hits + 1);
  EXPECT_EQ(after.num_raw_alloc, before.num_raw_alloc);
  a.free(b2);
}
