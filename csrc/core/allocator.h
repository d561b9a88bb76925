// The caching allocator: one policy for every device (CPU memory and each GPU).
//
// Policy (same for all devices; only the raw backend differs):
//  - Requests are rounded up to a size class (kSmallRound / kClassesPerOctave / kHugeRound
//    below), so a freed block serves every later request of the same class.
//  - Each device has its own pool: a free list keyed by (stream, size class) and a mutex, so
//    threads driving different devices never wait on each other.
//  - A request is served from the free list when a block of its class is cached, else by the
//    smallest cached block of a larger class up to kReuseSpan times its size (a cache hit); only
//    on a miss does the pool call the raw backend (malloc / cudaMalloc). A large request (from
//    kLargeThreshold) takes the smallest cached block at least its size and splits off the rest
//    when that is large too; freed pieces of one backend allocation merge again (Note [Splitting
//    large blocks]).
//  - Freed blocks go back to the free list, never to the backend; empty_cache() releases them.
//  - A per-device limit caps reserved bytes (live + cached). A miss that would pass the limit
//    first releases the cache, then raises OutOfMemoryError; a backend failure does the same.
//    The message names the request, allocated, reserved and the limit; stats stay exact.
// Blocks are only reused on the stream that freed them, which is what keeps a block safe to
// reuse without synchronising: work on one stream runs in order.
//
// Private pools (CUDA graph capture, Note [Private pools] in allocator.cpp): while a thread holds
// a PoolRedirect for (device, stream), its allocations there come from the pool, and the blocks it
// frees there join the pool, whichever cache they came from: the graph may read them at every
// replay, so nothing else may reuse them. Only a capture hands out pool blocks, so their addresses
// stay fixed across replays. release_pool() gives the pool's free blocks back to the shared
// cache (after the graph is gone); a live block of a released pool goes there when it is freed.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace xt {

// Where the bytes really come from. Returns nullptr on failure (never throws).
class RawBackend {
 public:
  virtual ~RawBackend() = default;
  virtual void* raw_alloc(int device_index, size_t nbytes) = 0;
  virtual void raw_free(int device_index, void* ptr, size_t nbytes) = 0;
  virtual std::string describe_failure(int device_index) { return ""; }  // e.g. driver free/total
};

struct MemoryStats {
  int64_t allocated_bytes = 0;       // live blocks (rounded sizes)
  int64_t allocated_bytes_peak = 0;
  int64_t requested_bytes = 0;       // live blocks, sizes as asked for
  int64_t requested_bytes_peak = 0;  // the data's own peak: allocated's less the classes' rounding
  int64_t reserved_bytes = 0;        // live + cached
  int64_t reserved_bytes_peak = 0;
  int64_t num_alloc_calls = 0;       // requests
  int64_t num_free_calls = 0;
  int64_t num_cache_hits = 0;        // requests served from the free list
  int64_t num_raw_alloc = 0;         // backend allocations (cudaMalloc / malloc)
  int64_t num_raw_free = 0;          // backend frees (empty_cache, limit pressure)
  int64_t num_ooms = 0;
  int64_t limit_bytes = -1;          // -1: no limit
  int64_t pool_bytes = 0;            // reserved bytes owned by private pools (captured graphs)
  int64_t num_pools = 0;             // private pools alive
};

// One backend allocation the pool made while recording (DevicePool::record_history): what was
// asked for, the stats just before it, and what the owner it served (the stream's shared cache or
// a private pool) had free then. A miss with much free memory in pieces too small for the request
// is fragmentation (known issue 42).
struct MemoryEvent {
  int64_t requested = 0;         // bytes asked for
  int64_t size = 0;              // bytes taken from the backend (the rounded size)
  uint64_t pool = 0;             // the private pool served (0: the shared cache)
  int64_t allocated_bytes = 0;   // stats before the allocation
  int64_t requested_bytes = 0;
  int64_t reserved_bytes = 0;
  int64_t owner_free_bytes = 0;  // free blocks of the owner served, at the miss
  int64_t owner_largest_free = 0;
  int64_t owner_free_blocks = 0;
};

// A backend allocation of a large block (kLargeThreshold and up) and its pieces, as they are now.
struct MemorySegment {
  int64_t size = 0;
  struct Piece {
    int64_t offset = 0, size = 0;
    bool free = false;
    uint64_t pool = 0;  // owner while free: the private pool (0: the shared cache)
  };
  std::vector<Piece> pieces;
};

// A block handed out by the allocator; Storage keeps it and gives it back on free.
struct Block {
  void* ptr = nullptr;
  size_t size = 0;         // rounded size
  size_t requested = 0;    // size asked for
  void* stream = nullptr;  // stream the block is bound to (nullptr on the CPU)
  Device device;
  uint64_t pool = 0;       // private pool that handed it out (0: the shared cache)
};

// The redirect of one thread's allocations into a private pool (set by a graph capture).
struct PoolRedirect {
  Device device;
  void* stream = nullptr;
  uint64_t pool = 0;
};

