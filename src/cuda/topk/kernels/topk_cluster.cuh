// SPDX-License-Identifier: Apache-2.0
// The CUDA top-k kernel for rows of up to kMaxClusterCtas * 8192 columns, held in the
// registers of one thread-block cluster (sm_90) that pools its histograms and candidates through
// distributed shared memory; with one CTA per row elsewhere. Algorithm and measured numbers:
// docs/topk.md ("Clusters").
//
//   topk_cluster_rows_kernel  one cluster per row. Thread t of CTA r holds the kPerThread
//                             consecutive columns from lo + (r * kThreads + t) * kPerThread as
//                             raw 16-byte vectors, so column order is (CTA, thread, element)
//                             order. Then:
//     1. Sample. A spread sample of the row's scores (common/topk_sample.hpp) goes into an
//        11-bit-digit histogram; the digit holding the sample's `need`-th best, `need` the
//        expected count above the k-th plus three standard deviations, gives a floor that
//        about 1.5 k of the row's elements beat.
//     2. Candidates. A packed prefilter (one comparison per 32-bit word) and an exact score
//        test on the flagged elements mark the elements scoring above the floor in a
//        per-thread bit mask; the CTAs exchange their counts.
//     3a. Fast path (the count reaches k and fits CTA 0's candidate list): every CTA writes its
//        candidates, in column order, into CTA 0's shared memory, and CTA 0 alone selects the
//        best k of them (select_into), sorts them for sorted="value" and writes the outputs.
//     3b. Otherwise (the sample overestimated the row, so fewer than k beat the floor, and
//        every valid element competes; or too many tie above it): a radix select over the
//        candidate masks in registers, 11 + 5 bits for 16-bit types, 11 + 11 + 10 for fp32,
//        each pass's histogram pooled across the cluster; then one block scan of packed
//        (greater, equal) counts and an exchange of the CTAs' totals place every kept element
//        in CTA 0's list. Either way the result never depends on the sample, only the time.
//   Pooling: every CTA counts into a private histogram, then adds the nonzero bins to every
//   CTA's copy of the pass's histogram, so that after one cluster barrier each CTA finds the
//   same pivot on its own copy. Two histograms alternate between passes, so a copy is cleared
//   by its owner a full barrier before anyone adds to it again.
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

#ifdef ATTNKIT_TOPK_TRACE
__device__ unsigned long long g_topk_trace[16];
#define ATTNKIT_TRACE(i)                                                   \
  do {                                                                     \
    if (blockIdx.x == 0 && threadIdx.x == 0) {                             \
      unsigned long long t;                                                \
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));                \
      g_topk_trace[i] = t;                                                 \
    }                                                                      \
  } while (0)
#else
#define ATTNKIT_TRACE(i)
#endif

constexpr int kMaxClusterCtas = 16;  // non-portable cluster size on sm_90

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

/// The address of `p` (in this CTA's shared memory) in the shared memory of cluster CTA `rank`.
template <class T>
__device__ __forceinline__ T* cluster_map(T* p, unsigned rank) {
#ifdef ATTNKIT_HAS_CLUSTERS
  return cooperative_groups::this_cluster().map_shared_rank(p, rank);
#else
  (void)rank;
  return p;
#endif
}

template <int kThreads, bool kClustered>
struct ClusterScratch {
  union {
    std::uint32_t hist[2][kShortBins];  // digit counts of the row, alternating between passes
    SelectScratch<kThreads> select;     // CTA 0's final select, after the last pooling
  };
  std::uint32_t local[kClustered ? kShortBins : 1];  // this CTA's counts, before they are pooled
  std::uint32_t warp_totals[32];
  std::uint32_t cta_count[kMaxClusterCtas];    // candidates of each cluster CTA
  std::uint32_t cta_greater[kMaxClusterCtas];  // kept-element counts of each cluster CTA
  std::uint32_t cta_equal[kMaxClusterCtas];
  std::uint32_t pivot_digit;
  std::uint32_t pivot_need;
  std::uint32_t candidates;
};

