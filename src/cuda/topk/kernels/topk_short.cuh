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
  std::uint32_t top;         // the highest nonzero digit (find_pivot_digit with kFindTop)
};

struct ShortScratch {
  alignas(16) std::uint32_t hist[kShortBins];  // 16-byte reads in find_pivot_digit
  PivotState pivot;
};

/// Finds, in hist[lowest..kBins) (counts by digit), the digit D holding the need-th best: the
/// candidates of digits above D number fewer than need, those of digits >= D at least need.
/// Leaves D, need minus the count above D and D's count in s.digit / s.need / s.count
/// (untouched when the total is below need), and the total in s.candidates; with kFindTop also
/// the highest nonzero digit in s.top (untouched when the total is 0). Every thread must call
/// it; the histogram must be complete (barrier before). Ends with a barrier.
template <int kThreads, int kBins, bool kFindTop = false>
__device__ void find_pivot_digit(PivotState& s, const std::uint32_t* hist, std::uint32_t need,
                                 int lowest = 0) {
  constexpr int kPer = kBins > kThreads ? kBins / kThreads : 1;  // digits a thread owns
  static_assert(kPer == 1 || kPer % 4 == 0, "whole 16-byte vectors of digits");
  // Thread t owns digits [top - kPer, top), counted from the top digit down.
  const int top = kBins - static_cast<int>(threadIdx.x) * kPer;
  std::uint32_t c[kPer];
  if constexpr (kPer == 1) {
    c[0] = top >= 1 + lowest ? hist[top - 1] : 0u;
  } else {
#pragma unroll
    for (int v = 0; v < kPer / 4; ++v) {
      const uint4 q = reinterpret_cast<const uint4*>(hist + top - kPer)[v];
      c[4 * v] = q.x, c[4 * v + 1] = q.y, c[4 * v + 2] = q.z, c[4 * v + 3] = q.w;
    }
#pragma unroll
    for (int i = 0; i < kPer; ++i) c[i] = top - kPer + i >= lowest ? c[i] : 0u;
  }
  std::uint32_t count = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) count += c[i];
  std::uint32_t total;
  std::uint32_t above = block_exclusive_sum<kThreads>(count, s.warp_totals, total);
  if constexpr (kFindTop) {
    if (above == 0 && count > 0) {  // the one thread owning the highest nonzero digit
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        if (c[i] > 0) s.top = static_cast<std::uint32_t>(top - kPer + i);
      }
    }
  }
  if (above < need && need <= above + count) {
#pragma unroll
    for (int i = kPer - 1; i >= 0; --i) {  // c[kPer - 1] is this thread's top digit
      if (above < need && above + c[i] >= need) {
        s.digit = static_cast<std::uint32_t>(top - kPer + i);
        s.need = need - above;
        s.count = c[i];
      }
      above += c[i];
    }
  }
  if (threadIdx.x == 0) s.candidates = total;
  __syncthreads();
}

