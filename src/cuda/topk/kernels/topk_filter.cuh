// SPDX-License-Identifier: Apache-2.0
// The CUDA top-k kernels for k <= kMaxFilterK: one read of each row through a threshold filter
// into a candidate buffer in shared memory, cut back to k by a block radix select whenever it
// fills. Algorithm, invariants and bound: docs/topk.md.
//
//   topk_rows_kernel   one CTA per (row, slice). A slice streams its columns in order with
//                      16-byte loads kPrefetch tiles ahead; each tile's elements that beat
//                      the threshold are appended in column order (a block prefix sum gives
//                      the slots); a full buffer is cut to the best k (select_best) and the
//                      threshold rises to the k-th key. Single-slice launches write the
//                      outputs; multi-slice launches write each slice's best k to workspace.
//   topk_merge_kernel  one CTA per row: streams the slices' (key, column) lists, which are in
//                      column order slice after slice, through the same filter, and writes the
//                      outputs. Used when B is too small to fill the GPU with one CTA per row.
//
// Thread roles: all threads load, filter and append; all take part in every select. Shared
// memory: key[cap] and col[cap] (dynamic), SelectScratch and the per-warp append counts.
#pragma once

#include <cstdint>

#include "common/topk_keys.hpp"
#include "cuda/common/block_scan.cuh"
#include "cuda/topk/block_select.cuh"
#include "cuda/topk/topk_params.cuh"

namespace attnkit::detail::cuda {

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ std::int64_t load_row_value(const void* p, bool is_int64,
                                                       std::int64_t stride, std::int64_t b,
                                                       std::int64_t fallback) {
  if (p == nullptr) return fallback;
  return is_int64 ? static_cast<const std::int64_t*>(p)[b * stride]
                  : static_cast<const std::int32_t*>(p)[b * stride];
}

/// Row b's valid range, clamped so that 0 <= lo <= hi <= N whatever begin/end hold: device
/// values are never trusted (check=True validates them on the host instead).
__device__ __forceinline__ void row_range(const TopkKernelParams& p, std::int64_t b,
                                          std::int64_t& lo, std::int64_t& hi) {
  const std::int64_t e = load_row_value(p.end, p.end_is_int64, p.end_stride, b, p.row_len);
  hi = e < 0 ? 0 : (e > p.row_len ? p.row_len : e);
  const std::int64_t s = load_row_value(p.begin, p.begin_is_int64, p.begin_stride, b, 0);
  lo = s < 0 ? 0 : (s > hi ? hi : s);
}

__device__ __forceinline__ std::uint32_t next_pow2(std::uint32_t v) {
  return v <= 1 ? 1u : 1u << (32 - __clz(v - 1));
}

// ---------------------------------------------------------------------------------------------
// The filter engine: per-CTA state and the steps every kernel shares
// ---------------------------------------------------------------------------------------------

template <class Traits, int kThreads, int kItems>
struct FilterEngine {
  static constexpr int kWarps = kThreads / kWarpSize;

  std::uint32_t* key;  // [cap] candidate keys, column order
  std::uint32_t* col;  // [cap] candidate columns
  SelectScratch& scratch;
  std::uint32_t* warp_hits;  // [2][32]: append counts per warp, double-buffered by tile parity
  std::uint32_t k;           // candidates kept by a select
  std::uint32_t limit;       // buffer fill that triggers a select (k + slack)
  std::uint32_t count = 0;
  std::uint32_t threshold = kExcludedScore;  // admit only scores above it
  std::uint32_t parity = 0;

  /// Offers this thread's V candidates of one tile (score[j], cols[j]), the first `valid` of
  /// which are real. Every thread of the block calls it once per tile. Appends the winners in
  /// thread order, which is column order, and selects when the buffer is full.
  template <int V>
  __device__ __forceinline__ void offer(const std::uint32_t (&score)[V],
                                        const std::uint32_t (&cols)[V], int valid) {
    std::uint32_t mask = 0;
#pragma unroll
    for (int j = 0; j < V; ++j) mask |= (j < valid && score[j] > threshold) ? (1u << j) : 0u;
    const std::uint32_t hits = __popc(mask);
    const std::uint32_t inclusive = warp_inclusive_sum(hits);
    const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
    std::uint32_t* slot = warp_hits + parity * 32;
    if (lane == kWarpSize - 1) slot[warp] = inclusive;
    __syncthreads();
    std::uint32_t before = 0, total = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const std::uint32_t t = slot[w];
      before += w < warp ? t : 0u;
      total += t;
    }
    // Reusing `slot` two tiles later is safe: every thread passes the next tile's barrier
    // only after these reads.
    parity ^= 1u;
    if (mask != 0) {
      std::uint32_t pos = count + before + inclusive - hits;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        if (mask & (1u << j)) {
          key[pos] = score[j];
          col[pos] = cols[j];
          ++pos;
        }
      }
    }
    count += total;
    if (count >= limit) {
      threshold = select_best<kThreads, kItems, Traits::kBits>(key, col, count, k, scratch);
      count = k;
    }
  }

  /// Cuts the buffer to k and, for sorted="value", sorts it best first. Returns the count.
  __device__ std::uint32_t finish(bool sort_by_value) {
    __syncthreads();
    if (count > k) {
      select_best<kThreads, kItems, Traits::kBits>(key, col, count, k, scratch);
      count = k;
    }
    if (sort_by_value && count > 1) sort_best_first<kThreads>(key, col, count, next_pow2(count));
    return count;
  }
};

