// DLPack both ways: Tensor.__dlpack__/__dlpack_device__ and xtrain.from_dlpack(obj).
//
// The structs below are the DLPack ABI (v1.0: legacy DLManagedTensor and the versioned
// DLManagedTensorVersioned), declared here because no installed package ships the header.
// Memory is shared, never copied: the exported capsule keeps our storage alive; an imported
// tensor keeps the producer's managed tensor until its last view dies.
#include <cstring>

#include "core/cuda_api.h"
#include "core/error.h"
#include "python/bind.h"

namespace xt {
namespace {

// ---- DLPack ABI
enum DLDeviceType : int32_t { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13 };
enum DLDataTypeCode : uint8_t { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4 };
struct DLDevice { int32_t device_type; int32_t device_id; };
struct DLDataType { uint8_t code; uint8_t bits; uint16_t lanes; };
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
struct DLPackVersion { uint32_t major; uint32_t minor; };
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
};
constexpr uint64_t kDLFlagReadOnly = 1;

// ---- export
struct ExportCtx {
  Tensor tensor;  // keeps the storage alive
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
};

DLDataType to_dl(DType dt) {
  switch (dt) {
    case DType::Float32: return {kDLFloat, 32, 1};
    case DType::Float64: return {kDLFloat, 64, 1};
    case DType::BFloat16: return {kDLBfloat, 16, 1};
    case DType::Int32: return {kDLInt, 32, 1};
    case DType::Int64: return {kDLInt, 64, 1};
  }
  return {kDLFloat, 32, 1};
}

DType from_dl(DLDataType t) {
  XT_CHECK(t.lanes == 1, TypeError, "from_dlpack: vector dtypes (lanes=", t.lanes, ") are not supported");
  if (t.code == kDLFloat && t.bits == 32) return DType::Float32;
  if (t.code == kDLFloat && t.bits == 64) return DType::Float64;
  if (t.code == kDLBfloat && t.bits == 16) return DType::BFloat16;
  if (t.code == kDLInt && t.bits == 32) return DType::Int32;
  if (t.code == kDLInt && t.bits == 64) return DType::Int64;
  throw TypeError(str("from_dlpack: unsupported dtype (code ", int(t.code), ", bits ", int(t.bits),
                      "); xtrain holds float32, bfloat16, float64, int32, int64"));
}

void fill_dl_tensor(DLTensor& dl, ExportCtx* ctx) {
  const Tensor& t = ctx->tensor;
  ctx->shape.assign(t.shape().begin(), t.shape().end());
  ctx->strides.resize(ctx->shape.size());
  int64_t s = 1;
  for (int i = static_cast<int>(ctx->shape.size()) - 1; i >= 0; --i) {
    ctx->strides[i] = s;
    s *= ctx->shape[i];
  }
  dl.data = t.data_ptr();
  dl.device = {t.device().is_cuda() ? kDLCUDA : kDLCPU, t.device().is_cuda() ? t.device().index : 0};
  dl.ndim = static_cast<int32_t>(ctx->shape.size());
  dl.dtype = to_dl(t.dtype());
  dl.shape = ctx->shape.data();
  dl.strides = ctx->strides.data();
  dl.byte_offset = 0;
}

py::capsule export_tensor(const Tensor& t, const py::object& max_version) {
  // The consumer may use the data on any stream: finish our work on it first (sync point).
  if (t.device().is_cuda()) {
    py::gil_scoped_release nogil;
    cuda::synchronize(t.device().index);
  }
  bool versioned = false;
  if (!max_version.is_none()) {
    auto v = max_version.cast<std::pair<int, int>>();
    versioned = v.first >= 1;
  }
  auto* ctx = new ExportCtx{t.detach(), {}, {}};
  if (versioned) {
    auto* mt = new DLManagedTensorVersioned{};
    mt->version = {1, 0};
    mt->manager_ctx = ctx;
    mt->flags = 0;
    mt->deleter = [](DLManagedTensorVersioned* self) {
      delete static_cast<ExportCtx*>(self->manager_ctx);
      delete self;
    };
    fill_dl_tensor(mt->dl_tensor, ctx);
    return py::capsule(mt, "dltensor_versioned", [](PyObject* cap) {
      // Only a capsule nobody consumed still carries its original name.
      if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        auto* p = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap, "dltensor_versioned"));
        if (p && p->deleter) p->deleter(p);
      }
    });
  }
  auto* mt = new DLManagedTensor{};
  mt->manager_ctx = ctx;
  mt->deleter = [](DLManagedTensor* self) {
    delete static_cast<ExportCtx*>(self->manager_ctx);
    delete self;
  };
  fill_dl_tensor(mt->dl_tensor, ctx);
  return py::capsule(mt, "dltensor", [](PyObject* cap) {
    if (PyCapsule_IsValid(cap, "dltensor")) {
      auto* p = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
      if (p && p->deleter) p->deleter(p);
    }
  });
}

