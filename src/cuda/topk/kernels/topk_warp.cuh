// SPDX-License-Identifier: Apache-2.0
// The CUDA top-k kernel of one warp per row, for 16-bit rows of at most 8192 columns without
// sorted="value" (selected with ATTNKIT_CUDA_TOPK_PATH=warp; not yet the default anywhere).
// The short-row kernel spends about 35 instructions an element on such rows, most of them
// per-thread work that the block barriers and scans of its select chain cost a CTA; a warp
// alone needs no barrier, and a threshold filter tests most elements with one comparison.
//
//   topk_warp_rows_kernel  kWarpRowsWarps rows a CTA, one a warp. The warp takes a threshold T
//                          from a sample of 256 of its row's elements (the m-th best, m = e +
//                          3 sqrt(e) + 2, e = 256 k / length: the sample's expected share of
//                          the best k, so that at least k elements score T or more unless the
//                          sample misleads), then streams the row once in column order, eight
//                          elements a lane and 256 a step (16-byte loads where the row start is
//                          aligned), and appends the words (score << 16 | column - lo) of the
//                          elements scoring at least T to its list in shared memory, in column
//                          order (ballot and a warp prefix sum place them). A list that would
//                          overflow is cut to its best k first (two 8-bit radix passes over the
//                          warp's 256-bin histogram; among equal scores the first listed, the
//                          lowest columns, stay) and T rises above the k-th score, which no
//                          later column can beat by its index. A row that ends with fewer than
//                          k listed while T > 1 (the sample misled) is streamed again with
//                          T = 1. The best k of the list, still in column order, are the
//                          outputs, which serves sorted="none" and sorted="index" alike.
#pragma once

#include <cstdint>

#include "common/topk_keys.hpp"
#include "cuda/topk/kernels/topk_filter.cuh"
#include "cuda/topk/kernels/topk_short.cuh"
#include "cuda/topk/topk_params.cuh"

namespace attnkit::detail::cuda {

constexpr int kWarpRowsWarps = 4;       // rows (warps) a CTA
constexpr int kWarpRowsHistBins = 256;  // a warp's radix histogram: 8-bit digits
constexpr int kWarpRowsUnroll = 4;      // 16-byte loads a lane has in flight
// CTAs an SM the registers must allow: 72 registers on sm_80 and sm_90a (79 on sm_86 and
// sm_89), no spills (ptxas's own choice for these CTAs, 64 registers, spilled the loads in
// flight).
constexpr int kWarpRowsMinBlocks = 6;
constexpr unsigned kFullMask = 0xFFFFFFFFu;

__device__ __forceinline__ std::uint32_t warp_sum(std::uint32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return __reduce_add_sync(kFullMask, v);
#else
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
#endif
}

/// The k-th best score of a list and how many of the entries equal to it are kept (the first
/// ones in list order).
struct WarpKth {
  std::uint32_t score, keep_equal;
};

/// warp_kth of list[0, n) (n >= k >= 1): the score's top byte, then its low byte among the
/// entries of that top byte, each through the 256-bin histogram `hist` (lane l reads bins
/// 255 - 8l down to 248 - 8l, and one warp prefix sum finds the bin of the need-th best).
__device__ inline WarpKth warp_kth(const std::uint32_t* list, std::uint32_t n, std::uint32_t k,
                                   std::uint32_t* hist, int lane) {
  std::uint32_t prefix = 0, need = k;
#pragma unroll
  for (int pass = 0; pass < 2; ++pass) {
#pragma unroll
    for (int i = 0; i < kWarpRowsHistBins / 32; ++i) hist[lane + 32 * i] = 0;
    __syncwarp();
    for (std::uint32_t j = lane; j < n; j += 32) {
      const std::uint32_t s = list[j] >> 16;
      if (pass == 0) {
        atomicAdd(&hist[s >> 8], 1u);
      } else if (s >> 8 == prefix) {
        atomicAdd(&hist[s & 255u], 1u);
      }
    }
    __syncwarp();
    const int top = kWarpRowsHistBins - 1 - 8 * lane;
    std::uint32_t c[8], count = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      c[i] = hist[top - i];
      count += c[i];
    }
    const std::uint32_t upto = warp_inclusive_sum(count);
    std::uint32_t above = upto - count;
    const unsigned owner = __ballot_sync(kFullMask, above < need && need <= upto);
    const int src = __ffs(static_cast<int>(owner)) - 1;
    std::uint32_t digit = 0, rest = 0;
    if (lane == src) {
      bool found = false;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        if (!found && above + c[i] >= need) {
          found = true;
          digit = static_cast<std::uint32_t>(top - i);
          rest = need - above;
        }
        above += c[i];
      }
    }
    digit = __shfl_sync(kFullMask, digit, src);
    need = __shfl_sync(kFullMask, rest, src);
    prefix = pass == 0 ? digit : (prefix << 8 | digit);
    __syncwarp();  // the histogram read before the next pass clears it
  }
  return {prefix, need};
}

