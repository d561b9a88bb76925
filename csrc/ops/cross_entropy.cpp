// cross_entropy: logits [N, V] (float32/bfloat16/float64), targets int32/int64 [N]; the mean
// loss over non-ignored targets, float32 []. Also returns lse float32 [N] and count float32 [1]
// for the backward, which recomputes the softmax from logits and lse.
//
// Targets outside [0, V) that are not ignore_index raise IndexError. On the CPU the targets are
// scanned in place. On CUDA, index_range finds min/max on the device and one 16-byte copy brings
// them to the host: a sync point, once per forward. Only when that range is not plainly inside
// [0, V) (a bad target, or ignore_index among them) are the targets copied over and scanned.
#include "core/cuda_api.h"
#include "core/error.h"
#include "ops/dispatch.h"

namespace xt {
namespace ops {

namespace {

// targets: host memory.
void scan_targets(const Tensor& targets, int64_t vocab, int64_t ignore_index) {
  const bool i32 = targets.dtype() == DType::Int32;
  for (int64_t i = 0; i < targets.numel(); ++i) {
    const int64_t t = i32 ? static_cast<int64_t>(targets.data<int32_t>()[i]) : targets.data<int64_t>()[i];
    XT_CHECK(t == ignore_index || (t >= 0 && t < vocab), IndexError, "cross_entropy: target ", t, " at position ", i,
             " is out of range for ", vocab, " classes (expected 0 <= target < ", vocab, ", or ignore_index ",
             ignore_index, ")");
  }
}

void check_targets_in_range(const Tensor& targets, int64_t vocab, int64_t ignore_index) {
  if (targets.numel() == 0) return;
  const Device dev = targets.device();
  if (dev.is_cpu()) return scan_targets(targets, vocab, ignore_index);
  Tensor minmax = Tensor::empty({2}, DType::Int64, dev);
  XT_KERNEL(dev, index_range, targets.dtype(), targets.data_ptr(), targets.numel(), minmax.data<int64_t>(),
            stream_for(dev));
  int64_t host[2] = {0, 0};
  cuda::copy_bytes(host, Device::cpu(), minmax.data_ptr(), dev, sizeof(host));  // sync point: waits for the stream
  if (host[0] >= 0 && host[1] < vocab) return;
  scan_targets(to(targets, Device::cpu(), targets.dtype()), vocab, ignore_index);  // sync point (rare path)
}

void check_logits_targets(const Tensor& logits, const Tensor& targets, const char* op) {
  check_floating(logits, op, "logits");
  check_defined(targets, "targets");
  XT_CHECK(is_integral(targets.dtype()), TypeError, op, ": targets must be int32 or int64, got ", targets.describe());
  check_same_device(logits, targets, op, "logits", "targets");
  XT_CHECK(logits.dim() == 2, ValueError, op, ": logits must be [N, V] (2 dimensions), got ", logits.describe());
  XT_CHECK(targets.dim() == 1 && targets.numel() == logits.size(0), ValueError, op, ": targets must be [",
           logits.size(0), "] (one per row of logits), got targets ", targets.describe(), " for logits ",
           logits.describe());
  XT_CHECK(logits.size(1) >= 1, ValueError, op, ": logits must have at least one class, got ", logits.describe());
}

}  // namespace

std::vector<Tensor> cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  check_logits_targets(logits, targets, "cross_entropy");
  const int64_t N = logits.size(0), V = logits.size(1);
  check_targets_in_range(targets, V, ignore_index);
  const Device dev = logits.device();
  Tensor loss = Tensor::empty({}, DType::Float32, dev);
  Tensor lse = Tensor::empty({N}, DType::Float32, dev);
  Tensor count = Tensor::empty({1}, DType::Float32, dev);
  if (N == 0) {  // the mean over no targets is 0 (the contract's max(count, 1))
    zero_(loss);
    zero_(count);
    return {loss, lse, count};
  }
  Tensor losses = Tensor::empty({N}, DType::Float32, dev);
  void* stream = stream_for(dev);
  XT_KERNEL(dev, cross_entropy_forward, logits.dtype(), logits.data_ptr(), targets.dtype(), targets.data_ptr(),
            losses.data<float>(), lse.data<float>(), N, V, ignore_index, stream);
  XT_KERNEL(dev, cross_entropy_reduce, losses.data<float>(), targets.dtype(), targets.data_ptr(), loss.data<float>(),
            count.data<float>(), N, ignore_index, stream);
  return {loss, lse, count};
}

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& lse, const Tensor& targets, const Tensor& dloss,
                              const Tensor& count, int64_t ignore_index) {
  check_logits_targets(logits, targets, "cross_entropy_backward");
  const int64_t N = logits.size(0), V = logits.size(1);
  const Device dev = logits.device();
  check_defined(lse, "lse");
  check_defined(dloss, "dloss");
  check_defined(count, "count");
  XT_CHECK(lse.dtype() == DType::Float32 && lse.numel() == N && lse.device() == dev, ValueError,
           "cross_entropy_backward: lse must be float32 with ", N, " elements on ", dev.str(), ", got ",
           lse.describe());
  XT_CHECK(dloss.dtype() == DType::Float32 && dloss.numel() == 1 && dloss.device() == dev, ValueError,
           "cross_entropy_backward: dloss must be a float32 scalar on ", dev.str(), ", got ", dloss.describe());
  XT_CHECK(count.dtype() == DType::Float32 && count.numel() == 1 && count.device() == dev, ValueError,
           "cross_entropy_backward: count must be a float32 scalar on ", dev.str(), ", got ", count.describe());
  Tensor dlogits = Tensor::empty(logits.shape(), logits.dtype(), dev);
  if (N)
    XT_KERNEL(dev, cross_entropy_backward, logits.dtype(), logits.data_ptr(), lse.data<float>(), targets.dtype(),
              targets.data_ptr(), dloss.data<float>(), count.data<float>(), dlogits.data_ptr(), N, V, ignore_index,
              stream_for(dev));
  return dlogits;
}

}  // namespace ops
}  // namespace xt
