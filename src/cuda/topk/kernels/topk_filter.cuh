// SPDX-License-Identifier: Apache-2.0
// The CUDA top-k kernels for k <= kMaxFilterK: one read of each row through a threshold filter
// into candidate lists in shared memory, cut back to k by a block radix select whenever the
// newcomers fill up. Algorithm, invariants and bound: docs/topk.md.
//
//   topk_rows_kernel   one CTA per (row, slice). A slice streams its columns in order, a round
//                      of kU coalesced 16-byte vectors per thread at a time, kPrefetch rounds
//                      ahead. An element is a newcomer if it may beat the threshold by one
//                      float comparison (prefilter_bound_bits) and does by its exact score;
//                      newcomers are appended in column order (block prefix sums, one barrier
//                      per round). When survivors + newcomers reach `limit`, select_into keeps
//                      the best k in the other survivor list and the threshold rises to the
//                      k-th key. Single-slice launches write the outputs; multi-slice launches
//                      write each slice's best k to workspace.
//   topk_merge_kernel  one CTA per row: streams the slices' (key, column) lists, which are in
//                      column order slice after slice, through the same filter, then writes the
//                      outputs. Used when B is too small to fill the GPU with one CTA per row.
//
// Thread roles: all threads load, filter and append; all take part in every select.
// Shared memory (dynamic): survivors key/col [2][kS] (kS = next power of two >= k, so the
// final sort fits), newcomers key/col [slack + round]; static: SelectScratch, append counts.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "common/topk_index.hpp"
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

template <class Traits>
__device__ __forceinline__ float to_float(std::uint32_t bits) {
  if constexpr (Traits::kBits == 32) {
    return __uint_as_float(bits);
  } else if constexpr (Traits::kInf == 0x7F80u) {  // bfloat16: the high half of a float
    return __uint_as_float(bits << 16);
  } else {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
  }
}

/// Elements per 16-byte vector and vectors per thread per round: 16 elements per thread for
/// every dtype, so that a round's fixed cost (one barrier, the warp scans) is spread wide.
template <class Traits>
struct RoundShape {
  static constexpr int kVec = Traits::kBits == 32 ? 4 : 8;
  static constexpr int kU = 16 / kVec;
};

// ---------------------------------------------------------------------------------------------
// The filter engine: per-CTA state and the steps every kernel shares
// ---------------------------------------------------------------------------------------------

template <class Traits, int kThreads>
struct FilterEngine {
  static constexpr int kWarps = kThreads / kWarpSize;
  static constexpr int kMaxWords = 2;  // packed append counts: two 16-bit groups a word

  Candidates survivors;  // column order
  Candidates spare;      // the other survivor list, written by the next select
  Candidates newcomers;  // column order, all after the survivors
  SelectScratch<kThreads>& scratch;
  std::uint32_t* warp_hits;  // [2][kMaxWords][32] packed counts, double-buffered by parity
  std::uint32_t k;           // candidates a select keeps
  std::uint32_t limit;       // survivors + newcomers that trigger a select
  ScoreParams sp;
  std::uint32_t threshold = kExcludedScore;  // admit only scores above it
  // Prefilter: v may beat the threshold iff !(v * direction < bound * direction), which is
  // !(v < B) when largest and !(v > B) when smallest, and true for NaN; folding the
  // direction into both sides leaves one multiply and one comparison an element.
  float direction = 1.0f;
  float scaled_bound = 0.0f;
  std::uint32_t parity = 0;

  __device__ void set_threshold(std::uint32_t t) {
    threshold = t;
    direction = sp.flip == 0 ? 1.0f : -1.0f;
    scaled_bound = direction * to_float<Traits>(prefilter_bound_bits<Traits>(t, sp));
  }

  /// Whether an element may beat the threshold, by one float comparison (NaN always may).
  __device__ __forceinline__ bool may_pass(std::uint32_t bits) const {
    return !(to_float<Traits>(bits) * direction < scaled_bound);
  }

