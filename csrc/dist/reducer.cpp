// GradReducer (see reducer.h).
#include "dist/reducer.h"

#include "core/error.h"

namespace xt {
namespace dist {

GradReducer::GradReducer(std::shared_ptr<Communicator> comm, int rank, std::vector<Tensor> params,
                         size_t bucket_bytes)
    : comm_(std::move(comm)), rank_(rank), params_(std::move(params)) {
  XT_CHECK(comm_ != nullptr, ValueError, "GradReducer: no communicator");
  XT_CHECK(rank_ >= 0 && rank_ < comm_->world_size(), IndexError, "GradReducer: rank ", rank_,
           " is out of range for ", comm_->world_size(), " rank(s)");
  XT_CHECK(bucket_bytes > 0, ValueError, "GradReducer: bucket_bytes must be positive");
  bucket_of_.assign(params_.size(), -1);
  size_t fill = 0;
  for (size_t k = params_.size(); k-- > 0;) {  // reverse: backward finishes the last layers first
    const Tensor& p = params_[k];
    XT_CHECK(p.defined() && p.requires_grad() && p.is_leaf(), ValueError, "GradReducer: parameter ", k,
             " must be a leaf tensor that requires grad");
    XT_CHECK(p.dtype() == DType::Float32 || p.dtype() == DType::BFloat16, TypeError, "GradReducer: parameter ", k,
             " is ", p.describe(), "; only float32 and bfloat16 gradients are reduced");
    XT_CHECK(index_.emplace(p.impl(), k).second, ValueError, "GradReducer: parameter ", k,
             " appears twice in the list");
    if (p.nbytes() < kInPlaceBytes) {
      small_.push_back(k);
      continue;
    }
    if (buckets_.empty() || fill >= bucket_bytes) {
      buckets_.emplace_back();
      fill = 0;
    }
    buckets_.back().push_back(k);
    bucket_of_[k] = static_cast<int>(buckets_.size() - 1);
    fill += p.nbytes();
  }
}

GradReducer::~GradReducer() {
  if (armed_) set_grad_ready_hook(std::move(prev_));  // only valid on the arming thread
}

void GradReducer::arm() {
  XT_CHECK(!armed_, RuntimeError, "GradReducer.arm: already armed (call finish() after backward)");
  ready_.assign(params_.size(), 0);
  missing_.clear();
  for (const auto& b : buckets_) missing_.push_back(static_cast<int>(b.size()));
  next_ = 0;
  launched_in_backward_ = 0;
  prev_ = set_grad_ready_hook([this](const Tensor& leaf) { on_ready(leaf); });
  armed_ = true;
}

void GradReducer::disarm() {
  if (!armed_) return;
  set_grad_ready_hook(std::move(prev_));
  prev_ = nullptr;
  armed_ = false;
}

Tensor GradReducer::grad_of(size_t i) const {
  Tensor g = params_[i].grad();
  XT_CHECK(g.defined(), ValueError, "all_reduce_gradients: parameter ", i, " (", params_[i].describe(),
           ") has no gradient on rank ", rank_, "; every rank must reduce the same tensors");
  return g;
}

void GradReducer::launch(size_t b) {
  std::vector<Tensor> grads;
  grads.reserve(buckets_[b].size());
  for (size_t i : buckets_[b]) grads.push_back(grad_of(i));
  comm_->all_reduce_async(rank_, grads, ReduceOp::Avg);
}

void GradReducer::on_ready(const Tensor& leaf) {
  auto it = index_.find(leaf.impl());
  if (it == index_.end()) return;  // not ours (a checkpoint's local leaf, another model)
  const size_t i = it->second;
  if (ready_[i]) return;
  ready_[i] = 1;
  const int b = bucket_of_[i];
  if (b < 0 || --missing_[b] > 0) return;
  while (next_ < buckets_.size() && missing_[next_] == 0) {
    launch(next_++);
    ++launched_in_backward_;
  }
}

void GradReducer::finish(const std::vector<Tensor>& extra) {
  XT_CHECK(armed_, RuntimeError, "GradReducer.finish: not armed (call arm() before backward)");
  disarm();
  while (next_ < buckets_.size()) launch(next_++);
  comm_->wait_async(rank_);
  std::vector<Tensor> rest;
  rest.reserve(small_.size() + extra.size());
  for (size_t i : small_) rest.push_back(grad_of(i));
  rest.insert(rest.end(), extra.begin(), extra.end());
  if (!rest.empty()) comm_->all_reduce(rank_, rest, ReduceOp::Avg);
}

}  // namespace dist
}  // namespace xt