/// Scores of the elements of one 16-byte vector.
template <class Traits>
struct VectorTraits {
  using Bits = typename Traits::Bits;
  static constexpr int kVec = 16 / static_cast<int>(sizeof(Bits));
};

template <class Traits, int kVec>
__device__ __forceinline__ void score_vector(const uint4& v, ScoreParams sp, std::uint32_t col0,
                                             std::uint32_t (&score)[kVec],
                                             std::uint32_t (&cols)[kVec], bool& any_nan) {
  const std::uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    std::uint32_t bits;
    if constexpr (kVec == 4) {
      bits = words[j];
    } else {
      bits = (words[j / 2] >> (16 * (j % 2))) & 0xFFFFu;  // little endian: low half first
    }
    any_nan |= is_nan_bits<Traits>(bits);
    score[j] = score_of<Traits>(bits, sp);
    cols[j] = col0 + static_cast<std::uint32_t>(j);
  }
}

/// Streams columns [lo, hi) of `row` through the engine in column order: a scalar head up to
/// 16-byte alignment, whole tiles of 16-byte vectors kPrefetch tiles ahead, then the leftover
/// vectors and scalars. Returns whether this thread saw a NaN.
template <class Traits, int kThreads, int kItems, int kPrefetch>
__device__ bool stream_row(FilterEngine<Traits, kThreads, kItems>& e,
                           const typename Traits::Bits* row, std::int64_t lo, std::int64_t hi,
                           ScoreParams sp) {
  using Bits = typename Traits::Bits;
  constexpr int kVec = VectorTraits<Traits>::kVec;
  const int tid = threadIdx.x;
  bool any_nan = false;

  // One scalar element per thread (the head and the last scalars are < kVec elements).
  auto scalar_tile = [&](std::int64_t first, std::int64_t n) {
    std::uint32_t score[1] = {kExcludedScore}, cols[1] = {0};
    if (tid < n) {
      const std::uint32_t bits = row[first + tid];
      any_nan |= is_nan_bits<Traits>(bits);
      score[0] = score_of<Traits>(bits, sp);
      cols[0] = static_cast<std::uint32_t>(first + tid);
    }
    e.template offer<1>(score, cols, tid < n ? 1 : 0);
  };

  const auto addr = reinterpret_cast<std::uintptr_t>(row + lo);
  const std::int64_t to_align = static_cast<std::int64_t>(((16 - addr % 16) % 16) / sizeof(Bits));
  const std::int64_t head = to_align < hi - lo ? to_align : hi - lo;
  if (head > 0) scalar_tile(lo, head);

  const std::int64_t a0 = lo + head;
  const std::int64_t vectors = (hi - a0) / kVec;
  const std::int64_t tiles = vectors / kThreads;
  const uint4* vec = reinterpret_cast<const uint4*>(row + a0);

  uint4 buf[kPrefetch];
#pragma unroll
  for (int t = 0; t < kPrefetch; ++t) {
    if (t < tiles) buf[t] = __ldg(vec + static_cast<std::int64_t>(t) * kThreads + tid);
  }
  for (std::int64_t t0 = 0; t0 < tiles; t0 += kPrefetch) {
#pragma unroll
    for (int u = 0; u < kPrefetch; ++u) {
      const std::int64_t t = t0 + u;
      if (t < tiles) {  // uniform across the block
        const uint4 v = buf[u];
        if (t + kPrefetch < tiles) buf[u] = __ldg(vec + (t + kPrefetch) * kThreads + tid);
        std::uint32_t score[kVec], cols[kVec];
        const std::int64_t c0 = a0 + (t * kThreads + tid) * kVec;
        score_vector<Traits, kVec>(v, sp, static_cast<std::uint32_t>(c0), score, cols, any_nan);
        e.template offer<kVec>(score, cols, kVec);
      }
    }
  }

  const std::int64_t rest_vectors = vectors - tiles * kThreads;  // < kThreads
  if (rest_vectors > 0) {
    std::uint32_t score[kVec], cols[kVec];
    bool mine = tid < rest_vectors;
    if (mine) {
      const std::int64_t v = tiles * kThreads + tid;
      score_vector<Traits, kVec>(__ldg(vec + v), sp, static_cast<std::uint32_t>(a0 + v * kVec),
                                 score, cols, any_nan);
    }
    e.template offer<kVec>(score, cols, mine ? kVec : 0);
  }
  const std::int64_t rest = (hi - a0) - vectors * kVec;  // < kVec
  if (rest > 0) scalar_tile(a0 + vectors * kVec, rest);
  return any_nan;
}

