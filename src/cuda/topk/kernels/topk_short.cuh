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
//                           16-bit rows hold (score << 16 | column - lo) words; when the
//                           candidates from the first digit's pivot up fit a list, they are
//                           placed there after the first digit and the pivot digit is resolved
//                           over the list alone (resolve_short_list), not over the registers.
//                           CTAs of 256 threads x 32 columns, four an SM; fp32 rows of more
//                           than kShortWideMinLen columns without sorted="value" take 512 x 16,
//                           three an SM (topk_launch.cuh).
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
  alignas(16) std::uint32_t hist[kShortBins];  // 16- or 8-byte reads in find_pivot_digit
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
  static_assert(kPer == 1 || kPer % 2 == 0, "whole 16- or 8-byte vectors of digits");
  // Thread t owns digits [top - kPer, top), counted from the top digit down.
  const int top = kBins - static_cast<int>(threadIdx.x) * kPer;
  std::uint32_t c[kPer];
  if constexpr (kPer == 1) {
    c[0] = top >= 1 + lowest ? hist[top - 1] : 0u;
  } else {
    if constexpr (kPer % 4 == 0) {
#pragma unroll
      for (int v = 0; v < kPer / 4; ++v) {
        const uint4 q = reinterpret_cast<const uint4*>(hist + top - kPer)[v];
        c[4 * v] = q.x, c[4 * v + 1] = q.y, c[4 * v + 2] = q.z, c[4 * v + 3] = q.w;
      }
    } else {  // 1024 bins over 512 threads
#pragma unroll
      for (int v = 0; v < kPer / 2; ++v) {
        const uint2 q = reinterpret_cast<const uint2*>(hist + top - kPer)[v];
        c[2 * v] = q.x, c[2 * v + 1] = q.y;
      }
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

/// n + (w >= bound): a comparison and a predicated add, where the compiler's own form of the
/// count takes three instructions.
__device__ __forceinline__ std::uint32_t count_at_least(std::uint32_t n, std::uint32_t w,
                                                        std::uint32_t bound) {
  asm("{\n\t.reg .pred p;\n\tsetp.ge.u32 p, %1, %2;\n\t@p add.u32 %0, %0, 1;\n\t}"
      : "+r"(n)
      : "r"(w), "r"(bound));
  return n;
}

/// When w > floor, stores w at the shared-memory address `at` and advances `at` by a word:
/// three instructions, where the compiler derives each address from a count (six). The test is
/// `>` against the bound less one so that ptxas does not share it with count_at_least's, which
/// keeps each element's flag in a register bit between the two loops (four more instructions).
__device__ __forceinline__ void append_if_above(std::uint32_t& at, std::uint32_t w,
                                                std::uint32_t floor) {
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.gt.u32 p, %1, %2;\n\t@p st.shared.u32 [%0], %1;\n\t"
      "@p add.u32 %0, %0, 4;\n\t}"
      : "+r"(at)
      : "r"(w), "r"(floor)
      : "memory");
}

/// Resolves the candidate list of the 16-bit path of topk_short_rows_kernel: leaves the kept
/// words, in column order, in `kept_words` and returns their count. `list` holds `listed`
/// words (score << 16 | column - lo) in column order: every candidate whose first digit is
/// `digit` or above (those above it, k_select - need in all, are all kept), or, with
/// `all_kept`, every valid element. The `need` best of the pivot digit's candidates are found
/// from a 32-bin histogram of their low 5 score bits (`s.hist`, cleared by the caller); the
/// kept words then follow as in the registers' placement, from one block scan of packed
/// (greater, equal) counts. Thread t takes the entries [t * per, (t + 1) * per), per being
/// four times an odd number, so that a warp's 16-byte loads hit distinct banks. Every thread
/// calls it; ends with a barrier.
template <int kThreads>
__device__ std::uint32_t resolve_short_list(const std::uint32_t* list, std::uint32_t listed,
                                            bool all_kept, std::uint32_t digit,
                                            std::uint32_t need, std::uint32_t* kept_words,
                                            ShortScratch& s) {
  const std::uint32_t quads = (listed + 4 * kThreads - 1) / (4 * kThreads) | 1u;
  const std::uint32_t first = threadIdx.x * 4 * quads;
  // Visits this thread's entries; past `listed` they read as word 0 (score 0, not a candidate).
  auto for_each_entry = [&](auto&& visit) {
    for (std::uint32_t v = 0; v < quads; ++v) {
      const std::uint32_t at = first + 4 * v;
      if (at >= listed) break;
      // In bounds: `at` and the capacity are multiples of four, and at < listed <= capacity.
      const uint4 q = *reinterpret_cast<const uint4*>(list + at);
      const std::uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int u = 0; u < 4; ++u) visit(at + u < listed ? w[u] : 0u);
    }
  };
  std::uint32_t kth = 0, keep_equal = 0;  // with all_kept every listed score beats 0
  if (!all_kept) {
    for_each_entry([&](std::uint32_t w) {
      if (w >> 21 == digit) atomicAdd(&s.hist[(w >> 16) & 31u], 1u);
    });
    __syncthreads();
    find_pivot_digit<kThreads, 32>(s.pivot, s.hist, need);
    kth = digit << 5 | s.pivot.digit;
    keep_equal = s.pivot.need;
  }
  // Scores compared as words: score > kth is w >= (kth + 1) << 16, score >= kth w >= kth << 16
  // (16-bit scores stay below 0xFF82, NaN's with nan="largest", so the shifts do not wrap).
  std::uint32_t greater = 0, equal = 0;
  for_each_entry([&](std::uint32_t w) {
    greater = count_at_least(greater, w, (kth + 1) << 16);
    equal = count_at_least(equal, w, kth << 16);
  });
  equal = all_kept ? 0u : equal - greater;
  std::uint32_t total;
  const std::uint32_t before =
      block_exclusive_sum<kThreads>(greater << 16 | equal, s.pivot.warp_totals, total);
  const std::uint32_t equal_before = before & 0xFFFFu;
  std::uint32_t pos = (before >> 16) + min(equal_before, keep_equal);
  if (equal_before >= keep_equal || equal_before + equal <= keep_equal) {
    // All of this thread's ties are kept, or none (every thread but the one holding the last
    // kept tie): one comparison an entry.
    const std::uint32_t bound = equal_before >= keep_equal ? kth + 1 : kth;  // at least 1
    std::uint32_t at = static_cast<std::uint32_t>(__cvta_generic_to_shared(kept_words)) + 4 * pos;
    for_each_entry([&](std::uint32_t w) { append_if_above(at, w, (bound << 16) - 1); });
  } else {
    std::uint32_t equal_seen = equal_before;
    for_each_entry([&](std::uint32_t w) {
      const bool is_equal = w >> 16 == kth;
      if (w >> 16 > kth || (is_equal && equal_seen < keep_equal)) kept_words[pos++] = w;
      equal_seen += is_equal;
    });
  }
  __syncthreads();
  return (total >> 16) + min(total & 0xFFFFu, keep_equal);
}

