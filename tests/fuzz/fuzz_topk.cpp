// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for topk on the CPU. The input decodes into one call: dtype, B, N, k, every
// option, x's layout, begin/end/index_offset (values that may break the per-row rules, checked
// or clamped), and x's bit patterns (the remaining bytes, repeated to fill the rows). The call
// runs on the fast path and on the reference backend; both must agree bit for bit and match
// the independent reference of tests/cpp/topk_test_util.hpp (the expected error, untouched
// outputs on error, or exact outputs). ASan and UBSan, compiled into attnkit too, catch
// out-of-bounds accesses and undefined arithmetic on the way.
//
// Input layout (missing bytes read as 0):
//   [0]  dtype %3 | one_dim <<2 | layout <<3 (2 bits) | x_offset index <<5 (2 bits) | long <<7
//   [1]  largest | sorted <<1 (2 bits, %3) | nan <<3 (2 bits, %3) | ties <<5 | no values <<6 |
//        int32 indices <<7
//   [2]  ranges (2 bits) | int32 begin <<2 | int32 end <<3 | offset <<4 | int32 offset <<5 |
//        check off <<6 | row-vector stride 2 <<7
//   [3]  B %6 (bits 0-3; 1 for long rows) | threads - 1 (bits 4-5)
//   [4,5] N (little endian; a long row when [0] bit 7 and [4] >= 0xF0, longer when [5] >= 0xC0)
//   [6,7] k (bit 15 of it: k may exceed N freely)
//   [8]  row_pad (3 bits) | out_pad <<3 (3 bits) | index_fill choice <<6
//   [9]  value_fill choice
//   then per row: begin (2 bytes), end (2 bytes), index_offset choice (1 byte) and value (4)
//   the rest: x's bytes
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <vector>

#define ATTNKIT_TOPK_TEST_NO_GTEST
#include "topk_test_util.hpp"