/// Keeps, in list order, the entries of list[0, n) scoring above kth.score and the first
/// kth.keep_equal scoring it; returns their count. In place: an entry moves only down, to
/// a place whose entry the warp has read already.
__device__ inline std::uint32_t warp_compact(std::uint32_t* list, std::uint32_t n, WarpKth kth,
                                             int lane) {
  const unsigned below = (1u << lane) - 1u;
  std::uint32_t kept = 0, equal_seen = 0;
  for (std::uint32_t base = 0; base < n; base += 32) {
    const std::uint32_t j = base + static_cast<std::uint32_t>(lane);
    const std::uint32_t w = j < n ? list[j] : 0u;  // score 0 is never listed
    __syncwarp();  // every lane's read before any lane's write below (a vote orders no memory)
    const std::uint32_t s = w >> 16;
    const bool is_equal = s == kth.score;
    const unsigned equal = __ballot_sync(kFullMask, is_equal);
    const bool keep =
        s > kth.score || (is_equal && equal_seen + __popc(equal & below) < kth.keep_equal);
    const unsigned keeps = __ballot_sync(kFullMask, keep);
    if (keep) list[kept + __popc(keeps & below)] = w;
    kept += __popc(keeps);
    equal_seen += __popc(equal);
  }
  __syncwarp();
  return kept;
}

/// The eight elements of row columns [c, c + 8) (c relative to `first`, the row's valid
/// start) as a 16-byte vector, zeros from the row's end on; `valid` receives how many are real.
template <class Bits>
__device__ __forceinline__ uint4 warp_rows_fetch(const Bits* first, std::int64_t len,
                                                 std::int64_t c, bool aligned, int& valid) {
  const std::int64_t rest = len - c;
  valid = rest <= 0 ? 0 : (rest >= 8 ? 8 : static_cast<int>(rest));
  if (aligned && valid == 8) return __ldg(reinterpret_cast<const uint4*>(first + c));
  if (valid > 0) return load_vector_prefix<8, Bits>(first + c, valid);
  return uint4{};
}

/// The words (score << 16 | column) of a fetched vector whose first column is `col`; 0 for
/// the elements past `valid`.
template <class Traits>
__device__ __forceinline__ void warp_rows_words(const uint4& data, int valid, std::uint32_t col,
                                                const ScoreParams& sp, std::uint32_t (&w)[8]) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const std::uint32_t pair = score_pair_of<Traits>(vector_word(data, q), sp);
    w[2 * q] = (pair << 16) | (col + 2 * q);
    w[2 * q + 1] = (pair & 0xFFFF0000u) | (col + 2 * q + 1);
  }
  if (valid < 8) {  // the row's last vector only: no selects on the others
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = i < valid ? w[i] : 0u;
  }
}

