// core/cuda_api.h for builds without the CUDA backend: no devices, clear errors.
#ifndef XT_CUDA
#include "core/allocator.h"
#include "core/cuda_api.h"
#include "core/error.h"

namespace xt {
namespace cuda {

namespace {
[[noreturn]] void not_built() {
  throw RuntimeError(
      "xtrain was built without the CUDA backend (xtrain.cuda.is_built() is False): "
      "reinstall on a machine with nvcc and cuBLAS to use cuda devices");
}
}  // namespace

bool is_built() { return false; }
int device_count() { return 0; }
bool is_available() { return false; }
void check_device(int) { not_built(); }
int current_device() { return 0; }
void set_device(int) { not_built(); }
void* current_stream(int) { not_built(); }
void synchronize(int) {}
void synchronize_all() {}
RawBackend* raw_backend() { not_built(); }
std::string device_name(int) { not_built(); }
std::string runtime_info() { return "CUDA backend not built"; }
void copy_bytes(void*, Device, const void*, Device, size_t) { not_built(); }
void memset_zero(void*, Device, size_t) { not_built(); }
HostRead::HostRead(const void*, int, size_t) { not_built(); }
HostRead::~HostRead() = default;
bool HostRead::ready() const { return true; }
const void* HostRead::wait() { return host_; }

Event::Event(int) { not_built(); }
Event::~Event() = default;
void Event::record() { not_built(); }
bool Event::ready() const { return true; }
double Event::elapsed_ms_since(const Event&) { not_built(); }

// No graphs without CUDA: constructing one raises; nothing ever captures.
class GraphPool {};
Graph::Graph(int, const Graph*) { not_built(); }
Graph::~Graph() = default;
void Graph::capture_begin() { not_built(); }
void Graph::capture_end() { not_built(); }
void Graph::abort_capture() {}
void Graph::replay() { not_built(); }
uint64_t Graph::pool_id() const { return 0; }
void Graph::end_redirect() {}
bool capturing() { return false; }
void check_not_capturing(const char*) {}
bool set_early_launch(bool on) {  // kept, though no launch happens without CUDA
  static thread_local bool requested = false;
  const bool prev = requested;
  requested = on;
  return prev;
}
bool early_launch(int) { return false; }

}  // namespace cuda
}  // namespace xt
#endif  // XT_CUDA