/// Writes row b's outputs from the n finished candidates, then the padding.
template <class Traits, int kThreads>
__device__ void write_outputs(const TopkKernelParams& p, std::int64_t b, const std::uint32_t* col,
                              std::uint32_t n) {
  using Bits = typename Traits::Bits;
  const Bits* row = static_cast<const Bits*>(p.x) + b * p.row_stride;
  const std::int64_t offset =
      load_row_value(p.index_offset, p.index_offset_is_int64, p.index_offset_stride, b, 0);
  for (std::int64_t j = threadIdx.x; j < p.k; j += kThreads) {
    const bool real = j < n;
    const std::uint32_t c = real ? col[j] : 0u;
    if (p.indices_int64) {
      static_cast<std::int64_t*>(p.indices)[b * p.indices_row_stride + j] =
          real ? static_cast<std::int64_t>(c) + offset : p.index_fill;
    } else {
      static_cast<std::int32_t*>(p.indices)[b * p.indices_row_stride + j] =
          real ? static_cast<std::int32_t>(static_cast<std::uint32_t>(c + offset))
               : static_cast<std::int32_t>(p.index_fill);
    }
    if (p.values != nullptr) {
      // Values are read back from x by column (a hit in L2, which just streamed the row), so
      // they are the input's bits exactly: -0.0 and NaN payloads survive.
      static_cast<Bits*>(p.values)[b * p.values_row_stride + j] =
          real ? row[c] : static_cast<Bits>(p.value_fill_bits);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------------------

template <class Traits, int kThreads, int kItems, int kPrefetch, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks) topk_rows_kernel(const TopkKernelParams p) {
  extern __shared__ __align__(16) std::uint32_t smem[];
  __shared__ SelectScratch scratch;
  __shared__ std::uint32_t warp_hits[64];

  const std::int64_t b = blockIdx.x / p.slices;
  const std::int64_t s = blockIdx.x % p.slices;
  std::int64_t lo, hi;
  row_range(p, b, lo, hi);
  const std::int64_t len = hi - lo;
  const std::int64_t seg_lo = lo + len * s / p.slices, seg_hi = lo + len * (s + 1) / p.slices;

  FilterEngine<Traits, kThreads, kItems> e{smem, smem + p.cap, scratch, warp_hits, p.k_select,
                                           p.limit};
  const auto* row = static_cast<const typename Traits::Bits*>(p.x) + b * p.row_stride;
  const bool any_nan = stream_row<Traits, kThreads, kItems, kPrefetch>(e, row, seg_lo, seg_hi, p.sp);
  if (__syncthreads_or(p.nan_flag != nullptr && any_nan) && threadIdx.x == 0) *p.nan_flag = 1;

  if (p.slices == 1) {
    const std::uint32_t n = e.finish(p.sort_by_value);
    write_outputs<Traits, kThreads>(p, b, e.col, n);
  } else {
    const std::uint32_t n = e.finish(false);
    const std::int64_t base = (b * p.slices + s) * p.slot_stride;
    for (std::uint32_t j = threadIdx.x; j < p.slot_stride; j += kThreads) {
      p.slice_key[base + j] = j < n ? e.key[j] : kExcludedScore;
      p.slice_col[base + j] = j < n ? e.col[j] : 0u;
    }
  }
}

template <class Traits, int kThreads, int kItems>
__global__ void __launch_bounds__(kThreads, 1) topk_merge_kernel(const TopkKernelParams p) {
  extern __shared__ __align__(16) std::uint32_t smem[];
  __shared__ SelectScratch scratch;
  __shared__ std::uint32_t warp_hits[64];

  const std::int64_t b = blockIdx.x;
  FilterEngine<Traits, kThreads, kItems> e{smem, smem + p.cap, scratch, warp_hits, p.k_select,
                                           p.limit};
  // The slices' lists, slice after slice, are in column order; slot_stride is a multiple of 4
  // and the workspace is 256-byte aligned, so every row starts on a 16-byte boundary.
  const std::int64_t pairs = static_cast<std::int64_t>(p.slices) * p.slot_stride;
  const uint4* keys = reinterpret_cast<const uint4*>(p.slice_key + b * pairs);
  const uint4* cols = reinterpret_cast<const uint4*>(p.slice_col + b * pairs);
  const std::int64_t vectors = pairs / 4;
  for (std::int64_t v0 = 0; v0 < vectors; v0 += kThreads) {
    std::uint32_t score[4] = {0, 0, 0, 0}, c[4] = {0, 0, 0, 0};
    const std::int64_t v = v0 + threadIdx.x;
    if (v < vectors) {
      const uint4 kv = keys[v], cv = cols[v];
      score[0] = kv.x, score[1] = kv.y, score[2] = kv.z, score[3] = kv.w;
      c[0] = cv.x, c[1] = cv.y, c[2] = cv.z, c[3] = cv.w;
    }
    // Empty slots carry key 0, which never beats the threshold.
    e.template offer<4>(score, c, 4);
  }
  const std::uint32_t n = e.finish(p.sort_by_value);
  write_outputs<Traits, kThreads>(p, b, e.col, n);
}

}  // namespace attnkit::detail::cuda
