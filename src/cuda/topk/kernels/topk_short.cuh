// SPDX-License-Identifier: Apache-2.0
// The CUDA top-k kernel for short rows (N <= kThreads * kPerThread, e.g. the 8K-column rows of
// a DSA prefill chunk): the whole row is held in registers, so one radix select over the
// registers replaces the filter's rounds, appends and repeated selects.
//
//   topk_short_rows_kernel  one CTA per row. Thread t holds the kPerThread consecutive columns
//                           starting at lo + t * kPerThread (loaded as 16-byte vectors when the
//                           row start is 16-byte aligned; L1 serves the strided lanes of one
//                           load from the lines the warp's first load brought in), so column
//                           order is thread order. Scores (docs/topk.md "Scores"; 0 for the
//                           columns outside [lo, hi) and for NaN with nan="ignore") go through
//                           a wide-digit radix select: 11 + 5 bits for 16-bit types, 11 + 11 +
//                           10 for fp32, one shared 2048-bin histogram, so that natural data
//                           (few exponents) spreads over many bins and atomics rarely collide.
//                           The k-th score K and how many candidates equal to K are kept give,
//                           through one block scan of packed (greater, equal) counts, every kept
//                           element's place in column order; they are written to shared memory
//                           (sorted best first for sorted="value") and then to the outputs.
#pragma once

#include <cstdint>

#include "common/topk_keys.hpp"
#include "cuda/common/block_scan.cuh"
#include "cuda/topk/block_select.cuh"
#include "cuda/topk/kernels/topk_filter.cuh"
#include "cuda/topk/topk_params.cuh"

