// The NCCL communicator (see communicator.h for the model). Locking, in the order taken:
//  - Rank::mu guards a rank's ncclComm_t for host-side NCCL calls: the rank's own collectives,
//    the watchdog's error check (try_lock only: it never waits on a rank) and abort/close. It is
//    never held while waiting on anything but NCCL's host-side progress, and that wait gives up
//    as soon as aborted_ is set, so abort() from another thread gets every lock promptly.
//  - Rank::pending_mu guards the rank's outstanding-collective events (rank thread, watchdog).
//  - error_mu_ guards the first abort reason.
// Sync points: barrier() and close() wait on the host (polling, with the timeout); nothing else.
#include "dist/communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <utility>

#include "core/cuda/cuda_check.h"
#include "core/cuda_api.h"
#include "core/error.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "xtrain needs NCCL 2.14 or newer (non-blocking communicators, ncclCommFinalize, ncclAvg)"
#endif

namespace xt {
namespace dist {

namespace {

using Clock = std::chrono::steady_clock;
// The watchdog looks at every rank this often: a failure or a timeout is acted on within it.
constexpr auto kWatchdogPeriod = std::chrono::milliseconds(20);
// Host-side polling step (NCCL in-progress state, barrier and close waits): short enough to add
// no visible latency, long enough that a waiting thread costs no CPU to speak of.
constexpr auto kPollSleep = std::chrono::microseconds(20);

bool is_error(ncclResult_t r) { return r != ncclSuccess && r != ncclInProgress; }

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

ncclDataType_t nccl_dtype(DType dt) {
  switch (dt) {
    case DType::Float32: return ncclFloat32;
    case DType::BFloat16: return ncclBfloat16;
    case DType::Float64: return ncclFloat64;
    case DType::Int32: return ncclInt32;
    case DType::Int64: return ncclInt64;
  }
  XT_ASSERT(false, "unknown dtype");
}

// In-place ncclAllReduce of each tensor (inside the caller's group); the first result.
ncclResult_t issue_all_reduce(const std::vector<Tensor>& tensors, ReduceOp op, ncclComm_t comm, void* stream) {
  const ncclRedOp_t nop = op == ReduceOp::Avg ? ncclAvg : ncclSum;
  ncclResult_t res = ncclSuccess;
  for (const Tensor& t : tensors) {
    if (is_error(res)) break;
    if (t.numel() == 0) continue;
    res = ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), nccl_dtype(t.dtype()), nop, comm,
                        static_cast<cudaStream_t>(stream));
  }
  return res;
}

}  // namespace

struct Communicator::Rank {
  struct Pending {
    cudaEvent_t event;       // recorded on the rank's stream right after the collective
    Clock::time_point queued;
    const char* op;
    uint64_t seq;
  };
  int index = 0;
  int device = 0;
  ncclComm_t comm = nullptr;  // null once aborted or closed
  std::mutex mu;
  std::mutex pending_mu;
  std::deque<Pending> pending;     // oldest first
  std::vector<cudaEvent_t> spare;  // completed events, reused
  uint64_t seq = 0;                // collectives queued so far (named in messages)
  // all_reduce_async: the side stream, its fork/join events, and the tensors it is reducing
  // (kept alive until wait_async has ordered the rank's stream after them). Guarded by mu.
  cudaStream_t side = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  std::vector<Tensor> in_flight;
};

ReduceOp parse_reduce_op(const std::string& name) {
  if (name == "avg") return ReduceOp::Avg;
  if (name == "sum") return ReduceOp::Sum;
  throw ValueError(str("all_reduce: op must be \"avg\" or \"sum\", got \"", name, "\""));
}

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  return str(v / 10000, ".", (v / 100) % 100, ".", v % 100);  // 2.9+ encoding
}

// ---------------------------------------------------------------- creation and teardown

std::string unique_id() {
  ncclUniqueId id;
  const ncclResult_t res = ncclGetUniqueId(&id);
  XT_CHECK(res == ncclSuccess, RuntimeError, "ncclGetUniqueId failed: ", ncclGetErrorString(res), ": ",
           ncclGetLastError(nullptr));
  return std::string(id.internal, sizeof(id.internal));
}

