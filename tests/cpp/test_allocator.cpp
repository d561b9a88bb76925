// Caching allocator policy on the CPU pool: reuse, rounding, exact stats, limit/OOM and
// recovery, many threads. The same DevicePool class serves every GPU.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
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

// With every block freed: empty_cache gives every backend allocation back and the stats are zero.
void expect_all_returned(DevicePool& pool, CountingBackend& be) {
  pool.empty_cache(&be);
  const MemoryStats st = pool.stats();
  EXPECT_EQ(st.allocated_bytes, 0);
  EXPECT_EQ(st.reserved_bytes, 0);
  EXPECT_EQ(st.pool_bytes, 0);
  EXPECT_EQ(be.allocs.load(), be.frees.load());
}

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

TEST(AllocatorPolicy, RoundsHugeRequestsTo2MiB) {
  const size_t mib = 1 << 20;
  EXPECT_EQ(round_size(64 * mib - 1), 64 * mib);  // the last eighth-octave class
  EXPECT_EQ(round_size(64 * mib), 64 * mib);
  EXPECT_EQ(round_size(64 * mib + 1), 66 * mib);
  // a 1.24B-parameter float32 flat buffer (4.94 GB): within 2 MiB, not rounded to 5 GiB
  const size_t flat = size_t(1235814400) * 4;
  EXPECT_EQ(round_size(flat), (flat + 2 * mib - 1) / (2 * mib) * (2 * mib));
  EXPECT_LT(round_size(flat) - flat, 2 * mib);
  for (size_t n = 60 * mib; n < 200 * mib; n += 123457) {  // monotone across the threshold
    EXPECT_GE(round_size(n), n);
    EXPECT_LE(round_size(n), round_size(n + 123457));
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

TEST(AllocatorPolicy, ALargerCachedBlockServesAMissUpToTheSpan) {
  CountingBackend be;
  DevicePool pool(Device::cpu());
  int s = 0, other = 0;
  Block big = pool.allocate(3000, &s, &be);  // 3072
  Block huge = pool.allocate(5000, &s, &be);  // 5120
  pool.free(big);
  pool.free(huge);
  Block a = pool.allocate(2000, &other, &be);  // another stream's cache: never
  EXPECT_NE(a.ptr, big.ptr);
  EXPECT_NE(a.ptr, huge.ptr);
  Block b = pool.allocate(2000, &s, &be);  // class 2048: none cached; 3072 <= 2 x 2048, the smallest fit
  EXPECT_EQ(b.ptr, big.ptr);
  EXPECT_EQ(b.size, 3072u);
  Block c = pool.allocate(2000, &s, &be);  // 5120 > 2 x 2048: a miss
  EXPECT_NE(c.ptr, huge.ptr);
  EXPECT_EQ(be.allocs.load(), 4);
  MemoryStats st = pool.stats();
  EXPECT_EQ(st.allocated_bytes, 2048 + 3072 + 2048);  // counted at the blocks' own sizes
  EXPECT_EQ(st.requested_bytes, 3 * 2000);
  EXPECT_GE(st.requested_bytes_peak, st.requested_bytes);  // the data's own peak
  EXPECT_LT(st.requested_bytes_peak, st.allocated_bytes_peak);  // without the blocks' waste
  EXPECT_EQ(st.reserved_bytes, 3072 + 5120 + 2 * 2048);
  pool.free(b);                                // back under its own class
  Block d = pool.allocate(3000, &s, &be);
  EXPECT_EQ(d.ptr, big.ptr);

  pool.create_pool(3, &s);                     // the same rule inside a private pool
  Block p = pool.allocate(5000, &s, &be, 3, false);
  pool.free(p);
  Block q = pool.allocate(3000, &s, &be, 3, false);
  EXPECT_EQ(q.ptr, p.ptr);
  EXPECT_EQ(q.size, 5120u);
  pool.free(q);
  pool.release_pool(3);
  for (const Block& x : {a, c, d}) pool.free(x);
  pool.empty_cache(&be);
  EXPECT_EQ(pool.stats().reserved_bytes, 0);
  EXPECT_EQ(be.allocs.load(), be.frees.load());
}

TEST(AllocatorPolicy, LargeBlocksSplitAndTheirPiecesMergeAgain) {
  // Note [Splitting large blocks]: a large request takes the smallest cached block of any larger
  // size and the large rest stays free; freed neighbours of one allocation merge, and only a
  // whole allocation goes back to the backend.
  const size_t mib = 1 << 20;
  CountingBackend be;
  DevicePool pool(Device::cpu());
  int s = 0;
  Block big = pool.allocate(8 * mib, &s, &be);
  pool.free(big);
  Block a = pool.allocate(3 * mib, &s, &be);  // carved from the 8 MiB block
  EXPECT_EQ(a.ptr, big.ptr);
  EXPECT_EQ(a.size, 3 * mib);
  Block b = pool.allocate(4 * mib, &s, &be);  // the 5 MiB rest, split again (1 MiB left)
  EXPECT_EQ(b.ptr, static_cast<char*>(big.ptr) + 3 * mib);
  EXPECT_EQ(b.size, 4 * mib);
  Block c = pool.allocate(mib + mib / 2, &s, &be);  // nothing of 1.5 MiB cached (1 MiB is): a miss
  EXPECT_EQ(be.allocs.load(), 2);
  Block small = pool.allocate(600 * 1024, &s, &be);  // never a piece of a large allocation
  EXPECT_NE(small.ptr, static_cast<char*>(big.ptr) + 7 * mib);
  EXPECT_EQ(be.allocs.load(), 3);
  pool.free(small);
  MemoryStats st = pool.stats();
  EXPECT_EQ(st.allocated_bytes, static_cast<int64_t>(7 * mib + c.size));  // no block held above its request's class
  pool.empty_cache(&be);                      // the 8 MiB allocation is partly in use: kept
  EXPECT_EQ(pool.stats().reserved_bytes, static_cast<int64_t>(8 * mib + c.size));
  EXPECT_EQ(be.frees.load(), 1);              // the small block went back
  pool.free(a);
  pool.free(b);                               // a, b and the 1 MiB rest merge into the whole
  Block whole = pool.allocate(8 * mib, &s, &be);
  EXPECT_EQ(whole.ptr, big.ptr);
  EXPECT_EQ(be.allocs.load(), 3);
  Block other_stream = pool.allocate(2 * mib, nullptr, &be);  // a piece stays on its stream
  EXPECT_NE(other_stream.ptr, big.ptr);
  for (const Block& x : {whole, c, other_stream}) pool.free(x);
  expect_all_returned(pool, be);
}

TEST(AllocatorPrivatePool, PiecesStayWithTheirOwner) {
  // A piece split from a pool block stays in the pool and a shared piece in the shared cache; they
  // never merge across owners; a released pool's pieces merge with the shared cache's.
  const size_t mib = 1 << 20;
  CountingBackend be;
  DevicePool pool(Device::cpu());
  int s = 0;
  Block shared = pool.allocate(8 * mib, &s, &be);  // live before the capture
  pool.create_pool(9, &s);
  Block p = pool.allocate(8 * mib, &s, &be, 9, false);
  pool.free(p);
  Block p1 = pool.allocate(2 * mib, &s, &be, 9, false);  // split inside the pool
  EXPECT_EQ(p1.ptr, p.ptr);
  Block e = pool.allocate(2 * mib, &s, &be);             // eager work never gets the pool's rest
  EXPECT_NE(e.ptr, static_cast<char*>(p.ptr) + 2 * mib);
  pool.free(e);
  pool.free(shared, /*into_pool=*/9);                    // joins the pool during the capture
  EXPECT_EQ(pool.stats().pool_bytes, static_cast<int64_t>(16 * mib));
  Block p2 = pool.allocate(6 * mib, &s, &be, 9, false);  // the pool's 6 MiB rest: the smallest fit
  EXPECT_EQ(p2.ptr, static_cast<char*>(p.ptr) + 2 * mib);
  for (const Block& x : {p1, p2}) pool.free(x);
  pool.release_pool(9);
  EXPECT_EQ(pool.stats().pool_bytes, 0);
  Block again = pool.allocate(8 * mib, &s, &be);         // the pool's pieces, merged, now shared
  EXPECT_TRUE(again.ptr == p.ptr || again.ptr == shared.ptr);
  pool.free(again);
  expect_all_returned(pool, be);
}

TEST(AllocatorHistory, RecordsEachBackendAllocationWithItsOwnersFreeBlocks) {
  // Recording on: each miss is one event with the stats before it and what its owner (the shared
  // cache of the stream, or the private pool) had free; hits record nothing; off records nothing.
  const size_t mib = 1 << 20;
  CountingBackend be;
  DevicePool pool(Device::cpu());
  int s = 0;
  Block before = pool.allocate(2 * mib, &s, &be);  // not recorded
  pool.record_history(true);
  Block a = pool.allocate(3 * mib, &s, &be);
  pool.free(a);
  Block b = pool.allocate(3 * mib, &s, &be);       // a hit
  pool.free(before);
  Block c = pool.allocate(8 * mib, &s, &be);       // a miss with 5 MiB free in two blocks
  pool.create_pool(7, &s);
  Block d = pool.allocate(4 * mib, &s, &be, 7, false);  // the pool has nothing free
  std::vector<MemoryEvent> h = pool.history();
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[0].requested, static_cast<int64_t>(3 * mib));
  EXPECT_EQ(h[0].allocated_bytes, static_cast<int64_t>(2 * mib));
  EXPECT_EQ(h[0].owner_free_bytes, 0);
  EXPECT_EQ(h[1].requested, static_cast<int64_t>(8 * mib));
  EXPECT_EQ(h[1].reserved_bytes, static_cast<int64_t>(5 * mib));
  EXPECT_EQ(h[1].owner_free_bytes, static_cast<int64_t>(2 * mib));  // `before`'s block; b holds a's
  EXPECT_EQ(h[1].owner_largest_free, static_cast<int64_t>(2 * mib));
  EXPECT_EQ(h[1].owner_free_blocks, 1);
  EXPECT_EQ(h[1].pool, 0u);
  EXPECT_EQ(h[2].pool, 7u);
  EXPECT_EQ(h[2].owner_free_bytes, 0);
  // Segments: every large allocation, its pieces in address order.
  std::vector<MemorySegment> segs = pool.segments();
  ASSERT_EQ(segs.size(), 4u);
  int64_t total = 0, free_bytes = 0;
  for (const MemorySegment& g : segs) {
    total += g.size;
    int64_t at = 0;
    for (const MemorySegment::Piece& pc : g.pieces) {
      EXPECT_EQ(pc.offset, at);
      at += pc.size;
      if (pc.free) free_bytes += pc.size;
    }
    EXPECT_EQ(at, g.size);
  }
  EXPECT_EQ(total, static_cast<int64_t>(17 * mib));
  EXPECT_EQ(free_bytes, static_cast<int64_t>(2 * mib));
  pool.record_history(false);
  Block e = pool.allocate(16 * mib, &s, &be);
  EXPECT_EQ(pool.history().size(), 3u);  // kept until recording starts again
  pool.record_history(true);
  EXPECT_TRUE(pool.history().empty());
  for (const Block& x : {b, c, d, e}) pool.free(x);
  pool.release_pool(7);
  expect_all_returned(pool, be);
}

TEST(AllocatorPolicy, SplitPiecesNeverOverlapUnderARandomSequence) {
  // Random large and small requests on two streams and, for a while, a private pool: live blocks
  // never overlap and keep their contents, the stats stay exact, and with everything freed (the
  // pool released) empty_cache gives every backend allocation back.
  CountingBackend be;
  DevicePool pool(Device::cpu());
  int s1 = 0, s2 = 0;
  void* streams[2] = {&s1, &s2};
  std::map<char*, std::pair<Block, unsigned char>> live;
  uint64_t x = 12345;
  const auto rnd = [&] { return x = x * 6364136223846793005ull + 1442695040888963407ull, x >> 33; };
  pool.create_pool(5, &s1);
  int64_t want_allocated = 0;
  for (int i = 0; i < 3000; ++i) {
    if (i == 2000) pool.release_pool(5);  // its pieces join the shared cache; live ones follow when freed
    if (live.size() < 24 && (live.empty() || rnd() % 3)) {
      const size_t mib = 1 << 20;
      const size_t n = rnd() % 4 ? mib / 2 + rnd() % (40 * mib) : 1 + rnd() % 300000;
      void* st = streams[rnd() % 2];
      const uint64_t from_pool = i < 2000 && st == &s1 && rnd() % 3 == 0 ? 5 : 0;
      Block b = pool.allocate(n, st, &be, from_pool, from_pool == 0);
      char* at = static_cast<char*>(b.ptr);
      auto next = live.lower_bound(at);  // no overlap with the neighbours by address
      if (next != live.end()) ASSERT_LE(at + b.size, next->first);
      if (next != live.begin()) ASSERT_LE(std::prev(next)->first + std::prev(next)->second.first.size, at);
      const unsigned char stamp = static_cast<unsigned char>(1 + rnd() % 250);
      std::memset(b.ptr, stamp, b.requested);
      live[at] = {b, stamp};
      want_allocated += static_cast<int64_t>(b.size);
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rnd() % live.size()));
      const Block b = it->second.first;
      const unsigned char* p = static_cast<const unsigned char*>(b.ptr);
      for (size_t k = 0; k < b.requested; k += 4093) ASSERT_EQ(p[k], it->second.second);
      ASSERT_EQ(p[b.requested - 1], it->second.second);
      live.erase(it);
      want_allocated -= static_cast<int64_t>(b.size);
      pool.free(b);
    }
    ASSERT_EQ(pool.stats().allocated_bytes, want_allocated);
  }
  for (auto& [at, bs] : live) pool.free(bs.first);
  expect_all_returned(pool, be);
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
  Block a = pool.allocate(3500, nullptr, &be);  // 3584
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
  EXPECT_EQ(s.allocated_bytes, 3584);
  EXPECT_EQ(s.reserved_bytes, 3584);
  pool.free(a);
  // 1024 bytes: the cached 3584 block is more than kReuseSpan times larger, so it is released to
  // make room
  Block b = pool.allocate(1000, nullptr, &be);
  s = pool.stats();
  EXPECT_EQ(s.allocated_bytes, 1024);
  EXPECT_EQ(s.reserved_bytes, 1024);
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

