// Default per-device generators and state handling.
#include "core/generator.h"

#include <array>

#include "core/allocator.h"
#include "core/error.h"

namespace xt {

uint64_t Generator::reserve(uint64_t n, uint64_t* seed_out, const uint64_t** base_out) {
  std::lock_guard<std::mutex> lock(mu_);
  *seed_out = state_.seed;
  if (capture_base_ != nullptr) {  // Note [Random draws in captured graphs]
    XT_CHECK(base_out != nullptr, RuntimeError,
             "random tensors cannot be drawn inside a captured CUDA graph: a replay would repeat the same "
             "numbers (dropout can: it reads its offset from device memory); draw them before the capture");
    *base_out = capture_base_;
    const uint64_t off = capture_offset_;
    capture_offset_ += n;
    return off;
  }
  if (base_out != nullptr) *base_out = nullptr;
  const uint64_t off = state_.offset;
  state_.offset += n;
  return off;
}

GeneratorState Generator::state() {
  std::lock_guard<std::mutex> lock(mu_);
  return capture_base_ != nullptr ? GeneratorState{state_.seed, capture_offset_} : state_;
}

void Generator::set_state(GeneratorState s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (capture_base_ != nullptr) {  // a checkpointed recompute inside the capture: the relative counter
    XT_CHECK(s.seed == state_.seed, RuntimeError, "a generator's seed cannot change while a CUDA graph is "
             "being captured with it");
    capture_offset_ = s.offset;
    return;
  }
  state_ = s;
}

void Generator::manual_seed(uint64_t seed) { set_state(GeneratorState{seed, 0}); }

void Generator::begin_capture(const uint64_t* base) {
  XT_CHECK(base != nullptr, ValueError, "begin_capture: no device words for the replays' (seed, offset)");
  std::lock_guard<std::mutex> lock(mu_);
  XT_CHECK(capture_base_ == nullptr, RuntimeError, "begin_capture: this generator is already capturing");
  capture_base_ = base;
  capture_offset_ = 0;
}

uint64_t Generator::end_capture() {
  std::lock_guard<std::mutex> lock(mu_);
  XT_CHECK(capture_base_ != nullptr, RuntimeError, "end_capture: this generator is not capturing");
  capture_base_ = nullptr;
  return capture_offset_;
}

bool Generator::capturing() {
  std::lock_guard<std::mutex> lock(mu_);
  return capture_base_ != nullptr;
}

namespace {
struct DefaultGenerators {
  std::shared_ptr<Generator> cpu = std::make_shared<Generator>();
  std::array<std::shared_ptr<Generator>, kMaxDevices> cuda;
  DefaultGenerators() {
    for (auto& g : cuda) g = std::make_shared<Generator>();
  }
};
DefaultGenerators& defaults() {
  static DefaultGenerators* d = new DefaultGenerators();
  return *d;
}
}  // namespace

std::shared_ptr<Generator> default_generator(Device device) {
  if (device.is_cpu()) return defaults().cpu;
  XT_CHECK(device.index >= 0 && device.index < kMaxDevices, ValueError, "device index out of range: ", device.str());
  return defaults().cuda[device.index];
}

void manual_seed_all(uint64_t seed) {
  defaults().cpu->manual_seed(seed);
  for (auto& g : defaults().cuda) g->manual_seed(seed);
}

}  // namespace xt