Communicator::Communicator(const std::vector<int>& devices, double timeout_s)
    : devices_(devices), world_size_(static_cast<int>(devices.size())), timeout_s_(timeout_s) {
  XT_CHECK(!devices.empty(), ValueError, "Communicator: devices is empty");
  XT_CHECK(timeout_s > 0, ValueError, "Communicator: timeout must be > 0 seconds, got ", timeout_s);
  std::set<int> seen;
  for (int d : devices) {
    cuda::check_device(d);
    XT_CHECK(seen.insert(d).second, ValueError, "Communicator: cuda:", d,
             " appears twice in devices; NCCL takes one rank per device");
  }
  ncclUniqueId id;
  const ncclResult_t id_res = ncclGetUniqueId(&id);
  XT_CHECK(id_res == ncclSuccess, RuntimeError, "ncclGetUniqueId failed: ", ncclGetErrorString(id_res), ": ",
           ncclGetLastError(nullptr));
  start(&id);
  wait_ready();
}

Communicator::Communicator(int device, int world_size, int rank, const std::string& unique_id, double timeout_s)
    : devices_{device}, world_size_(world_size), first_rank_(rank), timeout_s_(timeout_s) {
  XT_CHECK(world_size >= 1, ValueError, "Communicator: world_size must be >= 1, got ", world_size);
  XT_CHECK(rank >= 0 && rank < world_size, ValueError, "Communicator: rank ", rank, " is out of range for ",
           world_size, " rank(s)");
  XT_CHECK(timeout_s > 0, ValueError, "Communicator: timeout must be > 0 seconds, got ", timeout_s);
  ncclUniqueId id;
  XT_CHECK(unique_id.size() == sizeof(id.internal), ValueError, "Communicator: unique_id has ", unique_id.size(),
           " bytes; an NCCL unique id has ", sizeof(id.internal), " (xtrain._C.dist.unique_id() on rank 0)");
  cuda::check_device(device);
  std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  start(&id);
}

void Communicator::start(const void* nccl_id) {
  const ncclUniqueId& id = *static_cast<const ncclUniqueId*>(nccl_id);
  const int n = local_size();
  for (int i = 0; i < n; ++i) {
    ranks_.push_back(std::make_unique<Rank>());
    ranks_.back()->index = first_rank_ + i;
    ranks_.back()->device = devices_[i];
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  std::vector<ncclComm_t> comms(n, nullptr);
  // The local ranks are initialised from this thread, so the inits must share one group; each
  // binds its rank to the device current at the call.
  ncclResult_t res = ncclGroupStart();
  for (int i = 0; i < n && !is_error(res); ++i) {
    cuda::DeviceGuard guard(devices_[i]);
    res = ncclCommInitRankConfig(&comms[i], world_size_, id, first_rank_ + i, &config);
  }
  const ncclResult_t end = ncclGroupEnd();
  if (is_error(res) || is_error(end)) {
    const std::string err = str("NCCL communicator creation failed: ", ncclGetErrorString(is_error(res) ? res : end),
                                ": ", ncclGetLastError(nullptr));
    for (ncclComm_t c : comms)
      if (c) ncclCommAbort(c);
    throw RuntimeError(err);
  }
  for (int i = 0; i < n; ++i) ranks_[i]->comm = comms[i];
}

void Communicator::wait_ready() {
  if (ready_.load()) return;
  // Non-blocking: the ranks connect in the background; poll until each one is ready. The rank's
  // lock is held per poll only, so abort() (another thread) gets in between and ends the wait.
  const auto start = Clock::now();
  std::string err;
  for (size_t i = 0; i < ranks_.size() && err.empty(); ++i) {
    Rank& r = *ranks_[i];
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(r.mu);
        if (aborted_.load() || !r.comm) {
          err = str("NCCL communicator creation on rank ", r.index, " (cuda:", r.device, ") was aborted: ", error());
          break;
        }
        ncclResult_t st = ncclInProgress;
        const ncclResult_t q = ncclCommGetAsyncError(r.comm, &st);
        if (is_error(q) || is_error(st)) {
          err = str("NCCL communicator creation failed on rank ", r.index, " (cuda:", r.device, "): ",
                    ncclGetErrorString(is_error(q) ? q : st), ": ", ncclGetLastError(r.comm));
          break;
        }
        if (st == ncclSuccess) break;
      }
      if (seconds_since(start) > timeout_s_) {
        err = str("NCCL communicator creation did not finish within ", timeout_s_, " s (rank ", r.index,
                  ", cuda:", r.device, " of ", world_size_, ")");
        break;
      }
      std::this_thread::sleep_for(kPollSleep);
    }
  }
  if (!err.empty()) {
    abort(err);  // keeps the first reason when it was an abort
    throw RuntimeError(err);
  }
  ready_.store(true);
  watchdog_ = std::thread(&Communicator::watchdog, this);
}

