// SPDX-License-Identifier: Apache-2.0
#include "core/check_util.hpp"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

namespace attnkit::detail {

void fail(ErrorCode code, const char* op, const std::string& message) {
  throw Error(code, std::string(op) + ": " + message);
}

std::string hex_address(std::uintptr_t address) {
  char text[2 + 2 * sizeof address + 1];
  std::snprintf(text, sizeof text, "%#" PRIxPTR, address);
  return text;
}

std::string shape_with_names(std::initializer_list<const char*> names,
                             std::initializer_list<std::int64_t> values) {
  std::string a = "[", b = "[";
  auto v = values.begin();
  bool first = true;
  for (const char* n : names) {
    if (!first) {
      a += ", ";
      b += ", ";
    }
    first = false;
    a += n;
    b += std::to_string(*v++);
  }
  return a + "] = " + b + "]";
}

std::string dtype_label(DType d) {
  std::string label = dtype_name(d);
  if (dtype_size(d) == 0) label += " (" + std::to_string(static_cast<int>(d)) + ")";
  return label;
}

void check_dtype(const char* op, const char* arg, const TensorView& t,
                 std::initializer_list<DType> allowed) {
  for (DType d : allowed) {
    if (t.dtype == d) return;
  }
  std::string list;
  std::size_t i = 0;
  for (DType d : allowed) {
    if (i) list += (i + 1 == allowed.size()) ? " or " : ", ";
    list += dtype_name(d);
    ++i;
  }
  fail(ErrorCode::kDType, op,
       std::string(arg) + ".dtype = " + dtype_label(t.dtype) + "; expected " + list);
}

void check_device(const char* op, const char* arg, const TensorView& t, Device device) {
  if (t.device != device) {
    fail(ErrorCode::kDevice, op,
         std::string(arg) + " is on " + device_name(t.device) + " but x is on " +
             device_name(device) + "; all tensors must be on the same device");
  }
}

void check_last_dim_contiguous(const char* op, const char* arg, const TensorView& t) {
  if (t.ndim == 0 || t.numel() == 0) return;  // empty views have arbitrary strides (NumPy: 0)
  const int d = t.ndim - 1;
  if (t.shape[d] > 1 && t.strides[d] != 1) {
    fail(ErrorCode::kLayout, op,
         std::string(arg) + ".stride(-1) = " + std::to_string(t.strides[d]) +
             " elements; the last dimension must be contiguous (stride 1)");
  }
}

void check_storage(const char* op, const char* arg, const TensorView& t) {
  if (t.ndim < 0 || t.ndim > kMaxDims) {
    fail(ErrorCode::kShape, op,
         std::string(arg) + ".ndim = " + std::to_string(t.ndim) + "; views hold 0 to " +
             std::to_string(kMaxDims) + " dimensions");
  }
  if (t.device.type != DeviceType::kCPU && t.device.type != DeviceType::kCUDA) {
    fail(ErrorCode::kDevice, op,
         std::string(arg) + " is on " + device_name(t.device) + "; expected cpu or cuda");
  }
  for (int d = 0; d < t.ndim; ++d) {
    if (t.shape[d] < 0) {
      fail(ErrorCode::kShape, op,
           std::string(arg) + " has shape " + t.shape_str() + "; sizes must be >= 0");
    }
  }
  if (t.numel() == 0) return;
  if (t.data == nullptr && t.ndim == 0) {  // what a default-constructed TensorView holds
    fail(ErrorCode::kValue, op,
         std::string(arg) + " is not set (a 0-d view with a null data pointer); it is required");
  }
  if (t.data == nullptr) {
    fail(ErrorCode::kValue, op,
         std::string(arg) + " has " + std::to_string(t.numel()) +
             " elements but a null data pointer");
  }
  // Every byte offset of the view must be computable: the span of its strides, in bytes,
  // stays below 2^62 (no memory is that large, and addresses plus offsets cannot wrap).
  const auto elem = static_cast<std::int64_t>(dtype_size(t.dtype));
  std::int64_t span = 0;
  for (int d = 0; d < t.ndim; ++d) {
    if (t.shape[d] <= 1) continue;  // a stride never stepped (even INT64_MIN) spans nothing
    std::int64_t step = 0;
    const std::int64_t stride = t.strides[d];
    const bool overflow = stride == std::numeric_limits<std::int64_t>::min() ||
                          __builtin_mul_overflow(t.shape[d] - 1, stride < 0 ? -stride : stride,
                                                 &step) ||
                          __builtin_mul_overflow(step, elem, &step) ||
                          __builtin_add_overflow(span, step, &span);
    if (overflow || span >= (std::int64_t{1} << 62)) {
      std::string strides = "(";
      for (int e = 0; e < t.ndim; ++e) strides += (e ? ", " : "") + std::to_string(t.strides[e]);
      fail(ErrorCode::kLayout, op,
           std::string(arg) + " has shape " + t.shape_str() + " and strides " + strides +
               "), whose byte span is 2^62 or more; views must span less");
    }
  }
}

void check_element_aligned(const char* op, const char* arg, const TensorView& t) {
  const auto addr = reinterpret_cast<std::uintptr_t>(t.data);
  const std::size_t elem = dtype_size(t.dtype);
  if (t.numel() > 0 && elem != 0 && addr % elem != 0) {
    fail(ErrorCode::kLayout, op,
         std::string(arg) + ".data = " + hex_address(addr) + " is not a multiple of its " +
             std::to_string(elem) + "-byte element size");
  }
}

ByteExtent byte_extent(const TensorView& t) {
  if (t.numel() == 0) return {};
  const auto base = reinterpret_cast<std::intptr_t>(t.data);
  const auto elem = static_cast<std::intptr_t>(dtype_size(t.dtype));
  std::intptr_t lo = base, hi = base;
  for (int d = 0; d < t.ndim; ++d) {
    const std::intptr_t span = static_cast<std::intptr_t>(t.shape[d] - 1) * t.strides[d] * elem;
    if (span < 0) {
      lo += span;
    } else {
      hi += span;
    }
  }
  return {static_cast<std::uintptr_t>(lo), static_cast<std::uintptr_t>(hi + elem)};
}

namespace {

/// A view of at most two dimensions with a contiguous last one, as byte intervals: `rows`
/// intervals of `width` bytes starting at `start + r * stride` (stride >= 0). Starts and ends
/// both rise with r, which is what rows_intersect needs (rows may overlap one another).
struct RowIntervals {
  std::intptr_t start = 0, stride = 0, width = 0;
  std::int64_t rows = 0;
};

bool as_row_intervals(const TensorView& t, RowIntervals& r) {
  const auto elem = static_cast<std::intptr_t>(dtype_size(t.dtype));
  const auto base = reinterpret_cast<std::intptr_t>(t.data);
  if (t.ndim == 0) {
    r = {base, 0, elem, 1};
    return true;
  }
  if (t.ndim > 2) return false;
  const int last = t.ndim - 1;
  if (t.ndim == 1 && t.shape[0] > 1 && t.strides[0] != 1) {
    // A strided vector (begin, end, index_offset as a column of a wider buffer): rows of one
    // element.
    r.width = elem;
    r.rows = t.shape[0];
    r.stride = static_cast<std::intptr_t>(t.strides[0]) * elem;
  } else {
    if (t.shape[last] > 1 && t.strides[last] != 1) return false;
    r.width = static_cast<std::intptr_t>(t.shape[last]) * elem;
    r.rows = t.ndim == 2 ? t.shape[0] : 1;
    // A single row's stride is never stepped (and may be any value: check_storage skips it).
    r.stride = r.rows > 1 ? static_cast<std::intptr_t>(t.strides[0]) * elem : 0;
  }
  r.start = base;
  if (r.stride < 0) {  // the same rows walked from the other end
    r.start += static_cast<std::intptr_t>(r.rows - 1) * r.stride;
    r.stride = -r.stride;
  }
  if (r.stride == 0) r.rows = 1;  // every row is the same bytes
  return true;
}

/// "[0x..., 0x...)": a view's byte extent, for the overlap errors.
std::string hex_range(const ByteExtent& e) {
  std::string text = "[";
  text += hex_address(e.lo);
  text += ", ";
  text += hex_address(e.hi);
  return text + ")";
}

/// Whether some interval of `a` meets some interval of `b`: a merge of the two rising
/// sequences, O(a.rows + b.rows).
bool rows_intersect(const RowIntervals& a, const RowIntervals& b) {
  std::int64_t i = 0, j = 0;
  while (i < a.rows && j < b.rows) {
    const std::intptr_t a_lo = a.start + static_cast<std::intptr_t>(i) * a.stride;
    const std::intptr_t b_lo = b.start + static_cast<std::intptr_t>(j) * b.stride;
    if (a_lo + a.width <= b_lo) {
      ++i;  // a's row i ends before b's row j, and every later row of b starts later
    } else if (b_lo + b.width <= a_lo) {
      ++j;
    } else {
      return true;
    }
  }
  return false;
}

}  // namespace

void check_no_overlap(const char* op, const char* out_arg, const TensorView& out,
                      const char* in_arg, const TensorView& in) {
  const ByteExtent a = byte_extent(out), b = byte_extent(in);
  if (a.lo == a.hi || b.lo == b.hi) return;
  if (out.device != in.device) return;
  if (!(a.lo < b.hi && b.lo < a.hi)) return;
  // Extents that meet may still interleave without a common byte (outputs written into the
  // spare columns of x's buffer): rows of 1-D and 2-D views are compared exactly.
  RowIntervals ra, rb;
  if (as_row_intervals(out, ra) && as_row_intervals(in, rb) && !rows_intersect(ra, rb)) return;
  fail(ErrorCode::kLayout, op,
       std::string(out_arg) + " (bytes " + hex_range(a) + ") overlaps " + in_arg + " (bytes " +
           hex_range(b) + "); outputs may not share memory with inputs or with each other");
}

void check_rows_disjoint(const char* op, const char* arg, const TensorView& t) {
  if (t.ndim != 2 || t.shape[0] <= 1 || t.shape[1] == 0) return;  // also every empty view
  if (std::llabs(t.strides[0]) < t.shape[1]) {
    fail(ErrorCode::kLayout, op,
         std::string(arg) + ".stride(0) = " + std::to_string(t.strides[0]) +
             " makes rows of length " + std::to_string(t.shape[1]) +
             " overlap; |stride(0)| must be >= the row length");
  }
}

}  // namespace attnkit::detail
