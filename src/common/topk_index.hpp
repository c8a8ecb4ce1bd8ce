// SPDX-License-Identifier: Apache-2.0
// Output indices: column + index_offset[b], computed so that every input is defined behaviour
// (an unchecked offset may overflow; the result then wraps like two's-complement arithmetic).
#pragma once

#include <cstdint>

#include "common/host_device.hpp"

namespace attnkit::detail {

ATTNKIT_HD std::int64_t offset_index64(std::uint32_t col, std::int64_t offset) {
  return static_cast<std::int64_t>(std::uint64_t{col} + static_cast<std::uint64_t>(offset));
}

ATTNKIT_HD std::int32_t offset_index32(std::uint32_t col, std::int64_t offset) {
  return static_cast<std::int32_t>(col + static_cast<std::uint32_t>(offset));
}

}  // namespace attnkit::detail