Communicator::~Communicator() {
  try {
    close();
  } catch (...) {
    // Destructors must not throw; close() only raises for CUDA failures at process teardown.
  }
}

void Communicator::close() {
  if (closed_.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(watchdog_mu_);
    watchdog_stop_ = true;
  }
  watchdog_cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();

  if (!ready_.load()) {  // never connected (creation failed or was given up): nothing to flush
    abort("closed before the communicator was ready");
    destroy_events();
    return;
  }
  std::string err;
  if (!aborted_.load()) {
    // Sync point: outstanding collectives first (they end in time or the timeout names them).
    for (auto& r : ranks_) {
      for (;;) {
        bool done = false;
        err = poll_pending(*r, &done);
        if (!err.empty() || done) break;
        std::this_thread::sleep_for(kPollSleep);
      }
      if (!err.empty()) break;
    }
  }
  if (!aborted_.load() && err.empty()) {
    // Finalize every rank (non-blocking: each call returns at once), then wait for all of them.
    for (auto& r : ranks_) {
      std::lock_guard<std::mutex> lock(r->mu);
      const ncclResult_t res = r->comm ? ncclCommFinalize(r->comm) : ncclSuccess;
      if (is_error(res)) {
        err = nccl_failure(*r, res, "ncclCommFinalize");
        break;
      }
    }
    const auto start = Clock::now();
    for (size_t i = 0; i < ranks_.size() && err.empty(); ++i) {
      Rank& r = *ranks_[i];
      std::lock_guard<std::mutex> lock(r.mu);
      while (r.comm && err.empty()) {
        ncclResult_t st = ncclInProgress;
        const ncclResult_t q = ncclCommGetAsyncError(r.comm, &st);
        if (is_error(q) || is_error(st)) err = nccl_failure(r, is_error(q) ? q : st, "ncclCommFinalize");
        else if (st == ncclSuccess) break;
        else if (seconds_since(start) > timeout_s_)
          err = str("closing the communicator: rank ", r.index, " did not finalize within ", timeout_s_, " s");
        else std::this_thread::sleep_for(kPollSleep);
      }
    }
    if (err.empty()) {
      for (auto& r : ranks_) {
        std::lock_guard<std::mutex> lock(r->mu);
        if (r->comm) ncclCommDestroy(r->comm);
        r->comm = nullptr;
      }
    }
  }
  if (!err.empty()) abort(err);
  destroy_events();
  if (!err.empty()) throw RuntimeError(err);
}

void Communicator::destroy_events() {
  for (auto& r : ranks_) {
    {
      std::lock_guard<std::mutex> lock(r->mu);
      if (r->side) {
        cudaSetDevice(r->device);
        cudaStreamSynchronize(r->side);  // done or aborted by now; the tensors may then go
        cudaStreamDestroy(r->side);
        cudaEventDestroy(r->fork);
        cudaEventDestroy(r->join);
        r->side = nullptr;
      }
      r->in_flight.clear();
    }
    std::lock_guard<std::mutex> lock(r->pending_mu);
    for (auto& p : r->pending) cudaEventDestroy(p.event);
    for (cudaEvent_t e : r->spare) cudaEventDestroy(e);
    r->pending.clear();
    r->spare.clear();
  }
  cudaGetLastError();  // errors here only happen at process teardown
}

// ---------------------------------------------------------------- failure

void Communicator::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(error_mu_);
    if (!aborted_.load()) {
      error_ = reason.empty() ? std::string("aborted by the caller") : reason;
      aborted_.store(true);  // set before taking the rank locks: waits holding them give up
    }
  }
  for (auto& r : ranks_) {
    std::lock_guard<std::mutex> lock(r->mu);
    if (r->comm) {
      // Sets the abort flag NCCL's kernels poll, so kernels waiting for a peer exit, then frees.
      ncclCommAbort(r->comm);
      r->comm = nullptr;
    }
  }
}

