// SPDX-License-Identifier: Apache-2.0
// The by-value parameter block of every top-k kernel, filled by dispatch.cu from a checked
// TopkProblem. Kernels read it and never validate it.
#pragma once

#include <cstdint>

#include "common/topk_keys.hpp"

namespace attnkit::detail::cuda {

/// Most slices a row is cut into (the merge kernel takes one thread a slice). Each filter slice
/// samples its whole row, so more slices than this cost more than they stream: 1 x 1M bf16
/// rows took 34-35 us with 32 or 64 slices, 35-40 with 128, 44-49 with 256 (run 104).
constexpr int kMaxSlices = 64;
/// The flag bit of TopkKernelParams::slice_count.
constexpr std::uint32_t kSliceFloored = 1u << 31;

struct TopkKernelParams {
  // Input rows.
  const void* x;
  std::int64_t row_len;
  std::int64_t row_stride;  // elements
  const void* begin;
  std::int64_t begin_stride;
  const void* end;
  std::int64_t end_stride;
  const void* index_offset;
  std::int64_t index_offset_stride;
  bool begin_is_int64, end_is_int64, index_offset_is_int64;

  // Outputs.
  void* values;  // nullptr: values not returned
  std::int64_t values_row_stride;
  void* indices;
  std::int64_t indices_row_stride;
  bool indices_int64;
  std::int64_t k;  // output width; slots past the selected ones are padding
  std::int64_t index_fill;
  std::uint32_t value_fill_bits;

  // Selection.
  ScoreParams sp;
  bool sort_by_value;
  std::uint32_t k_select;        // candidates a CTA keeps: min(k, N), at least 1
  std::uint32_t limit;           // survivors + newcomers that trigger a select: k + slack
  std::uint32_t newcomer_limit;  // newcomers that make room before the first select
  std::uint32_t survivor_slots;  // per survivor list: next power of two >= k_select
  std::uint32_t newcomer_slots;  // newcomer_limit + one round of appends
  // Short rows of 16-bit scores: words of the candidate list (0: no list, the registers are
  // resolved in place; topk_short_rows_kernel).
  std::uint32_t candidate_words;

  // Row slicing (1 <= slices <= kMaxSlices; > 1 for small batches): each slice's best
  // k_select go to slice_key/slice_col, at slot_stride slots a slice.
  int slices;
  std::uint32_t slot_stride;  // slots per slice, a multiple of 4
  std::uint32_t* slice_key;
  std::uint32_t* slice_col;
  // Filter slices: each slice's final threshold; every element it kept scores at least that.
  // Unless the merge rescans the row (fewer than k_select kept above the sampled floor), the
  // row's k-th best scores at least every slice's threshold (a slice that kept fewer than
  // k_select has the floor's, or 0 without one), so the merge admits only scores from their
  // maximum up, and from their minimum every candidate's score counts as a 16-bit select's base.
  std::uint32_t* slice_threshold;
  // Filter slices: the number of candidates each slice kept, | kSliceFloored when the row's
  // sampled floor bounded its admissions.
  std::uint32_t* slice_count;

  // Cluster rows: CTAs per row (one thread-block cluster when > 1), the sample's need and the
  // digits past its best that bound the first fp32 pass (cluster_sample, common/topk_sample.hpp).
  int cluster_ctas;
  std::uint32_t cluster_sample_need;
  std::uint32_t cluster_span_past;

  // Large k: (score << 32 | ~column) per selected element, [B, k], for sorted="value".
  std::uint64_t* ranked;

  int* nan_flag;  // set to 1 when a NaN is seen; nullptr unless nan = "raise"
  // Only for topk_nan_scan_kernel run to locate a NaN once nan_flag was set: lowered to
  // row << 32 | column of each NaN seen, so that it ends at the first in row-major order.
  unsigned long long* nan_at;
};

}  // namespace attnkit::detail::cuda
