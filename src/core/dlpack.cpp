// SPDX-License-Identifier: Apache-2.0
#include "attnkit/dlpack.hpp"

#include <cstdint>
#include <cstring>
#include <string>

#include "attnkit/error.hpp"

namespace attnkit {
namespace {

std::string dl_dtype_str(DLDataType t) {
  return "DLPack dtype (code " + std::to_string(t.code) + ", bits " + std::to_string(t.bits) +
         ", lanes " + std::to_string(t.lanes) + ")";
}

struct DTypeCode {
  DType dtype;
  std::uint8_t code;
  std::uint8_t bits;
};

constexpr DTypeCode kCodes[] = {
    {DType::kFloat32, kDLFloat, 32}, {DType::kBFloat16, kDLBfloat, 16},
    {DType::kFloat16, kDLFloat, 16}, {DType::kInt32, kDLInt, 32},
    {DType::kInt64, kDLInt, 64},     {DType::kFloat64, kDLFloat, 64},
    {DType::kInt8, kDLInt, 8},       {DType::kUInt8, kDLUInt, 8},
    {DType::kInt16, kDLInt, 16},     {DType::kUInt16, kDLUInt, 16},
    {DType::kUInt32, kDLUInt, 32},   {DType::kUInt64, kDLUInt, 64},
};

DType dtype_from_dl(DLDataType t) {
  if (t.lanes == 1) {
    for (const DTypeCode& c : kCodes) {
      if (c.code == t.code && c.bits == t.bits) return c.dtype;
    }
    if (t.bits == 8 && t.code == 6) return DType::kBool;  // kDLBool (DLPack >= 0.8)
  }
  throw Error(ErrorCode::kDType, "from_dlpack: " + dl_dtype_str(t) + " has no attnkit dtype");
}

DLDataType dl_from_dtype(DType d) {
  for (const DTypeCode& c : kCodes) {
    if (c.dtype == d) return DLDataType{c.code, c.bits, 1};
  }
  if (d == DType::kBool) return DLDataType{6, 8, 1};  // kDLBool
  throw Error(ErrorCode::kDType, "to_dlpack: dtype " + std::to_string(static_cast<int>(d)) +
                                     " is not an attnkit dtype");
}

}  // namespace

TensorView from_dlpack(const DLTensor& t) {
  TensorView v;
  v.dtype = dtype_from_dl(t.dtype);
  // The device type read as an integer: a producer's unknown type is no DLDeviceType value,
  // and loading it as one would be undefined.
  int device_type = 0;
  static_assert(sizeof(t.device.device_type) == sizeof(device_type));
  std::memcpy(&device_type, &t.device.device_type, sizeof(device_type));
  switch (device_type) {
    case kDLCPU:
    case kDLCUDAHost:  // pinned host memory is ordinary CPU memory to the CPU backend
      v.device = Device{DeviceType::kCPU, 0};
      break;
    case kDLCUDA:
      v.device = Device{DeviceType::kCUDA, t.device.device_id};
      break;
    default:
      throw Error(ErrorCode::kDevice, "from_dlpack: DLPack device type " +
                                          std::to_string(device_type) + " is not CPU or CUDA");
  }
  if (t.ndim < 0 || t.ndim > kMaxDims) {
    throw Error(ErrorCode::kShape, "from_dlpack: ndim = " + std::to_string(t.ndim) +
                                       " must be in [0, " + std::to_string(kMaxDims) + "]");
  }
  if (t.ndim > 0 && t.shape == nullptr) {
    throw Error(ErrorCode::kShape,
                "from_dlpack: shape is null with ndim = " + std::to_string(t.ndim) +
                    "; DLPack requires a shape for every dimension");
  }
  // An empty tensor may have a null data pointer; no offset is applied to it. The offset is
  // added as an address, refused where it could not describe memory (the views' byte spans
  // obey the same 2^62 bound) or would wrap the address space.
  if (t.data != nullptr) {
    const auto address = reinterpret_cast<std::uintptr_t>(t.data);
    if (t.byte_offset >= (std::uint64_t{1} << 62)) {
      throw Error(ErrorCode::kLayout, "from_dlpack: byte_offset = " +
                                          std::to_string(t.byte_offset) + " must be < 2^62");
    }
    if (address + t.byte_offset < address) {
      throw Error(ErrorCode::kLayout, "from_dlpack: data + byte_offset (" +
                                          std::to_string(t.byte_offset) +
                                          ") wraps past the end of the address space");
    }
    v.data = reinterpret_cast<void*>(address + t.byte_offset);
  }
  v.ndim = t.ndim;
  for (int d = 0; d < t.ndim; ++d) {
    v.shape[d] = t.shape[d];
    if (t.strides) v.strides[d] = t.strides[d];
  }
  if (!t.strides) v.set_compact_strides();  // producers that give none are compact
  return v;
}

DLTensor to_dlpack(TensorView& view) {
  if (view.ndim < 0 || view.ndim > kMaxDims) {
    throw Error(ErrorCode::kShape, "to_dlpack: ndim = " + std::to_string(view.ndim) +
                                       " must be in [0, " + std::to_string(kMaxDims) + "]");
  }
  if (view.device.type != DeviceType::kCPU && view.device.type != DeviceType::kCUDA) {
    throw Error(ErrorCode::kDevice,
                "to_dlpack: " + device_name(view.device) + " is not cpu or cuda");
  }
  DLTensor t{};
  t.data = view.data;
  t.device = view.device.type == DeviceType::kCPU ? DLDevice{kDLCPU, 0}
                                                  : DLDevice{kDLCUDA, view.device.index};
  t.ndim = view.ndim;
  t.dtype = dl_from_dtype(view.dtype);
  t.shape = view.shape;
  t.strides = view.strides;
  t.byte_offset = 0;
  return t;
}

}  // namespace attnkit
