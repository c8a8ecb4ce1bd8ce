// SPDX-License-Identifier: Apache-2.0
/// \file
/// Non-owning tensor views: the currency of every attnkit entry point.
///
/// A `TensorView` names memory that somebody else owns (a PyTorch tensor, a NumPy array, a
/// `cudaMalloc` block): a data pointer, a dtype, a device, a shape and strides counted in
/// elements, as DLPack counts them (not in bytes, as NumPy does). attnkit never frees, resizes
/// or copies what a view points at. `attnkit/dlpack.hpp` converts views to and from DLPack's
/// `DLTensor`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

// The CUDA runtime declares `typedef struct CUstream_st* cudaStream_t;`. Redeclaring the same
// alias here lets CPU-only users call the API without the CUDA headers; C++ allows the repeat.
struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace attnkit {

/// Element types a view can describe. Each op accepts a subset and names it in its errors; the
/// others exist so that a wrong dtype is reported by name rather than refused at conversion.
enum class DType : std::uint8_t {
  kFloat32,
  kBFloat16,
  kFloat16,
  kInt32,
  kInt64,
  kFloat64,
  kInt8,
  kUInt8,
  kInt16,
  kUInt16,
  kUInt32,
  kUInt64,
  kBool,
};

/// "float32", "bfloat16", "float16", "int32", "int64", "float64", "int8", ...
const char* dtype_name(DType dtype) noexcept;
/// Size of one element in bytes.
std::size_t dtype_size(DType dtype) noexcept;

enum class DeviceType : std::uint8_t { kCPU, kCUDA };

/// Where a view's memory lives. `index` is the CUDA ordinal; it is 0 for the CPU.
struct Device {
  DeviceType type = DeviceType::kCPU;
  std::int32_t index = 0;

  friend bool operator==(const Device& a, const Device& b) noexcept {
    return a.type == b.type && (a.type == DeviceType::kCPU || a.index == b.index);
  }
  friend bool operator!=(const Device& a, const Device& b) noexcept { return !(a == b); }
};

/// "cpu" or "cuda:N".
std::string device_name(Device device);

inline constexpr int kMaxDims = 6;

/// A strided, non-owning view of an n-dimensional array.
///
/// Strides are in elements and may be zero (broadcast) or negative. A view may describe more
/// than 2^31 elements; every size and offset is 64-bit.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  Device device{};
  std::int32_t ndim = 0;
  std::int64_t shape[kMaxDims] = {};
  std::int64_t strides[kMaxDims] = {};

  /// A view with the given shape; `strides` empty means C-contiguous.
  /// \throws Error(kShape) for more than kMaxDims dimensions, or `strides` not empty and of
  /// another length than `shape`.
  static TensorView make(void* data, DType dtype, Device device,
                         std::initializer_list<std::int64_t> shape,
                         std::initializer_list<std::int64_t> strides = {});

  /// Sets `strides` to the C-contiguous strides of `shape`; a stride too large for int64
  /// saturates at INT64_MAX (such a shape describes no real buffer, and the checks refuse its
  /// span).
  void set_compact_strides() noexcept;

  std::int64_t size(int dim) const noexcept { return shape[dim]; }
  std::int64_t stride(int dim) const noexcept { return strides[dim]; }
  /// Product of the sizes (1 for a 0-d view), saturating at INT64_MAX.
  std::int64_t numel() const noexcept;
  /// "[4, 128]".
  std::string shape_str() const;
  template <class T>
  T* data_as() const noexcept {
    return static_cast<T*>(data);
  }
};

}  // namespace attnkit