  /// Keeps the best k of survivors ++ newcomers and raises the threshold.
  __device__ void select() {
    set_threshold(select_into<kThreads, Traits::kBits>(survivors, newcomers, spare.key, spare.col,
                                                        k, scratch));
    const Candidates t = survivors;
    survivors = spare;
    survivors.n = k;
    spare = t;
    newcomers.n = 0;
  }

  /// Appends this thread's winners of one round: for each of kU groups, the elements j whose
  /// bit is set in mask[u], with key key_of(u, j) and column col_of(u, j) (computed only for
  /// winners, which keeps them out of registers). Groups are ordered u-major then by thread,
  /// which is column order. Every thread calls it once per round.
  template <int kU, int kV, class KeyFn, class ColFn>
  __device__ __forceinline__ void append(const std::uint32_t (&mask)[kU], KeyFn key_of,
                                         ColFn col_of) {
    static_assert(kU <= 2 * kMaxWords, "warp_hits holds 2 * kMaxWords groups");
    static_assert(kV <= 16 && kThreads * kV < 65536, "16-bit packed counts");
    constexpr int kWords = (kU + 1) / 2;
    const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
    // Per-thread hit counts, two groups a word (group 2w in the low half, 2w+1 in the high).
    std::uint32_t hits[kWords] = {};
    std::uint32_t any = 0;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      hits[u / 2] |= static_cast<std::uint32_t>(__popc(mask[u])) << (16 * (u % 2));
      any |= mask[u];
    }
    const bool warp_has_hits = __any_sync(0xFFFFFFFFu, any != 0);
    std::uint32_t inclusive[kWords];
#pragma unroll
    for (int w = 0; w < kWords; ++w) inclusive[w] = warp_has_hits ? warp_inclusive_sum(hits[w]) : 0u;
    std::uint32_t* slot = warp_hits + parity * (kMaxWords * 32);
    if (lane == kWarpSize - 1) {
#pragma unroll
      for (int w = 0; w < kWords; ++w) slot[w * 32 + warp] = inclusive[w];
    }
    // Reusing this half of warp_hits two rounds later is safe: every thread reads it before
    // arriving at the next round's barrier.
    parity ^= 1u;
    if (!__syncthreads_or(any != 0)) return;  // no newcomer anywhere in the block this round
    std::uint32_t base = newcomers.n;
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      std::uint32_t before = 0, total = 0;
#pragma unroll
      for (int v = 0; v < kWarps; ++v) {
        const std::uint32_t t = slot[w * 32 + v];  // broadcast reads
        before += v < warp ? t : 0u;
        total += t;
      }
      const std::uint32_t exclusive = before + inclusive[w] - hits[w];
#pragma unroll
      for (int h = 0; h < 2 && 2 * w + h < kU; ++h) {
        const int u = 2 * w + h;
        if (mask[u] != 0) {
          std::uint32_t pos = base + ((exclusive >> (16 * h)) & 0xFFFFu);
#pragma unroll
          for (int j = 0; j < kV; ++j) {
            if (mask[u] & (1u << j)) {
              newcomers.key[pos] = key_of(u, j);
              newcomers.col[pos] = col_of(u, j);
              ++pos;
            }
          }
        }
        base += (total >> (16 * h)) & 0xFFFFu;
      }
    }
    newcomers.n = base;
    if (survivors.n + newcomers.n >= limit) select();
  }

  /// Leaves the best min(k, candidates) in `survivors` (sorted best first for sorted="value",
  /// else in column order) and returns that list.
  __device__ Candidates finish(bool sort_by_value) {
    __syncthreads();
    if (survivors.n + newcomers.n > k) {
      select();
    } else if (newcomers.n > 0) {  // everything fits: append the newcomers to the survivors
      for (std::uint32_t p = threadIdx.x; p < newcomers.n; p += kThreads) {
        survivors.key[survivors.n + p] = newcomers.key[p];
        survivors.col[survivors.n + p] = newcomers.col[p];
      }
      survivors.n += newcomers.n;
      newcomers.n = 0;
      __syncthreads();
    }
    if (sort_by_value && survivors.n > 1) {
      sort_best_first<kThreads>(survivors.key, survivors.col, survivors.n, next_pow2(survivors.n));
    }
    return survivors;
  }
};