/// One warp per row (see the file comment). Dynamic shared memory: kWarpRowsWarps x
/// (p.survivor_slots + kWarpRowsHistBins) words, a warp's list being p.survivor_slots words, at
/// least k_select + 256 (warp_rows_capacity, topk_launch.cuh). Uses no block barrier: a warp
/// past the last row returns at once.
template <class Traits>
__global__ void __launch_bounds__(kWarpRowsWarps * 32, kWarpRowsMinBlocks)
    topk_warp_rows_kernel(const TopkKernelParams p) {
  static_assert(Traits::kBits == 16, "16-bit scores, with the column in the low half");
  using Bits = typename Traits::Bits;
  extern __shared__ __align__(16) std::uint32_t smem[];
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const std::int64_t b = static_cast<std::int64_t>(blockIdx.x) * kWarpRowsWarps + warp;
  if (b >= p.batch) return;
  const std::uint32_t capacity = p.survivor_slots;
  std::uint32_t* list = smem + warp * (capacity + kWarpRowsHistBins);
  std::uint32_t* hist = list + capacity;

  std::int64_t lo, hi;
  row_range(p, b, lo, hi);
  const std::int64_t len = hi - lo;
  const Bits* first = static_cast<const Bits*>(p.x) + b * p.row_stride + lo;
  const bool aligned = reinterpret_cast<std::uintptr_t>(first) % 16 == 0;
  const std::uint32_t k = p.k_select;
  const ScoreParams sp = p.sp;

  // The threshold from the sample: lane l's eight elements at the l-th 32nd of the row.
  std::uint32_t threshold = 1;
  const std::int64_t vectors = len / 8;
  if (len > static_cast<std::int64_t>(2 * k) && vectors >= 64) {  // uniform
    // Fast division and square root: the threshold decides the time only, never the result.
    const float e = __fdividef(256.0f * static_cast<float>(k), static_cast<float>(len));
    const float m = e + 3.0f * e * rsqrtf(e) + 2.0f;
    if (m < 256.0f) {
      const auto need = static_cast<std::uint32_t>(m);
      const std::int64_t c = vectors * lane / 32 * 8;
      int valid;
      const uint4 data = warp_rows_fetch(first, len, c, aligned, valid);
      std::uint32_t s[8];
      warp_rows_words<Traits>(data, valid, static_cast<std::uint32_t>(c), sp, s);
      std::uint32_t t = 0;
#pragma unroll 1
      for (int bit = 15; bit >= 0; --bit) {
        const std::uint32_t bound = (t | 1u << bit) << 16;
        std::uint32_t count = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) count += s[i] >= bound;
        if (warp_sum(count) >= need) t |= 1u << bit;
      }
      threshold = t > 1 ? t : 1;
    }
  }

  const bool track_nan = p.nan_flag != nullptr;
  bool any_nan = false;
  std::uint32_t n = 0;
  for (;;) {
    for (std::int64_t base = 0; base < len; base += 256 * kWarpRowsUnroll) {
      // kWarpRowsUnroll loads a lane in flight before the first is tested.
      uint4 data[kWarpRowsUnroll];
      int valid[kWarpRowsUnroll];
#pragma unroll
      for (int u = 0; u < kWarpRowsUnroll; ++u) {
        data[u] = warp_rows_fetch(first, len, base + 256 * u + 8 * lane, aligned, valid[u]);
      }
#pragma unroll
      for (int u = 0; u < kWarpRowsUnroll; ++u) {
        if (base + 256 * u >= len) break;  // uniform
        std::uint32_t w[8];
        warp_rows_words<Traits>(data[u], valid[u],
                                static_cast<std::uint32_t>(base + 256 * u + 8 * lane), sp, w);
        if (track_nan) {
#pragma unroll
          for (int i = 0; i < 8; ++i) any_nan |= w[i] >> 16 == sp.nan_score;  // not 0 then
        }
        std::uint32_t bound = threshold << 16;
        std::uint32_t hits = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) hits = count_at_least(hits, w[i], bound);
        if (__ballot_sync(kFullMask, hits != 0) == 0) continue;
        std::uint32_t upto = warp_inclusive_sum(hits);
        std::uint32_t total = __shfl_sync(kFullMask, upto, 31);
        if (n + total > capacity) {  // uniform; then n > capacity - 256 >= k
          const WarpKth kth = warp_kth(list, n, k, hist, lane);
          n = warp_compact(list, n, kth, lane);
          threshold = kth.score + 1;  // later columns lose ties to the kept ones
          bound = threshold << 16;
          hits = 0;
#pragma unroll
          for (int i = 0; i < 8; ++i) hits = count_at_least(hits, w[i], bound);
          upto = warp_inclusive_sum(hits);
          total = __shfl_sync(kFullMask, upto, 31);
        }
        std::uint32_t at = n + upto - hits;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          if (w[i] >= bound) list[at++] = w[i];
        }
        n += total;
        __syncwarp();
      }
    }
    if (n >= k || threshold <= 1) break;  // uniform
    // The sample misled: every valid element is a candidate.
    threshold = 1;
    n = 0;
  }
  if (track_nan && __any_sync(kFullMask, any_nan) && lane == 0) *p.nan_flag = 1;

  if (n > k) n = warp_compact(list, n, warp_kth(list, n, k, hist, lane), lane);
  const std::int64_t offset =
      load_row_value(p.index_offset, p.index_offset_is_int64, p.index_offset_stride, b, 0);
  const Bits* row = static_cast<const Bits*>(p.x) + b * p.row_stride;
  const auto lo32 = static_cast<std::uint32_t>(lo);
  for (std::uint32_t j = lane; j < n; j += 32) {
    const std::uint32_t w = list[j];
    const std::uint32_t col = lo32 + (w & 0xFFFFu);
    const std::uint32_t bits =
        p.values != nullptr ? kept_value_bits<Traits>(row, w >> 16, col, sp) : 0u;
    write_slot_bits<Traits>(p, b, j, true, col, offset, bits);
  }
  for (std::int64_t j = n + lane; j < p.k; j += 32) {
    write_slot_bits<Traits>(p, b, j, false, 0u, offset, 0u);
  }
}

}  // namespace attnkit::detail::cuda
