// parallel_for: a CPU kernel's independent pieces (rows, element ranges) split over the CPU
// backend's threads (the count xtrain.set_num_threads sets for OpenBLAS, kernels/cpu/gemm.cpp).
//
//  - [0, n) is cut into contiguous chunks, one per thread; the calling thread runs the first and
//    waits for the others. Each piece is computed by the same code whichever chunk holds it, so
//    the results do not depend on the thread count (bitwise), only the time does.
//  - Work under `grain` pieces per thread stays on the calling thread (a thread start costs tens
//    of microseconds). An exception thrown by a chunk is rethrown on the calling thread.
#pragma once
#include <algorithm>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

#include "kernels/kernels.h"

namespace xt {
namespace kernels {
namespace cpu {

template <typename F>
void parallel_for(int64_t n, int64_t grain, F&& f) {
  const int64_t most = std::max<int64_t>(1, n / std::max<int64_t>(1, grain));
  const int64_t threads = std::min<int64_t>(std::max(1, num_threads()), most);
  if (threads <= 1) {
    if (n > 0) f(int64_t(0), n);
    return;
  }
  const int64_t chunk = (n + threads - 1) / threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads - 1));
  for (int64_t t = 1; t < threads; ++t) {
    const int64_t lo = t * chunk, hi = std::min(n, lo + chunk);
    if (lo >= hi) break;
    pool.emplace_back([&f, &errors, t, lo, hi] {
      try {
        f(lo, hi);
      } catch (...) {
        errors[static_cast<size_t>(t)] = std::current_exception();
      }
    });
  }
  try {
    f(int64_t(0), std::min(n, chunk));
  } catch (...) {
    errors[0] = std::current_exception();
  }
  for (std::thread& th : pool) th.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