/// Filters one round, bits[u][j] being the element at column col0[u] + j (real when
/// j < valid[u], or always when kFull), and appends its newcomers.
template <bool kFull, int kU, int kVec, class Traits, int kThreads>
__device__ __forceinline__ void filter_round(FilterEngine<Traits, kThreads>& e,
                                             const std::uint32_t (&bits)[kU][kVec],
                                             const std::uint32_t (&col0)[kU],
                                             const int (&valid)[kU], bool track_nan,
                                             bool& any_nan) {
  std::uint32_t mask[kU];
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    mask[u] = 0;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      if (kFull || j < valid[u]) {
        if (track_nan) any_nan |= is_nan_bits<Traits>(bits[u][j]);
        mask[u] |= e.may_pass(bits[u][j]) ? 1u << j : 0u;
      }
    }
    if (mask[u] != 0) {  // rare once the threshold has risen: exact scores
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        if ((mask[u] & (1u << j)) && score_of<Traits>(bits[u][j], e.sp) <= e.threshold) {
          mask[u] &= ~(1u << j);
        }
      }
    }
  }
  e.template append<kU, kVec>(
      mask, [&](int u, int j) { return score_of<Traits>(bits[u][j], e.sp); },
      [&](int u, int j) { return col0[u] + static_cast<std::uint32_t>(j); });
}

/// Streams columns [lo, hi) of `row` through the engine in column order: a scalar head up to
/// 16-byte alignment, whole rounds of kU coalesced 16-byte vectors per thread with
/// kPrefetchVectors vectors per thread in flight, then the leftover vectors and scalars.
/// Returns whether this thread saw a NaN (only tracked when track_nan).
template <class Traits, int kThreads, int kPrefetchVectors>
__device__ bool stream_row(FilterEngine<Traits, kThreads>& e, const typename Traits::Bits* row,
                           std::int64_t lo, std::int64_t hi, bool track_nan) {
  using Bits = typename Traits::Bits;
  constexpr int kVec = RoundShape<Traits>::kVec, kU = RoundShape<Traits>::kU;
  constexpr int kPrefetch = kPrefetchVectors / kU > 0 ? kPrefetchVectors / kU : 1;  // rounds
  const int tid = threadIdx.x;
  bool any_nan = false;

  auto unpack = [&](const uint4& v, std::uint32_t (&out)[kVec]) {
    const std::uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      out[j] = kVec == 4 ? w[j] : (w[j / 2] >> (16 * (j % 2))) & 0xFFFFu;  // little endian
    }
  };

  // One scalar element per thread: the head (< kVec elements) and the last scalars.
  auto scalar_round = [&](std::int64_t first, std::int64_t n) {
    std::uint32_t bits[kU][kVec] = {}, col0[kU] = {};
    int valid[kU] = {};
    if (tid < n) {
      bits[0][0] = row[first + tid];
      col0[0] = static_cast<std::uint32_t>(first + tid);
      valid[0] = 1;
    }
    filter_round<false>(e, bits, col0, valid, track_nan, any_nan);
  };

  const auto addr = reinterpret_cast<std::uintptr_t>(row + lo);
  const std::int64_t to_align = static_cast<std::int64_t>(((16 - addr % 16) % 16) / sizeof(Bits));
  const std::int64_t head = to_align < hi - lo ? to_align : hi - lo;
  if (head > 0) scalar_round(lo, head);

  const std::int64_t a0 = lo + head;
  const std::int64_t vectors = (hi - a0) / kVec;
  const std::int64_t per_round = static_cast<std::int64_t>(kThreads) * kU;  // vectors
  const std::int64_t rounds = vectors / per_round;
  const uint4* vec = reinterpret_cast<const uint4*>(row + a0);

  // Round r, group u covers vectors [(r * kU + u) * kThreads, +kThreads): coalesced loads.
  uint4 buf[kPrefetch][kU];
