// The CPU kernels' persistent thread pool behind parallel_for (parallel.h).
//
//  - Workers start on first use, as many as a call needs (num_threads() - 1 at most), and live
//    for the process: a call costs a wake-up (a condition variable, after a short spin of the
//    workers that just finished a task) instead of a thread start per call.
//  - One call at a time: pool_run takes the pool with an atomic flag and returns false when it
//    is taken (a nested call, or another thread's), and parallel_for then runs the range itself.
//  - Worker t runs task t of the call it wakes for; the caller runs task 0 and waits until the
//    others are done (spinning briefly, then on a condition variable).
//  - A forked child (the data loader's worker processes) has none of the parent's threads: the
//    pool is forgotten at fork in the child (pthread_atfork) and a new one starts on first use.
#include "kernels/cpu/parallel.h"

#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace xt {
namespace kernels {
namespace cpu {

namespace {

using Task = void (*)(void*, int64_t);

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Pauses (~10 ns each on the 2-core Xeon) spent waiting before blocking: a worker ~20 us for the
// next call (split kernels often come back to back; longer would take the core from OpenBLAS's
// threads in the GEMM that usually follows), the caller ~200 us for the workers' tasks (a split
// is even, they end close together).
constexpr int kWorkerSpin = 2000;
constexpr int kCallerSpin = 20000;

class Pool {
 public:
  bool run(int64_t tasks, Task task, void* ctx) {
    bool idle = false;
    if (!busy_.compare_exchange_strong(idle, true, std::memory_order_acquire)) return false;
    while (static_cast<int64_t>(workers_.size()) < tasks - 1) start_worker(static_cast<int64_t>(workers_.size()) + 1);
    {
      std::lock_guard<std::mutex> lock(m_);
      task_ = task;
      ctx_ = ctx;
      tasks_ = tasks;
      pending_.store(tasks - 1, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
    }
    work_.notify_all();
    task(ctx, 0);
    for (int i = 0; i < kCallerSpin && pending_.load(std::memory_order_acquire) != 0; ++i) cpu_relax();
    if (pending_.load(std::memory_order_acquire) != 0) {
      std::unique_lock<std::mutex> lock(m_);
      done_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
    }
    busy_.store(false, std::memory_order_release);
    return true;
  }

 private:
  // Before the call's generation is published: the worker waits for the next one.
  void start_worker(int64_t index) {
    const uint64_t seen = generation_.load(std::memory_order_acquire);
    workers_.emplace_back([this, index, seen] { worker(index, seen); });
    workers_.back().detach();
  }

  void worker(int64_t index, uint64_t seen) {
    for (;;) {
      for (int i = 0; i < kWorkerSpin && generation_.load(std::memory_order_acquire) == seen; ++i) cpu_relax();
      Task task;
      void* ctx;
      int64_t tasks;
      {
        std::unique_lock<std::mutex> lock(m_);
        work_.wait(lock, [&] { return generation_.load(std::memory_order_relaxed) != seen; });
        seen = generation_.load(std::memory_order_relaxed);
        task = task_;
        ctx = ctx_;
        tasks = tasks_;
      }
      if (index >= tasks) continue;
      task(ctx, index);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lock(m_);
        done_.notify_one();
      }
    }
  }

  std::atomic<bool> busy_{false};
  std::vector<std::thread> workers_;  // grown only by the caller holding busy_
  std::mutex m_;
  std::condition_variable work_, done_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int64_t> pending_{0};
  Task task_ = nullptr;
  void* ctx_ = nullptr;
  int64_t tasks_ = 0;
};

std::atomic<Pool*> g_pool{nullptr};

void forget_pool_in_child() { g_pool.store(nullptr, std::memory_order_relaxed); }

// The process's pool (never destroyed: its workers live as long as the process).
Pool& pool() {
  Pool* p = g_pool.load(std::memory_order_acquire);
  if (p != nullptr) return *p;
  static const bool registered = (pthread_atfork(nullptr, nullptr, forget_pool_in_child), true);
  (void)registered;
  Pool* fresh = new Pool();
  if (g_pool.compare_exchange_strong(p, fresh, std::memory_order_acq_rel)) return *fresh;
  delete fresh;  // another thread made it first (fresh has no workers yet)
  return *p;
}

}  // namespace

bool pool_run(int64_t tasks, Task task, void* ctx) { return pool().run(tasks, task, ctx); }

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
