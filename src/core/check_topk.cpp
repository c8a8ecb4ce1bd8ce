// SPDX-License-Identifier: Apache-2.0
#include "core/check_topk.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "attnkit/error.hpp"
#include "common/float_bits.hpp"
#include "core/check_util.hpp"

namespace attnkit::detail {
namespace {

constexpr const char* kOp = "topk";
constexpr std::int64_t kMaxExtent = std::numeric_limits<std::int32_t>::max();  // 2^31 - 1

std::string str(std::int64_t v) { return std::to_string(v); }

RowVector check_row_vector(const char* arg, const std::optional<TensorView>& maybe_t,
                           std::int64_t batch, Device device) {
  if (!maybe_t) return {};
  const TensorView& t = *maybe_t;
  check_storage(kOp, arg, t);
  if (t.ndim != 1 || t.shape[0] != batch) {
    fail(ErrorCode::kShape, kOp,
         std::string(arg) + " has shape " + t.shape_str() + "; expected [B] = [" + str(batch) +
             "]");
  }
  check_dtype(kOp, arg, t, {DType::kInt32, DType::kInt64});
  check_device(kOp, arg, t, device);
  check_element_aligned(kOp, arg, t);
  return RowVector{t.data, t.dtype == DType::kInt64, t.strides[0]};
}

void check_output(const char* arg, const TensorView& t, const TensorView& x, std::int64_t batch,
                  std::int64_t k) {
  check_storage(kOp, arg, t);
  const bool one_row = x.ndim == 1;
  const bool ok = one_row ? (t.ndim == 1 && t.shape[0] == k)
                          : (t.ndim == 2 && t.shape[0] == batch && t.shape[1] == k);
  if (!ok) {
    fail(ErrorCode::kShape, kOp,
         std::string(arg) + " has shape " + t.shape_str() + "; expected " +
             (one_row ? shape_with_names({"k"}, {k}) : shape_with_names({"B", "k"}, {batch, k})));
  }
  check_device(kOp, arg, t, x.device);
  check_last_dim_contiguous(kOp, arg, t);
  check_element_aligned(kOp, arg, t);
  check_rows_disjoint(kOp, arg, t);
}

/// value_fill in x's format, rounded once to nearest-even from the double given.
std::uint32_t fill_bits(DType dtype, double v) {
  switch (dtype) {
    case DType::kFloat32: return double_to_float_bits(v, false);
    case DType::kBFloat16: return double_to_bf16_bits(v);
    case DType::kFloat16: return double_to_f16_bits(v);
    default: return 0;
  }
}

template <class E>
void check_enum(const char* name, E value, E last) {
  if (static_cast<int>(value) > static_cast<int>(last)) {
    fail(ErrorCode::kValue, kOp,
         std::string("options.") + name + " = " + str(static_cast<int>(value)) +
             " is not a valid enumerator");
  }
}

}  // namespace

TopkProblem check_topk_inputs(const TopkTensors& t, const TopkOptions& o) {
  TopkProblem p;

  // Check x.
  const TensorView& x = t.x;
  check_storage(kOp, "x", x);
  if (x.ndim != 1 && x.ndim != 2) {
    fail(ErrorCode::kShape, kOp,
         "x has " + str(x.ndim) + " dimensions (shape " + x.shape_str() +
             "); expected [B, N] or [N]");
  }
  check_dtype(kOp, "x", x, {DType::kFloat32, DType::kBFloat16, DType::kFloat16});
  check_last_dim_contiguous(kOp, "x", x);
  check_element_aligned(kOp, "x", x);
  p.batch = x.ndim == 2 ? x.shape[0] : 1;
  p.one_row = x.ndim == 1;
  p.row_len = x.shape[x.ndim - 1];
  // Rows with no columns, or a single row, never step by the row stride: it is not carried,
  // so that no kernel forms an address from a stride nothing checked (empty views skip the
  // span check).
  p.row_stride = x.ndim == 2 && p.row_len > 0 && p.batch > 1 ? x.strides[0] : 0;
  if (p.row_len > kMaxExtent) {
    fail(ErrorCode::kShape, kOp, "x has N = " + str(p.row_len) + " columns; N must be <= 2^31 - 1");
  }
  if (p.batch > kMaxExtent) {
    fail(ErrorCode::kShape, kOp, "x has B = " + str(p.batch) + " rows; B must be <= 2^31 - 1");
  }
  p.x = x.data;
  p.dtype = x.dtype;
  p.device = x.device;
#if !defined(ATTNKIT_WITH_CUDA)
  if (x.device.type == DeviceType::kCUDA) {
    fail(ErrorCode::kDevice, kOp,
         "x is on " + device_name(x.device) + " but this attnkit build has no CUDA backend");
  }
#endif

  // Check k and the options.
  if (o.k < 0) fail(ErrorCode::kValue, kOp, "k = " + str(o.k) + " must be >= 0");
  if (o.k > kMaxExtent) fail(ErrorCode::kValue, kOp, "k = " + str(o.k) + " must be <= 2^31 - 1");
  check_enum("sorted", o.sorted, TopkOrder::kValue);
  check_enum("nan", o.nan, NanPolicy::kRaise);
  check_enum("ties", o.ties, TiePolicy::kAny);
  check_enum("check", o.check, CheckMode::kOff);
  check_enum("backend", o.backend, TopkBackend::kReference);
  if (o.backend == TopkBackend::kReference && x.device.type != DeviceType::kCPU) {
    fail(ErrorCode::kDevice, kOp,
         "backend = reference runs on the CPU only, but x is on " + device_name(x.device));
  }
  p.k = o.k;
  p.largest = o.largest;
  p.order = o.sorted;
  p.nan = o.nan;
  p.ties = o.ties;
  p.backend = o.backend;
  p.check_rows = o.check == CheckMode::kOn ||
                 (o.check == CheckMode::kDefault && x.device.type == DeviceType::kCPU);
  const double fill = o.value_fill.value_or(o.largest ? -INFINITY : INFINITY);
  p.value_fill_bits = fill_bits(x.dtype, fill);

  // Check begin, end, index_offset.
  p.begin = check_row_vector("begin", t.begin, p.batch, x.device);
  p.end = check_row_vector("end", t.end, p.batch, x.device);
  p.index_offset = check_row_vector("index_offset", t.index_offset, p.batch, x.device);
  return p;
}

TopkProblem check_topk(const TopkTensors& t, const TopkOptions& o) {
  TopkProblem p = check_topk_inputs(t, o);
  const TensorView& x = t.x;

  // Check out_indices.
  check_output("out_indices", t.out_indices, x, p.batch, o.k);
  check_dtype(kOp, "out_indices", t.out_indices, {DType::kInt32, DType::kInt64});
  p.indices = t.out_indices.data;
  p.indices_int64 = t.out_indices.dtype == DType::kInt64;
  p.indices_row_stride = t.out_indices.ndim == 2 ? t.out_indices.strides[0] : 0;
  if (!p.indices_int64 && (o.index_fill < std::numeric_limits<std::int32_t>::min() ||
                           o.index_fill > std::numeric_limits<std::int32_t>::max())) {
    fail(ErrorCode::kValue, kOp,
         "index_fill = " + str(o.index_fill) + " does not fit the int32 indices");
  }
  p.index_fill = o.index_fill;

  // Check out_values.
  if (t.out_values) {
    const TensorView& v = *t.out_values;
    check_output("out_values", v, x, p.batch, o.k);
    if (v.dtype != x.dtype) {
      fail(ErrorCode::kDType, kOp,
           "out_values.dtype = " + dtype_label(v.dtype) + "; expected x.dtype = " +
               dtype_name(x.dtype));
    }
    p.values = v.data;
    p.values_row_stride = v.ndim == 2 ? v.strides[0] : 0;
    check_no_overlap(kOp, "out_values", v, "out_indices", t.out_indices);
  }

  // Outputs may not alias any input.
  auto check_against_inputs = [&](const char* name, const TensorView& out) {
    check_no_overlap(kOp, name, out, "x", x);
    if (t.begin) check_no_overlap(kOp, name, out, "begin", *t.begin);
    if (t.end) check_no_overlap(kOp, name, out, "end", *t.end);
    if (t.index_offset) check_no_overlap(kOp, name, out, "index_offset", *t.index_offset);
  };
  check_against_inputs("out_indices", t.out_indices);
  if (t.out_values) check_against_inputs("out_values", *t.out_values);
  return p;
}

void check_topk_row_values(const TopkProblem& p, const RowVector& begin, const RowVector& end,
                           const RowVector& index_offset) {
  // Without row tensors every row is [0, N] as it stands: nothing to read, even for 2^31 rows.
  if (begin.data == nullptr && end.data == nullptr && index_offset.data == nullptr) return;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int64_t lo = host_row_value(begin, b, 0);
    const std::int64_t hi = host_row_value(end, b, p.row_len);
    if (lo < 0 || lo > p.row_len) {
      fail(ErrorCode::kValue, kOp,
           "begin[" + str(b) + "] = " + str(lo) + " is outside [0, N] = [0, " + str(p.row_len) +
               "]");
    }
    if (hi < lo || hi > p.row_len) {
      fail(ErrorCode::kValue, kOp,
           "end[" + str(b) + "] = " + str(hi) + " is outside [begin[" + str(b) + "], N] = [" +
               str(lo) + ", " + str(p.row_len) + "]");
    }
    if (index_offset.data == nullptr || hi == lo || p.k == 0) continue;
    const std::int64_t off = host_row_value(index_offset, b, 0);
    std::int64_t lowest = 0, highest = 0;
    const bool fits64 = !__builtin_add_overflow(lo, off, &lowest) &&
                        !__builtin_add_overflow(hi - 1, off, &highest);
    const bool fits32 = fits64 && lowest >= std::numeric_limits<std::int32_t>::min() &&
                        highest <= std::numeric_limits<std::int32_t>::max();
    if (!(p.indices_int64 ? fits64 : fits32)) {
      // The columns whose index leaves [tmin, tmax]: above tmax - off for a positive offset,
      // below tmin - off otherwise (columns are >= 0; neither bound overflows).
      const std::int64_t tmin = p.indices_int64 ? std::numeric_limits<std::int64_t>::min()
                                                : std::numeric_limits<std::int32_t>::min();
      const std::int64_t tmax = p.indices_int64 ? std::numeric_limits<std::int64_t>::max()
                                                : std::numeric_limits<std::int32_t>::max();
      const std::int64_t first = off > 0 ? std::max(lo, tmax - off + 1) : lo;
      const std::int64_t last = off > 0 ? hi : std::min(hi, tmin - off);
      fail(ErrorCode::kValue, kOp,
           "index_offset[" + str(b) + "] = " + str(off) + " moves indices of columns [" +
               str(first) + ", " + str(last) + ") outside the range of " +
               (p.indices_int64 ? "int64" : "int32"));
    }
  }
}

}  // namespace attnkit::detail
