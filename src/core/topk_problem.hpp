// SPDX-License-Identifier: Apache-2.0
// A checked top-k call, flattened for the backends: raw pointers, element strides, the fill
// value already in x's bit pattern. Built only by check_topk(); backends trust every field.
#pragma once

#include <cstdint>

#include "attnkit/tensor.hpp"
#include "attnkit/topk.hpp"

namespace attnkit::detail {

/// An optional [B] vector of int32/int64 (begin, end, index_offset); data == nullptr if absent.
struct RowVector {
  const void* data = nullptr;
  bool is_int64 = false;
  std::int64_t stride = 1;  // elements
};

/// v[b] widened to int64, or `fallback` when v is absent. v must point at host memory.
inline std::int64_t host_row_value(const RowVector& v, std::int64_t b, std::int64_t fallback) {
  if (v.data == nullptr) return fallback;
  return v.is_int64 ? static_cast<const std::int64_t*>(v.data)[b * v.stride]
                    : static_cast<const std::int32_t*>(v.data)[b * v.stride];
}

struct TopkProblem {
  // Input.
  const void* x = nullptr;
  DType dtype = DType::kFloat32;
  Device device{};
  std::int64_t batch = 0;       // B
  std::int64_t row_len = 0;     // N
  std::int64_t row_stride = 0;  // elements; any sign
  bool one_row = false;         // x is [N]: messages name x[col], not x[0, col]
  RowVector begin, end, index_offset;

  // Outputs. values == nullptr when values are not returned.
  void* values = nullptr;
  std::int64_t values_row_stride = 0;
  void* indices = nullptr;
  bool indices_int64 = true;
  std::int64_t indices_row_stride = 0;

  // Options.
  std::int64_t k = 0;
  bool largest = true;
  TopkOrder order = TopkOrder::kNone;
  NanPolicy nan = NanPolicy::kLargest;
  TiePolicy ties = TiePolicy::kLowestIndex;
  std::int64_t index_fill = -1;
  std::uint32_t value_fill_bits = 0;  // in x's dtype (low 16 bits for 16-bit types)
  bool check_rows = false;            // validate begin/end/index_offset values
  TopkBackend backend = TopkBackend::kAuto;
};

}  // namespace attnkit::detail
