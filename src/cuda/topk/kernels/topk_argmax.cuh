// SPDX-License-Identifier: Apache-2.0
// The CUDA top-k kernel for k = 1 (greedy sampling's argmax, argmin with largest=false): one
// read of each row keeping, per thread, the best (score, column), then one block reduction.
// It needs no candidate lists, so nothing in the loop waits for other threads.
//
//   topk_argmax_kernel  one CTA per (row, slice). Each thread streams its 16-byte vectors of
//                       the slice (kUnroll loads in flight), scores every element (exact
//                       order: docs/topk.md "Scores") and keeps the first best it meets, which
//                       is its lowest column among equal scores. The block keeps the largest
//                       (score << 32 | ~column): the best score, then the lowest column.
//                       Single-slice launches write the outputs; multi-slice launches write the
//                       slice's best to workspace.
//   topk_argmax_merge_kernel  one warp per row: the best of the slices' bests.
#pragma once

#include <cstdint>

#include "common/topk_keys.hpp"
#include "cuda/common/block_scan.cuh"
#include "cuda/common/dependent_launch.cuh"
#include "cuda/topk/kernels/topk_filter.cuh"
#include "cuda/topk/topk_params.cuh"

namespace attnkit::detail::cuda {

/// (score, column) as one orderable word: larger is better; 0 means "nothing selected"
/// (an excluded score never wins, whatever its column).
__device__ __forceinline__ std::uint64_t argmax_key(std::uint32_t score, std::uint32_t col) {
  return score == kExcludedScore ? 0ull
                                 : (static_cast<std::uint64_t>(score) << 32) | (0xFFFFFFFFu - col);
}

/// Writes row b's output (k = 1) from its best argmax_key, or the fills when it is 0.
template <class Traits>
__device__ void write_argmax(const TopkKernelParams& p, std::int64_t b, std::uint64_t best) {
  const std::int64_t offset =
      load_row_value(p.index_offset, p.index_offset_is_int64, p.index_offset_stride, b, 0);
  const bool real = best != 0;
  const std::uint32_t col = 0xFFFFFFFFu - static_cast<std::uint32_t>(best);
  // The value from the best score, so the launch's last thread stores without waiting on a
  // load (kept_value_bits).
  const auto* row = static_cast<const typename Traits::Bits*>(p.x) + b * p.row_stride;
  const std::uint32_t bits =
      real && p.values != nullptr
          ? kept_value_bits<Traits>(row, static_cast<std::uint32_t>(best >> 32), col, p.sp)
          : 0u;
  write_slot_bits<Traits>(p, b, 0, real, col, offset, bits);
}

template <class Traits, int kThreads, int kUnroll>
__global__ void __launch_bounds__(kThreads) topk_argmax_kernel(const TopkKernelParams p) {
  using Bits = typename Traits::Bits;
  constexpr int kVec = 16 / sizeof(Bits);
  __shared__ std::uint64_t warp_best[kThreads / kWarpSize];

  if (p.slices > 1) allow_dependent_launch();  // the merge kernel
  const std::int64_t b = blockIdx.x / p.slices;
  const std::int64_t s = blockIdx.x % p.slices;
  std::int64_t seg_lo, seg_hi;
  slice_range(p, b, s, seg_lo, seg_hi);
  const Bits* row = static_cast<const Bits*>(p.x) + b * p.row_stride;
  const int tid = threadIdx.x;
  const bool track_nan = p.nan_flag != nullptr;

  std::uint32_t best_score = kExcludedScore, best_col = 0;
  bool any_nan = false;
  // Vectors are first tested against the best so far with one packed comparison a word
  // (Prefilter); only the elements that may beat it are scored.
  Prefilter<Traits> pre;
  pre.set(best_score, p.sp);
  // Each thread meets its columns in increasing order (head, vectors, tail), so a strict >
  // keeps its lowest column among equal scores; across threads the reduction orders columns.
  auto consider = [&](std::uint32_t bits, std::int64_t col) {
    if (track_nan) any_nan |= is_nan_bits<Traits>(bits);
    const std::uint32_t score = score_of<Traits>(bits, p.sp);
    if (score > best_score) {
      best_score = score;
      best_col = static_cast<std::uint32_t>(col);
    }
  };

  // A scalar head up to 16-byte alignment, the vectors, a scalar tail.
  const std::int64_t head = head_to_alignment(row, seg_lo, seg_hi);
  if (tid < head) consider(row[seg_lo + tid], seg_lo + tid);
  pre.set(best_score, p.sp);
  const std::int64_t a0 = seg_lo + head;
  const std::int64_t vectors = (seg_hi - a0) / kVec;
  const uint4* vec = reinterpret_cast<const uint4*>(row + a0);
  for (std::int64_t v0 = tid; v0 < vectors; v0 += static_cast<std::int64_t>(kThreads) * kUnroll) {
    uint4 buf[kUnroll];
#pragma unroll
    for (int q = 0; q < kUnroll; ++q) {
      const std::int64_t v = v0 + static_cast<std::int64_t>(q) * kThreads;
      if (v < vectors) buf[q] = __ldg(vec + v);
    }
#pragma unroll
    for (int q = 0; q < kUnroll; ++q) {
      const std::int64_t v = v0 + static_cast<std::int64_t>(q) * kThreads;
      if (v < vectors && pre.vector_may_pass(buf[q])) {  // NaN always passes
        std::uint32_t maybe = pre.vector_may_pass_bits(buf[q]);
        while (maybe != 0) {
          const int j = __ffs(maybe) - 1;
          maybe &= maybe - 1;
          consider(vector_element<kVec>(buf[q], j), a0 + v * kVec + j);
        }
        pre.set(best_score, p.sp);
      }
    }
  }
  const std::int64_t tail0 = a0 + vectors * kVec;
  if (tail0 + tid < seg_hi) consider(row[tail0 + tid], tail0 + tid);

  if (track_nan && __syncthreads_or(any_nan) && tid == 0) *p.nan_flag = 1;

  std::uint64_t best = argmax_key(best_score, best_col);
#pragma unroll
  for (int d = kWarpSize / 2; d > 0; d /= 2) {
    const std::uint64_t other = __shfl_xor_sync(0xFFFFFFFFu, best, d);
    best = other > best ? other : best;
  }
  if (tid % kWarpSize == 0) warp_best[tid / kWarpSize] = best;
  __syncthreads();
  if (tid != 0) return;
#pragma unroll
  for (int w = 1; w < kThreads / kWarpSize; ++w) best = warp_best[w] > best ? warp_best[w] : best;
  if (p.slices > 1) {
    const std::int64_t base = (b * p.slices + s) * p.slot_stride;
    for (std::uint32_t j = 0; j < p.slot_stride; ++j) {
      p.slice_key[base + j] = j == 0 ? static_cast<std::uint32_t>(best >> 32) : kExcludedScore;
      p.slice_col[base + j] = j == 0 ? 0xFFFFFFFFu - static_cast<std::uint32_t>(best) : 0u;
    }
    return;
  }
  write_argmax<Traits>(p, b, best);
}

/// Row b's best of its slices (written by topk_argmax_kernel at slot 0 of each slice), for
/// small batches: one warp per row.
template <class Traits>
__global__ void __launch_bounds__(kWarpSize) topk_argmax_merge_kernel(const TopkKernelParams p) {
  const std::int64_t b = blockIdx.x;
  std::uint64_t best = 0;
  wait_for_prior_grid();  // the slices' bests
  for (int s = threadIdx.x; s < p.slices; s += kWarpSize) {
    const std::int64_t at = (b * p.slices + s) * p.slot_stride;
    const std::uint64_t key = argmax_key(p.slice_key[at], p.slice_col[at]);
    best = key > best ? key : best;
  }
#pragma unroll
  for (int d = kWarpSize / 2; d > 0; d /= 2) {
    const std::uint64_t other = __shfl_xor_sync(0xFFFFFFFFu, best, d);
    best = other > best ? other : best;
  }
  if (threadIdx.x == 0) write_argmax<Traits>(p, b, best);
}

}  // namespace attnkit::detail::cuda
