// NCCL communicator for data-parallel training: the ranks this process drives, one host thread per
// rank. Two ways to make one:
//  - Thread per GPU: every rank in this process (Communicator(devices, timeout)); the constructor
//    creates all of them from one thread (ncclCommInitRankConfig for every device inside one
//    ncclGroupStart/End) and returns when they are connected.
//  - Process per GPU: one rank of a group spread over processes and machines
//    (Communicator(device, world_size, rank, unique_id, timeout)); rank 0 made `unique_id`
//    (unique_id()) and sent it to every process (the Python rendezvous, xtrain.launch.rendezvous). The
//    constructor only starts the connection; wait_ready() waits for it, and abort() from another
//    thread (a peer process died) ends that wait.
// Either way, rank r's collectives are called from rank r's thread with r its global rank, and run
// on that thread's current stream of its device (xt::cuda::current_stream), so they are ordered
// with the rank's own kernels and the host never waits for them (barrier() excepted).
//  - Communicators are non-blocking (ncclConfig_t.blocking = 0): no NCCL call blocks the host;
//    host-side progress (ncclInProgress) is polled against the timeout.
//  - Failure never hangs. A watchdog thread follows each local rank's outstanding collectives (a
//    CUDA event recorded after each) and NCCL's asynchronous error state; a collective still
//    running after `timeout_s`, or an NCCL error, aborts the communicator. abort() does the same
//    from any thread (the Python launcher calls it when one rank raises, the process rendezvous
//    when another process failed). Abort runs ncclCommAbort on every local rank, which makes NCCL
//    kernels still waiting for a peer exit, so a thread blocked on its stream returns; every later
//    call raises RuntimeError carrying the first reason. Ranks in other processes are not reached
//    by it: their own process aborts when its rendezvous connection reports the failure.
//  - all_reduce over a list is one NCCL launch: tensors of kInPlaceBytes or more are reduced in
//    place, smaller ones are packed into one flat buffer per dtype (from the caching allocator,
//    on the rank's stream) and reduced there, all inside one ncclGroupStart/End.
// This header does not include nccl.h: builds without NCCL never compile communicator.cpp.
#pragma once
#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/tensor.h"

namespace xt {
namespace dist {

enum class ReduceOp { Sum, Avg };
ReduceOp parse_reduce_op(const std::string& name);  // "sum" | "avg"; ValueError otherwise

// Tensors at least this large are reduced where they lie; smaller ones are packed first. 1 MiB
// is where a separate NCCL collective stops being latency-bound on NVLink, while the packing
// copies of everything below it are a few MB per step at most.
constexpr size_t kInPlaceBytes = size_t(1) << 20;

std::string nccl_version();  // "2.27.3": the NCCL the process runs with
// A new NCCL unique id (ncclGetUniqueId), as its raw bytes: rank 0 of a process group makes it and
// every process passes it to its Communicator. Making it starts NCCL's bootstrap listener here.
std::string unique_id();

class Communicator {
 public:
  // One rank per entry of `devices` (rank i drives cuda:devices[i]); distinct, visible devices.
  // A collective that has not completed `timeout_s` seconds after it was queued aborts everything.
  Communicator(const std::vector<int>& devices, double timeout_s);
  // Rank `rank` of `world_size`, the only one of this process, on cuda:device; `unique_id` is rank
  // 0's unique_id(). Returns once the connection has started: call wait_ready() before anything
  // else.
  Communicator(int device, int world_size, int rank, const std::string& unique_id, double timeout_s);
  ~Communicator();  // close()
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // Sync point: waits until every local rank is connected to its peers; raises RuntimeError when
  // creation fails, takes longer than the timeout, or abort() is called meanwhile. The
  // thread-per-GPU constructor calls it itself; idempotent.
  void wait_ready();
  bool ready() const { return ready_.load(); }

  int world_size() const { return world_size_; }
  // The devices of this process's ranks, in rank order (every rank with threads; one with processes).
  const std::vector<int>& devices() const { return devices_; }
  int first_rank() const { return first_rank_; }  // global rank of devices()[0]
  bool is_local(int rank) const { return rank >= first_rank_ && rank < first_rank_ + local_size(); }
  int device_of(int rank) const { return devices_.at(static_cast<size_t>(rank - first_rank_)); }
  double timeout() const { return timeout_s_; }

