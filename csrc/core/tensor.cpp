// Tensor construction, views and descriptions.
#include "core/tensor.h"

#include <sstream>

#include "core/cuda_api.h"
#include "core/error.h"

namespace xt {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s)
    XT_CHECK(!__builtin_mul_overflow(n, d, &n), ValueError, "shape ", shape_str(s),
             " has more elements than fit in 64 bits");
  return n;
}

namespace {
// Bytes a tensor of this shape needs; ValueError when a dimension is negative or the size
// does not fit in 63 bits (a product that overflowed would silently allocate too little).
size_t checked_nbytes(const Shape& shape, DType dtype) {
  for (int64_t d : shape) XT_CHECK(d >= 0, ValueError, "negative dimension in shape ", shape_str(shape));
  const int64_t n = shape_numel(shape);
  int64_t bytes = 0;
  XT_CHECK(!__builtin_mul_overflow(n, static_cast<int64_t>(dtype_size(dtype)), &bytes), ValueError, "shape ",
           shape_str(shape), " of ", dtype_name(dtype), " needs more bytes than fit in 64 bits");
  return static_cast<size_t>(bytes);
}
}  // namespace

Storage::Storage(void* ptr, size_t nbytes, Device device, std::function<void()> release)
    : external_release(std::move(release)) {
  block.ptr = ptr;
  block.size = nbytes;
  block.requested = nbytes;
  block.device = device;
}

Storage::~Storage() {
  if (external_release) external_release();
  else if (block.ptr) Allocator::get().free(block);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  const size_t nbytes = checked_nbytes(shape, dtype);
  auto impl = std::make_shared<TensorImpl>();
  void* stream = device.is_cuda() ? cuda::current_stream(device.index) : nullptr;
  impl->storage = std::make_shared<Storage>(Allocator::get().allocate(device, nbytes, stream));
  impl->shape = shape;
  impl->dtype = dtype;
  impl->device = device;
  return Tensor(std::move(impl));
}

Tensor Tensor::from_external(void* data, const Shape& shape, DType dtype, Device device,
                             std::function<void()> release) {
  const size_t nbytes = checked_nbytes(shape, dtype);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(data, nbytes, device, std::move(release));
  impl->shape = shape;
  impl->dtype = dtype;
  impl->device = device;
  return Tensor(std::move(impl));
}

int64_t Tensor::size(int64_t d) const {
  const int64_t n = dim();
  XT_CHECK(d >= -n && d < n, IndexError, "dimension ", d, " out of range for a tensor of shape ", shape_str(shape()));
  return impl_->shape[d < 0 ? d + n : d];
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined tensor";
  return str(dtype_name(dtype()), shape_str(shape()), " on ", device().str());
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->offset_bytes = impl_->offset_bytes;
  impl->shape = impl_->shape;
  impl->dtype = impl_->dtype;
  impl->device = impl_->device;
  return Tensor(std::move(impl));
}

Tensor Tensor::view_as_shape(const Shape& shape) const {
  XT_CHECK(shape_numel(shape) == numel(), ValueError, "cannot view a tensor of shape ", shape_str(this->shape()),
           " (", numel(), " elements) as shape ", shape_str(shape));
  Tensor t = detach();
  t.impl_->shape = shape;
  return t;
}

Tensor Tensor::storage_view(int64_t offset, const Shape& shape) const {
  for (int64_t d : shape)
    XT_CHECK(d >= 0, ValueError, "storage_view: negative dimension in shape ", shape_str(shape));
  const int64_t begin = impl_->offset_bytes + offset * static_cast<int64_t>(itemsize());
  const int64_t end = begin + shape_numel(shape) * static_cast<int64_t>(itemsize());
  XT_CHECK(offset >= 0 && end <= static_cast<int64_t>(impl_->storage->nbytes()), ValueError, "storage_view: ",
           shape_numel(shape), " elements at offset ", offset, " do not fit in the storage of ", describe(), " (",
           impl_->storage->nbytes(), " bytes from byte ", impl_->offset_bytes, ")");
  Tensor t = detach();
  t.impl_->offset_bytes = begin;
  t.impl_->shape = shape;
  return t;
}

void Tensor::set_requires_grad(bool r) {
  XT_CHECK(!r || is_floating(dtype()), TypeError, "only floating-point tensors can require gradients, got ",
           dtype_name(dtype()));
  XT_CHECK(is_leaf() || r, RuntimeError,
           "requires_grad can only be turned off on a leaf tensor; use detach() for a non-leaf");
  impl_->requires_grad = r;
}

}  // namespace xt
