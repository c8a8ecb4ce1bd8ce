// SPDX-License-Identifier: Apache-2.0
// Pieces the fast and the reference CPU top-k share: each row's valid range, and writing a
// finished row (values by bit copy, indices with their offset, padding).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>

#include "common/topk_index.hpp"
#include "core/topk_problem.hpp"

namespace attnkit::detail::cpu {

/// Row b's valid range [lo, hi), clamped so that 0 <= lo <= hi <= N whatever the inputs hold
/// (the check layer has already rejected bad values when checking was on).
struct RowRange {
  std::int64_t lo, hi;
};

inline RowRange row_range(const TopkProblem& p, std::int64_t b) {
  const std::int64_t n = p.row_len;
  const std::int64_t hi = std::clamp<std::int64_t>(host_row_value(p.end, b, n), 0, n);
  const std::int64_t lo = std::clamp<std::int64_t>(host_row_value(p.begin, b, 0), 0, hi);
  return {lo, hi};
}

/// std::bad_alloc naming what a call's working buffers needed (Python: MemoryError):
/// `count` buffers of `each` bytes.
class WorkingMemoryError : public std::bad_alloc {
 public:
  WorkingMemoryError(const TopkProblem& p, std::size_t count, std::size_t each)
      : message_("topk: out of host memory for the CPU backend's working buffers: " +
                 std::to_string(count) + " x " + std::to_string(each) + " bytes (k = " +
                 std::to_string(p.k) + ", N = " + std::to_string(p.row_len) + ", B = " +
                 std::to_string(p.batch) + "); no output was written") {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

/// Writes row b of the outputs from `count` selected columns in output order, then pads.
template <class Bits>
void write_row(const TopkProblem& p, std::int64_t b, const std::uint32_t* cols,
               std::int64_t count) {
  const Bits* row = static_cast<const Bits*>(p.x) + b * p.row_stride;
  const std::int64_t offset = host_row_value(p.index_offset, b, 0);
  if (p.values != nullptr) {
    Bits* out = static_cast<Bits*>(p.values) + b * p.values_row_stride;
    for (std::int64_t j = 0; j < count; ++j) out[j] = row[cols[j]];
    const Bits fill = static_cast<Bits>(p.value_fill_bits);
    for (std::int64_t j = count; j < p.k; ++j) out[j] = fill;
  }
  if (p.indices_int64) {
    auto* out = static_cast<std::int64_t*>(p.indices) + b * p.indices_row_stride;
    for (std::int64_t j = 0; j < count; ++j) out[j] = offset_index64(cols[j], offset);
    for (std::int64_t j = count; j < p.k; ++j) out[j] = p.index_fill;
  } else {
    auto* out = static_cast<std::int32_t*>(p.indices) + b * p.indices_row_stride;
    // Wraps modulo 2^32 when an unchecked offset pushes an index out of int32 (checked calls
    // were refused before this point).
    for (std::int64_t j = 0; j < count; ++j) out[j] = offset_index32(cols[j], offset);
    for (std::int64_t j = count; j < p.k; ++j) out[j] = static_cast<std::int32_t>(p.index_fill);
  }
}

}  // namespace attnkit::detail::cpu