#pragma unroll
  for (int r = 0; r < kPrefetch; ++r) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (r < rounds) buf[r][u] = __ldg(vec + (static_cast<std::int64_t>(r) * kU + u) * kThreads + tid);
    }
  }
  for (std::int64_t r0 = 0; r0 < rounds; r0 += kPrefetch) {
#pragma unroll
    for (int q = 0; q < kPrefetch; ++q) {
      const std::int64_t r = r0 + q;
      if (r < rounds) {  // uniform across the block
        std::uint32_t bits[kU][kVec], col0[kU];
        int valid[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          unpack(buf[q][u], bits[u]);
          col0[u] = static_cast<std::uint32_t>(a0 + ((r * kU + u) * kThreads + tid) * kVec);
          valid[u] = kVec;
          if (r + kPrefetch < rounds) {
            buf[q][u] = __ldg(vec + ((r + kPrefetch) * kU + u) * kThreads + tid);
          }
        }
        filter_round<true>(e, bits, col0, valid, track_nan, any_nan);
      }
    }
  }

  // Leftover vectors (fewer than a round), in the same group layout.
  const std::int64_t rest0 = rounds * per_round;
  if (rest0 < vectors) {
    std::uint32_t bits[kU][kVec] = {}, col0[kU] = {};
    int valid[kU] = {};
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const std::int64_t v = rest0 + static_cast<std::int64_t>(u) * kThreads + tid;
      if (v < vectors) {
        unpack(__ldg(vec + v), bits[u]);
        col0[u] = static_cast<std::uint32_t>(a0 + v * kVec);
        valid[u] = kVec;
      }
    }
    filter_round<false>(e, bits, col0, valid, track_nan, any_nan);
  }
  const std::int64_t rest = (hi - a0) - vectors * kVec;  // < kVec
  if (rest > 0) scalar_round(a0 + vectors * kVec, rest);
  return any_nan;
}

/// Writes row b's outputs from the finished candidates, then the padding.
template <class Traits, int kThreads>
__device__ void write_outputs(const TopkKernelParams& p, std::int64_t b, const Candidates& c) {
  using Bits = typename Traits::Bits;
  const Bits* row = static_cast<const Bits*>(p.x) + b * p.row_stride;
  const std::int64_t offset =
      load_row_value(p.index_offset, p.index_offset_is_int64, p.index_offset_stride, b, 0);
  for (std::int64_t j = threadIdx.x; j < p.k; j += kThreads) {
    const bool real = j < c.n;
    const std::uint32_t col = real ? c.col[j] : 0u;
    if (p.indices_int64) {
      static_cast<std::int64_t*>(p.indices)[b * p.indices_row_stride + j] =
          real ? offset_index64(col, offset) : p.index_fill;
    } else {
      static_cast<std::int32_t*>(p.indices)[b * p.indices_row_stride + j] =
          real ? offset_index32(col, offset) : static_cast<std::int32_t>(p.index_fill);
    }
    if (p.values != nullptr) {
      // Values are read back from x by column (a hit in L2, which just streamed the row), so
      // they are the input's bits exactly: -0.0 and NaN payloads survive.
      static_cast<Bits*>(p.values)[b * p.values_row_stride + j] =
          real ? row[col] : static_cast<Bits>(p.value_fill_bits);
    }
  }
}

/// Carves the dynamic shared memory and builds the engine.
template <class Traits, int kThreads>
__device__ __forceinline__ FilterEngine<Traits, kThreads> make_engine(
    const TopkKernelParams& p, std::uint32_t* smem, SelectScratch<kThreads>& scratch,
    std::uint32_t* warp_hits) {
  const std::uint32_t s = p.survivor_slots;
  FilterEngine<Traits, kThreads> e{Candidates{smem, smem + s, 0},
                                   Candidates{smem + 2 * s, smem + 3 * s, 0},
                                   Candidates{smem + 4 * s, smem + 4 * s + p.newcomer_slots, 0},
                                   scratch,
                                   warp_hits,
                                   p.k_select,
                                   p.limit,
                                   p.sp};
  e.set_threshold(kExcludedScore);
  return e;
}

