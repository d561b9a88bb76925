// Creation and copies: empty/full/arange/random, fill_/zero_, copy_, device and dtype conversion
// (to_forward, clone). Nothing here records history; fill_/zero_/copy_ write in place.
#include <cmath>
#include <cstring>

#include "core/cuda_api.h"
#include "core/error.h"
#include "ops/dispatch.h"

namespace xt {
namespace ops {

namespace {

// The writes of fill_ and copy_, without counting them as in-place writes: for tensors the
// caller has just created (full, to_forward), or after fill_/copy_ counted them.
void fill_into(Tensor& t, double value) {
  if (t.numel() == 0) return;
  XT_KERNEL(t.device(), fill, t.dtype(), t.data_ptr(), t.numel(), value, stream_for(t.device()));
}

void copy_into(Tensor& dst, const Tensor& src) {
  if (src.numel() == 0) return;
  if (dst.device() == src.device()) {
    const Device d = dst.device();
    if (dst.dtype() == src.dtype() && d.is_cpu()) {
      std::memcpy(dst.data_ptr(), src.data_ptr(), src.nbytes());
    } else if (dst.dtype() == src.dtype()) {
      cuda::copy_bytes(dst.data_ptr(), d, src.data_ptr(), d, src.nbytes());
    } else {
      XT_KERNEL(d, cast, src.dtype(), src.data_ptr(), dst.dtype(), dst.data_ptr(), src.numel(), stream_for(d));
    }
    return;
  }
  // Across devices: move the bytes in the source dtype, then cast on the destination.
  if (dst.dtype() == src.dtype()) {
    cuda::copy_bytes(dst.data_ptr(), dst.device(), src.data_ptr(), src.device(), src.nbytes());
  } else {
    Tensor staged = Tensor::empty(src.shape(), src.dtype(), dst.device());
    cuda::copy_bytes(staged.data_ptr(), dst.device(), src.data_ptr(), src.device(), src.nbytes());
    copy_into(dst, staged);
  }
}

}  // namespace

Tensor empty(const Shape& shape, DType dtype, Device device) { return Tensor::empty(shape, dtype, device); }

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = Tensor::empty(shape, dtype, device);
  fill_into(t, value);
  return t;
}

void fill_(Tensor& t, double value) {
  check_defined(t, "tensor");
  t.bump_version();
  fill_into(t, value);
}

void zero_(Tensor& t) { fill_(t, 0.0); }

Tensor arange(double start, double end, double step, DType dtype, Device device) {
  XT_CHECK(step != 0, ValueError, "arange: step must be nonzero");
  XT_CHECK(std::isfinite(start) && std::isfinite(end) && std::isfinite(step), ValueError,
           "arange: start, end and step must be finite");
  const double n = std::ceil((end - start) / step);
  const int64_t count = n > 0 ? static_cast<int64_t>(n) : 0;
  Tensor t = Tensor::empty({count}, dtype, device);
  if (count) XT_KERNEL(device, arange, dtype, t.data_ptr(), count, start, step, stream_for(device));
  return t;
}

Tensor random(const Shape& shape, kernels::RandomKind kind, DType dtype, Device device,
              const std::shared_ptr<Generator>& gen) {
  XT_CHECK(is_floating(dtype), TypeError, "random tensors must be floating point, got ", dtype_name(dtype));
  Tensor t = Tensor::empty(shape, dtype, device);
  const int64_t n = t.numel();
  if (n == 0) return t;
  std::shared_ptr<Generator> g = gen ? gen : default_generator(device);
  uint64_t seed = 0;
  const uint64_t offset = g->reserve(static_cast<uint64_t>(n), &seed);
  XT_KERNEL(device, random_fill, kind, dtype, t.data_ptr(), n, seed, offset, stream_for(device));
  return t;
}

void copy_(Tensor& dst, const Tensor& src) {
  check_defined(dst, "dst");
  check_defined(src, "src");
  XT_CHECK(dst.numel() == src.numel(), ValueError, "copy_: dst ", dst.describe(), " and src ", src.describe(),
           " have different sizes");
  dst.bump_version();
  copy_into(dst, src);
}

Tensor to_forward(const Tensor& x, Device device, DType dtype) {
  check_defined(x, "x");
  Tensor out = Tensor::empty(x.shape(), dtype, device);
  copy_into(out, x);
  return out;
}

Tensor clone(const Tensor& x) { return to_forward(x, x.device(), x.dtype()); }

}  // namespace ops
}  // namespace xt
