// The CPU profile: wall time and calls per CPU kernel (and per backward tape Node), accumulated
// while enabled, for reading one training step's cost op by op (bench/profile_step.py --device cpu).
//
//  - Off by default; when off a timed call costs one relaxed atomic load and a branch
//    (cpu_profile::on()), nothing is recorded and no clock is read.
//  - A kernel's entry is keyed by its name and phase: forward, or backward when the calling thread
//    runs a backward walk (the engine marks it with BackwardPhase; a checkpoint's recompute inside
//    the walk counts as backward). A kernel entry's time is the kernel's own; a Node's entry
//    (kind "node") includes the kernels it ran, so the two tables are read apart, never summed.
//  - Thread-safe: entries are added under one mutex, only while enabled.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace xt {
namespace cpu_profile {

extern std::atomic<bool> g_enabled;

inline bool on() { return g_enabled.load(std::memory_order_relaxed); }

void set_enabled(bool enabled);
void reset();

struct Entry {
  std::string name;
  std::string kind;   // "kernel" or "node"
  std::string phase;  // "forward" or "backward"
  int64_t calls = 0;
  double seconds = 0.0;
};
// Every entry recorded since the last reset, in the order each was first seen.
std::vector<Entry> read();

void add(const char* name, bool node, double seconds);

// Marks the calling thread as running a backward walk for the scope's life (nests).
class BackwardPhase {
 public:
  BackwardPhase();
  ~BackwardPhase();
  BackwardPhase(const BackwardPhase&) = delete;
  BackwardPhase& operator=(const BackwardPhase&) = delete;
};

// Runs f(), timing it under `name` when the profile is on. Returns what f returns.
template <typename F>
decltype(auto) timed(const char* name, bool node, F&& f) {
  if (!on()) return std::forward<F>(f)();
  struct Stop {
    const char* name;
    bool node;
    std::chrono::steady_clock::time_point t0;
    ~Stop() { add(name, node, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()); }
  } stop{name, node, std::chrono::steady_clock::now()};
  return std::forward<F>(f)();
}

}  // namespace cpu_profile
}  // namespace xt