  // Collectives of rank `rank`, called from that rank's thread; every rank must make the same
  // calls in the same order with tensors of the same shapes and dtypes. In place, asynchronous.
  // all_reduce: float32 or bfloat16 tensors on the rank's device.
  void all_reduce(int rank, const std::vector<Tensor>& tensors, ReduceOp op);
  // all_reduce_async: the same reduction, every tensor in place (no packing: pass tensors of
  // kInPlaceBytes or more for good bandwidth), on a second stream of the rank that first waits
  // for everything queued so far on the rank's stream. The rank's stream goes on at once: the
  // reduction overlaps whatever is queued next (backward of the earlier layers). The tensors must
  // not be read or written until wait_async(); they are kept alive until then.
  void all_reduce_async(int rank, const std::vector<Tensor>& tensors, ReduceOp op);
  // Orders the rank's stream after every all_reduce_async so far (no host wait).
  void wait_async(int rank);
  // reduce_scatter: each of `flats` (float32 or bfloat16, numel a multiple of the world size) in
  // place: rank r's chunk [r*n/W, (r+1)*n/W) becomes the reduction of every rank's chunk r; the
  // other chunks hold unspecified values afterwards. `extra` (small float32/bf16 tensors, the
  // step's loss) are all-reduced with the same op. One launch for all of it.
  void reduce_scatter(int rank, const std::vector<Tensor>& flats, ReduceOp op, const std::vector<Tensor>& extra);
  // all_gather: each of `flats` in place (any dtype, numel a multiple of the world size): chunk r
  // of every rank becomes rank r's chunk r. One launch.
  void all_gather(int rank, const std::vector<Tensor>& flats);
  // broadcast: root's values overwrite every other rank's (any dtype).
  void broadcast(int rank, const std::vector<Tensor>& tensors, int root);
  // Sync point: returns once every rank has reached its barrier and this rank's earlier
  // collectives are done; raises RuntimeError on abort or timeout instead of waiting forever.
  void barrier(int rank);
  // After a replay of a CUDA graph holding this rank's collectives (queued during a capture, where
  // nothing is tracked): the watchdog then times the replay's work on the rank's stream as one.
  void note_replay(int rank);

  // Tear down every rank with ncclCommAbort (any thread; idempotent; the first reason is kept).
  void abort(const std::string& reason);
  bool aborted() const { return aborted_.load(); }
  std::string error() const;  // why it was aborted; "" while it is healthy
  // Orderly teardown once the ranks are done: waits (bounded by the timeout) for outstanding
  // collectives, then ncclCommFinalize + ncclCommDestroy; aborts instead if that does not finish.
  // Idempotent; later calls raise RuntimeError.
  void close();

 private:
  struct Rank;
  int local_size() const { return static_cast<int>(devices_.size()); }
  // Creates ranks_ for devices_ and starts ncclCommInitRankConfig for each inside one group.
  void start(const void* nccl_id);
  Rank& rank_at(int rank, const char* op);
  void check_tensors(const Rank& r, const std::vector<Tensor>& tensors, const char* op, bool floating);
  std::string check_usable(const Rank& r, const char* op) const;  // "" when usable (r.mu held)
  std::string wait_host_progress(Rank& r, const char* op);       // "" when done (r.mu held)
  // `issue` makes NCCL calls (returning the first ncclResult_t, as int) inside one group on rank
  // r's device; then the host-side progress wait and tracking on `stream`. "" or the failure
  // (r.mu held).
  std::string launch_group(Rank& r, void* stream, const char* name, const std::function<int()>& issue);
  // launch_group on the rank's current stream with r.mu taken and usability checked; raises.
  void run_group(Rank& r, const char* name, const std::function<int()>& issue);
  std::string nccl_failure(const Rank& r, int result, const char* op) const;
  void track(Rank& r, void* stream, const char* op);               // r.mu held
  // Retire this rank's completed collectives; a reason to abort if the oldest one is overdue or
  // failed, else "". *done (if given) tells whether none is outstanding.
  std::string poll_pending(Rank& r, bool* done);
  [[noreturn]] void fail(const std::string& reason);               // abort(reason) and throw
  void watchdog();
  std::string watchdog_check(Rank& r);  // a reason to abort, or ""
  void destroy_events();

  std::vector<int> devices_;
  int world_size_ = 0;
  int first_rank_ = 0;
  double timeout_s_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::atomic<bool> ready_{false};
  std::atomic<bool> aborted_{false};
  std::atomic<bool> closed_{false};
  mutable std::mutex error_mu_;
  std::string error_;
  std::mutex watchdog_mu_;
  std::condition_variable watchdog_cv_;
  bool watchdog_stop_ = false;
  std::thread watchdog_;
};

}  // namespace dist
}  // namespace xt
