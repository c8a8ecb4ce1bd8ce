// SPDX-License-Identifier: Apache-2.0
// Warp- and block-wide prefix sums for kernels whose blocks are a whole number of warps.
#pragma once

#include <cstdint>

namespace attnkit::detail::cuda {

constexpr int kWarpSize = 32;

/// Inclusive prefix sum across the warp. All 32 lanes must call it.
__device__ __forceinline__ std::uint32_t warp_inclusive_sum(std::uint32_t v) {
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int d = 1; d < kWarpSize; d *= 2) {
    const std::uint32_t up = __shfl_up_sync(0xFFFFFFFFu, v, d);
    if (lane >= d) v += up;
  }
  return v;
}

/// The least and the greatest of `lo` and `hi` over the warp, in every lane (one `redux.sync`
/// each from sm_80 on). All 32 lanes must call it.
__device__ __forceinline__ void warp_min_max(std::uint32_t& lo, std::uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  lo = __reduce_min_sync(0xFFFFFFFFu, lo);
  hi = __reduce_max_sync(0xFFFFFFFFu, hi);
#else
#pragma unroll
  for (int d = kWarpSize / 2; d > 0; d /= 2) {
    lo = min(lo, __shfl_xor_sync(0xFFFFFFFFu, lo, d));
    hi = max(hi, __shfl_xor_sync(0xFFFFFFFFu, hi, d));
  }
#endif
}

/// The least and the greatest of every thread's `lo` and `hi` over the block, in every thread.
/// \param warp_totals shared scratch of 32 words (at most 16 warps); the caller's next barrier
/// must come before it is written again. Contains one __syncthreads(); every thread calls it.
template <int kThreads>
__device__ __forceinline__ void block_min_max(std::uint32_t& lo, std::uint32_t& hi,
                                              std::uint32_t* warp_totals) {
  constexpr int kWarps = kThreads / kWarpSize;
  static_assert(kThreads % kWarpSize == 0 && kWarps <= 16, "whole warps, at most 16");
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  warp_min_max(lo, hi);
  if (lane == 0) warp_totals[warp] = lo, warp_totals[16 + warp] = hi;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kWarps; ++w) lo = min(lo, warp_totals[w]), hi = max(hi, warp_totals[16 + w]);
}

/// From `count` (<= 32) totals in shared memory, `totals[0 .. count)`, published before the
/// caller's barrier: in every thread, the sum of those before `position` (`before`) and of all of
/// them (`total`). `count` and `position` must be the same in every lane of the warp. From sm_80
/// on, one shared read by the first `count` lanes and two `redux.sync` a warp, where every thread
/// reading and adding up every total took about 3 count instructions a thread (and, for a count
/// known only at run time, an unrolled loop of several times that in code). All 32 lanes of the
/// warp must call it.
__device__ __forceinline__ void lane_totals_before(const std::uint32_t* totals, int count,
                                                   int position, std::uint32_t& before,
                                                   std::uint32_t& total) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const int lane = threadIdx.x % kWarpSize;
  const std::uint32_t t = lane < count ? totals[lane] : 0u;
  total = __reduce_add_sync(0xFFFFFFFFu, t);
  before = __reduce_add_sync(0xFFFFFFFFu, lane < position ? t : 0u);
#else
  before = 0, total = 0;
  for (int i = 0; i < count; ++i) {
    const std::uint32_t t = totals[i];  // broadcast reads: no bank conflict
    before += i < position ? t : 0u;
    total += t;
  }
#endif
}

/// From the warps' totals `totals[0 .. kWarps)` (shared memory, published before the caller's
/// barrier): in every thread, the sum of the totals of the warps before its own (`before`) and
/// of all of them (`total`), by lane_totals_before. All 32 lanes of every warp must call it.
template <int kWarps>
__device__ __forceinline__ void warp_totals_before(const std::uint32_t* totals,
                                                   std::uint32_t& before, std::uint32_t& total) {
  static_assert(kWarps >= 1 && kWarps <= kWarpSize, "one total a lane");
  lane_totals_before(totals, kWarps, static_cast<int>(threadIdx.x / kWarpSize), before, total);
}

/// Exclusive prefix sum of `v` over the block in thread order, and the block total.
/// \param warp_totals shared scratch of kThreads / 32 words, reusable once this returns.
/// Contains two __syncthreads(); every thread of the block must call it.
template <int kThreads>
__device__ __forceinline__ std::uint32_t block_exclusive_sum(std::uint32_t v,
                                                             std::uint32_t* warp_totals,
                                                             std::uint32_t& total) {
  static_assert(kThreads % kWarpSize == 0 && kThreads <= 1024, "whole warps, at most 1024");
  constexpr int kWarps = kThreads / kWarpSize;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const std::uint32_t inclusive = warp_inclusive_sum(v);
  if (lane == kWarpSize - 1) warp_totals[warp] = inclusive;
  __syncthreads();
  std::uint32_t before, sum;
  warp_totals_before<kWarps>(warp_totals, before, sum);
  __syncthreads();
  total = sum;
  return before + inclusive - v;
}

}  // namespace attnkit::detail::cuda
