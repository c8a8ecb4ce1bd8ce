// SPDX-License-Identifier: Apache-2.0
// The CUDA top-k path for k > kMaxFilterK: a multi-pass radix select that re-reads the row.
//
//   topk_radix_kernel   one CTA per row. Pass p histograms the p-th 8-bit digit of the scores
//                       that match the digits fixed so far (2 passes for 16-bit types, 4 for
//                       float32), which fixes the k-th score K and how many elements equal to
//                       K are kept. A last pass walks the row in column order and writes each
//                       kept element at its rank (block prefix sums), so the output is in
//                       column order; for sorted="value" it writes (score, ~column) keys that
//                       cub::DeviceSegmentedSort then orders and topk_ranked_kernel writes out.
// Reads the row 3 (16-bit) or 5 (float32) times; the filter kernels read it once.
#pragma once

#include <cstdint>

#include "common/topk_keys.hpp"
#include "cuda/common/block_scan.cuh"
#include "cuda/topk/kernels/topk_filter.cuh"
#include "cuda/topk/topk_params.cuh"

namespace attnkit::detail::cuda {

template <class Traits, int kThreads>
__global__ void __launch_bounds__(kThreads) topk_radix_kernel(const TopkKernelParams p) {
  using Bits = typename Traits::Bits;
  __shared__ std::uint32_t hist[256];
  __shared__ std::uint32_t warp_totals[32];
  __shared__ std::uint32_t pivot_digit, pivot_need;

  const std::int64_t b = blockIdx.x;
  std::int64_t lo, hi;
  row_range(p, b, lo, hi);
  const Bits* row = static_cast<const Bits*>(p.x) + b * p.row_stride;
  const int tid = threadIdx.x;

  // Passes: fix the k-th score digit by digit.
  std::uint32_t prefix = 0, need = static_cast<std::uint32_t>(p.k);
  bool take_all = false;  // the row has <= k selectable elements
#pragma unroll 1
  for (int pass = 0; pass < Traits::kBits / 8; ++pass) {
    const int shift = Traits::kBits - 8 * (pass + 1);
    const int above_shift = pass == 0 ? 0 : shift + 8;
    if (tid < 256) hist[tid] = 0;
    __syncthreads();
    const bool track_nan = pass == 0 && p.nan_flag != nullptr;  // uniform
    bool any_nan = false;
    for (std::int64_t c = lo + tid; c < hi; c += kThreads) {
      const Bits bits = row[c];
      if (track_nan) any_nan |= is_nan_bits<Traits>(bits);
      const std::uint32_t s = score_of<Traits>(bits, p.sp);
      if (s != kExcludedScore && (pass == 0 || (s >> above_shift) == (prefix >> above_shift))) {
        atomicAdd(&hist[(s >> shift) & 0xFFu], 1u);
      }
    }
    if (track_nan) {
      if (__syncthreads_or(any_nan) && tid == 0) *p.nan_flag = 1;
    } else {
      __syncthreads();
    }
    const std::uint32_t count = tid < 256 ? hist[255 - tid] : 0u;
    std::uint32_t total;
    const std::uint32_t above = block_exclusive_sum<kThreads>(count, warp_totals, total);
    if (pass == 0 && total <= need) {  // uniform: every thread sees the same total
      take_all = true;
      need = total;
      break;
    }
    if (tid < 256 && above < need && need <= above + count) {
      pivot_digit = 255 - tid;
      pivot_need = need - above;
    }
    __syncthreads();
    prefix |= pivot_digit << shift;
    need = pivot_need;
  }
  // Keep scores > kth, and the first `keep_equal` scores == kth in column order.
  const std::uint32_t kth = take_all ? 1u : prefix;
  const std::uint32_t keep_equal = take_all ? 0xFFFFFFFFu : need;
  const std::uint32_t selected = take_all ? need : static_cast<std::uint32_t>(p.k);

  const std::int64_t offset =
      load_row_value(p.index_offset, p.index_offset_is_int64, p.index_offset_stride, b, 0);
  std::uint32_t greater_so_far = 0, equal_so_far = 0;
  for (std::int64_t t0 = lo; t0 < hi; t0 += kThreads) {
    const std::int64_t c = t0 + tid;
    const std::uint32_t s = c < hi ? score_of<Traits>(row[c], p.sp) : kExcludedScore;
    const bool greater = s > kth, equal = s == kth && s != kExcludedScore;
    std::uint32_t tile_total;
    const std::uint32_t before = block_exclusive_sum<kThreads>(
        (static_cast<std::uint32_t>(greater) << 16) | static_cast<std::uint32_t>(equal),
        warp_totals, tile_total);
    const std::uint32_t eq_rank = equal_so_far + (before & 0xFFFFu);
    if (greater || (equal && eq_rank < keep_equal)) {
      const std::int64_t pos = greater_so_far + (before >> 16) + min(eq_rank, keep_equal);
      if (p.ranked != nullptr) {
        p.ranked[b * p.k + pos] = (static_cast<std::uint64_t>(s) << 32) |
                                  static_cast<std::uint32_t>(~static_cast<std::uint32_t>(c));
      } else {
        write_slot<Traits>(p, b, pos, true, static_cast<std::uint32_t>(c), offset);
      }
    }
    greater_so_far += tile_total >> 16;
    equal_so_far += tile_total & 0xFFFFu;
  }

  // Padding.
  for (std::int64_t j = selected + tid; j < p.k; j += kThreads) {
    if (p.ranked != nullptr) {
      p.ranked[b * p.k + j] = 0;  // sorts after every selected key, then becomes padding
    } else {
      write_slot<Traits>(p, b, j, false, 0u, offset);
    }
  }
}

/// Writes outputs from sorted (score << 32 | ~column) keys; key 0 is padding.
template <class Traits, int kThreads>
__global__ void __launch_bounds__(kThreads) topk_ranked_kernel(const TopkKernelParams p,
                                                               const std::uint64_t* sorted) {
  const std::int64_t b = blockIdx.x;
  const std::int64_t offset =
      load_row_value(p.index_offset, p.index_offset_is_int64, p.index_offset_stride, b, 0);
  for (std::int64_t j = threadIdx.x; j < p.k; j += kThreads) {
    const std::uint64_t r = sorted[b * p.k + j];
    write_slot<Traits>(p, b, j, r != 0, ~static_cast<std::uint32_t>(r), offset);
  }
}

}  // namespace attnkit::detail::cuda