template <class Traits, int kThreads, int kPerThread>
__global__ void __launch_bounds__(kThreads, 4) topk_short_rows_kernel(const TopkKernelParams p) {
  using Bits = typename Traits::Bits;
  constexpr int kVec = 16 / static_cast<int>(sizeof(Bits));
  static_assert(kPerThread % kVec == 0, "whole vectors per thread");
  // Kept keys and columns, [2][slots], then as many for the sort with sorted="value".
  extern __shared__ __align__(16) std::uint32_t smem[];
  __shared__ ShortScratch s;

  const std::int64_t b = blockIdx.x;
  std::int64_t lo, hi;
  row_range(p, b, lo, hi);
  const Bits* row = static_cast<const Bits*>(p.x) + b * p.row_stride;
  const int tid = threadIdx.x;
  const std::int64_t c0 = lo + static_cast<std::int64_t>(tid) * kPerThread;
  // This thread's columns in [lo, hi) are c0 .. c0 + valid - 1. The per-element work below
  // tests no column bounds: they cost more instructions than the scores themselves.
  const std::int64_t rest = hi - c0;
  const int valid = rest <= 0 ? 0 : (rest >= kPerThread ? kPerThread : static_cast<int>(rest));

  std::uint32_t sc[kPerThread];
  if (reinterpret_cast<std::uintptr_t>(row + lo) % 16 == 0) {
#pragma unroll
    for (int v = 0; v < kPerThread / kVec; ++v) {
      const int first = v * kVec;
      uint4 data{};
      if (first + kVec <= valid) {
        data = __ldg(reinterpret_cast<const uint4*>(row + c0 + first));
      } else if (first < valid) {  // the row's last, partial vector: only its real elements
        data = load_vector_prefix<kVec>(row + c0 + first, valid - first);
      }
      if constexpr (Traits::kBits == 16) {
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          const std::uint32_t pair = score_pair_of<Traits>(vector_word(data, w), p.sp);
          sc[first + 2 * w] = pair & 0xFFFFu;
          sc[first + 2 * w + 1] = pair >> 16;
        }
      } else {
#pragma unroll
        for (int j = 0; j < kVec; ++j) sc[first + j] = score_of<Traits>(vector_word(data, j), p.sp);
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) sc[i] = score_of<Traits>(i < valid ? row[c0 + i] : Bits{0}, p.sp);
  }
  if (valid < kPerThread) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) sc[i] = i < valid ? sc[i] : kExcludedScore;
  }
  if (p.nan_flag != nullptr) {  // nan="raise": only a NaN has nan_score, and it is not 0
    bool any_nan = false;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) any_nan |= sc[i] == p.sp.nan_score;
    if (__syncthreads_or(any_nan) && tid == 0) *p.nan_flag = 1;
  }

  // Radix select of the k_select-th best score over the candidates (score != 0). Every number's
  // score is at least 0x7E for 16-bit types and 0x7FFFFE for fp32 (docs/topk.md "Scores"), so
  // the first pass's bin 0 holds only excluded scores: it counts every element unconditionally
  // and the pivot search starts at bin 1.
  constexpr int kKeyBits = Traits::kBits;
  constexpr int kPasses = kKeyBits == 16 ? 2 : 3;
  constexpr int kWidth[3] = {11, kKeyBits == 16 ? 5 : 11, 10};
  std::uint32_t prefix = 0, need = p.k_select;
  bool all_kept = false;
  int shift = kKeyBits;
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int width = kWidth[pass];
    const int above_shift = shift;  // bits fixed by earlier passes are those >= above_shift
    shift -= width;
    for (int i = tid; i < kShortBins; i += kThreads) s.hist[i] = 0;
    __syncthreads();
    if (pass == 0) {
      if (valid > 0) {
#pragma unroll
        for (int i = 0; i < kPerThread; ++i) atomicAdd(&s.hist[sc[i] >> shift], 1u);
      }
    } else {
      const std::uint32_t span = 1u << above_shift;  // the prefix's scores: prefix + [0, span)
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) {
        if (sc[i] - prefix < span) atomicAdd(&s.hist[(sc[i] >> shift) & ((1u << width) - 1u)], 1u);
      }
    }
    __syncthreads();
    if (pass == 0) {
      find_pivot_digit<kThreads, kShortBins>(s.pivot, s.hist, need, 1);
    } else if (kWidth[pass] == 5) {
      find_pivot_digit<kThreads, 32>(s.pivot, s.hist, need);
    } else if (kWidth[pass] == 10) {
      find_pivot_digit<kThreads, 1024>(s.pivot, s.hist, need);
    } else {
      find_pivot_digit<kThreads, kShortBins>(s.pivot, s.hist, need);
    }
    if (pass == 0 && s.pivot.candidates <= need) {  // uniform: every candidate is kept
      all_kept = true;
      break;
    }
    prefix |= s.pivot.digit << shift;
    need = s.pivot.need;
    __syncthreads();  // pivot read by all before the next pass rewrites it
  }
  // Kept: score > kth, or score == kth among the first `keep_equal` such in column order.
  const std::uint32_t kth = all_kept ? kExcludedScore : prefix;
  const std::uint32_t keep_equal = all_kept ? 0u : need;

  std::uint32_t greater = 0, equal = 0;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    if constexpr (kKeyBits == 16) {  // 16-bit scores: the sign of a difference is the comparison
      greater += (kth - sc[i]) >> 31;
      equal += (kth - 1u - sc[i]) >> 31;  // at least kth, for now
    } else {
      greater += sc[i] > kth;
      equal += sc[i] == kth;
    }
  }
  if constexpr (kKeyBits == 16) equal -= greater;
  if (kth == kExcludedScore) equal = 0;
  std::uint32_t total;
  const std::uint32_t before =
      block_exclusive_sum<kThreads>((greater << 16) | equal, s.pivot.warp_totals, total);
  const std::uint32_t kept = (total >> 16) + min(total & 0xFFFFu, keep_equal);
  const std::uint32_t slots = p.survivor_slots;
  std::uint32_t* key = smem;
  std::uint32_t* col = smem + slots;
  const std::uint32_t equal_before = before & 0xFFFFu;
  std::uint32_t pos = (before >> 16) + min(equal_before, keep_equal);
  const auto col0 = static_cast<std::uint32_t>(c0);
  if (equal_before >= keep_equal || equal_before + equal <= keep_equal) {
    // This thread keeps all of its elements equal to kth or none of them (every thread but
    // the one holding the last kept tie): one comparison an element.
    const std::uint32_t bound = equal_before >= keep_equal ? kth + 1 : kth;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      if (sc[i] >= bound) {
        key[pos] = sc[i];
        col[pos] = col0 + i;
        ++pos;
      }
    }
  } else {
    std::uint32_t equal_seen = equal_before;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const bool is_equal = sc[i] == kth;
      if (sc[i] > kth || (is_equal && equal_seen < keep_equal)) {
        key[pos] = sc[i];
        col[pos] = col0 + i;
        ++pos;
      }
      equal_seen += is_equal;
    }
  }
  __syncthreads();
  Candidates out{key, col, kept};
  if (p.sort_by_value && kept > 1) {  // through the spare lists, which follow with sorted="value"
    static_assert(sort_count_words<kThreads>() <= kShortBins, "the sort counts in the histogram");
    const Candidates spare{smem + 2 * slots, smem + 3 * slots, 0};
    out = sort_best_first<kThreads>(out, spare, s.hist, s.pivot.warp_totals);
  }
  write_outputs<Traits, kThreads>(p, b, out);
}

}  // namespace attnkit::detail::cuda