std::string Communicator::error() const {
  std::lock_guard<std::mutex> lock(error_mu_);
  return error_;
}

void Communicator::fail(const std::string& reason) {
  abort(reason);
  throw RuntimeError(reason);
}

std::string Communicator::nccl_failure(const Rank& r, int result, const char* op) const {
  const ncclResult_t res = static_cast<ncclResult_t>(result);
  const char* last = ncclGetLastError(r.comm);
  return str("NCCL ", op, " failed on rank ", r.index, " (cuda:", r.device, "): ", ncclGetErrorString(res),
             last && *last ? str(": ", last) : std::string());
}

std::string Communicator::check_usable(const Rank& r, const char* op) const {
  if (closed_.load()) return str(op, " on rank ", r.index, ": the communicator is closed");
  if (aborted_.load() || !r.comm)
    return str(op, " on rank ", r.index, " (cuda:", r.device, "): the communicator was aborted: ", error());
  return "";
}

// ---------------------------------------------------------------- collectives

Communicator::Rank& Communicator::rank_at(int rank, const char* op) {
  XT_CHECK(rank >= 0 && rank < world_size(), IndexError, op, ": rank ", rank, " is out of range for ",
           world_size(), " rank(s)");
  XT_CHECK(is_local(rank), IndexError, op, ": rank ", rank, " belongs to another process (this one drives rank",
           local_size() > 1 ? "s " : " ", first_rank_, local_size() > 1 ? str("-", first_rank_ + local_size() - 1) : "",
           ")");
  XT_CHECK(ready_.load(), RuntimeError, op, ": the communicator is not ready (call wait_ready() first)");
  return *ranks_[static_cast<size_t>(rank - first_rank_)];
}

void Communicator::check_tensors(const Rank& r, const std::vector<Tensor>& tensors, const char* op,
                                 bool floating) {
  const Device dev = Device::cuda(r.device);
  std::set<const void*> seen;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    XT_CHECK(t.defined(), ValueError, op, ": tensors[", i, "] is undefined");
    XT_CHECK(t.device() == dev, ValueError, op, " on rank ", r.index, ": tensors[", i, "] is ", t.describe(),
             ", but rank ", r.index, " drives cuda:", r.device);
    if (floating) {
      XT_CHECK(t.dtype() == DType::Float32 || t.dtype() == DType::BFloat16, TypeError, op, ": tensors[", i,
               "] is ", t.describe(), "; only float32 and bfloat16 are reduced");
    }
    if (t.numel() > 0) {
      XT_CHECK(seen.insert(t.data_ptr()).second, ValueError, op, ": tensors[", i,
               "] shares its memory with an earlier tensor of the list (each may appear once)");
    }
  }
  for (const Tensor& t : tensors) t.bump_version();  // the collective writes them in place
}

std::string Communicator::wait_host_progress(Rank& r, const char* op) {
  const auto start = Clock::now();
  for (;;) {
    ncclResult_t st = ncclInProgress;
    const ncclResult_t q = ncclCommGetAsyncError(r.comm, &st);
    if (is_error(q) || is_error(st)) return nccl_failure(r, is_error(q) ? q : st, op);
    if (st == ncclSuccess) return "";
    if (aborted_.load()) return check_usable(r, op);
    if (seconds_since(start) > timeout_s_)
      return str(op, " on rank ", r.index, " (cuda:", r.device, "): NCCL did not finish queuing it within ",
                 timeout_s_, " s");
    std::this_thread::sleep_for(kPollSleep);
  }
}