namespace {

using namespace attnkit_test;

class Reader {
 public:
  Reader(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  std::uint8_t u8() { return pos_ < size_ ? data_[pos_++] : 0; }
  std::uint16_t u16() {
    const std::uint16_t lo = u8();
    return static_cast<std::uint16_t>(lo | (std::uint16_t{u8()} << 8));
  }
  std::uint32_t u32() {
    const std::uint32_t lo = u16();
    return lo | (std::uint32_t{u16()} << 16);
  }
  std::vector<std::uint8_t> rest() {
    std::vector<std::uint8_t> r(data_ + std::min(pos_, size_), data_ + size_);
    pos_ = size_;
    return r;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

/// A per-row value around [0, N]: mostly inside, sometimes one past either end.
std::int64_t row_value(std::uint16_t raw, std::int64_t n) {
  return static_cast<std::int64_t>(raw % static_cast<std::uint64_t>(n + 3)) - 1;
}

/// An index_offset: zero, the batch fold, the edges of the index dtypes, or raw bits.
std::int64_t offset_value(std::uint8_t choice, std::uint32_t raw, std::int64_t b, std::int64_t n) {
  constexpr std::int64_t kI32Max = std::numeric_limits<std::int32_t>::max();
  constexpr std::int64_t kI32Min = std::numeric_limits<std::int32_t>::min();
  switch (choice % 8) {
    case 0:
      return 0;
    case 1:
      return b * n;
    case 2:
      return kI32Max - (n - 1);  // the last column lands on INT32_MAX
    case 3:
      return kI32Max - n + 1 + static_cast<std::int64_t>(raw % 4);  // around that edge
    case 4:
      return kI32Min;
    case 5:
      return static_cast<std::int32_t>(raw);
    case 6:
      return -static_cast<std::int64_t>(raw % 1000);
    default:
      // Far outside int32, and at the int64 edge (refused when checked; when not, the index
      // arithmetic must still be defined).
      return raw & 1
                 ? (std::int64_t{1} << 40) + raw
                 : std::numeric_limits<std::int64_t>::max() - static_cast<std::int64_t>(raw % 4);
  }
}

TopkCase decode_case(const std::uint8_t* data, std::size_t size, std::vector<std::uint8_t>& bytes,
                     int& threads) {
  Reader r(data, size);
  TopkCase c;
  const std::uint8_t b0 = r.u8(), b1 = r.u8(), b2 = r.u8(), b3 = r.u8();
  c.dtype = kFloatDTypes[b0 % 3];
  c.one_dim = (b0 >> 2) & 1;
  c.layout = static_cast<XLayout>((b0 >> 3) & 3);
  const std::int64_t offsets[] = {0, 1, 3, 7};
  c.x_offset = offsets[(b0 >> 5) & 3];

  c.largest = b1 & 1;
  c.sorted = kAllOrders[((b1 >> 1) & 3) % 3];
  c.nan = kAllNanPolicies[((b1 >> 3) & 3) % 3];
  c.ties = kAllTiePolicies[(b1 >> 5) & 1];
  c.return_values = ((b1 >> 6) & 1) == 0;
  c.index_dtype = (b1 >> 7) ? DType::kInt32 : DType::kInt64;

  c.ranges = static_cast<Ranges>(b2 & 3);
  c.begin_dtype = (b2 >> 2) & 1 ? DType::kInt32 : DType::kInt64;
  c.end_dtype = (b2 >> 3) & 1 ? DType::kInt32 : DType::kInt64;
  c.with_offset = (b2 >> 4) & 1;
  c.offset_dtype = (b2 >> 5) & 1 ? DType::kInt32 : DType::kInt64;
  c.check = (b2 >> 6) & 1 ? CheckMode::kOff : CheckMode::kDefault;
  c.range_stride = 1 + ((b2 >> 7) & 1);

  threads = 1 + ((b3 >> 4) & 3);
  const std::uint16_t n16 = r.u16();
  const bool long_row = (b0 >> 7) && (n16 & 0xF0) == 0xF0;
  // Long rows reach the sampled threshold (rows of 4K-16K columns with k >= 32, any k from
  // 2^14 columns: cpu_row_floored); the longest, rarer still, the split of a row into segments
  // when rows are fewer than threads (>= 2^16 columns). A long row is a batch of its own and
  // only just past its threshold, so that a run stays cheap.
  const std::int64_t extra = (n16 >> 8) & 0x3F;
  const int length_class = n16 >> 14;
  c.n = !long_row              ? n16 % 1200
        : length_class == 3    ? 65536 + extra * 8
        : length_class == 2    ? 4096 + extra * 128
                               : 16384 + extra * 32;
  c.batch = c.one_dim || long_row ? 1 : (b3 & 0xF) % 6;
  const std::uint16_t k16 = r.u16();
  c.k = (k16 >> 15) ? (k16 & 0x7FFF) % 5000 : static_cast<std::int64_t>(k16 % (c.n + 9));

  const std::uint8_t b8 = r.u8();
  c.row_pad = b8 & 7;
  c.out_pad = (b8 >> 3) & 7;
  const std::int64_t index_fills[] = {-1, 0, std::numeric_limits<std::int32_t>::max(),
                                      std::numeric_limits<std::int32_t>::min()};
  c.index_fill = index_fills[b8 >> 6];
  const std::uint8_t b9 = r.u8();
  const double value_fills[] = {0.0, -0.0, 1.5, INFINITY, -INFINITY};
  if (b9 % 6 != 0) c.value_fill = value_fills[b9 % 6 - 1];

  // The per-row tensors' values; an offset is drawn for every row whether or not it is used,
  // so that one input byte keeps its meaning when other flags change.
  const bool has_begin = c.ranges == Ranges::kBegin || c.ranges == Ranges::kBoth;
  const bool has_end = c.ranges == Ranges::kEnd || c.ranges == Ranges::kBoth;
  for (std::int64_t b = 0; b < c.batch; ++b) {
    const std::int64_t lo = row_value(r.u16(), c.n), hi = row_value(r.u16(), c.n);
    const std::uint8_t choice = r.u8();
    const std::uint32_t raw = r.u32();
    if (has_begin) c.begin_values.push_back(lo);
    if (has_end) c.end_values.push_back(hi);
    std::int64_t off = offset_value(choice, raw, b, c.n);
    if (c.offset_dtype == DType::kInt32) {
      off = static_cast<std::int32_t>(static_cast<std::uint32_t>(static_cast<std::uint64_t>(off)));
    }
    c.offset_values.push_back(off);
  }
  if (!c.with_offset) c.offset_values.clear();
  // int32 begin/end hold what the int32 view reads.
  auto narrow = [](std::vector<std::int64_t>& v, DType d) {
    if (d != DType::kInt32) return;
    for (auto& x : v)
      x = static_cast<std::int32_t>(static_cast<std::uint32_t>(static_cast<std::uint64_t>(x)));
  };
  narrow(c.begin_values, c.begin_dtype);
  narrow(c.end_values, c.end_dtype);

  bytes = r.rest();
  c.dist = Dist::kFuzzBytes;
  c.bytes = &bytes;
  c.seed = 0;
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::uint8_t> bytes;
  int threads = 1;
  const TopkCase c = decode_case(data, size, bytes, threads);
  // Resizing the pool costs thread start-ups; do it only when the input asks for a change.
  if (attnkit::num_threads() != threads) attnkit::set_num_threads(threads);
  const std::string report = run_topk_case(c);
  if (!report.empty()) {
    std::fprintf(stderr, "topk mismatch: %s threads=%d\n%s", c.describe().c_str(), threads,
                 report.c_str());
    std::abort();
  }
  return 0;
}
