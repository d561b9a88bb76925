// The CPU profile's table (see cpu_profile.h): entries keyed by (name, kind, phase) in first-seen
// order, under one mutex; the phase is the calling thread's (BackwardPhase).
#include "core/cpu_profile.h"

#include <mutex>
#include <unordered_map>

namespace xt {
namespace cpu_profile {

std::atomic<bool> g_enabled{false};

namespace {

std::mutex g_mutex;
std::vector<Entry> g_entries;                     // guarded by g_mutex
std::unordered_map<std::string, size_t> g_index;  // key -> position in g_entries
thread_local int t_backward_depth = 0;

}  // namespace

void set_enabled(bool enabled) { g_enabled.store(enabled, std::memory_order_relaxed); }

void reset() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_entries.clear();
  g_index.clear();
}

std::vector<Entry> read() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_entries;
}

void add(const char* name, bool node, double seconds) {
  const bool backward = t_backward_depth > 0;
  std::string key = std::string(node ? "n|" : "k|") + (backward ? "b|" : "f|") + name;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_index.find(key);
  if (it == g_index.end()) {
    it = g_index.emplace(std::move(key), g_entries.size()).first;
    g_entries.push_back(Entry{name, node ? "node" : "kernel", backward ? "backward" : "forward", 0, 0.0});
  }
  Entry& e = g_entries[it->second];
  e.calls += 1;
  e.seconds += seconds;
}

BackwardPhase::BackwardPhase() { ++t_backward_depth; }
BackwardPhase::~BackwardPhase() { --t_backward_depth; }

}  // namespace cpu_profile
}  // namespace xt