// ---- import
Tensor wrap_dl(const DLTensor& dl, std::function<void()> release) {
  Device dev;
  if (dl.device.device_type == kDLCPU || dl.device.device_type == kDLCUDAHost) dev = Device::cpu();
  else if (dl.device.device_type == kDLCUDA) dev = Device::cuda(dl.device.device_id);
  else {
    release();
    throw TypeError(str("from_dlpack: unsupported device type ", dl.device.device_type, " (cpu and cuda only)"));
  }
  DType dt;
  try {
    dt = from_dl(dl.dtype);
  } catch (...) {
    release();
    throw;
  }
  Shape shape(dl.shape, dl.shape + dl.ndim);
  if (dl.strides) {
    int64_t expect = 1;
    for (int i = dl.ndim - 1; i >= 0; --i) {
      if (shape[i] != 1 && dl.strides[i] != expect) {
        release();
        throw ValueError(str("from_dlpack: only contiguous row-major tensors can be shared (shape ", shape_str(shape),
                             "); call .contiguous() on the source first"));
      }
      expect *= shape[i];
    }
  }
  void* data = static_cast<char*>(dl.data) + dl.byte_offset;
  return Tensor::from_external(data, shape, dt, dev, std::move(release));
}

Tensor import_capsule(py::capsule cap) {
  const char* name = PyCapsule_GetName(cap.ptr());
  if (name && std::strcmp(name, "dltensor_versioned") == 0) {
    auto* mt = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap.ptr(), name));
    XT_CHECK(mt->version.major == 1, ValueError, "from_dlpack: unsupported DLPack major version ", mt->version.major);
    PyCapsule_SetName(cap.ptr(), "used_dltensor_versioned");
    return wrap_dl(mt->dl_tensor, [mt] { if (mt->deleter) mt->deleter(mt); });
  }
  if (name && std::strcmp(name, "dltensor") == 0) {
    auto* mt = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap.ptr(), name));
    PyCapsule_SetName(cap.ptr(), "used_dltensor");
    return wrap_dl(mt->dl_tensor, [mt] { if (mt->deleter) mt->deleter(mt); });
  }
  throw ValueError("from_dlpack: expected a DLPack capsule named 'dltensor' or 'dltensor_versioned' that has not been used");
}

}  // namespace

void init_dlpack(py::module_& m) {
  py::object cls = m.attr("Tensor");
  py::setattr(cls, "__dlpack__",
              py::cpp_function(
                  [](const Tensor& t, const py::object& stream, const py::object& max_version,
                     const py::object& dl_device, const py::object& copy) {
                    XT_CHECK(copy.is_none() || !copy.cast<bool>(), ValueError,
                             "__dlpack__: xtrain exports without copies (copy=True is not supported)");
                    return export_tensor(t, max_version);
                  },
                  py::name("__dlpack__"), py::is_method(cls), py::kw_only(),
                  py::arg("stream") = py::none(), py::arg("max_version") = py::none(),
                  py::arg("dl_device") = py::none(), py::arg("copy") = py::none(),
                  "Export as a DLPack capsule sharing memory"));
  py::setattr(cls, "__dlpack_device__",
              py::cpp_function(
                  [](const Tensor& t) {
                    return py::make_tuple(t.device().is_cuda() ? int(kDLCUDA) : int(kDLCPU),
                                          t.device().is_cuda() ? t.device().index : 0);
                  },
                  py::name("__dlpack_device__"), py::is_method(cls), "(device_type, device_id) for DLPack"));
  m.def("_from_dlpack_capsule", &import_capsule, py::arg("capsule"),
        "Wrap a DLPack capsule as a tensor sharing its memory");
}

}  // namespace xt
