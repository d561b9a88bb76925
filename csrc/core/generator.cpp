// Default per-device generators and state handling.
#include "core/generator.h"

#include <array>

#include "core/allocator.h"
#include "core/error.h"

namespace xt {

uint64_t Generator::reserve(uint64_t n, uint64_t* seed_out) {
  std::lock_guard<std::mutex> lock(mu_);
  *seed_out = state_.seed;
  uint64_t off = state_.offset;
  state_.offset += n;
  return off;
}

GeneratorState Generator::state() {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

void Generator::set_state(GeneratorState s) {
  std::lock_guard<std::mutex> lock(mu_);
  state_ = s;
}

void Generator::manual_seed(uint64_t seed) { set_state(GeneratorState{seed, 0}); }

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