// Note [Private pools]: what a CUDA graph capture relies on, checked on the CPU pool.
TEST(AllocatorPrivatePool, CaptureBlocksStayThePoolsUntilReleased) {
  CountingBackend be;
  DevicePool pool(Device::cpu());
  int s = 0;
  Block before = pool.allocate(1000, &s, &be);  // a shared-cache block the capture reads, then frees
  Block cached = pool.allocate(4000, &s, &be);
  pool.free(cached);                            // the shared cache holds a 4 KiB block
  pool.create_pool(7, &s);

  Block a = pool.allocate(4000, &s, &be, 7, /*may_release=*/false);  // the pool never takes a shared block
  EXPECT_NE(a.ptr, cached.ptr);
  EXPECT_EQ(a.pool, 7u);
  pool.free(a);                                  // back into the pool, not the shared cache
  Block b = pool.allocate(4000, &s, &be, 7, false);
  EXPECT_EQ(b.ptr, a.ptr);                       // reused within the capture
  pool.free(before, /*into_pool=*/7);            // a shared block freed during the capture joins the pool
  Block c = pool.allocate(1000, &s, &be, 7, false);
  EXPECT_EQ(c.ptr, before.ptr);
  pool.free(c);

  Block eager = pool.allocate(4000, &s, &be);    // eager work gets the shared block, never the pool's
  EXPECT_EQ(eager.ptr, cached.ptr);
  Block eager2 = pool.allocate(1000, &s, &be);
  EXPECT_NE(eager2.ptr, before.ptr);
  MemoryStats st = pool.stats();
  EXPECT_EQ(st.num_pools, 1);
  EXPECT_EQ(st.pool_bytes, static_cast<int64_t>(round_size(4000) + round_size(1000)));

  pool.empty_cache(&be);                         // never releases pool blocks
  EXPECT_EQ(pool.stats().pool_bytes, st.pool_bytes);

  pool.release_pool(7);                          // b is still live: it follows when freed
  st = pool.stats();
  EXPECT_EQ(st.num_pools, 0);
  EXPECT_EQ(st.pool_bytes, 0);
  Block d = pool.allocate(1000, &s, &be);        // the released pool's free block, now shared
  EXPECT_EQ(d.ptr, before.ptr);
  pool.free(b);
  Block e = pool.allocate(4000, &s, &be);
  EXPECT_EQ(e.ptr, b.ptr);
  for (const Block& x : {eager, eager2, d, e}) pool.free(x);
  pool.empty_cache(&be);
  st = pool.stats();
  EXPECT_EQ(st.allocated_bytes, 0);
  EXPECT_EQ(st.reserved_bytes, 0);
  EXPECT_EQ(be.allocs.load(), be.frees.load());
}

