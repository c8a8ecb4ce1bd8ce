// SPDX-License-Identifier: Apache-2.0
// Block-wide selection over the candidate buffer in shared memory: the reconstruct (a radix
// select that keeps the best k in column order) and the best-first sort of the final k.
#pragma once

#include <cstdint>

#include "cuda/common/block_scan.cuh"

namespace attnkit::detail::cuda {

/// Shared scratch of select_best.
struct SelectScratch {
  std::uint32_t hist[256];
  std::uint32_t warp_totals[32];
  std::uint32_t pivot_digit;
  std::uint32_t pivot_need;
};

/// Keeps the best k of the n candidates (key[i], col[i]) (n > k >= 1), in place, in their
/// column order, and returns the k-th best key. Best = larger key, then lower column; the
/// buffer is in column order, so the lowest-index ties are the first ones met.
///
/// Algorithm: every thread stages kItems consecutive candidates in registers (kItems odd, so
/// the strided shared-memory reads hit distinct banks), a radix select with 8-bit digits from
/// the top finds the k-th key K and how many candidates equal to K to keep, and one block
/// scan of packed (greater, equal) counts gives each thread its output position. All threads
/// have read their items before the scan's barrier, so the in-place writes are safe.
/// Candidates never have key 0 (excluded scores are never admitted), which the register
/// padding uses. Requires n <= kThreads * kItems <= 65535 (packed 16-bit counts).
template <int kThreads, int kItems, int kKeyBits>
__device__ std::uint32_t select_best(std::uint32_t* key, std::uint32_t* col, std::uint32_t n,
                                     std::uint32_t k, SelectScratch& s) {
  static_assert(kThreads >= 256, "one thread per histogram bin");
  static_assert(kItems % 2 == 1, "an odd stride keeps the staging reads free of bank conflicts");
  static_assert(kThreads * kItems <= 65535, "counts are packed in 16 bits");
  static_assert(kKeyBits == 16 || kKeyBits == 32, "keys of 16 or 32 bits");
  __syncthreads();  // the appends that filled the buffer are visible
  std::uint32_t rk[kItems], rc[kItems];
  const std::uint32_t base = threadIdx.x * kItems;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const std::uint32_t p = base + i;
    rk[i] = p < n ? key[p] : 0u;
    rc[i] = p < n ? col[p] : 0u;
  }

  std::uint32_t prefix = 0, need = k;
#pragma unroll
  for (int pass = 0; pass < kKeyBits / 8; ++pass) {
    const int shift = kKeyBits - 8 * (pass + 1);
    const int above_shift = pass == 0 ? 0 : shift + 8;  // bits already fixed by earlier passes
    if (threadIdx.x < 256) s.hist[threadIdx.x] = 0;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      // Padding (key 0) never matches: a digit-0 prefix is possible for small keys.
      const bool match = rk[i] != 0u &&
                         (pass == 0 || (rk[i] >> above_shift) == (prefix >> above_shift));
      if (match) atomicAdd(&s.hist[(rk[i] >> shift) & 0xFFu], 1u);
    }
    __syncthreads();
    // Thread t owns digit 255 - t; the exclusive sum counts the candidates of higher digits.
    const std::uint32_t count = threadIdx.x < 256 ? s.hist[255 - threadIdx.x] : 0u;
    std::uint32_t total;
    const std::uint32_t above = block_exclusive_sum<kThreads>(count, s.warp_totals, total);
    if (threadIdx.x < 256 && above < need && need <= above + count) {
      s.pivot_digit = 255 - threadIdx.x;
      s.pivot_need = need - above;
    }
    __syncthreads();
    prefix |= s.pivot_digit << shift;
    need = s.pivot_need;
  }
  const std::uint32_t kth = prefix;  // `need` candidates equal to kth are kept

  std::uint32_t greater = 0, equal = 0;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    greater += rk[i] > kth;
    equal += rk[i] == kth;
  }
  std::uint32_t total;
  const std::uint32_t before =
      block_exclusive_sum<kThreads>((greater << 16) | equal, s.warp_totals, total);
  std::uint32_t equal_seen = before & 0xFFFFu;
  std::uint32_t pos = (before >> 16) + min(equal_seen, need);
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const bool is_equal = rk[i] == kth;
    const bool keep = rk[i] > kth || (is_equal && equal_seen < need);
    equal_seen += is_equal;
    if (keep) {
      key[pos] = rk[i];
      col[pos] = rc[i];
      ++pos;
    }
  }
  __syncthreads();
  return kth;
}

/// Sorts the first n candidates best first (key descending, then column ascending) with a
/// bitonic network over `padded` = the next power of two >= n slots, which must fit the buffer.
template <int kThreads>
__device__ void sort_best_first(std::uint32_t* key, std::uint32_t* col, std::uint32_t n,
                                std::uint32_t padded) {
  for (std::uint32_t p = n + threadIdx.x; p < padded; p += kThreads) {
    key[p] = 0u;            // below every candidate
    col[p] = 0xFFFFFFFFu;
  }
  for (std::uint32_t size = 2; size <= padded; size <<= 1) {
    for (std::uint32_t stride = size >> 1; stride > 0; stride >>= 1) {
      __syncthreads();
      for (std::uint32_t i = threadIdx.x; i < padded / 2; i += kThreads) {
        const std::uint32_t lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
        const bool ascending = (lo & size) == 0;
        const std::uint32_t ka = key[lo], kb = key[hi], ca = col[lo], cb = col[hi];
        const bool hi_first = kb > ka || (kb == ka && cb < ca);
        if (hi_first == ascending) {
          key[lo] = kb;
          key[hi] = ka;
          col[lo] = cb;
          col[hi] = ca;
        }
      }
    }
  }
  __syncthreads();
}

}  // namespace attnkit::detail::cuda