// ---------------------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------------------

template <class Traits, int kThreads, int kPrefetchVectors, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks) topk_rows_kernel(const TopkKernelParams p) {
  extern __shared__ __align__(16) std::uint32_t smem[];
  __shared__ SelectScratch<kThreads> scratch;
  __shared__ std::uint32_t warp_hits[2 * 2 * 32];

  const std::int64_t b = blockIdx.x / p.slices;
  const std::int64_t s = blockIdx.x % p.slices;
  std::int64_t lo, hi;
  row_range(p, b, lo, hi);
  const std::int64_t len = hi - lo;
  const std::int64_t seg_lo = lo + len * s / p.slices, seg_hi = lo + len * (s + 1) / p.slices;

  auto e = make_engine<Traits, kThreads>(p, smem, scratch, warp_hits);
  const auto* row = static_cast<const typename Traits::Bits*>(p.x) + b * p.row_stride;
  const bool track_nan = p.nan_flag != nullptr;
  const bool any_nan =
      stream_row<Traits, kThreads, kPrefetchVectors>(e, row, seg_lo, seg_hi, track_nan);
  if (track_nan && __syncthreads_or(any_nan) && threadIdx.x == 0) *p.nan_flag = 1;

  if (p.slices == 1) {
    write_outputs<Traits, kThreads>(p, b, e.finish(p.sort_by_value));
  } else {
    const Candidates c = e.finish(false);
    const std::int64_t base = (b * p.slices + s) * p.slot_stride;
    for (std::uint32_t j = threadIdx.x; j < p.slot_stride; j += kThreads) {
      p.slice_key[base + j] = j < c.n ? c.key[j] : kExcludedScore;
      p.slice_col[base + j] = j < c.n ? c.col[j] : 0u;
    }
  }
}

template <class Traits, int kThreads>
__global__ void __launch_bounds__(kThreads, 1) topk_merge_kernel(const TopkKernelParams p) {
  extern __shared__ __align__(16) std::uint32_t smem[];
  __shared__ SelectScratch<kThreads> scratch;
  __shared__ std::uint32_t warp_hits[2 * 2 * 32];

  const std::int64_t b = blockIdx.x;
  auto e = make_engine<Traits, kThreads>(p, smem, scratch, warp_hits);
  // The slices' lists, slice after slice, are in column order; slot_stride is a multiple of 4
  // and the workspace is 256-byte aligned, so every row starts on a 16-byte boundary.
  const std::int64_t pairs = static_cast<std::int64_t>(p.slices) * p.slot_stride;
  const uint4* keys = reinterpret_cast<const uint4*>(p.slice_key + b * pairs);
  const uint4* cols = reinterpret_cast<const uint4*>(p.slice_col + b * pairs);
  const std::int64_t vectors = pairs / 4;
  for (std::int64_t v0 = 0; v0 < vectors; v0 += kThreads) {
    std::uint32_t mask[1] = {0}, key[4] = {}, col[4] = {};
    const std::int64_t v = v0 + threadIdx.x;
    if (v < vectors) {
      const uint4 kv = keys[v], cv = cols[v];
      key[0] = kv.x, key[1] = kv.y, key[2] = kv.z, key[3] = kv.w;
      col[0] = cv.x, col[1] = cv.y, col[2] = cv.z, col[3] = cv.w;
#pragma unroll
      for (int j = 0; j < 4; ++j) mask[0] |= key[j] > e.threshold ? 1u << j : 0u;
    }
    // Empty slots carry key 0, which never beats the threshold.
    e.template append<1, 4>(
        mask, [&](int, int j) { return key[j]; }, [&](int, int j) { return col[j]; });
  }
  write_outputs<Traits, kThreads>(p, b, e.finish(p.sort_by_value));
}

}  // namespace attnkit::detail::cuda
