// SPDX-License-Identifier: Apache-2.0
// The CUDA top-k kernel for rows of up to kMaxClusterCtas CTAs of 8192 columns (256 threads)
// or, beyond, of 16384 (512 threads), held in the registers of one thread-block cluster
// (sm_90) that pools its histograms and counts through distributed shared memory; one CTA per
// row elsewhere. Algorithm and measured numbers:
// docs/topk.md (the `topk_cluster_rows_kernel` entry).
//
//   topk_cluster_rows_kernel  one cluster per row. Thread t of CTA r holds the kPerThread
//                             consecutive columns from lo + (r * kThreads + t) * kPerThread as
//                             16-byte vectors (XORed with the direction's sign flip for the
//                             packed comparisons, except in 16-bit CTAs of 512 threads), so column
//                             order is (CTA, thread, element) order, and again as raw words in
//                             shared memory, from which the loops over a thread's candidates
//                             read theirs and the outputs their bits. Then:
//     1. Sample. A spread sample of the row's scores (common/topk_sample.hpp) goes into an
//        11-bit-digit histogram; the digit holding the sample's `need`-th best, `need` the
//        expected count above the k-th plus three standard deviations, gives a floor that
//        about 1.5-3 k of the row's elements beat.
//     2. Candidates. A packed prefilter (one comparison per 32-bit word against the bound of
//        floor + 1, exact for every number) marks the elements scoring above the floor in a
//        per-thread bit mask, with an exact score test of the flagged elements only where NaN
//        must be judged. Only they take part from here on.
//     3. Select. Radix passes over the candidates' scores relative to the floor, bins narrow
//        near it, where the k-th best usually is: one pass for 16-bit types; for fp32 2048
//        bins from the floor to one digit past the highest sampled one, then narrower, ending
//        when the pivot's bin is kept whole. If fewer than k candidates beat the
//        floor (the sample overestimated the row), every valid element becomes a candidate
//        and the passes start over: the result never depends on the sample, only the time.
//     4. Kept: score > K, or score == K among the first `need` such in column order, as bit
//        masks from packed comparisons (no loop over candidates, whose count varies by lane).
//        A block scan of packed (greater, equal) counts and an exchange of the CTAs' totals
//        place each kept element; for sorted="none"/"index" every CTA writes its own to the
//        outputs, for sorted="value" they go to CTA 0, which sorts them and writes the outputs.
//   Pooling: every CTA counts into a private histogram, then adds the nonzero bins to CTA 0's
//   histogram of the pass (one remote addition a bin: adding to every CTA's copy cost 16 and
//   most of a pass, run 26); after a cluster barrier CTA 0 finds the pivot and stores it in
//   every CTA, and a second barrier publishes it. Two histograms alternate between passes, so
//   CTA 0 clears one at least a full barrier before anyone adds to it again.
#pragma once

#include <cooperative_groups.h>

#include <cstdint>

#include "common/topk_keys.hpp"
#include "common/topk_sample.hpp"
#include "cuda/common/block_scan.cuh"
#include "cuda/topk/block_select.cuh"
#include "cuda/topk/kernels/topk_filter.cuh"
#include "cuda/topk/kernels/topk_short.cuh"
#include "cuda/topk/topk_params.cuh"