void Communicator::track(Rank& r, void* stream, const char* op) {
  // A collective queued into a CUDA graph capture runs at each replay, not now: an event recorded
  // here would be part of the capture and cannot be queried. The caller tracks each replay instead
  // (note_replay).
  if (cuda::capturing()) return;
  cudaEvent_t ev = nullptr;
  {
    std::lock_guard<std::mutex> lock(r.pending_mu);
    if (!r.spare.empty()) {
      ev = r.spare.back();
      r.spare.pop_back();
    }
  }
  if (!ev) XT_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  const cudaError_t rec = cudaEventRecord(ev, static_cast<cudaStream_t>(stream));
  std::lock_guard<std::mutex> lock(r.pending_mu);
  if (rec != cudaSuccess) {
    r.spare.push_back(ev);
    cuda::throw_cuda_error(rec, "cudaEventRecord", __FILE__, __LINE__);
  }
  r.pending.push_back({ev, Clock::now(), op, ++r.seq});
}

std::string Communicator::poll_pending(Rank& r, bool* done) {
  std::lock_guard<std::mutex> lock(r.pending_mu);
  while (!r.pending.empty()) {
    const Rank::Pending& p = r.pending.front();
    const cudaError_t q = cudaEventQuery(p.event);
    if (q == cudaSuccess) {
      r.spare.push_back(p.event);
      r.pending.pop_front();
      continue;
    }
    if (q != cudaErrorNotReady) {
      cudaGetLastError();
      return str(p.op, " #", p.seq, " of rank ", r.index, " (cuda:", r.device, "): CUDA error while it ran: ",
                 cudaGetErrorName(q), ": ", cudaGetErrorString(q));
    }
    const double age = seconds_since(p.queued);
    if (age > timeout_s_) {
      return str(p.op, " #", p.seq, " of rank ", r.index, " (cuda:", r.device, ") has not completed ",
                 static_cast<int64_t>(age), " s after it was queued (timeout ", timeout_s_,
                 " s): a rank stopped early or the ranks issued different collectives");
    }
    break;
  }
  if (done) *done = r.pending.empty();
  return "";
}

void Communicator::all_reduce(int rank, const std::vector<Tensor>& tensors, ReduceOp op) {
  Rank& r = rank_at(rank, "all_reduce");
  check_tensors(r, tensors, "all_reduce", /*floating=*/true);
  const Device dev = Device::cuda(r.device);

  // Plan: large tensors in place; small ones packed per dtype (a lone one stays in place).
  std::vector<Tensor> in_place;
  std::map<DType, std::vector<Tensor>> small;
  for (const Tensor& t : tensors) {
    if (t.numel() == 0) continue;
    if (t.nbytes() >= kInPlaceBytes) in_place.push_back(t);
    else small[t.dtype()].push_back(t);
  }
  std::vector<std::pair<Tensor, std::vector<Tensor>>> buckets;  // (flat buffer, its tensors)
  for (auto& [dtype, list] : small) {
    if (list.size() == 1) {
      in_place.push_back(list[0]);
      continue;
    }
    int64_t total = 0;
    for (const Tensor& t : list) total += t.numel();
    Tensor flat = Tensor::empty({total}, dtype, dev);  // this rank's stream: reuse is ordered
    char* p = flat.data<char>();
    for (const Tensor& t : list) {
      cuda::copy_bytes(p, dev, t.data_ptr(), dev, t.nbytes());
      p += t.nbytes();
    }
    buckets.emplace_back(std::move(flat), std::move(list));
  }
  if (in_place.empty() && buckets.empty()) return;

  for (const auto& b : buckets) in_place.push_back(b.first);
  run_group(r, "all_reduce", [&] { return issue_all_reduce(in_place, op, r.comm, cuda::current_stream(r.device)); });

  for (const auto& [flat, list] : buckets) {
    const char* p = flat.data<char>();
    for (const Tensor& t : list) {
      cuda::copy_bytes(t.data_ptr(), dev, p, dev, t.nbytes());
      p += t.nbytes();
    }
  }
}

std::string Communicator::launch_group(Rank& r, void* stream, const char* name, const std::function<int()>& issue) {
  cuda::DeviceGuard guard(r.device);
  ncclResult_t res = ncclGroupStart();
  if (!is_error(res)) res = static_cast<ncclResult_t>(issue());
  const ncclResult_t end = ncclGroupEnd();  // always closes the group, even after an error
  std::string err;
  if (is_error(res) || is_error(end)) err = nccl_failure(r, is_error(res) ? res : end, name);
  else err = wait_host_progress(r, name);
  if (err.empty()) track(r, stream, name);
  return err;
}

