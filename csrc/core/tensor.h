// Tensor: a handle to a contiguous, row-major block of typed elements on one device.
//
// Storage is shared by views (reshape/view/detach share it; transpose/permute copy), and so is
// its version counter: every in-place write through the engine bumps it. The
// autograd fields live here as plain pointers so core knows nothing of the tape: grad_fn is
// the tape Node that produced this tensor (null for leaves), grad is accumulated into leaves
// with += by the engine (csrc/tape/engine.cpp).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/dtype.h"

namespace xt {

class Node;  // csrc/tape/node.h
using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[2, 3]"
int64_t shape_numel(const Shape& s);

// Bytes on a device: from the caching allocator, or borrowed from another library (DLPack),
// in which case `external_release` gives them back.
struct Storage {
  Block block;
  std::function<void()> external_release;
  Storage(Block b) : block(b) {}
  Storage(void* ptr, size_t nbytes, Device device, std::function<void()> release);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return block.ptr; }
  size_t nbytes() const { return block.requested; }

  // How many in-place writes the engine has made to these bytes (PyTorch's version counter):
  // fill_/zero_/copy_/accumulate_, the optimizer steps, NCCL collectives and the like bump it,
  // results written out of place do not. The tape compares it with the value a Node saw when it
  // saved a tensor of this storage (tape/node.h, SavedTensor). Writes from outside the engine
  // (a DLPack producer or consumer, a numpy array sharing CPU memory) are not counted.
  uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  void bump_version() { version_.fetch_add(1, std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> version_{0};
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset_bytes = 0;
  Shape shape;
  DType dtype = DType::Float32;
  Device device;
  // autograd
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<Node> grad_fn;
  uint32_t output_nr = 0;
  std::weak_ptr<Node> grad_accumulator;  // the AccumulateGrad node of a leaf, shared by all uses
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // Uninitialised tensor from the caching allocator (on this thread's stream for CUDA).
  static Tensor empty(const Shape& shape, DType dtype, Device device);
  // Wrap memory owned elsewhere; `release` runs when the last view dies.
  static Tensor from_external(void* data, const Shape& shape, DType dtype, Device device,
                              std::function<void()> release);

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl_->shape; }
  int64_t dim() const { return static_cast<int64_t>(impl_->shape.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return shape_numel(impl_->shape); }
  DType dtype() const { return impl_->dtype; }
  Device device() const { return impl_->device; }
  size_t itemsize() const { return dtype_size(impl_->dtype); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * itemsize(); }
  void* data_ptr() const { return static_cast<char*>(impl_->storage->data()) + impl_->offset_bytes; }
  template <typename T> T* data() const { return static_cast<T*>(data_ptr()); }
  const std::shared_ptr<Storage>& storage() const { return impl_->storage; }
  uint64_t version() const { return impl_->storage->version(); }  // the storage's (shared by views)
  void bump_version() const { impl_->storage->bump_version(); }    // after an in-place write
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& o) const { return impl_ == o.impl_; }
  std::string describe() const;  // "float32[2, 3] on cpu"

  // Views without autograd (the tape's reshape/detach wrap these).
  Tensor detach() const;                   // same storage, no history, requires_grad false
  Tensor view_as_shape(const Shape& shape) const;  // same storage; numel must match
  // A view of `shape` starting `offset` elements after this tensor's first element, inside its
  // storage (bounds-checked): how flat buffers hand out per-tensor and per-shard views.
  Tensor storage_view(int64_t offset, const Shape& shape) const;

  // Autograd fields (read and set by the tape).
  bool requires_grad() const { return impl_->requires_grad; }
  void set_requires_grad(bool r);
  Tensor grad() const { return Tensor(impl_->grad); }
  void set_grad(const Tensor& g) { impl_->grad = g.impl_; }
  const std::shared_ptr<Node>& grad_fn() const { return impl_->grad_fn; }
  bool is_leaf() const { return impl_->grad_fn == nullptr; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

}  // namespace xt
