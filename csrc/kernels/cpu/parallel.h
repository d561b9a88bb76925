// parallel_for: a CPU kernel's independent pieces (rows, element ranges) split over the CPU
// backend's threads (the count xtrain.set_num_threads sets for OpenBLAS, kernels/cpu/gemm.cpp).
//
//  - [0, n) is cut into contiguous chunks, one per thread; the calling thread runs the first,
//    the workers of a persistent pool (parallel.cpp) the others, and the call returns when all
//    are done. Each piece is computed by the same code whichever chunk holds it, so the results
//    do not depend on the thread count (bitwise), only the time does.
//  - Work under `grain` pieces per thread stays on the calling thread. So does a call made while
//    the pool runs another one (a chunk's own parallel_for, or a second thread's kernel): the
//    whole range on the calling thread, the same bits.
//  - An exception thrown by a chunk is rethrown on the calling thread (the first chunk's first).
#pragma once
#include <algorithm>
#include <cstdint>
#include <exception>
#include <vector>

#include "kernels/kernels.h"

namespace xt {
namespace kernels {
namespace cpu {

// Runs task(t) for t in [0, tasks): t = 0 on the calling thread, the others on the pool's
// workers (started on first use, kept for the process). Returns false, running nothing, when the
// pool is busy with another call. task must not throw.
bool pool_run(int64_t tasks, void (*task)(void* ctx, int64_t t), void* ctx);

template <typename F>
void parallel_for(int64_t n, int64_t grain, F&& f) {
  const int64_t most = std::max<int64_t>(1, n / std::max<int64_t>(1, grain));
  const int64_t threads = std::min<int64_t>(std::max(1, num_threads()), most);
  if (threads <= 1) {
    if (n > 0) f(int64_t(0), n);
    return;
  }
  struct Ctx {
    F* f;
    int64_t n, chunk;
    std::vector<std::exception_ptr> errors;
  } ctx{&f, n, (n + threads - 1) / threads, std::vector<std::exception_ptr>(static_cast<size_t>(threads))};
  const auto task = [](void* p, int64_t t) {
    Ctx& c = *static_cast<Ctx*>(p);
    const int64_t lo = t * c.chunk, hi = std::min(c.n, lo + c.chunk);
    if (lo >= hi) return;
    try {
      (*c.f)(lo, hi);
    } catch (...) {
      c.errors[static_cast<size_t>(t)] = std::current_exception();
    }
  };
  if (!pool_run(threads, task, &ctx)) {
    f(int64_t(0), n);
    return;
  }
  for (const std::exception_ptr& e : ctx.errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