void Communicator::run_group(Rank& r, const char* name, const std::function<int()>& issue) {
  void* stream = cuda::current_stream(r.device);
  std::string err;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    err = check_usable(r, name);
    if (err.empty()) err = launch_group(r, stream, name, issue);
  }
  if (!err.empty()) fail(err);
}

void Communicator::all_reduce_async(int rank, const std::vector<Tensor>& tensors, ReduceOp op) {
  Rank& r = rank_at(rank, "all_reduce_async");
  check_tensors(r, tensors, "all_reduce_async", /*floating=*/true);
  std::vector<Tensor> list;
  for (const Tensor& t : tensors)
    if (t.numel() > 0) list.push_back(t);
  if (list.empty()) return;
  std::string err;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    err = check_usable(r, "all_reduce_async");
    if (err.empty()) {
      cuda::DeviceGuard guard(r.device);
      if (!r.side) {
        XT_CUDA_CHECK(cudaStreamCreateWithFlags(&r.side, cudaStreamNonBlocking));
        XT_CUDA_CHECK(cudaEventCreateWithFlags(&r.fork, cudaEventDisableTiming));
        XT_CUDA_CHECK(cudaEventCreateWithFlags(&r.join, cudaEventDisableTiming));
      }
      // The side stream starts where the rank's stream is now: after the kernels that wrote them.
      XT_CUDA_CHECK(cudaEventRecord(r.fork, static_cast<cudaStream_t>(cuda::current_stream(r.device))));
      XT_CUDA_CHECK(cudaStreamWaitEvent(r.side, r.fork, 0));
      err = launch_group(r, r.side, "all_reduce_async", [&] { return issue_all_reduce(list, op, r.comm, r.side); });
      if (err.empty()) r.in_flight.insert(r.in_flight.end(), list.begin(), list.end());
    }
  }
  if (!err.empty()) fail(err);
}

void Communicator::wait_async(int rank) {
  Rank& r = rank_at(rank, "wait_async");
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.side || r.in_flight.empty()) return;
  cuda::DeviceGuard guard(r.device);
  XT_CUDA_CHECK(cudaEventRecord(r.join, r.side));
  XT_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(cuda::current_stream(r.device)), r.join, 0));
  // Safe to let go: whatever reuses their memory next runs on the rank's stream, after the join.
  r.in_flight.clear();
}

namespace {
// Elements per rank of each flat tensor of a chunked collective (reduce-scatter, all-gather).
std::vector<size_t> chunk_sizes(const std::vector<Tensor>& flats, int64_t world, const char* op) {
  std::vector<size_t> out;
  for (size_t i = 0; i < flats.size(); ++i) {
    XT_CHECK(flats[i].numel() % world == 0, ValueError, op, ": flats[", i, "] ", flats[i].describe(), " has ",
             flats[i].numel(), " elements, not a multiple of the ", world, " ranks");
    out.push_back(static_cast<size_t>(flats[i].numel() / world));
  }
  return out;
}
}  // namespace

void Communicator::reduce_scatter(int rank, const std::vector<Tensor>& flats, ReduceOp op,
                                  const std::vector<Tensor>& extra) {
  Rank& r = rank_at(rank, "reduce_scatter");
  std::vector<Tensor> all(flats);
  all.insert(all.end(), extra.begin(), extra.end());
  check_tensors(r, all, "reduce_scatter", /*floating=*/true);
  const std::vector<size_t> chunks = chunk_sizes(flats, world_size(), "reduce_scatter");
  run_group(r, "reduce_scatter", [&] {
    const auto s = static_cast<cudaStream_t>(cuda::current_stream(r.device));
    ncclResult_t res = ncclSuccess;
    for (size_t i = 0; i < flats.size() && !is_error(res); ++i) {
      if (chunks[i] == 0) continue;
      char* base = flats[i].data<char>();
      res = ncclReduceScatter(base, base + rank * chunks[i] * flats[i].itemsize(), chunks[i],
                              nccl_dtype(flats[i].dtype()), op == ReduceOp::Avg ? ncclAvg : ncclSum, r.comm, s);
    }
    return is_error(res) ? res : issue_all_reduce(extra, op, r.comm, s);
  });
}

