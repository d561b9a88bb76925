// core/cuda_api.h for CUDA builds: devices, per-thread streams, the cudaMalloc backend, copies.
//
//  - The current device is per host thread (default 0), like the CUDA runtime's own.
//  - Each (thread, device) pair gets one non-blocking stream, created on first use and
//    synchronised + destroyed when the thread exits; blocks cached by the allocator are keyed by
//    stream, so a stream is only destroyed once its work is done.
//  - device_count()/is_available() never throw: no driver or no GPU means 0 devices.
//  - The raw backend never throws either: cudaMalloc running out of memory returns nullptr
//    (the allocator then releases its cache, retries, and raises OutOfMemoryError).
//  - Sync points (host waits for the GPU): copies into host memory, synchronize*(),
//    and a stream's destruction at thread exit. Nothing else here blocks the host: uploads of
//    up to 16 MiB are staged through pinned buffers (a copy from pageable memory may wait for
//    the stream), larger ones are copied from where they lie.
//  - Each sync point but the thread-exit one also reports what the kernels found out of range
//    (Note [Device-side index checks] in cuda_check.h): IndexError, and the record is cleared.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda_api.h"
#include "core/error.h"

namespace xt {
namespace cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  cudaGetLastError();  // clear a non-sticky error so the process keeps working
  throw RuntimeError(str("CUDA error ", cudaGetErrorName(err), ": ", cudaGetErrorString(err), " (in ", what,
                         " at ", file, ":", line, ")"));
}

namespace {

// What the runtime sees, probed once: the device count cannot change during a process.
struct DeviceTable {
  int count = 0;
  std::string why_none;  // the runtime's answer when count is 0
};

const DeviceTable& devices() {
  static const DeviceTable table = [] {
    DeviceTable t;
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      cudaGetLastError();
      t.why_none = str(cudaGetErrorName(err), ": ", cudaGetErrorString(err));
      n = 0;
    } else if (n == 0) {
      t.why_none = "the CUDA runtime reports no devices";
    }
    t.count = n < kMaxDevices ? n : kMaxDevices;
    return t;
  }();
  return table;
}

thread_local int tl_device = 0;
thread_local int tl_capture_depth = 0;  // graphs this thread is capturing (core/cuda/graph.cpp)
thread_local bool tl_early_launch = false;  // set_early_launch

// This thread's streams, one per device; synchronised and destroyed at thread exit. Errors
// are ignored there: at process exit the driver may already be shutting down.
struct ThreadStreams {
  cudaStream_t stream[kMaxDevices] = {};
  ~ThreadStreams() {
    for (int d = 0; d < kMaxDevices; ++d) {
      if (!stream[d]) continue;
      if (cudaSetDevice(d) == cudaSuccess) {
        cudaStreamSynchronize(stream[d]);  // sync point: thread exit
        cudaStreamDestroy(stream[d]);
      }
      cudaGetLastError();
    }
  }
};
thread_local ThreadStreams tl_streams;

// Host -> device uploads of up to kStageMax bytes go through pinned staging buffers: a copy from
// pageable memory may make the host wait for the stream (the driver stages it itself), and the
// training loop uploads each step's token ids while the previous step still runs. A ring of
// kStageSlots buffers per (thread, device); a slot is reused once the event recorded after its
// copy has completed (in practice always: four uploads later).
constexpr size_t kStageMax = size_t(16) << 20;
constexpr int kStageSlots = 4;
struct StageRing {
  struct Slot {
    void* host = nullptr;
    size_t cap = 0;
    cudaEvent_t done = nullptr;
    bool pending = false;
  };
  Slot slot[kMaxDevices][kStageSlots];
  int next[kMaxDevices] = {};
  ~StageRing() {
    for (int d = 0; d < kMaxDevices; ++d)
      for (Slot& s : slot[d]) {
        if (s.pending) cudaEventSynchronize(s.done);
        if (s.done) cudaEventDestroy(s.done);
        if (s.host) cudaFreeHost(s.host);
      }
    cudaGetLastError();  // errors here only happen at process exit
  }
};
thread_local StageRing tl_stage;

