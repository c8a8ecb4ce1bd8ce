// SPDX-License-Identifier: Apache-2.0
// nan="raise" with k = 0: nothing is selected, but a NaN inside a valid range must still
// raise (SPEC §1, as the CPU backend does), so the rows are scanned for one and nothing else.
//
//   topk_nan_scan_kernel  one CTA per row: each thread tests every kThreads-th element of the
//                         row's valid range and the block sets p.nan_flag if any is a NaN.
//                         Rare (k = 0 with nan="raise"), so it reads elements one at a time.
//                         With p.nan_at set (after any kernel set the flag, so that the error
//                         names the NaN as the CPU backend's does) each thread lowers it to its
//                         own first NaN's row << 32 | column instead (rows and columns are
//                         below 2^31).
#pragma once

#include <cstdint>

#include "common/topk_keys.hpp"
#include "cuda/topk/topk_params.cuh"

namespace attnkit::detail::cuda {

template <class Traits, int kThreads>
__global__ void __launch_bounds__(kThreads) topk_nan_scan_kernel(const TopkKernelParams p) {
  using Bits = typename Traits::Bits;
  const std::int64_t b = blockIdx.x;
  std::int64_t lo, hi;
  row_range(p, b, lo, hi);
  const Bits* row = static_cast<const Bits*>(p.x) + b * p.row_stride;
  if (p.nan_at != nullptr) {
    for (std::int64_t c = lo + threadIdx.x; c < hi; c += kThreads) {
      if (is_nan_bits<Traits>(row[c])) {
        atomicMin(p.nan_at, static_cast<unsigned long long>(b) << 32 |
                                static_cast<unsigned long long>(c));
        return;
      }
    }
    return;
  }
  bool any_nan = false;
  for (std::int64_t c = lo + threadIdx.x; c < hi && !any_nan; c += kThreads) {
    any_nan = is_nan_bits<Traits>(row[c]);
  }
  if (__syncthreads_or(any_nan) && threadIdx.x == 0) *p.nan_flag = 1;
}

}  // namespace attnkit::detail::cuda