void Communicator::all_gather(int rank, const std::vector<Tensor>& flats) {
  Rank& r = rank_at(rank, "all_gather");
  check_tensors(r, flats, "all_gather", /*floating=*/false);
  const std::vector<size_t> chunks = chunk_sizes(flats, world_size(), "all_gather");
  run_group(r, "all_gather", [&] {
    ncclResult_t res = ncclSuccess;
    for (size_t i = 0; i < flats.size() && !is_error(res); ++i) {
      const size_t bytes = chunks[i] * flats[i].itemsize();
      if (bytes == 0) continue;
      char* base = flats[i].data<char>();
      res = ncclAllGather(base + rank * bytes, base, bytes, ncclUint8, r.comm,
                          static_cast<cudaStream_t>(cuda::current_stream(r.device)));  // bytes: any dtype
    }
    return res;
  });
}

void Communicator::broadcast(int rank, const std::vector<Tensor>& tensors, int root) {
  Rank& r = rank_at(rank, "broadcast");
  XT_CHECK(root >= 0 && root < world_size(), ValueError, "broadcast: root ", root, " is out of range for ",
           world_size(), " rank(s)");
  check_tensors(r, tensors, "broadcast", /*floating=*/false);
  run_group(r, "broadcast", [&] {
    ncclResult_t res = ncclSuccess;
    for (const Tensor& t : tensors) {
      if (is_error(res) || t.numel() == 0) continue;
      res = ncclBroadcast(t.data_ptr(), t.data_ptr(), t.nbytes(), ncclUint8, root, r.comm,
                          static_cast<cudaStream_t>(cuda::current_stream(r.device)));  // bytes: any dtype
    }
    return res;
  });
}

void Communicator::note_replay(int rank) {
  Rank& r = rank_at(rank, "note_replay");
  cuda::check_not_capturing("Communicator.note_replay");
  std::string err;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    err = check_usable(r, "a replayed graph's collectives");
    if (err.empty()) {
      cuda::DeviceGuard guard(r.device);
      track(r, cuda::current_stream(r.device), "a replayed graph's collectives");
    }
  }
  if (!err.empty()) fail(err);
}

void Communicator::barrier(int rank) {
  cuda::check_not_capturing("Communicator.barrier (a sync point)");
  Rank& r = rank_at(rank, "barrier");
  const Device dev = Device::cuda(r.device);
  Tensor token = Tensor::empty({1}, DType::Float32, dev);
  cuda::memset_zero(token.data_ptr(), dev, token.nbytes());
  all_reduce(rank, {token}, ReduceOp::Sum);
  // Sync point: poll until this rank's collectives are done (the watchdog enforces the timeout
  // too; polling here makes the barrier raise at once when another thread aborts).
  for (;;) {
    bool done = false;
    std::string err = poll_pending(r, &done);
    if (err.empty() && done) return;
    if (err.empty() && aborted_.load()) err = check_usable(r, "barrier");
    if (!err.empty()) fail(err);
    std::this_thread::sleep_for(kPollSleep);
  }
}

// ---------------------------------------------------------------- watchdog

std::string Communicator::watchdog_check(Rank& r) {
  {
    std::unique_lock<std::mutex> lock(r.mu, std::try_to_lock);  // never wait on a busy rank
    if (lock.owns_lock() && r.comm) {
      ncclResult_t st = ncclSuccess;
      const ncclResult_t q = ncclCommGetAsyncError(r.comm, &st);
      if (is_error(q) || is_error(st)) return nccl_failure(r, is_error(q) ? q : st, "asynchronous operation");
    }
  }
  return poll_pending(r, nullptr);
}

void Communicator::watchdog() {
  std::unique_lock<std::mutex> lock(watchdog_mu_);
  while (!watchdog_stop_) {
    watchdog_cv_.wait_for(lock, kWatchdogPeriod);
    if (watchdog_stop_ || aborted_.load()) continue;
    lock.unlock();
    std::string reason;
    for (auto& r : ranks_) {
      // This thread's own current device: events are queried in their device's context.
      if (cudaSetDevice(r->device) != cudaSuccess) cudaGetLastError();
      reason = watchdog_check(*r);
      if (!reason.empty()) break;
    }
    if (!reason.empty()) abort(reason);
    lock.lock();
  }
}

}  // namespace dist
}  // namespace xt
