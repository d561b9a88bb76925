// Random generators: a (seed, offset) pair; a draw of n numbers reserves n counters.
//
// Each device has a default generator (xtrain.manual_seed seeds them all); explicit
// Generator objects can be passed to creation functions and dropout. checkpoint saves and
// restores the state of the default generator of the segment's device so a recompute draws
// the same numbers.
//
// Note [Random draws in captured graphs]
// A kernel captured into a CUDA graph keeps its launch arguments, so a (seed, offset) passed by
// value would draw the same numbers at every replay. Between begin_capture(base) and
// end_capture() a generator hands out offsets relative to the captured work's start together
// with `base`, two device words [seed, offset] that the kernel adds its relative offset to
// (dropout reads them so; draws that cannot, random tensors, raise). end_capture() returns how
// many counters the captured work draws. Before each replay the owner writes the generator's
// (seed, offset) into base and advances the offset by that count: replay k then draws exactly the
// counters an eager run of the same work would have drawn at that point, so the two are bitwise
// equal. While capturing, state() and set_state() read and set the relative counter, so a
// checkpointed recompute inside the capture (which restores the state it saved) repeats its
// forward's offsets.
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
  // Returns the offset to use and advances the state by n counters. base_out: set to the capture's
  // device words (Note [Random draws in captured graphs]) while capturing, else nullptr; a caller
  // that cannot use them passes nullptr, and reserving while capturing then raises.
  uint64_t reserve(uint64_t n, uint64_t* seed_out, const uint64_t** base_out = nullptr);
  GeneratorState state();
  void set_state(GeneratorState s);
  void manual_seed(uint64_t seed);
  // Capture mode: base points to two uint64 device words the replays fill with (seed, offset).
  void begin_capture(const uint64_t* base);
  // Leaves capture mode; returns the counters the captured work drew.
  uint64_t end_capture();
  bool capturing();
  static constexpr uint64_t kDefaultSeed = 0x5eed;

 private:
  std::mutex mu_;
  GeneratorState state_;
  const uint64_t* capture_base_ = nullptr;  // non-null: capture mode
  uint64_t capture_offset_ = 0;             // counters drawn since begin_capture
};

std::shared_ptr<Generator> default_generator(Device device);
void manual_seed_all(uint64_t seed);

}  // namespace xt
