// SPDX-License-Identifier: Apache-2.0
#include "attnkit/tensor.hpp"

#include <limits>
#include <string>

#include "attnkit/error.hpp"

namespace attnkit {

const char* dtype_name(DType dtype) noexcept {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat16: return "float16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kFloat64: return "float64";
    case DType::kInt8: return "int8";
    case DType::kUInt8: return "uint8";
    case DType::kInt16: return "int16";
    case DType::kUInt16: return "uint16";
    case DType::kUInt32: return "uint32";
    case DType::kUInt64: return "uint64";
    case DType::kBool: return "bool";
  }
  return "unknown";
}

std::size_t dtype_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kBFloat16: return 2;
    case DType::kFloat16: return 2;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kFloat64: return 8;
    case DType::kInt8: return 1;
    case DType::kUInt8: return 1;
    case DType::kInt16: return 2;
    case DType::kUInt16: return 2;
    case DType::kUInt32: return 4;
    case DType::kUInt64: return 8;
    case DType::kBool: return 1;
  }
  return 0;
}

std::string device_name(Device device) {
  if (device.type == DeviceType::kCPU) return "cpu";
  if (device.type == DeviceType::kCUDA) return "cuda:" + std::to_string(device.index);
  return "device type " + std::to_string(static_cast<int>(device.type));
}

TensorView TensorView::make(void* data, DType dtype, Device device,
                            std::initializer_list<std::int64_t> shape,
                            std::initializer_list<std::int64_t> strides) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  if (shape.size() > static_cast<std::size_t>(kMaxDims)) {
    throw Error(ErrorCode::kShape, "TensorView::make: " + std::to_string(shape.size()) +
                                       " dimensions, at most " + std::to_string(kMaxDims));
  }
  if (strides.size() != 0 && strides.size() != shape.size()) {
    throw Error(ErrorCode::kShape, "TensorView::make: " + std::to_string(strides.size()) +
                                       " strides for " + std::to_string(shape.size()) +
                                       " dimensions");
  }
  v.ndim = static_cast<std::int32_t>(shape.size());
  int d = 0;
  for (std::int64_t s : shape) v.shape[d++] = s;
  if (strides.size() != 0) {
    d = 0;
    for (std::int64_t s : strides) v.strides[d++] = s;
  } else {
    v.set_compact_strides();
  }
  return v;
}

namespace {
/// The dimensions a view's arrays hold: ndim within [0, kMaxDims] (the checks refuse others,
/// and name them through shape_str first).
int held_dims(std::int32_t ndim) noexcept {
  return ndim < 0 ? 0 : ndim > kMaxDims ? kMaxDims : ndim;
}
}  // namespace

void TensorView::set_compact_strides() noexcept {
  std::int64_t running = 1;
  for (int d = held_dims(ndim) - 1; d >= 0; --d) {
    strides[d] = running;
    if (__builtin_mul_overflow(running, shape[d], &running)) {
      running = std::numeric_limits<std::int64_t>::max();
    }
  }
}

std::int64_t TensorView::numel() const noexcept {
  // Saturates at INT64_MAX: views of a few real bytes may carry huge broadcast shapes.
  std::int64_t n = 1;
  bool saturated = false;
  for (int d = 0; d < held_dims(ndim); ++d) {
    if (shape[d] == 0) return 0;
    if (saturated || __builtin_mul_overflow(n, shape[d], &n)) saturated = true;
  }
  return saturated ? std::numeric_limits<std::int64_t>::max() : n;
}

std::string TensorView::shape_str() const {
  std::string s = "[";
  for (int d = 0; d < held_dims(ndim); ++d) {
    if (d) s += ", ";
    s += std::to_string(shape[d]);
  }
  return s + "]";
}

}  // namespace attnkit
