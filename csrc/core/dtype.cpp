// dtype and device names, sizes and parsing.
#include "core/dtype.h"

#include <cctype>

#include "core/error.h"

namespace xt {

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::Float32: return 4;
    case DType::BFloat16: return 2;
    case DType::Float64: return 8;
    case DType::Int32: return 4;
    case DType::Int64: return 8;
  }
  return 0;
}

const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::Float32: return "float32";
    case DType::BFloat16: return "bfloat16";
    case DType::Float64: return "float64";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
  }
  return "?";
}

DType parse_dtype(const std::string& name) {
  if (name == "float32" || name == "f32" || name == "fp32" || name == "float") return DType::Float32;
  if (name == "bfloat16" || name == "bf16") return DType::BFloat16;
  if (name == "float64" || name == "f64" || name == "fp64" || name == "double") return DType::Float64;
  if (name == "int32" || name == "i32") return DType::Int32;
  if (name == "int64" || name == "i64" || name == "long") return DType::Int64;
  throw ValueError(str("unknown dtype '", name,
                       "': expected one of float32, bfloat16, float64, int32, int64"));
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : ::xt::str("cuda:", index);
}

Device Device::parse(const std::string& s) {
  if (s == "cpu") return Device::cpu();
  if (s == "cuda" || s == "gpu") return Device::cuda(0);
  if (s.rfind("cuda:", 0) == 0 && s.size() > 5 && s.size() < 9) {
    int idx = 0;
    for (size_t i = 5; i < s.size(); ++i) {
      if (!std::isdigit(static_cast<unsigned char>(s[i]))) goto bad;
      idx = idx * 10 + (s[i] - '0');
    }
    return Device::cuda(idx);
  }
bad:
  throw ValueError(::xt::str("unknown device '", s, "': expected 'cpu', 'cuda' or 'cuda:N'"));
}

}  // namespace xt