template <class Traits, int kThreads, int kPerThread, bool kClustered>
__global__ void __launch_bounds__(kThreads, 4) topk_cluster_rows_kernel(const TopkKernelParams p) {
  using Bits = typename Traits::Bits;
  constexpr int kVec = 16 / static_cast<int>(sizeof(Bits));  // elements per 16-byte vector
  constexpr int kVecs = kPerThread / kVec;
  constexpr std::uint32_t kVecMask = (1u << kVec) - 1u;
  static_assert(kPerThread == 32, "one 32-bit candidate mask per thread");
  // Kept keys and columns [2][survivor_slots], then candidate keys and columns
  // [2][candidate_slots] (CTA 0's are the cluster's).
  extern __shared__ __align__(16) std::uint32_t smem[];
  __shared__ ClusterScratch<kThreads, kClustered> s;

  const unsigned ctas = kClustered ? static_cast<unsigned>(p.cluster_ctas) : 1u;
  const unsigned rank = kClustered ? cluster_rank() : 0u;
  const std::int64_t b = blockIdx.x / ctas;
  std::int64_t lo, hi;
  row_range(p, b, lo, hi);
  ATTNKIT_TRACE(0);
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
    if (vm == kVecMask && aligned) {
      v[q] = __ldg(reinterpret_cast<const uint4*>(row + col));
    } else {
      std::uint32_t words[4] = {};
      constexpr int kPerWord = kVec / 4;  // elements in a 32-bit word
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        if ((vm >> j) & 1u) {
          words[j / kPerWord] |= static_cast<std::uint32_t>(row[col + j])
                                 << ((j % kPerWord) * (32 / kPerWord));
        }
      }
      v[q] = uint4{words[0], words[1], words[2], words[3]};
    }
  }
  for (int i = tid; i < 2 * kShortBins; i += kThreads) (&s.hist[0][0])[i] = 0;
  if constexpr (kClustered) {
    for (int i = tid; i < kShortBins; i += kThreads) s.local[i] = 0;
  }

  // Calls fn(bits, i) for every set bit i of `mask`, in column order.
  auto for_each = [&](std::uint32_t mask, auto&& fn) {
#pragma unroll
    for (int q = 0; q < kVecs; ++q) {
      std::uint32_t m = (mask >> (q * kVec)) & kVecMask;
      while (m != 0) {
        const int j = __ffs(m) - 1;
        m &= m - 1;
        fn(vector_element<kVec>(v[q], j), q * kVec + j);
      }
    }
  };

  if (p.nan_flag != nullptr) {
    bool any_nan = false;
    for_each(valid, [&](std::uint32_t bits, int) { any_nan |= is_nan_bits<Traits>(bits); });
    if (__syncthreads_or(any_nan) && tid == 0) *p.nan_flag = 1;
  }

  // Histogram passes. Counts go straight to the CTA's histogram, or in a cluster to a private
  // one whose nonzero bins are then added to every CTA's copy (see the file comment).
  int h = 0;  // the histogram the next pass uses
  auto count_digit = [&](std::uint32_t digit) {
    atomicAdd(kClustered ? &s.local[digit] : &s.hist[h][digit], 1u);
  };
  auto pool_counts = [&] {
    if constexpr (kClustered) {
      __syncthreads();
      for (int i = tid; i < kShortBins; i += kThreads) {
        const std::uint32_t c = s.local[i];
        if (c == 0) continue;
        s.local[i] = 0;
        for (unsigned r = 0; r < ctas; ++r) atomicAdd(cluster_map(&s.hist[h][i], r), c);
      }
      cluster_sync();
    } else {
      __syncthreads();
    }
  };
  // Finds the pivot digit of the finished pass, then clears its histogram for the pass after
  // next and flips to the other one.
  auto finish_pass = [&](int bins, std::uint32_t need) {
    pool_counts();
    find_pivot_digit<kThreads>(s, s.hist[h], bins, need);
    for (int i = tid; i < bins; i += kThreads) s.hist[h][i] = 0;
    h ^= 1;
  };
  if constexpr (kClustered) cluster_sync();  // every CTA runs and has cleared its histograms
  else __syncthreads();
  ATTNKIT_TRACE(1);

  // 1. Sample: the threshold that about 1.5 k of the row's elements reach.
  constexpr int kKeyBits = Traits::kBits;
  constexpr int kTopShift = kKeyBits - kShortDigitBits;
  const int every = short_sample_every(static_cast<int>(ctas));
  {
    const int js = short_sample_element(tid, static_cast<int>(rank));
    if (tid % every == 0 && ((valid >> js) & 1u)) {
      constexpr int kPerWord = kVec / 4;  // elements in a 32-bit word
      // Masks with static indices select the word, so that v stays in registers.
      std::uint32_t word = 0;
#pragma unroll
      for (int w = 0; w < 4 * kVecs; ++w) {
        word |= vector_word(v[w / 4], w % 4) & (0u - static_cast<std::uint32_t>(w == js / kPerWord));
      }
      const std::uint32_t bits = kPerWord == 1 ? word : (word >> (16 * (js % 2))) & 0xFFFFu;
      const std::uint32_t score = score_of<Traits>(bits, p.sp);
      if (score != kExcludedScore) count_digit(score >> kTopShift);
    }
  }
  // Samples above the k-th best: k / (columns per sample) expected; allow three deviations.
  const float expected = static_cast<float>(p.k_select) / static_cast<float>(kPerThread * every);
  const auto sample_need = static_cast<std::uint32_t>(expected + 3.0f * sqrtf(expected) + 2.0f);
  finish_pass(kShortBins, sample_need);
  ATTNKIT_TRACE(2);
  std::uint32_t floor_score = kExcludedScore;  // candidates score above it
  if (s.candidates >= sample_need && s.pivot_digit > 0) floor_score = (s.pivot_digit << kTopShift) - 1u;

  // 2. Candidates: the valid elements scoring above the floor.
  auto mark_candidates = [&] {
    std::uint32_t marked = 0;
    Prefilter<Traits> pre;
    pre.set(floor_score, p.sp);
#pragma unroll
    for (int q = 0; q < kVecs; ++q) {
      std::uint32_t m = pre.vector_may_pass_bits(v[q]) & (valid >> (q * kVec)) & kVecMask;
      while (m != 0) {
        const int j = __ffs(m) - 1;
        m &= m - 1;
        if (score_of<Traits>(vector_element<kVec>(v[q], j), p.sp) > floor_score) {
          marked |= 1u << (q * kVec + j);
        }
      }
    }
    return marked;
  };
  std::uint32_t cand = mark_candidates();
  ATTNKIT_TRACE(3);
  std::uint32_t cta_candidates;
  std::uint32_t cand_before =
      block_exclusive_sum<kThreads>(static_cast<std::uint32_t>(__popc(cand)), s.warp_totals,
                                    cta_candidates);
  std::uint32_t row_candidates = cta_candidates;
  if constexpr (kClustered) {
    if (tid == 0) {
      for (unsigned r = 0; r < ctas; ++r) *cluster_map(&s.cta_count[rank], r) = cta_candidates;
    }
    cluster_sync();
    row_candidates = 0;
    for (unsigned r = 0; r < ctas; ++r) {
      cand_before += r < rank ? s.cta_count[r] : 0u;
      row_candidates += s.cta_count[r];
    }
  }
  ATTNKIT_TRACE(4);

  // 3a. Fast path: CTA 0 selects from the gathered candidates.
  const std::uint32_t k_select = p.k_select;
  if ((row_candidates >= k_select || floor_score == kExcludedScore) &&
      row_candidates <= p.candidate_slots) {
    std::uint32_t* cand_key = smem + 2 * p.survivor_slots;
    std::uint32_t* cand_col = cand_key + p.candidate_slots;
    std::uint32_t* key_to = kClustered ? cluster_map(cand_key, 0) : cand_key;
    std::uint32_t* col_to = kClustered ? cluster_map(cand_col, 0) : cand_col;
    for_each(cand, [&](std::uint32_t bits, int i) {
      key_to[cand_before] = score_of<Traits>(bits, p.sp);
      col_to[cand_before] = static_cast<std::uint32_t>(c0 + i);
      ++cand_before;
    });
    if constexpr (kClustered) {
      cluster_sync();  // the candidates are in CTA 0; the others are done with every copy
      if (rank != 0) return;
    } else {
      __syncthreads();
    }
    Candidates kept{cand_key, cand_col, row_candidates};
  ATTNKIT_TRACE(5);
    if (row_candidates > k_select) {
      select_into<kThreads, kKeyBits>(kept, Candidates{cand_key, cand_col, 0}, smem,
                                      smem + p.survivor_slots, k_select, s.select);
      kept = Candidates{smem, smem + p.survivor_slots, k_select};
    }
  ATTNKIT_TRACE(6);
    if (p.sort_by_value && kept.n > 1) {
      // The sort needs a power-of-two span: candidates past k sit in the kept lists.
      if (kept.key != smem) {
        for (std::uint32_t i = tid; i < kept.n; i += kThreads) {
          smem[i] = kept.key[i];
          smem[p.survivor_slots + i] = kept.col[i];
        }
        kept = Candidates{smem, smem + p.survivor_slots, kept.n};
      }
      sort_best_first<kThreads>(kept.key, kept.col, kept.n, next_pow2(kept.n));
    }
    write_outputs<Traits, kThreads>(p, b, kept);
  ATTNKIT_TRACE(7);
    return;
  }

  // 3b. Radix select over the candidate masks.
  constexpr int kPasses = kKeyBits == 16 ? 2 : 3;
  constexpr int kWidth[3] = {kShortDigitBits, kKeyBits == 16 ? 5 : 11, 10};
  std::uint32_t prefix = 0, need = k_select;
  bool all_kept = false;
  if (row_candidates < k_select && floor_score != kExcludedScore) {
    floor_score = kExcludedScore;  // the sample overestimated: every valid element competes
    cand = mark_candidates();
  }
  for_each(cand, [&](std::uint32_t bits, int) {
    count_digit(score_of<Traits>(bits, p.sp) >> kTopShift);
  });
  finish_pass(kShortBins, need);
  if (s.candidates <= need) {
    all_kept = true;
  } else {
    int shift = kTopShift;
    prefix = s.pivot_digit << shift;
    need = s.pivot_need;
#pragma unroll
    for (int pass = 1; pass < kPasses; ++pass) {
      const int width = kWidth[pass];
      const int above_shift = shift;  // bits fixed by earlier passes are those >= shift
      shift -= width;
      for_each(cand, [&](std::uint32_t bits, int) {
        const std::uint32_t score = score_of<Traits>(bits, p.sp);
        if ((score >> above_shift) == (prefix >> above_shift)) {
          count_digit((score >> shift) & ((1u << width) - 1u));
        }
      });
      finish_pass(1 << width, need);
      prefix |= s.pivot_digit << shift;
      need = s.pivot_need;
    }
  }

  // 4. Kept: score > kth, or score == kth among the first `keep_equal` such in column order.
  const std::uint32_t kth = all_kept ? kExcludedScore : prefix;
  const std::uint32_t keep_equal = all_kept ? 0u : need;
  std::uint32_t greater = 0, equal = 0;
  for_each(cand, [&](std::uint32_t bits, int) {
    const std::uint32_t score = score_of<Traits>(bits, p.sp);
    greater += score > kth;
    equal += score == kth;
  });
  std::uint32_t cta_total;
  const std::uint32_t before =
      block_exclusive_sum<kThreads>((greater << 16) | equal, s.warp_totals, cta_total);
  std::uint32_t greater_before = before >> 16, equal_before = before & 0xFFFFu;
  std::uint32_t kept_total = (cta_total >> 16) + min(cta_total & 0xFFFFu, keep_equal);
  std::uint32_t* out_key = smem;
  std::uint32_t* out_col = smem + p.survivor_slots;
  if constexpr (kClustered) {
    if (tid == 0) {
      for (unsigned r = 0; r < ctas; ++r) {
        *cluster_map(&s.cta_greater[rank], r) = cta_total >> 16;
        *cluster_map(&s.cta_equal[rank], r) = cta_total & 0xFFFFu;
      }
    }
    cluster_sync();
    std::uint32_t all_greater = 0, all_equal = 0;
    for (unsigned r = 0; r < ctas; ++r) {
      if (r < rank) {
        greater_before += s.cta_greater[r];
        equal_before += s.cta_equal[r];
      }
      all_greater += s.cta_greater[r];
      all_equal += s.cta_equal[r];
    }
    kept_total = all_greater + min(all_equal, keep_equal);
    out_key = cluster_map(out_key, 0);
    out_col = cluster_map(out_col, 0);
  }
  std::uint32_t pos = greater_before + min(equal_before, keep_equal);
  for_each(cand, [&](std::uint32_t bits, int i) {
    const std::uint32_t score = score_of<Traits>(bits, p.sp);
    const bool is_equal = score == kth;
    if (score > kth || (is_equal && equal_before < keep_equal)) {
      out_key[pos] = score;
      out_col[pos] = static_cast<std::uint32_t>(c0 + i);
      ++pos;
    }
    equal_before += is_equal;
  });
  if constexpr (kClustered) {
    cluster_sync();  // the kept elements are in CTA 0; the others are done with every copy
    if (rank != 0) return;
  } else {
    __syncthreads();
  }
  if (p.sort_by_value && kept_total > 1) {
    sort_best_first<kThreads>(smem, smem + p.survivor_slots, kept_total, next_pow2(kept_total));
  }
  write_outputs<Traits, kThreads>(p, b, Candidates{smem, smem + p.survivor_slots, kept_total});
}

}  // namespace attnkit::detail::cuda
