// SPDX-License-Identifier: Apache-2.0
// TensorView and its helpers (include/attnkit/tensor.hpp), error codes, and the DLPack
// conversions (include/attnkit/dlpack.hpp) when the build found dlpack.h.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attnkit/attnkit.hpp"
#include "topk_test_util.hpp"
#if defined(ATTNKIT_TEST_DLPACK)
#include "attnkit/dlpack.hpp"
#endif

namespace {

using attnkit::Device;
using attnkit::DeviceType;
using attnkit::DType;
using attnkit::ErrorCode;
using attnkit::TensorView;
using attnkit_test::expect_throws;

struct DTypeFact {
  DType dtype;
  const char* name;
  std::size_t size;
};

const DTypeFact kDTypes[] = {
    {DType::kFloat32, "float32", 4}, {DType::kBFloat16, "bfloat16", 2},
    {DType::kFloat16, "float16", 2}, {DType::kInt32, "int32", 4},
    {DType::kInt64, "int64", 8},     {DType::kFloat64, "float64", 8},
    {DType::kInt8, "int8", 1},       {DType::kUInt8, "uint8", 1},
    {DType::kInt16, "int16", 2},     {DType::kUInt16, "uint16", 2},
    {DType::kUInt32, "uint32", 4},   {DType::kUInt64, "uint64", 8},
    {DType::kBool, "bool", 1},
};

TEST(Tensor, MakeContiguousStrides) {
  float storage[1];
  const Device cpu{};
  const TensorView v = TensorView::make(storage, DType::kFloat32, cpu, {2, 3, 4});
  EXPECT_EQ(v.data, storage);
  EXPECT_EQ(v.dtype, DType::kFloat32);
  EXPECT_EQ(v.device, cpu);
  ASSERT_EQ(v.ndim, 3);
  EXPECT_EQ(v.size(0), 2);
  EXPECT_EQ(v.size(1), 3);
  EXPECT_EQ(v.size(2), 4);
  EXPECT_EQ(v.stride(0), 12);
  EXPECT_EQ(v.stride(1), 4);
  EXPECT_EQ(v.stride(2), 1);
  EXPECT_EQ(v.data_as<float>(), storage);

  const TensorView one = TensorView::make(storage, DType::kInt64, cpu, {7});
  ASSERT_EQ(one.ndim, 1);
  EXPECT_EQ(one.stride(0), 1);
}

// Shapes whose compact strides do not fit int64 (broadcast views may carry them) get strides
// that saturate rather than wrap, so that the checks see a span too large instead of a small one.
TEST(Tensor, MakeContiguousStridesSaturate) {
  float storage[1];
  const std::int64_t huge = std::int64_t{1} << 40;
  const TensorView v = TensorView::make(storage, DType::kFloat32, {}, {huge, huge, huge, 4});
  EXPECT_EQ(v.stride(3), 1);
  EXPECT_EQ(v.stride(2), 4);
  EXPECT_EQ(v.stride(1), 4 * huge);
  EXPECT_EQ(v.stride(0), std::numeric_limits<std::int64_t>::max());  // 2^82 does not fit
}

TEST(Tensor, MakeExplicitStrides) {
  int storage[1];
  const Device gpu{DeviceType::kCUDA, 3};
  // Zero (broadcast) and negative strides are kept as given.
  const TensorView v = TensorView::make(storage, DType::kInt32, gpu, {5, 6}, {0, -2});
  EXPECT_EQ(v.stride(0), 0);
  EXPECT_EQ(v.stride(1), -2);
  EXPECT_EQ(v.device.type, DeviceType::kCUDA);
  EXPECT_EQ(v.device.index, 3);
  // Sizes past 2^31 are held in 64 bits.
  const std::int64_t big = std::int64_t{1} << 40;
  const TensorView w = TensorView::make(storage, DType::kUInt8, {}, {big, 3}, {0, 1});
  EXPECT_EQ(w.size(0), big);
  EXPECT_EQ(w.numel(), 3 * big);
}

TEST(Tensor, MakeErrors) {
  expect_throws(
      [] {
        (void)TensorView::make(nullptr, DType::kFloat32, {}, {1, 1, 1, 1, 1, 1, 1});
      },
      ErrorCode::kShape, "7 dimensions, at most 6");
  expect_throws(
      [] {
        (void)TensorView::make(nullptr, DType::kFloat32, {}, {2, 3}, {1});
      },
      ErrorCode::kShape, "1 strides for 2 dimensions");
  expect_throws(
      [] {
        (void)TensorView::make(nullptr, DType::kFloat32, {}, {2}, {1, 1, 1});
      },
      ErrorCode::kShape, "3 strides for 1 dimensions");
  // The maximum rank itself is fine.
  const TensorView v = TensorView::make(nullptr, DType::kFloat32, {}, {1, 2, 1, 2, 1, 2});
  EXPECT_EQ(v.ndim, attnkit::kMaxDims);
  EXPECT_EQ(v.stride(0), 8);
}

TEST(Tensor, Numel) {
  EXPECT_EQ(TensorView::make(nullptr, DType::kFloat32, {}, {}).numel(), 1);  // 0-d: one element
  EXPECT_EQ(TensorView::make(nullptr, DType::kFloat32, {}, {4, 0, 3}).numel(), 0);
  EXPECT_EQ(TensorView::make(nullptr, DType::kFloat32, {}, {4, 5, 3}).numel(), 60);
  EXPECT_EQ(TensorView{}.numel(), 1);
}

TEST(Tensor, ShapeStr) {
  EXPECT_EQ(TensorView::make(nullptr, DType::kFloat32, {}, {4, 128}).shape_str(), "[4, 128]");
  EXPECT_EQ(TensorView::make(nullptr, DType::kFloat32, {}, {7}).shape_str(), "[7]");
  EXPECT_EQ(TensorView::make(nullptr, DType::kFloat32, {}, {}).shape_str(), "[]");
  EXPECT_EQ(TensorView::make(nullptr, DType::kFloat32, {}, {-1, 2147483648}).shape_str(),
            "[-1, 2147483648]");
}

TEST(Tensor, DTypeNameAndSize) {
  for (const DTypeFact& f : kDTypes) {
    EXPECT_STREQ(attnkit::dtype_name(f.dtype), f.name);
    EXPECT_EQ(attnkit::dtype_size(f.dtype), f.size) << f.name;
  }
  // An out-of-range enumerator is named, not undefined.
  const auto bogus = static_cast<DType>(200);
  EXPECT_STREQ(attnkit::dtype_name(bogus), "unknown");
  EXPECT_EQ(attnkit::dtype_size(bogus), 0u);
}

TEST(Tensor, DevicesAndNames) {
  const Device cpu{}, cpu_other{DeviceType::kCPU, 5}, cuda0{DeviceType::kCUDA, 0},
      cuda1{DeviceType::kCUDA, 1};
  EXPECT_EQ(attnkit::device_name(cpu), "cpu");
  EXPECT_EQ(attnkit::device_name(cuda1), "cuda:1");
  EXPECT_TRUE(cpu == cpu_other);  // the index means nothing on the CPU
  EXPECT_FALSE(cpu != cpu_other);
  EXPECT_TRUE(cuda0 != cuda1);
  EXPECT_TRUE(cpu != cuda0);
  EXPECT_TRUE(cuda1 == (Device{DeviceType::kCUDA, 1}));
}

TEST(Tensor, ErrorCodeNames) {
  const std::pair<ErrorCode, const char*> names[] = {
      {ErrorCode::kValue, "value"},
      {ErrorCode::kShape, "shape"},
      {ErrorCode::kDType, "dtype"},
      {ErrorCode::kDevice, "device"},
      {ErrorCode::kLayout, "layout"},
      {ErrorCode::kNanFound, "nan_found"},
      {ErrorCode::kDeviceFault, "device_fault"},
      {ErrorCode::kInternal, "internal"},
  };
  for (const auto& [code, name] : names) EXPECT_STREQ(attnkit::error_code_name(code), name);
  const attnkit::Error e(ErrorCode::kShape, "op: x has shape [2]");
  EXPECT_EQ(e.code(), ErrorCode::kShape);
  EXPECT_STREQ(e.what(), "op: x has shape [2]");
}

#if defined(ATTNKIT_TEST_DLPACK)

TEST(TensorDlpack, RoundTripEveryDType) {
  std::int64_t storage[8] = {};
  for (const DTypeFact& f : kDTypes) {
    SCOPED_TRACE(f.name);
    TensorView v =
        TensorView::make(storage, f.dtype, {DeviceType::kCUDA, 2}, {3, 4, 5}, {40, -5, 1});
    const DLTensor t = attnkit::to_dlpack(v);
    EXPECT_EQ(t.data, storage);
    EXPECT_EQ(t.byte_offset, 0u);
    EXPECT_EQ(t.device.device_type, kDLCUDA);
    EXPECT_EQ(t.device.device_id, 2);
    EXPECT_EQ(t.ndim, 3);
    EXPECT_EQ(t.dtype.lanes, 1);
    EXPECT_EQ(static_cast<std::size_t>(t.dtype.bits), 8 * f.size);
    EXPECT_EQ(t.shape[1], 4);
    EXPECT_EQ(t.strides[1], -5);
    const TensorView back = attnkit::from_dlpack(t);
    EXPECT_EQ(back.data, v.data);
    EXPECT_EQ(back.dtype, f.dtype);
    EXPECT_EQ(back.device, v.device);
    ASSERT_EQ(back.ndim, v.ndim);
    for (int d = 0; d < v.ndim; ++d) {
      EXPECT_EQ(back.shape[d], v.shape[d]) << "dim " << d;
      EXPECT_EQ(back.strides[d], v.strides[d]) << "dim " << d;
    }
  }
}

TEST(TensorDlpack, DLPackCodesOfTheFloatTypes) {
  float storage[1];
  TensorView bf = TensorView::make(storage, DType::kBFloat16, {}, {1});
  TensorView f16 = TensorView::make(storage, DType::kFloat16, {}, {1});
  TensorView b = TensorView::make(storage, DType::kBool, {}, {1});
  EXPECT_EQ(attnkit::to_dlpack(bf).dtype.code, kDLBfloat);
  EXPECT_EQ(attnkit::to_dlpack(f16).dtype.code, kDLFloat);
  EXPECT_EQ(attnkit::to_dlpack(f16).dtype.bits, 16);
  EXPECT_EQ(attnkit::to_dlpack(b).device.device_type, kDLCPU);
  EXPECT_EQ(attnkit::to_dlpack(b).dtype.bits, 8);
}

TEST(TensorDlpack, ViewsOutOfRangeAreRefused) {
  float storage[1];
  TensorView v = TensorView::make(storage, DType::kFloat32, {}, {1});
  v.dtype = static_cast<DType>(200);
  EXPECT_THROW(attnkit::to_dlpack(v), attnkit::Error);
  v.dtype = DType::kFloat32;
  v.ndim = 7;
  EXPECT_THROW(attnkit::to_dlpack(v), attnkit::Error);
  v.ndim = 1;
  v.device.type = static_cast<attnkit::DeviceType>(7);
  EXPECT_THROW(attnkit::to_dlpack(v), attnkit::Error);
}

TEST(TensorDlpack, NullStridesAreContiguousAndByteOffsetIsFolded) {
  float storage[64];
  std::int64_t shape[3] = {2, 3, 4};
  DLTensor t{};
  t.data = storage;
  t.device = {kDLCPU, 0};
  t.ndim = 3;
  t.dtype = {kDLFloat, 32, 1};
  t.shape = shape;
  t.strides = nullptr;
  t.byte_offset = 12;
  const TensorView v = attnkit::from_dlpack(t);
  EXPECT_EQ(v.data, static_cast<void*>(storage + 3));
  EXPECT_EQ(v.stride(0), 12);
  EXPECT_EQ(v.stride(1), 4);
  EXPECT_EQ(v.stride(2), 1);
  EXPECT_EQ(v.device, Device{});
  // Pinned host memory is CPU memory to attnkit.
  t.device = {kDLCUDAHost, 0};
  EXPECT_EQ(attnkit::from_dlpack(t).device.type, DeviceType::kCPU);
  // A 0-d tensor.
  t.ndim = 0;
  const TensorView scalar = attnkit::from_dlpack(t);
  EXPECT_EQ(scalar.ndim, 0);
  EXPECT_EQ(scalar.numel(), 1);
}

// A broadcast DLTensor of a huge shape keeps its given strides, and a null empty tensor stays
// null whatever its byte_offset.
TEST(TensorDlpack, HugeBroadcastShapesAndNullEmptyTensors) {
  float one = 1.0f;
  std::int64_t shape[3] = {std::int64_t{1} << 40, std::int64_t{1} << 40, 4};
  std::int64_t strides[3] = {0, 0, 1};
  DLTensor t{};
  t.data = &one;
  t.device = {kDLCPU, 0};
  t.ndim = 3;
  t.dtype = {kDLFloat, 32, 1};
  t.shape = shape;
  t.strides = strides;
  const TensorView v = attnkit::from_dlpack(t);
  EXPECT_EQ(v.stride(0), 0);
  EXPECT_EQ(v.stride(1), 0);
  EXPECT_EQ(v.stride(2), 1);
  EXPECT_EQ(v.numel(), std::numeric_limits<std::int64_t>::max());  // saturated

  std::int64_t empty_shape[1] = {0};
  DLTensor e{};
  e.byte_offset = 64;
  e.device = {kDLCPU, 0};
  e.ndim = 1;
  e.dtype = {kDLFloat, 32, 1};
  e.shape = empty_shape;
  EXPECT_EQ(attnkit::from_dlpack(e).data, nullptr);
}

TEST(TensorDlpack, Errors) {
  float storage[4];
  std::int64_t shape[7] = {1, 1, 1, 1, 1, 1, 1};
  DLTensor t{};
  t.data = storage;
  t.device = {kDLCPU, 0};
  t.ndim = 1;
  t.shape = shape;
  t.dtype = {kDLComplex, 64, 1};
  expect_throws([&] { (void)attnkit::from_dlpack(t); }, ErrorCode::kDType, "code 5, bits 64");
  t.dtype = {kDLFloat, 32, 4};  // vector lanes
  expect_throws([&] { (void)attnkit::from_dlpack(t); }, ErrorCode::kDType, "lanes 4");
  t.dtype = {kDLFloat, 8, 1};
  expect_throws([&] { (void)attnkit::from_dlpack(t); }, ErrorCode::kDType, "has no attnkit dtype");
  t.dtype = {kDLFloat, 32, 1};
  t.device = {kDLVulkan, 0};
  expect_throws([&] { (void)attnkit::from_dlpack(t); }, ErrorCode::kDevice, "device type 7");
  t.device = {kDLCPU, 0};
  t.ndim = 7;
  expect_throws([&] { (void)attnkit::from_dlpack(t); }, ErrorCode::kShape, "ndim = 7");
  t.ndim = -1;
  expect_throws([&] { (void)attnkit::from_dlpack(t); }, ErrorCode::kShape, "ndim = -1");
  t.ndim = 1;
  t.shape = nullptr;  // DLPack requires a shape; strides may be null, the shape may not
  expect_throws([&] { (void)attnkit::from_dlpack(t); }, ErrorCode::kShape, "shape is null");
  t.shape = shape;
  const int unknown = 12345;  // no DLDeviceType enumerator: read as an integer
  std::memcpy(&t.device.device_type, &unknown, sizeof(unknown));
  expect_throws([&] { (void)attnkit::from_dlpack(t); }, ErrorCode::kDevice, "device type 12345");
  t.device = {kDLCPU, 0};
  // An offset that no buffer spans (the views' spans stay below 2^62 too), at the bound and
  // past it; one that wraps the address (a pointer near the top, never dereferenced).
  t.byte_offset = std::uint64_t{1} << 62;
  expect_throws([&] { (void)attnkit::from_dlpack(t); }, ErrorCode::kLayout,
                "byte_offset = 4611686018427387904 must be < 2^62");
  t.byte_offset = ~std::uint64_t{3};
  expect_throws([&] { (void)attnkit::from_dlpack(t); }, ErrorCode::kLayout,
                "byte_offset = 18446744073709551612 must be < 2^62");
  t.byte_offset = (std::uint64_t{1} << 62) - 4;
  EXPECT_NO_THROW((void)attnkit::from_dlpack(t));
  void* const near_top = reinterpret_cast<void*>(~std::uintptr_t{0} - 15);
  t.data = near_top;
  t.byte_offset = 64;
  expect_throws([&] { (void)attnkit::from_dlpack(t); }, ErrorCode::kLayout,
                "data + byte_offset (64) wraps past the end of the address space");
  t.byte_offset = 12;
  EXPECT_EQ(attnkit::from_dlpack(t).data, static_cast<void*>(static_cast<char*>(near_top) + 12));
  t.data = storage;
  t.byte_offset = 4;
  EXPECT_EQ(attnkit::from_dlpack(t).data, static_cast<void*>(storage + 1));
}

#endif  // ATTNKIT_TEST_DLPACK

}  // namespace
