// Caching allocator: the policy in allocator.h, the CPU raw backend, and stats.
#include "core/allocator.h"

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

Block DevicePool::allocate(size_t nbytes, void* stream, RawBackend* backend) {
  std::lock_guard<std::mutex> lock(mu_);
  if (nbytes > kMaxRequest) throw_oom_locked(nbytes, nbytes, "larger than any device");
  const size_t size = round_size(nbytes);
  last_backend_ = backend;
  stats_.num_alloc_calls++;
  Block b{nullptr, size, nbytes, stream, device_};

  auto it = free_.find({stream, size});
  if (it != free_.end() && !it->second.empty()) {
    b.ptr = it->second.back();
    it->second.pop_back();
    if (it->second.empty()) free_.erase(it);
    stats_.num_cache_hits++;
  } else {
    const auto over_limit = [&] {
      return stats_.limit_bytes >= 0 &&
             stats_.reserved_bytes + static_cast<int64_t>(size) > stats_.limit_bytes;
    };
    if (over_limit()) release_cached_locked(backend);
    if (over_limit()) throw_oom_locked(nbytes, size, "over the memory limit");
    b.ptr = backend->raw_alloc(device_.index, size);
    if (!b.ptr) {  // the device itself is full: give back what we cache and try once more
      release_cached_locked(backend);
      b.ptr = backend->raw_alloc(device_.index, size);
      if (!b.ptr) throw_oom_locked(nbytes, size, "the device is out of memory" + backend->describe_failure(device_.index));
    }
    stats_.num_raw_alloc++;
    stats_.reserved_bytes += size;
    if (stats_.reserved_bytes > stats_.reserved_bytes_peak) stats_.reserved_bytes_peak = stats_.reserved_bytes;
  }
  stats_.allocated_bytes += size;
  stats_.requested_bytes += nbytes;
  if (stats_.allocated_bytes > stats_.allocated_bytes_peak) stats_.allocated_bytes_peak = stats_.allocated_bytes;
  return b;
}

void DevicePool::free(const Block& block) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.num_free_calls++;
  stats_.allocated_bytes -= block.size;
  stats_.requested_bytes -= block.requested;
  free_[{block.stream, block.size}].push_back(block.ptr);
}

void DevicePool::release_cached_locked(RawBackend* backend) {
  for (auto& [key, ptrs] : free_) {
    for (void* p : ptrs) {
      backend->raw_free(device_.index, p, key.second);
      stats_.num_raw_free++;
      stats_.reserved_bytes -= key.second;
    }
  }
  free_.clear();
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
  stats_.reserved_bytes_peak = stats_.reserved_bytes;
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

Block Allocator::allocate(Device device, size_t nbytes, void* stream) {
  return pool(device).allocate(nbytes, stream, backend(device));
}

void Allocator::free(const Block& block) { pool(block.device).free(block); }
MemoryStats Allocator::stats(Device device) { return pool(device).stats(); }
void Allocator::reset_peak(Device device) { pool(device).reset_peak(); }
void Allocator::empty_cache(Device device) { pool(device).empty_cache(backend(device)); }
void Allocator::set_limit(Device device, int64_t limit_bytes) {
  pool(device).set_limit(limit_bytes, backend(device));
}

}  // namespace xt
