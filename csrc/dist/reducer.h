// GradReducer: averages a rank's parameter gradients over the ranks WHILE backward runs.
//
// The tape calls a thread-local hook the moment a leaf's gradient is final (tape/engine.h). The
// reducer groups the parameters, at construction, into buckets of about `bucket_bytes` in reverse
// order of the parameter list (backward finishes the last layers first) and, as soon as every
// gradient of the next bucket is final, queues that bucket's in-place all-reduce on the rank's
// side stream (Communicator::all_reduce_async): it overlaps the backward of the layers before it.
// Buckets launch strictly in index order, so every rank issues the same collectives in the same
// order whatever the timing. Parameters under kInPlaceBytes (norm weights) and the `extra`
// tensors (the step's loss) are reduced by finish(), packed into one launch on the rank's stream
// after the side stream has been joined. The values equal Communicator::all_reduce of every
// gradient at the end: the same element-wise average, only issued earlier.
//
// Use from the rank's thread: arm(); loss.backward(); finish(extra). Gradients accumulated over
// several backward calls (micro-batches) need the reducer armed for the last call only.
#pragma once
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"
#include "dist/communicator.h"
#include "tape/engine.h"

namespace xt {
namespace dist {

class GradReducer {
 public:
  GradReducer(std::shared_ptr<Communicator> comm, int rank, std::vector<Tensor> params, size_t bucket_bytes);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Install the gradient-ready hook on this thread (the rank's) and start a new step.
  void arm();
  // Remove the hook (also when backward failed); nothing is launched.
  void disarm();
  // Disarm, launch the buckets not launched yet, join the side stream, then reduce the small
  // gradients and `extra` in one packed launch. Raises ValueError when a parameter has no gradient.
  void finish(const std::vector<Tensor>& extra);

  size_t num_buckets() const { return buckets_.size(); }
  // Buckets launched from inside the last backward (the overlapped ones).
  int launched_during_backward() const { return launched_in_backward_; }

 private:
  void on_ready(const Tensor& leaf);
  void launch(size_t b);
  Tensor grad_of(size_t i) const;

  std::shared_ptr<Communicator> comm_;
  int rank_;
  std::vector<Tensor> params_;
  std::unordered_map<const TensorImpl*, size_t> index_;
  std::vector<std::vector<size_t>> buckets_;  // large parameters, in expected ready order
  std::vector<int> bucket_of_;                // -1: small, reduced by finish()
  std::vector<size_t> small_;
  std::vector<int> missing_;                  // per bucket: gradients not final yet
  std::vector<char> ready_;
  size_t next_ = 0;                           // the next bucket to launch
  int launched_in_backward_ = 0;
  bool armed_ = false;
  GradReadyHook prev_;
};

}  // namespace dist
}  // namespace xt