// One IndexErrorRecord per device, in pinned host memory. Under unified addressing (every 64-bit
// process) pinned host memory is reachable from every device at its host address, so kernels
// and the host use the same pointer.
std::atomic<IndexErrorRecord*> g_index_errors[kMaxDevices];
std::mutex g_index_errors_mu;

std::string index_error_message(int device, const IndexErrorRecord& r) {
  const std::string where =
      str(" (found on cuda:", device, " by the kernel's device-side check; raised at the first sync point after it)");
  switch (static_cast<IndexSite>(r.site)) {
    case IndexSite::Embedding:
      return str("embedding: ids must be in [0, ", r.bound, "), got ", r.value, where);
    case IndexSite::EmbeddingBackward:
      return str("embedding backward: ids must be in [0, ", r.bound, "), got ", r.value, where);
    case IndexSite::CrossEntropy:
      return str("cross_entropy: target ", r.value, " is out of range for ", r.bound,
                 " classes (expected 0 <= target < ", r.bound, ", or ignore_index ", r.ignore_index, ")", where);
    case IndexSite::KvCacheWrite:
      return str("kv_cache_write_: positions must be in [0, ", r.bound - 1, "] (cache slots minus x's positions), got ",
                 r.value, where);
    case IndexSite::DecodeAttention:
      return str("decode_attention: lengths must be in [0, ", r.bound - 1, "] (the cache's slots), got ", r.value, where);
    case IndexSite::DecodePrep:
      return str("decode_prep: positions must be in [0, ", r.bound - 1, "] (the cache's slots), got ", r.value, where);
  }
  return str("index ", r.value, " out of range [0, ", r.bound, ")", where);
}

// The backend's failures are reported by describe_failure() on the same thread, right after.
thread_local std::string tl_last_alloc_error;

class CudaBackend : public RawBackend {
 public:
  void* raw_alloc(int device, size_t nbytes) override {
    tl_last_alloc_error.clear();
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess || (prev != device && cudaSetDevice(device) != cudaSuccess)) {
      const cudaError_t err = cudaGetLastError();
      tl_last_alloc_error = str("cannot select cuda:", device, ": ", cudaGetErrorString(err));
      return nullptr;
    }
    void* ptr = nullptr;
    // While this thread captures a graph, cudaMalloc is legal (it is not captured: the graph's
    // pool keeps the block) but counts as unsafe in thread-local capture mode: relax it around.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    const bool relax = tl_capture_depth > 0;
    if (relax) cudaThreadExchangeStreamCaptureMode(&mode);
    const cudaError_t err = cudaMalloc(&ptr, nbytes);
    if (relax) cudaThreadExchangeStreamCaptureMode(&mode);
    if (err != cudaSuccess) {
      cudaGetLastError();  // cudaErrorMemoryAllocation is not sticky: clear it and report OOM
      ptr = nullptr;
      if (err != cudaErrorMemoryAllocation) tl_last_alloc_error = str("cudaMalloc failed: ", cudaGetErrorString(err));
    }
    if (prev != device) cudaSetDevice(prev);
    return ptr;
  }

  void raw_free(int device, void* ptr, size_t) override {
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
    if (prev != device) cudaSetDevice(device);
    // cudaFree waits for the device (implicit sync point: only on empty_cache / limit pressure).
    // It cannot throw from here; a failure at process exit (driver unloading) is harmless.
    cudaFree(ptr);
    cudaGetLastError();
    if (prev >= 0 && prev != device) cudaSetDevice(prev);
  }

  std::string describe_failure(int device) override {
    std::string out;
    if (!tl_last_alloc_error.empty()) out += "; " + tl_last_alloc_error;
    size_t free_b = 0, total_b = 0;
    int prev = -1;
    if (cudaGetDevice(&prev) == cudaSuccess && (prev == device || cudaSetDevice(device) == cudaSuccess)) {
      if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
        out += str("; the driver reports ", format_bytes(static_cast<int64_t>(free_b)), " free of ",
                   format_bytes(static_cast<int64_t>(total_b)), " on cuda:", device);
      }
      if (prev != device) cudaSetDevice(prev);
    }
    cudaGetLastError();
    return out;
  }
};

}  // namespace

