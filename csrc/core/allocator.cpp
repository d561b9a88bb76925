// Caching allocator: the policy in allocator.h, the CPU raw backend, and stats.
#include "core/allocator.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "core/cuda_api.h"
#include "core/error.h"

namespace xt {

namespace {

// CPU backend: 64-byte aligned host memory (AVX-512 loads, and what numpy/torch expect).
constexpr size_t kCpuAlignment = 64;

class CpuBackend : public RawBackend {
 public:
  void* raw_alloc(int, size_t nbytes) override {
    return std::aligned_alloc(kCpuAlignment, nbytes);
  }
  void raw_free(int, void* ptr, size_t) override { std::free(ptr); }
};

}  // namespace

size_t round_size(size_t nbytes) {
  if (nbytes == 0) nbytes = 1;
  if (nbytes < kLargeThreshold) return (nbytes + kSmallRound - 1) / kSmallRound * kSmallRound;
  if (nbytes >= kHugeThreshold) return (nbytes + kHugeRound - 1) / kHugeRound * kHugeRound;
  // Octave = highest power of two <= nbytes; classes split it into kClassesPerOctave steps.
  size_t octave = size_t(1) << (63 - __builtin_clzll(static_cast<unsigned long long>(nbytes)));
  size_t step = octave / kClassesPerOctave;
  return (nbytes + step - 1) / step * step;
}

std::string format_bytes(int64_t n) {
  char buf[64];
  double v = static_cast<double>(n);
  if (v >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", v / (1ull << 30));
  else if (v >= (1ull << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", v / (1ull << 20));
  else if (v >= 1024) std::snprintf(buf, sizeof buf, "%.2f KiB", v / 1024);
  else std::snprintf(buf, sizeof buf, "%lld bytes", static_cast<long long>(n));
  return buf;
}

// ------------------------------------------------------------------------------- DevicePool

// Note [Private pools]
// A CUDA graph replays the kernels of its capture at the addresses they used then, so the blocks
// the capture touched must stay the graph's for as long as it lives:
//  - during the capture (the thread's PoolRedirect), allocations on the capture stream come from
//    the pool (its free list, else a raw allocation: cudaMalloc is allowed while capturing, a raw
//    free is not, so a miss never releases the cache then);
//  - a block freed there during the capture joins the pool, even one that came from the shared
//    cache before the capture: a captured kernel may read it at every replay;
//  - nothing but a capture allocates from a pool, so no eager work ever reuses a pool block while
//    the graph lives. Within one capture (one stream, so one chain of nodes) a block freed and
//    handed out again is safe: replay runs the nodes in capture order.
//  - release_pool (after the graph is destroyed and its stream synchronised) moves the pool's
//    free blocks to the shared cache of the capture stream; live blocks follow when freed.
// Pool blocks count as reserved (and in pool_bytes); empty_cache never releases them.
//
// Note [Reusing a larger block]
// Small blocks are never split, so with exact classes alone a cache holds, for every class, the
// most blocks of it ever live at once: a training step whose phases use different sizes (forward
// activations, a recomputed block's activations, gradients, the logits) ends up reserving far
// more than its live peak (dim768 at batch 4 on the CPU: 5.45 GiB reserved for a 4.33 GiB peak),
// and a graph's private pool keeps all of it. So a miss on the request's class takes the smallest
// cached block of a larger class up to kReuseSpan times the request (the block keeps its own size
// and is counted at it; the waste is bounded by the span) before asking the backend. Same stream
// or same pool as before, so reuse stays as safe as an exact-class hit; the choice depends only
// on the sequence of requests, so a captured step's addresses are as repeatable as before.
//
// Note [Splitting large blocks]
// Reused whole, a block of up to twice the request held the rest idle: a big step's activations
// and gradients come in a few sizes that halve and double (a packed [N, 2F] gate/up buffer freed,
// then [N, F] requests), and at qwen3-1.7b's dims the blocks handed out at the step's peak were
// 37% above the data (known issue 42). So a large request (from kLargeThreshold) takes the
// smallest cached block of at least its class, of any size, and when the rest is large too it
// is split off as a free piece of the same owner (the stream's shared cache, or the private pool).
// Every piece of a large backend allocation is tracked by address (pieces_); a freed piece merges
// with its free neighbours of the same allocation and owner (pieces that joined a private pool
// never merge with the shared cache's), so no two free neighbours of one owner exist. Only a
// whole allocation, all its pieces free and merged, goes back to the backend (empty_cache, the
// limit). Small requests keep their classes and the span, and never take a large block, so a
// long-lived small block (a step's static inputs, a scalar) cannot pin a large allocation.
// Deterministic: the choices depend only on the sequence of requests and frees, so captured
// addresses stay repeatable.
std::vector<void*>& DevicePool::free_list_locked(void* stream, uint64_t pool, size_t size) {
  if (pool != 0) return pools_.at(pool).free[size];
  return free_[{stream, size}];
}

void DevicePool::unlist_locked(void* ptr, void* stream, uint64_t pool, size_t size) {
  if (pool != 0) {
    auto& v = pools_.at(pool).free[size];
    v.erase(std::find(v.begin(), v.end(), ptr));
    return;
  }
  auto it = free_.find({stream, size});
  XT_ASSERT(it != free_.end());
  auto& v = it->second;
  v.erase(std::find(v.begin(), v.end(), ptr));
  if (v.empty()) free_.erase(it);  // the shared cache keeps no empty lists
}

void DevicePool::put_free_locked(void* ptr, size_t size, void* stream, uint64_t pool) {
  auto it = pieces_.find(static_cast<char*>(ptr));
  if (it != pieces_.end()) {
    const auto mergeable = [&](const Piece& q) {
      return q.free && q.seg == it->second.seg && q.stream == stream && q.pool == pool;
    };
    it->second.free = true;
    it->second.stream = stream;
    it->second.pool = pool;
    auto next = std::next(it);
    if (next != pieces_.end() && mergeable(next->second)) {
      unlist_locked(next->first, stream, pool, next->second.size);
      it->second.size += next->second.size;
      pieces_.erase(next);
    }
    if (it != pieces_.begin()) {
      auto prev = std::prev(it);
      if (mergeable(prev->second)) {
        unlist_locked(prev->first, stream, pool, prev->second.size);
        prev->second.size += it->second.size;
        pieces_.erase(it);
        it = prev;
      }
    }
    ptr = it->first;
    size = it->second.size;
  }
  free_list_locked(stream, pool, size).push_back(ptr);
}

Block DevicePool::allocate(size_t nbytes, void* stream, RawBackend* backend, uint64_t pool, bool may_release) {
  std::lock_guard<std::mutex> lock(mu_);
  if (nbytes > kMaxRequest) throw_oom_locked(nbytes, nbytes, "larger than any device");
  const size_t size = round_size(nbytes);
  last_backend_ = backend;
  stats_.num_alloc_calls++;
  Block b{nullptr, size, nbytes, stream, device_, pool};

  PrivatePool* priv = nullptr;
  if (pool != 0) {
    auto pit = pools_.find(pool);
    XT_CHECK(pit != pools_.end(), RuntimeError, device_.str(), ": allocation from private pool ", pool,
             ", which was released");
    priv = &pit->second;
  }
  // The smallest cached block of the request's class or a larger one up to kReuseSpan times it
  // (Note [Reusing a larger block]); any larger one for a large request, split (Note [Splitting
  // large blocks]).
  std::vector<void*>* cached = nullptr;
  // A small request never takes a piece of a large allocation: a long-lived small block would keep
  // the whole allocation from going back to the backend (PyTorch keeps small and large apart too).
  const bool large = size >= kLargeThreshold;
  const size_t span = large ? kMaxRequest : std::min(size * kReuseSpan, kLargeThreshold - 1);
  if (priv) {
    for (auto it = priv->free.lower_bound(size); it != priv->free.end() && it->first <= span; ++it) {
      if (!it->second.empty()) {
        cached = &it->second;
        b.size = it->first;
        break;
      }
    }
  } else {
    for (auto it = free_.lower_bound({stream, size}); it != free_.end() && it->first.first == stream &&
                                                       it->first.second <= span; ++it) {
      if (!it->second.empty()) {  // the shared cache erases emptied lists: the first is the one
        cached = &it->second;
        b.size = it->first.second;
        break;
      }
    }
  }
  if (cached) {
    b.ptr = cached->back();
    cached->pop_back();
    if (!priv && cached->empty()) free_.erase({stream, b.size});
    stats_.num_cache_hits++;
    auto it = pieces_.find(static_cast<char*>(b.ptr));
    if (it != pieces_.end()) {
      Piece& p = it->second;
      p.free = false;
      if (large && b.size - size >= kLargeThreshold) {  // the rest stays free, with the same owner
        Piece rest = p;
        rest.size = b.size - size;
        rest.free = false;
        p.size = size;
        char* at = it->first + size;
        pieces_.emplace(at, rest);
        put_free_locked(at, rest.size, rest.stream, rest.pool);
        b.size = size;
      }
    }
  } else {
    const auto over_limit = [&] {
      return stats_.limit_bytes >= 0 &&
             stats_.reserved_bytes + static_cast<int64_t>(size) > stats_.limit_bytes;
    };
    if (over_limit() && may_release) release_cached_locked(backend);
    if (over_limit())
      throw_oom_locked(nbytes, size, may_release ? "over the memory limit"
                                                 : "over the memory limit, during a CUDA graph capture");
    if (recording_) {
      MemoryEvent e;
      e.requested = static_cast<int64_t>(nbytes);
      e.size = static_cast<int64_t>(size);
      e.pool = pool;
      e.allocated_bytes = stats_.allocated_bytes;
      e.requested_bytes = stats_.requested_bytes;
      e.reserved_bytes = stats_.reserved_bytes;
      owner_free_locked(stream, pool, e);
      history_.push_back(e);
    }
    b.ptr = backend->raw_alloc(device_.index, size);
    if (!b.ptr && may_release) {  // the device itself is full: give back what we cache and try once more
      release_cached_locked(backend);
      b.ptr = backend->raw_alloc(device_.index, size);
    }
    if (!b.ptr) throw_oom_locked(nbytes, size, "the device is out of memory" + backend->describe_failure(device_.index));
    stats_.num_raw_alloc++;
    if (size >= kLargeThreshold) {
      char* at = static_cast<char*>(b.ptr);
      pieces_[at] = Piece{size, at, size, false, stream, pool};
    }
    stats_.reserved_bytes += size;
    if (stats_.reserved_bytes > stats_.reserved_bytes_peak) stats_.reserved_bytes_peak = stats_.reserved_bytes;
    if (priv) {
      priv->bytes += size;
      stats_.pool_bytes += size;
    }
  }
  stats_.allocated_bytes += b.size;
  stats_.requested_bytes += nbytes;
  if (stats_.allocated_bytes > stats_.allocated_bytes_peak) stats_.allocated_bytes_peak = stats_.allocated_bytes;
  if (stats_.requested_bytes > stats_.requested_bytes_peak) stats_.requested_bytes_peak = stats_.requested_bytes;
  return b;
}

void DevicePool::free(const Block& block, uint64_t into_pool) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.num_free_calls++;
  stats_.allocated_bytes -= block.size;
  stats_.requested_bytes -= block.requested;
  if (block.pool != 0) {
    if (pools_.count(block.pool)) {
      put_free_locked(block.ptr, block.size, block.stream, block.pool);
      return;
    }
    // its pool was released: the block goes to the shared cache
  } else if (into_pool != 0) {
    auto pit = pools_.find(into_pool);
    if (pit != pools_.end() && pit->second.stream == block.stream) {  // the capture may read it: the pool keeps it
      pit->second.bytes += block.size;
      stats_.pool_bytes += block.size;
      put_free_locked(block.ptr, block.size, block.stream, into_pool);
      return;
    }
  }
  put_free_locked(block.ptr, block.size, block.stream, 0);
}

void DevicePool::create_pool(uint64_t id, void* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  PrivatePool& p = pools_[id];
  p.stream = stream;
  stats_.num_pools = static_cast<int64_t>(pools_.size());
}

void DevicePool::release_pool(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto pit = pools_.find(id);
  if (pit == pools_.end()) return;
  PrivatePool p = std::move(pit->second);
  pools_.erase(pit);
  for (auto& [size, ptrs] : p.free)
    for (void* ptr : ptrs) put_free_locked(ptr, size, p.stream, 0);  // merging with the shared cache's
  stats_.pool_bytes -= p.bytes;
  stats_.num_pools = static_cast<int64_t>(pools_.size());
}

void DevicePool::release_cached_locked(RawBackend* backend) {
  // Whole backend allocations only: a piece of one still partly in use stays cached.
  std::map<std::pair<void*, size_t>, std::vector<void*>> kept;
  for (auto& [key, ptrs] : free_) {
    for (void* p : ptrs) {
      auto it = pieces_.find(static_cast<char*>(p));
      if (it != pieces_.end()) {
        if (it->second.seg != it->first || it->second.size != it->second.seg_size) {
          kept[key].push_back(p);
          continue;
        }
        pieces_.erase(it);
      }
      backend->raw_free(device_.index, p, key.second);
      stats_.num_raw_free++;
      stats_.reserved_bytes -= key.second;
    }
  }
  free_.swap(kept);
}

void DevicePool::throw_oom_locked(size_t requested, size_t rounded, const std::string& why) {
  stats_.num_ooms++;
  std::string limit = stats_.limit_bytes >= 0 ? format_bytes(stats_.limit_bytes) : std::string("none");
  throw OutOfMemoryError(str(device_.str(), ": out of memory (", why, "): tried to allocate ",
                             format_bytes(static_cast<int64_t>(requested)), " (", rounded, " bytes rounded); ",
                             format_bytes(stats_.allocated_bytes), " allocated, ",
                             format_bytes(stats_.reserved_bytes), " reserved by xtrain; limit ", limit,
                             ". Free tensors, lower the batch, or use recompute."));
}

void DevicePool::empty_cache(RawBackend* backend) {
  std::lock_guard<std::mutex> lock(mu_);
  release_cached_locked(backend);
}

MemoryStats DevicePool::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void DevicePool::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.allocated_bytes_peak = stats_.allocated_bytes;
  stats_.requested_bytes_peak = stats_.requested_bytes;
  stats_.reserved_bytes_peak = stats_.reserved_bytes;
}

void DevicePool::owner_free_locked(void* stream, uint64_t pool, MemoryEvent& e) const {
  const auto add = [&e](size_t size, size_t n) {
    e.owner_free_bytes += static_cast<int64_t>(size * n);
    e.owner_free_blocks += static_cast<int64_t>(n);
    if (n) e.owner_largest_free = std::max(e.owner_largest_free, static_cast<int64_t>(size));
  };
  if (pool != 0) {
    auto pit = pools_.find(pool);
    if (pit != pools_.end())
      for (const auto& [size, ptrs] : pit->second.free) add(size, ptrs.size());
    return;
  }
  for (auto it = free_.lower_bound({stream, 0}); it != free_.end() && it->first.first == stream; ++it)
    add(it->first.second, it->second.size());
}

void DevicePool::record_history(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  recording_ = on;
  if (on) history_.clear();
}

std::vector<MemoryEvent> DevicePool::history() {
  std::lock_guard<std::mutex> lock(mu_);
  return history_;
}

std::vector<MemorySegment> DevicePool::segments() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<MemorySegment> out;
  for (const auto& [at, p] : pieces_) {
    if (at == p.seg) {
      out.emplace_back();
      out.back().size = static_cast<int64_t>(p.seg_size);
    }
    out.back().pieces.push_back({static_cast<int64_t>(at - p.seg), static_cast<int64_t>(p.size), p.free,
                                 p.free ? p.pool : 0});
  }
  return out;
}

void DevicePool::set_limit(int64_t limit_bytes, RawBackend* backend) {
  XT_CHECK(limit_bytes >= -1, ValueError, "memory limit must be >= 0 bytes (or None), got ", limit_bytes);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.limit_bytes = limit_bytes;
  // Cached blocks above a new, lower limit are released now rather than at the next miss.
  if (limit_bytes >= 0 && stats_.reserved_bytes > limit_bytes && backend) release_cached_locked(backend);
}

// ------------------------------------------------------------------------------- Allocator

Allocator::Allocator() : cpu_pool_(Device::cpu()), cpu_backend_(new CpuBackend()) {
  for (int i = 0; i < kMaxDevices; ++i) cuda_pools_[i] = new DevicePool(Device::cuda(i));
}

// Never destroyed: tensors held by Python may be freed during interpreter shutdown.
Allocator& Allocator::get() {
  static Allocator* instance = new Allocator();
  return *instance;
}

DevicePool& Allocator::pool(Device device) {
  if (device.is_cpu()) return cpu_pool_;
  XT_CHECK(device.index >= 0 && device.index < kMaxDevices, ValueError, "device index out of range: ", device.str());
  return *cuda_pools_[device.index];
}

RawBackend* Allocator::backend(Device device) {
  if (device.is_cpu()) return cpu_backend_;
  cuda::check_device(device.index);  // raises when CUDA is not built or the device is absent
  return cuda::raw_backend();
}

namespace {
thread_local const PoolRedirect* tl_redirect = nullptr;
std::atomic<uint64_t> g_next_pool{1};

void check_no_capture(Device device, const char* what) {
  XT_CHECK(!tl_redirect || tl_redirect->device != device, RuntimeError, what, " on ", device.str(),
           " during a CUDA graph capture: releasing memory would synchronise the device");
}
}  // namespace

const PoolRedirect* Allocator::set_redirect(const PoolRedirect* redirect) {
  const PoolRedirect* prev = tl_redirect;
  tl_redirect = redirect;
  return prev;
}

const PoolRedirect* Allocator::redirect() { return tl_redirect; }

Block Allocator::allocate(Device device, size_t nbytes, void* stream) {
  if (tl_redirect && tl_redirect->device == device) {  // capturing on this device: never release the cache
    const uint64_t p = tl_redirect->stream == stream ? tl_redirect->pool : 0;
    return pool(device).allocate(nbytes, stream, backend(device), p, /*may_release=*/false);
  }
  return pool(device).allocate(nbytes, stream, backend(device));
}

void Allocator::free(const Block& block) {
  const PoolRedirect* r = tl_redirect;
  const uint64_t into = r && r->device == block.device && r->stream == block.stream ? r->pool : 0;
  pool(block.device).free(block, into);
}
MemoryStats Allocator::stats(Device device) { return pool(device).stats(); }
void Allocator::reset_peak(Device device) { pool(device).reset_peak(); }
void Allocator::empty_cache(Device device) {
  check_no_capture(device, "empty_cache");
  pool(device).empty_cache(backend(device));
}
void Allocator::set_limit(Device device, int64_t limit_bytes) {
  check_no_capture(device, "set_memory_limit");
  pool(device).set_limit(limit_bytes, backend(device));
}

void Allocator::record_history(Device device, bool on) { pool(device).record_history(on); }
std::vector<MemoryEvent> Allocator::history(Device device) { return pool(device).history(); }
std::vector<MemorySegment> Allocator::segments(Device device) { return pool(device).segments(); }

uint64_t Allocator::create_pool(Device device, void* stream) {
  const uint64_t id = g_next_pool.fetch_add(1);
  pool(device).create_pool(id, stream);
  return id;
}

void Allocator::release_pool(Device device, uint64_t id) { pool(device).release_pool(id); }

}  // namespace xt