/// kMinBlocks, or as many CTAs of kThreads as the SMs of the architecture being compiled hold
/// when that is fewer (threads an SM: 1024 on sm_75, 1536 on sm_86, 87, 88, 89, 101, 110 and
/// 12x, 2048 on the others), so that the bound tuned for sm_90 still compiles for them, where
/// ptxas refuses a CTA count whose threads exceed the SM's.
template <int kThreads, int kMinBlocks>
constexpr int min_blocks_on_target() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 750
  constexpr int kSmThreads = 1024;
#elif defined(__CUDA_ARCH__) &&                                              \
    (__CUDA_ARCH__ == 860 || __CUDA_ARCH__ == 870 || __CUDA_ARCH__ == 880 ||  \
     __CUDA_ARCH__ == 890 || __CUDA_ARCH__ == 1010 || __CUDA_ARCH__ == 1100 || \
     __CUDA_ARCH__ >= 1200)
  constexpr int kSmThreads = 1536;
#else
  constexpr int kSmThreads = 2048;
#endif
  return kMinBlocks * kThreads <= kSmThreads ? kMinBlocks : kSmThreads / kThreads;
}

/// The kernel for CTAs of kThreads threads holding kPerThread columns each, kMinBlocks an SM
/// (the registers' bound; fewer where the SM holds fewer threads, min_blocks_on_target). The
/// sort of sorted="value" counts in the first pass's histogram, which holds the counts of up to
/// eight warps: wider CTAs are launched for the other orders only (the host's plan), and carry
/// no sort.
template <class Traits, int kThreads, int kPerThread, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, (min_blocks_on_target<kThreads, kMinBlocks>()))
    topk_short_rows_kernel(const TopkKernelParams p) {
  using Bits = typename Traits::Bits;
  constexpr int kVec = 16 / static_cast<int>(sizeof(Bits));
  static_assert(kPerThread % kVec == 0, "whole vectors per thread");
  constexpr int kKeyBits = Traits::kBits;
  // 16-bit scores are held as words (score << 16 | column - lo): a row of up to 8192 columns
  // leaves the low 16 bits to the column, so a candidate is stored with one shared store.
  constexpr int kLow = kKeyBits == 16 ? 16 : 0;
  static_assert(kKeyBits == 32 || kThreads * kPerThread <= 65536, "columns in 16 bits");
  // Kept keys and columns, [2][slots], then as many for the sort with sorted="value" (the
  // candidate words of 16-bit rows go there first).
  extern __shared__ __align__(16) std::uint32_t smem[];
  __shared__ ShortScratch s;

  const std::int64_t b = blockIdx.x;
  std::int64_t lo, hi;
  row_range(p, b, lo, hi);
  const Bits* row = static_cast<const Bits*>(p.x) + b * p.row_stride;
  const int tid = threadIdx.x;
  const std::int64_t c0 = lo + static_cast<std::int64_t>(tid) * kPerThread;
  const std::uint32_t rel0 = static_cast<std::uint32_t>(tid) * kPerThread;  // c0 - lo
  const std::uint32_t rel_pair = rel0 << 16 | rel0;
  // This thread's columns in [lo, hi) are c0 .. c0 + valid - 1. The per-element work below
  // tests no column bounds: they cost more instructions than the scores themselves.
  const std::int64_t rest = hi - c0;
  const int valid = rest <= 0 ? 0 : (rest >= kPerThread ? kPerThread : static_cast<int>(rest));

  // sc[i]: the score of column c0 + i, shifted left by kLow with the column's offset below.
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
      if constexpr (kKeyBits == 16) {
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          const std::uint32_t pair = score_pair_of<Traits>(vector_word(data, w), p.sp);
          const int i = first + 2 * w;
          // Both columns' offsets in one word (one add a pair), then one byte permute each.
          const std::uint32_t rels = rel_pair + (static_cast<std::uint32_t>(i + 1) << 16 | i);
          sc[i] = __byte_perm(pair, rels, 0x1054);      // low half over the first column
          sc[i + 1] = __byte_perm(pair, rels, 0x3276);  // high half over the second
        }
      } else {
#pragma unroll
        for (int j = 0; j < kVec; ++j) sc[first + j] = score_of<Traits>(vector_word(data, j), p.sp);
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const std::uint32_t score = score_of<Traits>(i < valid ? row[c0 + i] : Bits{0}, p.sp);
      sc[i] = kLow > 0 ? score << kLow | (rel0 + i) : score;
    }
  }
  if (valid < kPerThread) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) sc[i] = i < valid ? sc[i] : kExcludedScore;
  }
  if (p.nan_flag != nullptr) {  // nan="raise": only a NaN has nan_score, and it is not 0
    bool any_nan = false;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) any_nan |= sc[i] >> kLow == p.sp.nan_score;
    if (__syncthreads_or(any_nan) && tid == 0) *p.nan_flag = 1;
  }

  // Radix select of the k_select-th best score over the candidates (score != 0). Every number's
  // score is at least 0x7E for 16-bit types and 0x7FFFFE for fp32 (docs/topk.md "Scores"), so
  // the first pass's bin 0 holds only excluded scores: it counts every element unconditionally
  // and the pivot search starts at bin 1.
  constexpr int kPasses = kKeyBits == 16 ? 2 : 3;
  constexpr int kWidth[3] = {11, kKeyBits == 16 ? 5 : 11, 10};
  const std::uint32_t slots = p.survivor_slots;
  std::uint32_t* key = smem;
  std::uint32_t* col = smem + slots;
  // Writes the kept scores and columns (key, col): best first with sorted="value", through the
  // spare lists that follow them then.
  auto write_kept_lists = [&](std::uint32_t kept) {
    Candidates out{key, col, kept};
    if constexpr (sort_count_words<kThreads>() <= kShortBins) {
      if (p.sort_by_value && kept > 1) {
        const Candidates spare{smem + 2 * slots, smem + 3 * slots, 0};
        out = sort_best_first<kThreads>(out, spare, s.hist, s.pivot.warp_totals);
      }
    }
    write_outputs<Traits, kThreads>(p, b, out);
  };
  std::uint32_t prefix = 0, need = p.k_select;
  // Rows of at most k_select valid columns keep every candidate: no histogram to count.
  const bool row_all_kept = hi - lo <= static_cast<std::int64_t>(p.k_select);  // uniform
  bool all_kept = false;
  int shift = kKeyBits;
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int width = kWidth[pass];
    const int above_shift = shift;  // bits fixed by earlier passes are those >= above_shift
    shift -= width;
    if (pass > 0 || !row_all_kept) {
      // Only the bins this pass counts and searches, 16 bytes a store.
      for (int i = tid; i < (1 << width) / 4; i += kThreads) {
        reinterpret_cast<uint4*>(s.hist)[i] = make_uint4(0u, 0u, 0u, 0u);
      }
      __syncthreads();
      if (pass == 0) {
        if (valid > 0) {
#pragma unroll
          for (int i = 0; i < kPerThread; ++i) atomicAdd(&s.hist[sc[i] >> (shift + kLow)], 1u);
        }
      } else {
        const std::uint32_t span = 1u << above_shift;  // the prefix's scores: prefix + [0, span)
#pragma unroll
        for (int i = 0; i < kPerThread; ++i) {
          const std::uint32_t score = sc[i] >> kLow;
          if (score - prefix < span) {
            atomicAdd(&s.hist[(score >> shift) & ((1u << width) - 1u)], 1u);
          }
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
    }
    // Uniform: every candidate is kept.
    if (pass == 0) all_kept = row_all_kept || s.pivot.candidates <= need;
    if constexpr (kKeyBits == 16) {
      // 16-bit rows whose candidates from the pivot digit up fit the list: one more pass over
      // the registers places them, in column order, and the pivot digit is resolved there.
      // The other pass over the registers and its count of greater and equal scores, which
      // every element went through, then apply to the list only.
      // At most the list's words (the count itself comes from the scan below).
      const std::uint32_t listed = row_all_kept ? static_cast<std::uint32_t>(hi - lo)
                                   : all_kept   ? s.pivot.candidates
                                                : p.k_select - s.pivot.need + s.pivot.count;
      if (pass == 0 && listed <= p.candidate_words) {  // uniform
        const std::uint32_t digit = all_kept ? 0u : s.pivot.digit;
        const std::uint32_t digit_need = all_kept ? 0u : s.pivot.need;
        const std::uint32_t bound = (all_kept ? 1u : digit) << (shift + kLow);
        std::uint32_t n = 0;
#pragma unroll
        for (int i = 0; i < kPerThread; ++i) n = count_at_least(n, sc[i], bound);
        std::uint32_t total;
        const std::uint32_t before = block_exclusive_sum<kThreads>(n, s.pivot.warp_totals, total);
        const std::uint32_t* list = smem + 2 * slots;
        std::uint32_t at = static_cast<std::uint32_t>(__cvta_generic_to_shared(list)) + 4 * before;
        if (tid < 32) s.hist[tid] = 0;  // the pivot digit's 32 scores (resolve_short_list)
#pragma unroll
        for (int i = 0; i < kPerThread; ++i) append_if_above(at, sc[i], bound - 1);
        __syncthreads();
        const std::uint32_t kept =
            resolve_short_list<kThreads>(list, total, all_kept, digit, digit_need, key, s);
        const auto lo32 = static_cast<std::uint32_t>(lo);
        if (p.sort_by_value) {  // the sort takes scores and columns apart
          for (std::uint32_t j = tid; j < kept; j += kThreads) {
            const std::uint32_t w = key[j];
            key[j] = w >> 16;
            col[j] = lo32 + (w & 0xFFFFu);
          }
          __syncthreads();
          write_kept_lists(kept);
        } else {
          write_outputs<Traits, kThreads>(
              p, b, kept, [&](std::uint32_t j) { return lo32 + (key[j] & 0xFFFFu); },
              [&](std::uint32_t j) { return key[j] >> 16; });
        }
        return;
      }
    }
    if (all_kept) break;
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
    const std::uint32_t score = sc[i] >> kLow;
    if constexpr (kKeyBits == 16) {  // 16-bit scores: the sign of a difference is the comparison
      greater += (kth - score) >> 31;
      equal += (kth - 1u - score) >> 31;  // at least kth, for now
    } else {
      greater += score > kth;
      equal += score == kth;
    }
  }
  if constexpr (kKeyBits == 16) equal -= greater;
  if (kth == kExcludedScore) equal = 0;
  std::uint32_t total;
  const std::uint32_t before =
      block_exclusive_sum<kThreads>((greater << 16) | equal, s.pivot.warp_totals, total);
  const std::uint32_t kept = (total >> 16) + min(total & 0xFFFFu, keep_equal);
  const std::uint32_t equal_before = before & 0xFFFFu;
  std::uint32_t pos = (before >> 16) + min(equal_before, keep_equal);
  const auto col0 = static_cast<std::uint32_t>(c0);
  if (equal_before >= keep_equal || equal_before + equal <= keep_equal) {
    // This thread keeps all of its elements equal to kth or none of them (every thread but
    // the one holding the last kept tie): one comparison an element.
    const std::uint32_t bound = equal_before >= keep_equal ? kth + 1 : kth;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const std::uint32_t score = sc[i] >> kLow;
      if (score >= bound) {
        key[pos] = score;
        col[pos] = col0 + i;
        ++pos;
      }
    }
  } else {
    std::uint32_t equal_seen = equal_before;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const std::uint32_t score = sc[i] >> kLow;
      const bool is_equal = score == kth;
      if (score > kth || (is_equal && equal_seen < keep_equal)) {
        key[pos] = score;
        col[pos] = col0 + i;
        ++pos;
      }
      equal_seen += is_equal;
    }
  }
  __syncthreads();
  write_kept_lists(kept);
}

}  // namespace attnkit::detail::cuda
