// Random generators: a (seed, offset) pair; a draw of n numbers reserves n counters.
//
// Each device has a default generator (xtrain.manual_seed seeds them all); explicit
// Generator objects can be passed to creation functions and dropout. checkpoint saves and
// restores the state of the default generator of the segment's device so a recompute draws
// the same numbers.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>

#include "core/dtype.h"

namespace xt {

struct GeneratorState {
  uint64_t seed = 0;
  uint64_t offset = 0;
};

class Generator {
 public:
  explicit Generator(uint64_t seed = kDefaultSeed) { state_.seed = seed; }
  // Returns the offset to use and advances the state by n counters.
  uint64_t reserve(uint64_t n, uint64_t* seed_out);
  GeneratorState state();
  void set_state(GeneratorState s);
  void manual_seed(uint64_t seed);
  static constexpr uint64_t kDefaultSeed = 0x5eed;

 private:
  std::mutex mu_;
  GeneratorState state_;
};

std::shared_ptr<Generator> default_generator(Device device);
void manual_seed_all(uint64_t seed);

}  // namespace xt
