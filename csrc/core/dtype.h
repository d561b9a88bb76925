// Element types and devices: the two small value types every tensor carries.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/bf16.h"

namespace xt {

enum class DType : uint8_t { Float32, BFloat16, Float64, Int32, Int64 };

size_t dtype_size(DType dt);
const char* dtype_name(DType dt);  // "float32", "bfloat16", ...
DType parse_dtype(const std::string& name);  // accepts "float32"/"f32"/"fp32", "bf16", ...; ValueError otherwise
inline bool is_floating(DType dt) { return dt == DType::Float32 || dt == DType::BFloat16 || dt == DType::Float64; }
inline bool is_integral(DType dt) { return dt == DType::Int32 || dt == DType::Int64; }

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;  // always 0 for the CPU

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;  // "cpu" or "cuda:N"

  static Device cpu() { return Device{}; }
  static Device cuda(int index) { return Device{DeviceType::CUDA, index}; }
  static Device parse(const std::string& s);  // "cpu", "cuda", "cuda:N"; ValueError otherwise
};

}  // namespace xt