DeviceGuard::DeviceGuard(int device) {
  int cur = 0;
  XT_CUDA_CHECK(cudaGetDevice(&cur));
  if (cur != device) {
    XT_CUDA_CHECK(cudaSetDevice(device));
    prev_ = cur;
  }
}

DeviceGuard::~DeviceGuard() {
  if (prev_ >= 0) cudaSetDevice(prev_);
}

int stream_device(void* stream) {
  if (stream) {
    for (int d = 0; d < kMaxDevices; ++d)
      if (tl_streams.stream[d] == stream) return d;
    int dev = 0;
    XT_CUDA_CHECK(cudaStreamGetDevice(static_cast<cudaStream_t>(stream), &dev));
    return dev;
  }
  int dev = 0;
  XT_CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

void capture_depth_add(int delta) { tl_capture_depth += delta; }

bool capturing() { return tl_capture_depth > 0; }

bool set_early_launch(bool on) {
  const bool prev = tl_early_launch;
  tl_early_launch = on;
  return prev;
}

bool early_launch(int device) {
  if (!tl_early_launch) return false;
  if (device < 0 || device >= devices().count) return false;  // no driver: no devices
  static std::atomic<int> major[kMaxDevices] = {};  // 0: not asked yet
  int m = major[device].load(std::memory_order_relaxed);
  if (m == 0) {
    XT_CUDA_CHECK(cudaDeviceGetAttribute(&m, cudaDevAttrComputeCapabilityMajor, device));
    major[device].store(m, std::memory_order_relaxed);
  }
  return m >= 9;
}

void check_not_capturing(const char* what) {
  XT_CHECK(tl_capture_depth == 0, RuntimeError, what,
           " cannot run while this thread captures a CUDA graph (a graph cannot wait for the host, and a "
           "host value copied in would be replayed unchanged); run it before or after the capture "
           "(docs/cuda.md, Graph capture)");
}

bool is_built() { return true; }
int device_count() { return devices().count; }
bool is_available() { return devices().count > 0; }

void check_device(int index) {
  const DeviceTable& t = devices();
  XT_CHECK(t.count > 0, RuntimeError, "cuda:", index, " was requested but no CUDA device is available (",
           t.why_none, "); xtrain.cuda.is_available() is False on this machine");
  XT_CHECK(index >= 0 && index < t.count, RuntimeError, "cuda:", index, " was requested but this process sees ",
           t.count, " CUDA device(s) (cuda:0 to cuda:", t.count - 1, ")");
}

int current_device() { return tl_device; }

void set_device(int index) {
  check_device(index);
  XT_CUDA_CHECK(cudaSetDevice(index));
  tl_device = index;
}

void* current_stream(int device) {
  if (device >= 0 && device < kMaxDevices && tl_streams.stream[device]) return tl_streams.stream[device];
  check_device(device);
  cudaStream_t& s = tl_streams.stream[device];
  DeviceGuard guard(device);
  // Non-blocking: never serialises with the legacy default stream other libraries may use.
  XT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

void synchronize(int device) {
  if (device < 0 || device >= kMaxDevices) return;
  check_not_capturing("synchronize()");
  if (tl_streams.stream[device]) {  // else nothing was launched from this thread
    DeviceGuard guard(device);
    XT_CUDA_CHECK(cudaStreamSynchronize(tl_streams.stream[device]));  // sync point: explicit
  }
  check_index_errors(device);
}

IndexErrorRecord* index_error_record(int device) {
  XT_ASSERT(device >= 0 && device < kMaxDevices, "device ", device);
  std::atomic<IndexErrorRecord*>& slot = g_index_errors[device];
  if (IndexErrorRecord* r = slot.load(std::memory_order_acquire)) return r;
  std::lock_guard<std::mutex> lock(g_index_errors_mu);
  if (!slot.load(std::memory_order_relaxed)) {  // once per device and process
    int unified = 0;
    XT_CUDA_CHECK(cudaDeviceGetAttribute(&unified, cudaDevAttrUnifiedAddressing, device));
    XT_CHECK(unified, RuntimeError, "cuda:", device,
             " has no unified addressing, which the device-side index checks of embedding and cross_entropy need");
    DeviceGuard guard(device);
    void* host = nullptr;
    XT_CUDA_CHECK(cudaHostAlloc(&host, sizeof(IndexErrorRecord), cudaHostAllocMapped | cudaHostAllocPortable));
    std::memset(host, 0, sizeof(IndexErrorRecord));
    slot.store(static_cast<IndexErrorRecord*>(host), std::memory_order_release);
  }
  return slot.load(std::memory_order_relaxed);
}

void check_index_errors(int device) {
  if (device < 0 || device >= kMaxDevices) return;
  volatile IndexErrorRecord* r = g_index_errors[device].load(std::memory_order_acquire);
  if (!r || r->flag == 0) return;
  IndexErrorRecord seen{};
  seen.site = r->site;
  seen.value = r->value;
  seen.bound = r->bound;
  seen.ignore_index = r->ignore_index;
  r->flag = 0;  // reported once; the next out-of-range index is recorded afresh
  throw IndexError(index_error_message(device, seen));
}

void synchronize_all() {
  for (int d = 0; d < kMaxDevices; ++d) synchronize(d);
}

RawBackend* raw_backend() {
  static CudaBackend* backend = new CudaBackend();  // never destroyed (used at exit)
  return backend;
}

std::string device_name(int device) {
  check_device(device);
  cudaDeviceProp prop;
  XT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

std::string runtime_info() {
  int driver = 0, runtime = 0, cb_major = 0, cb_minor = 0, cb_patch = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  cudaGetLastError();
  cublasGetProperty(MAJOR_VERSION, &cb_major);
  cublasGetProperty(MINOR_VERSION, &cb_minor);
  cublasGetProperty(PATCH_LEVEL, &cb_patch);
  const auto ver = [](int v) { return str(v / 1000, ".", (v % 1000) / 10); };
  std::string out = str("CUDA driver ", driver ? ver(driver) : std::string("none"), ", runtime ", ver(runtime),
                        ", cuBLAS ", cb_major, ".", cb_minor, ".", cb_patch);
  const DeviceTable& t = devices();
  if (t.count == 0) return out + "; no device (" + t.why_none + ")";
  out += str("; ", t.count, " device(s):");
  for (int d = 0; d < t.count; ++d) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    out += str(" cuda:", d, " ", prop.name, " (sm_", prop.major, prop.minor, ", ",
               format_bytes(static_cast<int64_t>(prop.totalGlobalMem)), ", ", prop.multiProcessorCount, " SMs)");
  }
  return out;
}

// HostRead slots: pinned buffers with their events, reused per (thread, device) so a read per step
// allocates nothing (cudaFreeHost could wait for the device). A slot holds at least kHostReadMax
// bytes; a larger read takes the smallest free slot that fits, or a new one of its size rounded up
// to 256 bytes (the decode loop's token ring: the same size every time, so one allocation).
namespace {
struct ReadSlot {
  void* host = nullptr;
  cudaEvent_t event = nullptr;
  size_t bytes = 0;
};
thread_local std::vector<ReadSlot> tl_read_slots[kMaxDevices];
}  // namespace

HostRead::HostRead(const void* src, int device, size_t nbytes) : device_(device) {
  // Its event could not be waited on while the stream captures; read the graph's output after
  // the replay instead.
  check_not_capturing("read_async");
  DeviceGuard guard(device);
  cudaStream_t s = static_cast<cudaStream_t>(current_stream(device));
  std::vector<ReadSlot>& free_slots = tl_read_slots[device];
  size_t best = free_slots.size();
  for (size_t k = 0; k < free_slots.size(); ++k)
    if (free_slots[k].bytes >= nbytes && (best == free_slots.size() || free_slots[k].bytes < free_slots[best].bytes))
      best = k;
  ReadSlot slot;
  if (best < free_slots.size()) {
    slot = free_slots[best];
    free_slots.erase(free_slots.begin() + static_cast<std::ptrdiff_t>(best));
  } else {
    slot.bytes = nbytes <= kHostReadMax ? kHostReadMax : (nbytes + 255) / 256 * 256;
    XT_CUDA_CHECK(cudaHostAlloc(&slot.host, slot.bytes, cudaHostAllocDefault));
    XT_CUDA_CHECK(cudaEventCreateWithFlags(&slot.event, cudaEventDisableTiming));
  }
  host_ = slot.host;
  event_ = slot.event;
  bytes_ = slot.bytes;
  if (nbytes) XT_CUDA_CHECK(cudaMemcpyAsync(host_, src, nbytes, cudaMemcpyDeviceToHost, s));
  XT_CUDA_CHECK(cudaEventRecord(slot.event, s));
}

HostRead::~HostRead() {
  if (!host_) return;
  cudaEventSynchronize(static_cast<cudaEvent_t>(event_));  // the copy must land before the slot is reused
  tl_read_slots[device_].push_back(ReadSlot{host_, static_cast<cudaEvent_t>(event_), bytes_});
}

bool HostRead::ready() const { return cudaEventQuery(static_cast<cudaEvent_t>(event_)) == cudaSuccess; }

const void* HostRead::wait() {
  XT_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)));  // sync point
  check_index_errors(device_);
  return host_;
}