// Small requests are rounded to a multiple of this: one cache line-friendly unit, and the
// granularity cudaMalloc itself uses for alignment.
constexpr size_t kSmallRound = 512;
// Requests at or above this size use geometric size classes instead.
constexpr size_t kLargeThreshold = 1 << 20;
// Size classes per power of two for large requests: at most 1/kClassesPerOctave (12.5%) waste.
constexpr size_t kClassesPerOctave = 8;
// Requests at or above this size round to a multiple of kHugeRound instead (at most 3% waste,
// 0.2% at 1 GiB): the buffers of this size are a model's flat weights, moments and compute
// copies, allocated once (an eighth of an octave was up to 0.5 GiB each at 4-8 GiB), and the
// activations of big shapes, whose sizes recur every step.
constexpr size_t kHugeThreshold = size_t(64) << 20;
constexpr size_t kHugeRound = size_t(2) << 20;
// A request whose class has no cached block takes the smallest cached block of a larger class up
// to this many times its size before asking the backend (Note [Reusing a larger block]).
constexpr size_t kReuseSpan = 2;
// Larger requests fail at once (no device has 4 EiB; it also keeps the byte arithmetic far from
// overflow).
constexpr size_t kMaxRequest = size_t(1) << 62;
// Devices of one kind a process can address.
constexpr int kMaxDevices = 16;

size_t round_size(size_t nbytes);

class DevicePool {
 public:
  explicit DevicePool(Device device) : device_(device) {}
  // pool != 0: from that private pool. may_release: a miss may release the shared cache first
  // (false during a capture: a raw free would synchronise).
  Block allocate(size_t nbytes, void* stream, RawBackend* backend, uint64_t pool = 0, bool may_release = true);
  // into_pool != 0: a shared-cache block bound to that pool's stream joins the pool.
  void free(const Block& block, uint64_t into_pool = 0);
  void empty_cache(RawBackend* backend);
  void create_pool(uint64_t id, void* stream);
  void release_pool(uint64_t id);
  MemoryStats stats();
  void reset_peak();
  void set_limit(int64_t limit_bytes, RawBackend* backend);  // -1 lifts the limit
  // Record every backend allocation from now on (clears what was recorded), or stop.
  void record_history(bool on);
  std::vector<MemoryEvent> history();
  // The large allocations (kLargeThreshold and up) and their pieces, in address order.
  std::vector<MemorySegment> segments();

 private:
  // The free bytes, the largest free block and the free block count of one owner.
  void owner_free_locked(void* stream, uint64_t pool, MemoryEvent& e) const;
  void release_cached_locked(RawBackend* backend);
  [[noreturn]] void throw_oom_locked(size_t requested, size_t rounded, const std::string& why);

  // Note [Splitting large blocks]: every piece of a large backend allocation, by address.
  struct Piece {
    size_t size = 0;
    char* seg = nullptr;   // the backend allocation it is part of
    size_t seg_size = 0;
    bool free = false;
    void* stream = nullptr;  // while free: the owner, the stream's shared cache or private pool `pool`
    uint64_t pool = 0;
  };
  std::vector<void*>& free_list_locked(void* stream, uint64_t pool, size_t size);
  void unlist_locked(void* ptr, void* stream, uint64_t pool, size_t size);
  // A block freed to its owner (stream, pool: 0 for the shared cache); a piece first merges with
  // its free neighbours of the same allocation and owner.
  void put_free_locked(void* ptr, size_t size, void* stream, uint64_t pool);

  Device device_;
  std::mutex mu_;
  std::map<char*, Piece> pieces_;
  std::map<std::pair<void*, size_t>, std::vector<void*>> free_;  // (stream, size) -> blocks
  struct PrivatePool {
    void* stream = nullptr;
    std::map<size_t, std::vector<void*>> free;  // size -> blocks
    int64_t bytes = 0;                          // live + free blocks it owns
  };
  std::map<uint64_t, PrivatePool> pools_;
  MemoryStats stats_;
  RawBackend* last_backend_ = nullptr;
  bool recording_ = false;
  std::vector<MemoryEvent> history_;
};

class Allocator {
 public:
  static Allocator& get();
  Block allocate(Device device, size_t nbytes, void* stream = nullptr);
  void free(const Block& block);
  MemoryStats stats(Device device);
  void reset_peak(Device device);
  void empty_cache(Device device);
  void set_limit(Device device, int64_t limit_bytes);
  void record_history(Device device, bool on);
  std::vector<MemoryEvent> history(Device device);
  std::vector<MemorySegment> segments(Device device);

  // Private pools: a new id (never reused) bound to (device, stream); release gives its free
  // blocks to the shared cache of that stream. The caller makes sure no graph using the pool
  // can still run.
  uint64_t create_pool(Device device, void* stream);
  void release_pool(Device device, uint64_t id);
  // This thread's redirect (nullptr: none). Returns the previous one.
  static const PoolRedirect* set_redirect(const PoolRedirect* redirect);
  static const PoolRedirect* redirect();

 private:
  Allocator();
  DevicePool& pool(Device device);
  RawBackend* backend(Device device);
  DevicePool cpu_pool_;
  std::array<DevicePool*, kMaxDevices> cuda_pools_{};
  RawBackend* cpu_backend_;  // CUDA's comes from core/cuda_api.h
};

std::string format_bytes(int64_t n);  // "1.50 GiB"

}  // namespace xt