TEST(AllocatorPrivatePool, CaptureMissesNeverReleaseTheCache) {
  CountingBackend be;
  DevicePool pool(Device::cpu());
  pool.set_limit(8192, &be);
  Block a = pool.allocate(4000, nullptr, &be);
  pool.free(a);  // 4 KiB cached
  pool.create_pool(3, nullptr);
  Block b = pool.allocate(4000, nullptr, &be, 3, false);  // 8 KiB reserved: at the limit
  // A capture cannot free memory (cudaFree would synchronise): over the limit it raises instead.
  EXPECT_THROW(pool.allocate(600, nullptr, &be, 3, false), OutOfMemoryError);
  EXPECT_EQ(be.frees.load(), 0);
  pool.free(b);
  pool.release_pool(3);
  pool.set_limit(-1, &be);
  pool.empty_cache(&be);
  EXPECT_EQ(pool.stats().reserved_bytes, 0);
}

TEST(AllocatorPrivatePool, RedirectRoutesThisThreadsAllocationsAndRefusesReleases) {
  Allocator& al = Allocator::get();
  int s = 0;
  const uint64_t id = al.create_pool(Device::cpu(), &s);
  EXPECT_NE(id, 0u);
  EXPECT_NE(al.create_pool(Device::cpu(), &s), id);  // ids are never reused
  PoolRedirect r{Device::cpu(), &s, id};
  EXPECT_EQ(Allocator::set_redirect(&r), nullptr);
  Block in = al.allocate(Device::cpu(), 100, &s);
  Block other_stream = al.allocate(Device::cpu(), 100, nullptr);
  EXPECT_THROW(al.empty_cache(Device::cpu()), RuntimeError);
  std::thread([&] {  // another thread has no redirect
    Block t = al.allocate(Device::cpu(), 100, &s);
    EXPECT_EQ(t.pool, 0u);
    al.free(t);
  }).join();
  EXPECT_EQ(Allocator::set_redirect(nullptr), &r);
  EXPECT_EQ(in.pool, id);
  EXPECT_EQ(other_stream.pool, 0u);
  al.free(in);
  al.free(other_stream);
  al.release_pool(Device::cpu(), id);
  al.release_pool(Device::cpu(), id + 1);
  EXPECT_EQ(al.stats(Device::cpu()).num_pools, 0);
}
