// SPDX-License-Identifier: Apache-2.0
// Building blocks of the per-op argument checks (check_<op>.cpp). Each throws attnkit::Error
// with "<op>: <argument> <what was seen>; <rule>".
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "attnkit/error.hpp"
#include "attnkit/tensor.hpp"

namespace attnkit::detail {

[[noreturn]] void fail(ErrorCode code, const char* op, const std::string& message);

/// "0x7f00a0": an address as the error messages print it.
std::string hex_address(std::uintptr_t address);

/// "[B, k] = [4, 16]" style helper: the expected shape spelled with names and values.
std::string shape_with_names(std::initializer_list<const char*> names,
                             std::initializer_list<std::int64_t> values);

/// dtype_name(d), with the enumerator's number after it when d is none of attnkit's dtypes.
std::string dtype_label(DType d);

/// The dtype is one of `allowed`.
void check_dtype(const char* op, const char* arg, const TensorView& t,
                 std::initializer_list<DType> allowed);

/// The view is on `device`.
void check_device(const char* op, const char* arg, const TensorView& t, Device device);

/// The last dimension is contiguous (stride 1) whenever it holds more than one element.
void check_last_dim_contiguous(const char* op, const char* arg, const TensorView& t);

/// The view is well formed: 0 <= ndim <= kMaxDims, a known device type, no negative size; if
/// not empty, a data pointer that is not null and strides whose byte span is below 2^62.
void check_storage(const char* op, const char* arg, const TensorView& t);

/// The data pointer is a multiple of the element size (every framework allocates so; a view
/// offset by a fraction of an element cannot be read with typed loads).
void check_element_aligned(const char* op, const char* arg, const TensorView& t);

/// Byte range [lo, hi) a view can touch; lo == hi for an empty view.
struct ByteExtent {
  std::uintptr_t lo = 0, hi = 0;
};
ByteExtent byte_extent(const TensorView& t);

/// The two views touch no common byte: exactly for views of at most two dimensions with a
/// contiguous last one, conservatively (disjoint extents) for others.
void check_no_overlap(const char* op, const char* out_arg, const TensorView& out,
                      const char* in_arg, const TensorView& in);

/// The rows of a 2-D output do not overlap each other: |row stride| >= row length.
void check_rows_disjoint(const char* op, const char* arg, const TensorView& t);

}  // namespace attnkit::detail