namespace attnkit::detail::cuda {

constexpr int kShortDigitBits = 11;  // the widest digit
constexpr int kShortBins = 1 << kShortDigitBits;

/// What find_pivot_digit leaves for the whole block, and its scan's scratch.
struct PivotState {
  std::uint32_t warp_totals[32];
  std::uint32_t digit;       // the digit holding the need-th best
  std::uint32_t need;        // need less the count of the digits above it
  std::uint32_t count;       // the digit's own count
  std::uint32_t candidates;  // the histogram's total
};

struct ShortScratch {
  std::uint32_t hist[kShortBins];
  PivotState pivot;
};

/// Finds, in hist[0..bins) (counts by digit), the digit D holding the need-th best: the
/// candidates of digits above D number fewer than need, those of digits >= D at least need.
/// Leaves D, need minus the count above D and D's count in s.digit / s.need / s.count
/// (untouched when the total is below need), and the total in s.candidates. Every thread must
/// call it; the histogram must be complete (barrier before). Ends with a barrier.
template <int kThreads>
__device__ void find_pivot_digit(PivotState& s, const std::uint32_t* hist, int bins,
                                 std::uint32_t need) {
  const int per = bins > kThreads ? bins / kThreads : 1;  // digits a thread owns, top down
  const int first = threadIdx.x * per;
  std::uint32_t count = 0;
  for (int i = 0; i < per && first + i < bins; ++i) count += hist[bins - 1 - (first + i)];
  std::uint32_t total;
  std::uint32_t above = block_exclusive_sum<kThreads>(count, s.warp_totals, total);
  if (above < need && need <= above + count) {
    for (int i = 0; i < per; ++i) {
      const std::uint32_t c = hist[bins - 1 - (first + i)];
      if (above + c >= need) {
        s.digit = static_cast<std::uint32_t>(bins - 1 - (first + i));
        s.need = need - above;
        s.count = c;
        break;
      }
      above += c;
    }
  }
  if (threadIdx.x == 0) s.candidates = total;
  __syncthreads();
}

template <class Traits, int kThreads, int kPerThread>
__global__ void __launch_bounds__(kThreads) topk_short_rows_kernel(const TopkKernelParams p) {
  using Bits = typename Traits::Bits;
  constexpr int kVec = 16 / static_cast<int>(sizeof(Bits));
  static_assert(kPerThread % kVec == 0, "whole vectors per thread");
  extern __shared__ __align__(16) std::uint32_t smem[];  // kept keys and columns, [2][slots]
  __shared__ ShortScratch s;

  const std::int64_t b = blockIdx.x;
  std::int64_t lo, hi;
  row_range(p, b, lo, hi);
  const Bits* row = static_cast<const Bits*>(p.x) + b * p.row_stride;
  const int tid = threadIdx.x;
  const std::int64_t c0 = lo + static_cast<std::int64_t>(tid) * kPerThread;
  const bool track_nan = p.nan_flag != nullptr;

  // Scores of this thread's columns c0 .. c0 + kPerThread - 1 (0 outside [lo, hi)).
  std::uint32_t sc[kPerThread];
  bool any_nan = false;
  auto score_at = [&](std::uint32_t bits, std::int64_t col) {
    if (col >= hi) return kExcludedScore;
    if (track_nan) any_nan |= is_nan_bits<Traits>(bits);
    return score_of<Traits>(bits, p.sp);
  };
  if (reinterpret_cast<std::uintptr_t>(row + lo) % 16 == 0) {
#pragma unroll
    for (int v = 0; v < kPerThread / kVec; ++v) {
      const std::int64_t col = c0 + v * kVec;
      uint4 data{};
      if (col + kVec <= hi) {
        data = __ldg(reinterpret_cast<const uint4*>(row + col));
      } else if (col < hi) {  // the row's last, partial vector: only its real elements
        data = load_vector_prefix<kVec>(row + col, static_cast<int>(hi - col));
      }
#pragma unroll
      for (int j = 0; j < kVec; ++j) sc[v * kVec + j] = score_at(vector_element<kVec>(data, j), col + j);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const std::int64_t col = c0 + i;
      sc[i] = score_at(col < hi ? row[col] : Bits{0}, col);
    }
  }
  if (track_nan && __syncthreads_or(any_nan) && tid == 0) *p.nan_flag = 1;

  // Radix select of the k_select-th best score over the candidates (score != 0).
  constexpr int kKeyBits = Traits::kBits;
  constexpr int kPasses = kKeyBits == 16 ? 2 : 3;
  constexpr int kWidth[3] = {11, kKeyBits == 16 ? 5 : 11, 10};
  std::uint32_t prefix = 0, need = p.k_select;
  bool all_kept = false;
  int shift = kKeyBits;
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int width = kWidth[pass];
    const int above_shift = shift;  // bits fixed by earlier passes are those >= shift
    shift -= width;
    for (int i = tid; i < kShortBins; i += kThreads) s.hist[i] = 0;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const bool match = sc[i] != kExcludedScore &&
                         (pass == 0 || (sc[i] >> above_shift) == (prefix >> above_shift));
      if (match) atomicAdd(&s.hist[(sc[i] >> shift) & ((1u << width) - 1u)], 1u);
    }
    __syncthreads();
    find_pivot_digit<kThreads>(s.pivot, s.hist, 1 << width, need);
    if (pass == 0 && s.pivot.candidates <= need) {  // uniform: every candidate is kept
      all_kept = true;
      break;
    }
    prefix |= s.pivot.digit << shift;
    need = s.pivot.need;
    __syncthreads();  // pivot read by all before the next pass rewrites it
  }
  // Kept: score > kth, or score == kth among the first `keep_equal` such in column order.
  const std::uint32_t kth = all_kept ? 0u : prefix;
  const std::uint32_t keep_equal = all_kept ? 0u : need;

  std::uint32_t greater = 0, equal = 0;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    greater += sc[i] > kth;
    equal += sc[i] == kth && kth != kExcludedScore;
  }
  std::uint32_t total;
  const std::uint32_t before =
      block_exclusive_sum<kThreads>((greater << 16) | equal, s.pivot.warp_totals, total);
  const std::uint32_t kept = (total >> 16) + min(total & 0xFFFFu, keep_equal);
  const std::uint32_t slots = p.survivor_slots;
  std::uint32_t* key = smem;
  std::uint32_t* col = smem + slots;
  std::uint32_t equal_seen = before & 0xFFFFu;
  std::uint32_t pos = (before >> 16) + min(equal_seen, keep_equal);
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const bool is_equal = sc[i] == kth && kth != kExcludedScore;
    if (sc[i] > kth || (is_equal && equal_seen < keep_equal)) {
      key[pos] = sc[i];
      col[pos] = static_cast<std::uint32_t>(c0 + i);
      ++pos;
    }
    equal_seen += is_equal;
  }
  __syncthreads();
  if (p.sort_by_value && kept > 1) sort_best_first<kThreads>(key, col, kept, next_pow2(kept));
  write_outputs<Traits, kThreads>(p, b, Candidates{key, col, kept});
}

}  // namespace attnkit::detail::cuda
