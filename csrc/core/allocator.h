// The caching allocator: one policy for every device (CPU memory and each GPU).
//
// Policy (same for all devices; only the raw backend differs):
//  - Requests are rounded up to a size class (kSmallRound / kClassesPerOctave below), so a
//    freed block serves every later request of the same class.
//  - Each device has its own pool: a free list keyed by (stream, size class) and a mutex, so
//    threads driving different devices never wait on each other.
//  - A request is served from the free list when a block of its class is cached (a cache hit);
//    only on a miss does the pool call the raw backend (malloc / cudaMalloc).
//  - Freed blocks go back to the free list, never to the backend; empty_cache() releases them.
//  - A per-device limit caps reserved bytes (live + cached). A miss that would pass the limit
//    first releases the cache, then raises OutOfMemoryError; a backend failure does the same.
//    The message names the request, allocated, reserved and the limit; stats stay exact.
// Blocks are only reused on the stream that freed them, which is what keeps a block safe to
// reuse without synchronising: work on one stream runs in order.
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
  int64_t reserved_bytes = 0;        // live + cached
  int64_t reserved_bytes_peak = 0;
  int64_t num_alloc_calls = 0;       // requests
  int64_t num_free_calls = 0;
  int64_t num_cache_hits = 0;        // requests served from the free list
  int64_t num_raw_alloc = 0;         // backend allocations (cudaMalloc / malloc)
  int64_t num_raw_free = 0;          // backend frees (empty_cache, limit pressure)
  int64_t num_ooms = 0;
  int64_t limit_bytes = -1;          // -1: no limit
};

// A block handed out by the allocator; Storage keeps it and gives it back on free.
struct Block {
  void* ptr = nullptr;
  size_t size = 0;         // rounded size
  size_t requested = 0;    // size asked for
  void* stream = nullptr;  // stream the block is bound to (nullptr on the CPU)
  Device device;
};

// Small requests are rounded to a multiple of this: one cache line-friendly unit, and the
// granularity cudaMalloc itself uses for alignment.
constexpr size_t kSmallRound = 512;
// Requests at or above this size use geometric size classes instead.
constexpr size_t kLargeThreshold = 1 << 20;
// Size classes per power of two for large requests: at most 1/kClassesPerOctave (12.5%) waste.
constexpr size_t kClassesPerOctave = 8;
// Larger requests fail at once (no device has 4 EiB; it also keeps the byte arithmetic far from
// overflow).
constexpr size_t kMaxRequest = size_t(1) << 62;
// Devices of one kind a process can address.
constexpr int kMaxDevices = 16;

size_t round_size(size_t nbytes);

class DevicePool {
 public:
  explicit DevicePool(Device device) : device_(device) {}
  Block allocate(size_t nbytes, void* stream, RawBackend* backend);
  void free(const Block& block);
  void empty_cache(RawBackend* backend);
  MemoryStats stats();
  void reset_peak();
  void set_limit(int64_t limit_bytes, RawBackend* backend);  // -1 lifts the limit

 private:
  void release_cached_locked(RawBackend* backend);
  [[noreturn]] void throw_oom_locked(size_t requested, size_t rounded, const std::string& why);

  Device device_;
  std::mutex mu_;
  std::map<std::pair<void*, size_t>, std::vector<void*>> free_;  // (stream, size) -> blocks
  MemoryStats stats_;
  RawBackend* last_backend_ = nullptr;
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