Event::Event(int device) : device_(device) {
  check_device(device);
  DeviceGuard guard(device);
  cudaEvent_t e = nullptr;
  XT_CUDA_CHECK(cudaEventCreate(&e));  // with timing
  event_ = e;
}

Event::~Event() {
  if (event_) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}

void Event::record() {
  check_not_capturing("Event.record");
  DeviceGuard guard(device_);
  XT_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event_), static_cast<cudaStream_t>(current_stream(device_))));
  recorded_ = true;
}

bool Event::ready() const {
  return !recorded_ || cudaEventQuery(static_cast<cudaEvent_t>(event_)) == cudaSuccess;
}

double Event::elapsed_ms_since(const Event& start) {
  XT_CHECK(recorded_ && start.recorded_, RuntimeError, "Event.elapsed_ms_since: both events must be recorded first");
  XT_CHECK(start.device_ == device_, ValueError, "Event.elapsed_ms_since: the events are on devices ",
           start.device_, " and ", device_);
  XT_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)));  // sync point
  float ms = 0.f;
  XT_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.event_), static_cast<cudaEvent_t>(event_)));
  return ms;
}

// Copies run on this thread's stream of the CUDA side. H2D from pageable host memory returns
// once the source has been staged, so the caller may free it at once; D2H waits (sync point).
void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes) {
  if (nbytes == 0) return;
  if (dst_dev.is_cpu() && src_dev.is_cpu()) {
    std::memcpy(dst, src, nbytes);
    return;
  }
  if (src_dev.is_cpu()) {  // host -> device
    check_not_capturing("a host-to-device copy");
    const int d = dst_dev.index;
    cudaStream_t s = static_cast<cudaStream_t>(current_stream(d));
    DeviceGuard guard(d);
    if (nbytes <= kStageMax) {  // through a pinned slot: never waits for the stream
      StageRing::Slot& slot = tl_stage.slot[d][tl_stage.next[d]];
      tl_stage.next[d] = (tl_stage.next[d] + 1) % kStageSlots;
      if (slot.pending) XT_CUDA_CHECK(cudaEventSynchronize(slot.done));  // its copy four uploads ago
      slot.pending = false;
      if (slot.cap < nbytes) {
        if (slot.host) XT_CUDA_CHECK(cudaFreeHost(slot.host));
        slot.host = nullptr;
        slot.cap = 0;
        size_t cap = 4096;
        while (cap < nbytes) cap *= 2;
        XT_CUDA_CHECK(cudaHostAlloc(&slot.host, cap, cudaHostAllocDefault));
        slot.cap = cap;
      }
      if (!slot.done) XT_CUDA_CHECK(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming));
      std::memcpy(slot.host, src, nbytes);
      XT_CUDA_CHECK(cudaMemcpyAsync(dst, slot.host, nbytes, cudaMemcpyHostToDevice, s));
      XT_CUDA_CHECK(cudaEventRecord(slot.done, s));
      slot.pending = true;
      return;
    }
    XT_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, s));
    return;
  }
  if (dst_dev.is_cpu()) {  // device -> host
    check_not_capturing("a device-to-host copy (item(), numpy(), to(\"cpu\"): a sync point)");
    cudaStream_t s = static_cast<cudaStream_t>(current_stream(src_dev.index));
    DeviceGuard guard(src_dev.index);
    XT_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, s));
    XT_CUDA_CHECK(cudaStreamSynchronize(s));  // sync point: the host reads the bytes next
    check_index_errors(src_dev.index);
    return;
  }
  if (src_dev.index == dst_dev.index) {  // same device
    cudaStream_t s = static_cast<cudaStream_t>(current_stream(src_dev.index));
    DeviceGuard guard(src_dev.index);
    XT_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, s));
    return;
  }
  check_not_capturing("a copy between devices");
  // Across devices: the copy runs on the source's stream, after the destination stream's
  // pending work (which may still use dst), and the destination stream waits for the copy.
  // Events order the two streams on the GPU; the host does not wait.
  cudaStream_t ss = static_cast<cudaStream_t>(current_stream(src_dev.index));
  cudaStream_t ds = static_cast<cudaStream_t>(current_stream(dst_dev.index));
  cudaEvent_t dst_ready = nullptr, copied = nullptr;
  {
    DeviceGuard guard(dst_dev.index);
    XT_CUDA_CHECK(cudaEventCreateWithFlags(&dst_ready, cudaEventDisableTiming));
    XT_CUDA_CHECK(cudaEventRecord(dst_ready, ds));
  }
  {
    DeviceGuard guard(src_dev.index);
    XT_CUDA_CHECK(cudaStreamWaitEvent(ss, dst_ready, 0));
    XT_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_dev.index, src, src_dev.index, nbytes, ss));
    XT_CUDA_CHECK(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
    XT_CUDA_CHECK(cudaEventRecord(copied, ss));
  }
  {
    DeviceGuard guard(dst_dev.index);
    XT_CUDA_CHECK(cudaStreamWaitEvent(ds, copied, 0));
  }
  // Destroying a recorded event is safe: its resources go once the work it tracks is done.
  XT_CUDA_CHECK(cudaEventDestroy(dst_ready));
  XT_CUDA_CHECK(cudaEventDestroy(copied));
}

void memset_zero(void* dst, Device dev, size_t nbytes) {
  if (nbytes == 0) return;
  if (dev.is_cpu()) {
    std::memset(dst, 0, nbytes);
    return;
  }
  cudaStream_t s = static_cast<cudaStream_t>(current_stream(dev.index));
  DeviceGuard guard(dev.index);
  XT_CUDA_CHECK(cudaMemsetAsync(dst, 0, nbytes, s));
}

}  // namespace cuda
}  // namespace xt