namespace attnkit::detail::cuda {

// Thread-block cluster primitives. The clustered kernel is only launched on sm_90 and newer;
// other targets compile it with single-CTA stand-ins.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define ATTNKIT_HAS_CLUSTERS 1
#endif

__device__ __forceinline__ unsigned cluster_rank() {
#ifdef ATTNKIT_HAS_CLUSTERS
  return cooperative_groups::this_cluster().block_rank();
#else
  return 0;
#endif
}

__device__ __forceinline__ void cluster_sync() {
#ifdef ATTNKIT_HAS_CLUSTERS
  cooperative_groups::this_cluster().sync();
#else
  __syncthreads();
#endif
}

/// The two halves of cluster_sync, so that independent work fills the wait. arrive releases
/// this thread's earlier shared-memory writes; wait acquires every CTA's.
__device__ __forceinline__ void cluster_arrive() {
#ifdef ATTNKIT_HAS_CLUSTERS
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}

__device__ __forceinline__ void cluster_wait() {
#ifdef ATTNKIT_HAS_CLUSTERS
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
  __syncthreads();
#endif
}

/// The address of `p` (in this CTA's shared memory) in the shared::cluster window of cluster
/// CTA `rank`.
__device__ __forceinline__ std::uint32_t cluster_address(const void* p, unsigned rank) {
  auto local = static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
#ifdef ATTNKIT_HAS_CLUSTERS
  std::uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
#else
  (void)rank;
  return local;
#endif
}

/// Adds v to the word at `address` (from cluster_address) in the shared memory of a cluster
/// CTA, discarding the old value.
__device__ __forceinline__ void cluster_add_at(std::uint32_t address, std::uint32_t v) {
#ifdef ATTNKIT_HAS_CLUSTERS
  asm volatile("red.relaxed.cluster.shared::cluster.add.u32 [%0], %1;" :: "r"(address), "r"(v)
               : "memory");
#else
  asm volatile("red.shared.add.u32 [%0], %1;" :: "r"(address), "r"(v) : "memory");
#endif
}

/// *p = v in the shared memory of cluster CTA `rank`.
__device__ __forceinline__ void cluster_store(std::uint32_t* p, unsigned rank, std::uint32_t v) {
#ifdef ATTNKIT_HAS_CLUSTERS
  asm volatile("st.shared::cluster.u32 [%0], %1;" :: "r"(cluster_address(p, rank)), "r"(v)
               : "memory");
#else
  (void)rank;
  *p = v;
#endif
}

/// Zeroes `kWords` words of shared memory at `p` (16-byte aligned), 16 bytes a thread a turn, in
/// a loop whose count is known at compile time: a loop from threadIdx.x, which the compiler
/// cannot bound, unrolls with setup and remainder code (60-80 SASS instructions each).
template <int kThreads, int kWords>
__device__ __forceinline__ void clear_shared(std::uint32_t* p) {
  static_assert(kWords % (4 * kThreads) == 0, "whole 16-byte words a thread");
  auto* const p4 = reinterpret_cast<uint4*>(p);
#pragma unroll
  for (int j = 0; j < kWords / (4 * kThreads); ++j) {
    p4[j * kThreads + threadIdx.x] = make_uint4(0u, 0u, 0u, 0u);
  }
}

template <bool kClustered>
struct ClusterScratch {
  // Digit counts of the row, alternating between passes.
  alignas(16) std::uint32_t hist[2][kShortBins];
  std::uint32_t local[kClustered ? kShortBins : 1];  // this CTA's counts, before they are pooled
  std::uint32_t cta_greater[kMaxClusterCtas];  // kept-element counts of each cluster CTA
  std::uint32_t cta_equal[kMaxClusterCtas];
  PivotState pivot;
};

// 256-thread CTAs two an SM, four for 16-bit rows (the dispatch puts up to four an SM on batches
// of 16-bit rows: 64 registers a thread at most); 512-thread ones (rows beyond 16 x 8192
// columns) one, with the same registers a thread. kSorted (sorted="value") is a kernel of its
// own: the sort's code in the unordered kernel made one-row calls 4-6 % slower (code fetched
// after the L2 flush).
template <class Traits, int kThreads, int kPerThread, bool kClustered, bool kSorted>
__global__ void __launch_bounds__(kThreads, kThreads >= 512 ? 1 : Traits::kBits == 16 ? 4 : 2)
    topk_cluster_rows_kernel(const TopkKernelParams p) {
  using Bits = typename Traits::Bits;
  constexpr int kVec = 16 / static_cast<int>(sizeof(Bits));  // elements per 16-byte vector
  constexpr int kVecs = kPerThread / kVec;
  constexpr std::uint32_t kVecMask = (1u << kVec) - 1u;
  static_assert(kPerThread == 32, "one 32-bit candidate mask per thread");
  // Kept keys and columns, [2][survivor_slots] (CTA 0's are the cluster's), then the thread's
  // columns as 32-bit words, [kPerThread * sizeof(Bits) / 4][kThreads], whose place CTA 0's
  // sort takes for its spare lists with sorted="value" (cluster_smem_bytes).
  extern __shared__ __align__(16) std::uint32_t smem[];
  __shared__ ClusterScratch<kClustered> s;

  const unsigned ctas = kClustered ? static_cast<unsigned>(p.cluster_ctas) : 1u;
  const unsigned rank = kClustered ? cluster_rank() : 0u;
  const std::int64_t b = blockIdx.x / ctas;
  std::int64_t lo, hi;
  row_range(p, b, lo, hi);
  const Bits* row = static_cast<const Bits*>(p.x) + b * p.row_stride;
  const int tid = threadIdx.x;
  const std::int64_t c0 = lo + (static_cast<std::int64_t>(rank) * kThreads + tid) * kPerThread;
  const std::int64_t left = hi - c0;  // valid columns from c0 on
  const std::uint32_t valid = left >= kPerThread ? ~0u : left <= 0 ? 0u : (1u << left) - 1u;

  // Load this thread's columns; the elements outside [lo, hi) are never looked at again.
  uint4 v[kVecs];
  const bool aligned = reinterpret_cast<std::uintptr_t>(row + lo) % 16 == 0;
#pragma unroll
  for (int q = 0; q < kVecs; ++q) {
    const std::uint32_t vm = (valid >> (q * kVec)) & kVecMask;
    const std::int64_t col = c0 + q * kVec;
    v[q] = vm == kVecMask && aligned ? __ldg(reinterpret_cast<const uint4*>(row + col))
                                     : load_vector_prefix<kVec>(row + col, __popc(vm));
  }
  // The same words, word-major, for the loops over a thread's candidates (and the NaN check): a
  // candidate's word is one conflict-free shared load at a position known only at run time, so
  // one loop over the whole candidate mask replaces one a vector (the warp then runs as long as
  // its busiest lane's total, not the sum of each vector's busiest lane).
  constexpr int kWords = 4 * kVecs;
  std::uint32_t* const staged = smem + 2 * p.survivor_slots;
#pragma unroll
  for (int w = 0; w < kWords; ++w) staged[w * kThreads + tid] = vector_word(v[w / 4], w % 4);
  // The registers of 256-thread CTAs, and of fp32 ones of 512, keep the words XORed with the
  // direction's sign flip, once, for the packed comparisons below (the marking's
  // vector_may_pass_bits_as<false>, the kept masks' add_flipped_bits), which would otherwise
  // flip every word again in each of them: fp32 rows of 129280 1.02-1.04x, bf16 rows of 131072
  // 1.01-1.02x (runs 250-251), fp32 rows of 151936-202048 on 512-thread CTAs 1.03-1.04x (run
  // 259). 16-bit CTAs of 512 threads stay raw: with the flip, 8 bf16 rows of 131072 (which
  // take them where fewer than eight 16-CTA clusters fit, as on an H100, run 253) measured
  // 0.98x (runs 250-251, H100).
  constexpr bool kFlipOnce = kThreads < 512 || Traits::kBits == 32;
  if constexpr (kFlipOnce) {
    const std::uint32_t flip = Prefilter<Traits>::sign_flip_of(p.sp);
#pragma unroll
    for (int q = 0; q < kVecs; ++q) {
      v[q] = uint4{v[q].x ^ flip, v[q].y ^ flip, v[q].z ^ flip, v[q].w ^ flip};
    }
  }
  clear_shared<kThreads, 2 * kShortBins>(&s.hist[0][0]);
  if (tid == 0) s.pivot.top = 0;  // read even when the sample is empty
  if constexpr (kClustered) clear_shared<kThreads, kShortBins>(s.local);

  // Element i of this thread's columns, as bits.
  constexpr int kPerWord = kVec / 4;  // elements in a 32-bit word
  auto element = [&](int i) -> std::uint32_t {
    const std::uint32_t word = staged[(i / kPerWord) * kThreads + tid];
    return kPerWord == 1 ? word : (word >> (16 * (i % 2))) & 0xFFFFu;
  };
  // Calls fn(bits, i) for every set bit i of `mask`, in column order.
  auto for_each = [&](std::uint32_t mask, auto&& fn) {
    while (mask != 0) {
      const int i = __ffs(mask) - 1;
      mask &= mask - 1;
      fn(element(i), i);
    }
  };

  if (p.nan_flag != nullptr) {
    bool any_nan = false;
    // From the staged words, four a turn: only nan="raise" runs this, whose call waits for the
    // host's check anyway, and code this kernel fetches after every flush costs time even where
    // it does not run (unrolled from the registers it was 120-160 SASS instructions more).
#pragma unroll 4
    for (int i = 0; i < kPerThread; ++i) {
      any_nan |= ((valid >> i) & 1u) != 0 && is_nan_bits<Traits>(element(i));
    }
    if (__syncthreads_or(any_nan) && tid == 0) *p.nan_flag = 1;
  }

  // Histogram passes. Counts go straight to the CTA's histogram, or in a cluster to a private
  // one whose nonzero bins are then added to CTA 0's copy (see the file comment).
  int h = 0;  // the histogram the next pass uses
  auto count_digit = [&](std::uint32_t digit) {
    atomicAdd(kClustered ? &s.local[digit] : &s.hist[h][digit], 1u);
  };
  // fp32 passes also find the highest sampled digit: the first select pass spans the floor to
  // one digit past it (two for small k: cluster_sample).
  constexpr bool kFindTop = Traits::kBits == 32;
  // Pools the pass's counts, finds the digit holding the need-th best (find_pivot_digit), then
  // clears the histogram for the pass after next and flips to the other one.
  auto finish_pass = [&](std::uint32_t need) {
    __syncthreads();
    if constexpr (kClustered) {
      // Thread t adds bins t, t + kThreads, ...: each warp's additions go out as one
      // instruction over consecutive words (one bin per lane was 4x slower, run 27). CTA 0's
      // copy of the histogram is one window of the cluster's shared memory: one address
      // mapping, then offsets.
      const std::uint32_t remote = cluster_address(&s.hist[h][tid], 0);
      static_assert(kShortBins % kThreads == 0, "whole bins a thread");
#pragma unroll
      for (int j = 0; j < kShortBins / kThreads; ++j) {
        const std::uint32_t c = s.local[j * kThreads + tid];
        if (c == 0) continue;
        s.local[j * kThreads + tid] = 0;
        cluster_add_at(remote + j * kThreads * 4u, c);
      }
      cluster_sync();
      if (rank == 0) {
        find_pivot_digit<kThreads, kShortBins, kFindTop>(s.pivot, s.hist[h], need);
        clear_shared<kThreads, kShortBins>(s.hist[h]);
        if (tid > 0 && tid < static_cast<int>(ctas)) {  // thread r hands the pivot to CTA r
          cluster_store(&s.pivot.digit, tid, s.pivot.digit);
          cluster_store(&s.pivot.need, tid, s.pivot.need);
          cluster_store(&s.pivot.count, tid, s.pivot.count);
          cluster_store(&s.pivot.candidates, tid, s.pivot.candidates);
          if constexpr (kFindTop) cluster_store(&s.pivot.top, tid, s.pivot.top);
        }
      }
      cluster_sync();  // the pivot is in every CTA; CTA 0's histogram is clear
    } else {
      find_pivot_digit<kThreads, kShortBins, kFindTop>(s.pivot, s.hist[h], need);
      clear_shared<kThreads, kShortBins>(s.hist[h]);
    }
    h ^= 1;
  };
  __syncthreads();  // the histograms are clear
  if constexpr (kClustered) cluster_arrive();  // completed by the first pooling, below

  // 1. Sample: a floor that about 1.5-3 k of the row's elements beat.
  constexpr int kKeyBits = Traits::kBits;
  constexpr int kTopShift = kKeyBits - kShortDigitBits;
  const int every = short_sample_every(static_cast<int>(ctas));
  {
    const int js = short_sample_element(tid, static_cast<int>(rank));
    if (tid % every == 0 && ((valid >> js) & 1u)) {
      const std::uint32_t score = score_of<Traits>(element(js), p.sp);
      if (score != kExcludedScore) count_digit(score >> kTopShift);
    }
  }
  if constexpr (kClustered) cluster_wait();  // every CTA runs and has cleared its histograms
  // Samples above the k-th best: k / (columns per sample) expected, three deviations allowed
  // (cluster_sample, worked out on the host).
  const std::uint32_t sample_need = p.cluster_sample_need;
  std::uint32_t floor_score = kExcludedScore;  // candidates score above it

  // 2. Candidates: the valid elements scoring above the floor.
  auto mark_candidates = [&] {
    std::uint32_t marked = 0;
    Prefilter<Traits> pre;
    pre.set(floor_score, p.sp);
    if constexpr (kFlipOnce) {
      // The flipped words compare as a largest-first row's (no XOR). Here the select form
      // (vector_may_pass_bits_as), while the kept masks below take add_flipped_bits: against
      // add_flipped_bits in both, fp32 1 x 129280 k=1024 1.058x, k=50-4096 0.99x (run 254,
      // 256-thread CTAs; the fp32 CTAs of 512 threads were timed only with this form, run 259).
#pragma unroll
      for (int q = 0; q < kVecs; ++q) {
        marked |= pre.template vector_may_pass_bits_as<false>(v[q]) << (q * kVec);
      }
      marked &= valid;
    } else {
#pragma unroll
      for (int q = 0; q < kVecs; ++q) {
        std::uint32_t m = pre.vector_may_pass_bits(v[q]) & (valid >> (q * kVec)) & kVecMask;
        marked |= m << (q * kVec);
      }
    }
    if (!pre.exact) {  // the comparison flags a superset (Prefilter): test the flagged scores
      const std::uint32_t flagged = marked;
      marked = 0;
      for_each(flagged, [&](std::uint32_t bits, int i) {
        marked |= static_cast<std::uint32_t>(score_of<Traits>(bits, p.sp) > floor_score) << i;
      });
    }
    return marked;
  };
  std::uint32_t cand = 0;  // marked in the first select pass, and again after a restart

  // 3. Radix select of the k-th best candidate score over pooled histograms. A pass counts
  // the candidates in [lo, hi] by (score - lo) >> shift, the last bin also taking everything
  // above its start, so that bins stay narrow near the floor, where the k-th best usually is:
  // bins of one score for 16-bit types (one pass: the candidates span far fewer than 2048
  // scores); for fp32, 2048 bins from the floor to the end of the digit above the highest
  // sampled one (on i.i.d. rows with small k, under one candidate a bin at the k-th best, so
  // the first pass often finds the pivot's bin kept whole and ends the select), then 11 bits
  // of the pivot's bin at a time. The sample's pass (step 1) is the loop's first, and the
  // marking runs at the top of a select pass, so that the pooled pass and the marking each
  // have one call site: code this kernel fetches after every flush costs time even where it
  // does not run.
  std::uint32_t range_lo = 1u, range_hi = Traits::kMask, need = sample_need;
  // Kept: score > kth, or == kth (the first keep_equal of them).
  std::uint32_t kth = kExcludedScore, keep_equal = 0;
  int shift = kTopShift;  // without a floor: the top digits first
  constexpr std::uint32_t last = kShortBins - 1;
  bool first = true;  // the first select pass of floor_score
  for (bool sample = true;; sample = false) {
    if (!sample) {
      if (first) cand = mark_candidates();
      for_each(cand, [&](std::uint32_t bits, int) {
        const std::uint32_t score = score_of<Traits>(bits, p.sp);
        if (score >= range_lo && score <= range_hi) {
          count_digit(min((score - range_lo) >> shift, last));
        }
      });
    }
    finish_pass(need);
    if (sample) {
      need = p.k_select;
      if (s.pivot.candidates < sample_need || s.pivot.digit == 0) continue;  // no floor
      floor_score = (s.pivot.digit << kTopShift) - 1u;
      range_lo = floor_score + 1u;
      if constexpr (kKeyBits == 16) {
        shift = 0;
      } else {
        // Up to the end of the digit above the highest sampled one: the k-th best lies above
        // the sample's best on some rows, and in the open last bin it would cost a pass more
        // (rows of 129280 normals, k=50: 1.08 passes on average against 1.53 up to the sampled
        // digit's own end and 1.50 with bins of 2^15). Where under 0.3 sampled elements are
        // expected above the k-th best (k <= 38 with a sample every 128 columns) it lies more
        // than a digit above the sample's best on many rows: two digits past it there (k=2-32:
        // 1.02-1.07 passes against 1.15-1.68, tools/cluster_passes.py; one fp32 row of 129280,
        // k=2-32, 18.7 -> 13.4 us on an H100). A digit of 2048 wraps to 0, whose span reaches
        // kMask.
        const std::uint32_t end_digit =
            min(s.pivot.top + p.cluster_span_past, static_cast<std::uint32_t>(kShortBins));
        const std::uint32_t span = (end_digit << kTopShift) - 1u - range_lo;
        const int bits_needed = 32 - __clz(span);
        shift = bits_needed > kShortDigitBits ? bits_needed - kShortDigitBits : 0;
      }
      continue;
    }
    if (first && s.pivot.candidates < need && floor_score != kExcludedScore) {
      // The sample overestimated the row: every valid element competes.
      floor_score = kExcludedScore;
      range_lo = 1u;
      shift = kTopShift;
      continue;
    }
    first = false;
    if (s.pivot.candidates <= need) break;  // all of [range_lo, range_hi] kept: kth = range_lo - 1
    const std::uint32_t d = s.pivot.digit;
    const std::uint32_t bin_lo = range_lo + (d << shift);
    const std::uint32_t width = (1u << shift) - 1u;  // the bin's span, less one
    const std::uint32_t bin_hi =
        d == last || range_hi - bin_lo <= width ? range_hi : bin_lo + width;
    const std::uint32_t in_bin = s.pivot.count;
    need = s.pivot.need;
    range_lo = bin_lo;
    range_hi = bin_hi;
    if (range_lo == range_hi || in_bin == need) break;
    // Narrow to the pivot's bin: 2048 bins of 2^shift cover it, the last one open above.
    const std::uint32_t span = range_hi - range_lo;
    const int bits_needed = 32 - __clz(span);
    shift = bits_needed > kShortDigitBits ? bits_needed - kShortDigitBits : 0;
  }
  if (range_lo == range_hi && s.pivot.candidates > need) {
    kth = range_lo;
    keep_equal = need;
  } else {
    kth = range_lo - 1u;  // everything from range_lo up is kept
  }

  // 4. Kept: score > kth, or score == kth among the first `keep_equal` such in column order,
  // as bit masks over the thread's columns. In the default case the packed comparison against
  // the bounds of kth + 1 and kth decides them exactly, with no loop over the candidates (whose
  // length varies from lane to lane); elsewhere each candidate's score is tested.
  std::uint32_t above = 0, at_kth = 0;
  {
    Prefilter<Traits> gt, ge;
    gt.set(kth, p.sp);
    ge.set(keep_equal > 0 ? kth - 1u : kth, p.sp);  // kth > the floor >= 0 when ties count
    if (gt.exact && (keep_equal == 0 || ge.exact)) {
      if constexpr (kFlipOnce) {
#pragma unroll
        for (int q = 0; q < kVecs; ++q) gt.add_flipped_bits(v[q], q * kVec, above);
        if (keep_equal > 0) {
#pragma unroll
          for (int q = 0; q < kVecs; ++q) ge.add_flipped_bits(v[q], q * kVec, at_kth);
        }
      } else {
#pragma unroll
        for (int q = 0; q < kVecs; ++q) {
          above |= gt.vector_may_pass_bits(v[q]) << (q * kVec);
          if (keep_equal > 0) at_kth |= ge.vector_may_pass_bits(v[q]) << (q * kVec);
        }
      }
      above &= cand;  // every element above kth (>= the floor) is a candidate
      at_kth &= cand & ~above;
    } else {
      for_each(cand, [&](std::uint32_t bits, int i) {
        const std::uint32_t score = score_of<Traits>(bits, p.sp);
        above |= static_cast<std::uint32_t>(score > kth) << i;
        at_kth |= static_cast<std::uint32_t>(score == kth && keep_equal > 0) << i;
      });
    }
  }
  const std::uint32_t greater = __popc(above), equal = __popc(at_kth);
  std::uint32_t cta_total;
  const std::uint32_t before =
      block_exclusive_sum<kThreads>((greater << 16) | equal, s.pivot.warp_totals, cta_total);
  std::uint32_t greater_before = before >> 16, equal_before = before & 0xFFFFu;
  std::uint32_t kept_total = (cta_total >> 16) + min(cta_total & 0xFFFFu, keep_equal);
  if constexpr (kClustered) {
    if (tid < ctas) {
      cluster_store(&s.cta_greater[rank], tid, cta_total >> 16);
      cluster_store(&s.cta_equal[rank], tid, cta_total & 0xFFFFu);
    }
    cluster_sync();
    // Lane r reads CTA r's counts and warp sums add them up: a loop over the CTAs in every
    // thread, unrolled for their count known only at run time, was about 270 SASS instructions
    // of this kernel's code, which it fetches after every flush.
    static_assert(kMaxClusterCtas <= kWarpSize, "one CTA's counts a lane");
    std::uint32_t greater_ctas, equal_ctas, all_greater, all_equal;
    const int ranks = static_cast<int>(ctas), own = static_cast<int>(rank);
    lane_totals_before(s.cta_greater, ranks, own, greater_ctas, all_greater);
    lane_totals_before(s.cta_equal, ranks, own, equal_ctas, all_equal);
    greater_before += greater_ctas;
    equal_before += equal_ctas;
    kept_total = all_greater + min(all_equal, keep_equal);
  }
  std::uint32_t pos = greater_before + min(equal_before, keep_equal);
  // The ties this thread keeps: the first keep_equal - equal_before of at_kth, in column order.
  const std::uint32_t ties = keep_equal > equal_before ? keep_equal - equal_before : 0u;
  if (ties < equal) {  // threads past the last kept tie keep none; one may keep some
    std::uint32_t kept_ties = 0;
    for (std::uint32_t t = 0; t < ties; ++t) {
      kept_ties |= at_kth & (0u - at_kth);
      at_kth &= at_kth - 1u;
    }
    at_kth = kept_ties;
  }
  const std::uint32_t kept = above | at_kth;
  if constexpr (!kSorted) {
    // Column order is the output order: every CTA writes its kept elements in place, and CTA 0
    // the padding.
    const std::int64_t offset =
        load_row_value(p.index_offset, p.index_offset_is_int64, p.index_offset_stride, b, 0);
    for_each(kept, [&](std::uint32_t bits, int i) {
      write_slot_bits<Traits>(p, b, pos++, true, static_cast<std::uint32_t>(c0 + i), offset, bits);
    });
    if (rank == 0) {
      // Slots past the row's kept elements (k beyond its valid columns): rare, so one copy of
      // the slot's write, not the compiler's unrolled four (about 90 SASS instructions).
#pragma unroll 1
      for (std::int64_t j = kept_total + tid; j < p.k; j += kThreads) {
        write_slot_bits<Traits>(p, b, j, false, 0u, offset, 0u);
      }
    }
  } else {
    // sorted="value": the kept elements go to CTA 0, which sorts them.
    for_each(kept, [&](std::uint32_t bits, int i) {
      cluster_store(smem + pos, 0, score_of<Traits>(bits, p.sp));
      cluster_store(smem + p.survivor_slots + pos, 0, static_cast<std::uint32_t>(c0 + i));
      ++pos;
    });
    if constexpr (kClustered) {
      cluster_sync();  // the kept elements are in CTA 0; the others are done with every copy
      if (rank != 0) return;
    } else {
      __syncthreads();
    }
    Candidates out{smem, smem + p.survivor_slots, kept_total};
    if (kept_total > 1) {
      // Through spare lists where the staged columns were (cluster_smem_bytes makes room).
      static_assert(sort_count_words<kThreads>() <= 2 * kShortBins, "the sort counts in s.hist");
      const Candidates spare{smem + 2 * p.survivor_slots, smem + 3 * p.survivor_slots, 0};
      out = sort_best_first<kThreads>(out, spare, &s.hist[0][0], s.pivot.warp_totals);
    }
    write_outputs<Traits, kThreads>(p, b, out);
  }
}

}  // namespace attnkit::detail::cuda
