// SPDX-License-Identifier: Apache-2.0
// The CUDA top-k kernels for k <= kMaxFilterK: one read of each row through a threshold filter
// into candidate lists in shared memory, cut back to k by a block radix select whenever the
// newcomers fill up. Algorithm, invariants and bound: docs/topk.md.
//
//   topk_rows_kernel   one CTA per (row, slice). A row of at least kFilterSampleMinVectors
//                      vectors first gets a sampled floor (FilterEngine::sample_floor), the
//                      starting threshold: a whole row is streamed again from the bottom in the
//                      rare case that fewer than k elements reach it; every slice of a sliced
//                      row samples the whole row for the same floor, and the merge decides
//                      whether the row must be streamed again. A slice streams its columns in
//                      order, a round of kU (2 or 4, by policy) coalesced 16-byte vectors per
//                      thread at a time, kPrefetchVectors vectors ahead, rows in reverse
//                      (row_of_block). An
//                      element is a newcomer if it beats the threshold by one float comparison
//                      against the bound of threshold + 1 (prefilter_tight_bound_bits), which
//                      decides every number, and, where NaN must be judged, by its exact score;
//                      newcomers are appended in column order (block prefix sums, one barrier
//                      per round). When survivors + newcomers reach `limit`, select_into keeps
//                      the best k in the other survivor list and the threshold rises to the
//                      k-th key (FilterEngine::make_room: a newcomer list too small for k +
//                      slack + round is emptied earlier before the first select).
//                      Single-slice launches write the outputs; multi-slice launches write
//                      each slice's best k to workspace.
//   topk_merge_kernel  one CTA per row: the slices' kept (key, column) lists, in column order
//                      slice after slice, are copied into the newcomer list when they all fit
//                      it and selected once, else read through the same filter from the
//                      largest of the slices' final thresholds (a lower bound of the row's k-th
//                      best); the row is streamed again when they hold fewer than k. Then the
//                      outputs are written. Used when B is too small to fill the GPU with one
//                      CTA per row.
//
// Thread roles: all threads load, filter and append; all take part in every select.
// Shared memory (dynamic): survivors key/col [2][kS] (kS = next power of two >= k; the final
// sort goes from one list to the other), newcomers key/col [slack + round] (where the sort
// counts); static: SelectScratch, append counts.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common/topk_index.hpp"
#include "common/topk_keys.hpp"
#include "common/topk_sample.hpp"
#include "cuda/common/block_scan.cuh"
#include "cuda/common/dependent_launch.cuh"
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

/// The row of CTA `block` when each row takes `per_row` consecutive CTAs: rows in reverse, so
/// that with causal prefill ends (end[b] rising with b) the longest rows start first and the
/// short ones fill the last wave instead of a few long ones trailing it (longest first): 2048 x
/// 65536 bf16 causal rows 2.7-3.8 % faster (run 57), rows of one length within 1 %. The
/// short-row kernel keeps the forward order, which measured 2-3 % faster on its causal rows.
__device__ __forceinline__ std::int64_t row_of_block(std::int64_t block, std::int64_t per_row) {
  return static_cast<std::int64_t>(gridDim.x) / per_row - 1 - block / per_row;
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

/// Slice s of row b's valid range (row_range cut into p.slices near-equal parts).
__device__ __forceinline__ void slice_range(const TopkKernelParams& p, std::int64_t b,
                                            std::int64_t s, std::int64_t& lo, std::int64_t& hi) {
  std::int64_t row_lo, row_hi;
  row_range(p, b, row_lo, row_hi);
  const std::int64_t len = row_hi - row_lo;
  lo = row_lo + len * s / p.slices;
  hi = row_lo + len * (s + 1) / p.slices;
}

/// Elements of [lo, hi) before the first 16-byte boundary at or after row + lo: the scalar
/// head that precedes 16-byte vector loads.
template <class Bits>
__device__ __forceinline__ std::int64_t head_to_alignment(const Bits* row, std::int64_t lo,
                                                          std::int64_t hi) {
  const auto addr = reinterpret_cast<std::uintptr_t>(row + lo);
  const auto to_align = static_cast<std::int64_t>(((16 - addr % 16) % 16) / sizeof(Bits));
  return to_align < hi - lo ? to_align : hi - lo;
}

/// The prefilter of one 32-bit word of input (one fp32 element or two 16-bit ones): nonzero
/// when some element in it may beat the threshold. `w` has the sign bits flipped for
/// largest=false (x -> -x reverses the order, and NaN stays NaN), so one unordered
/// "greater or equal" serves both directions: NaN always passes, to be judged exactly.
template <class Traits>
__device__ __forceinline__ std::uint32_t word_may_pass(std::uint32_t w, std::uint32_t bound) {
  if constexpr (Traits::kBits == 32) {
    return !(__uint_as_float(w) < __uint_as_float(bound));
  } else if constexpr (Traits::kInf == 0x7F80u) {  // bfloat16x2
    return __hgeu2_mask(*reinterpret_cast<const __nv_bfloat162*>(&w),
                        *reinterpret_cast<const __nv_bfloat162*>(&bound));
  } else {  // half2
    return __hgeu2_mask(*reinterpret_cast<const __half2*>(&w),
                        *reinterpret_cast<const __half2*>(&bound));
  }
}

/// word_may_pass for largest=false without the sign flip: nonzero when some element of `w`
/// is not above `bound` (NaN included), i.e. !(x > bound).
template <class Traits>
__device__ __forceinline__ std::uint32_t word_may_pass_smallest(std::uint32_t w,
                                                                std::uint32_t bound) {
  if constexpr (Traits::kBits == 32) {
    return !(__uint_as_float(w) > __uint_as_float(bound));
  } else if constexpr (Traits::kInf == 0x7F80u) {  // bfloat16x2
    return __hleu2_mask(*reinterpret_cast<const __nv_bfloat162*>(&w),
                        *reinterpret_cast<const __nv_bfloat162*>(&bound));
  } else {  // half2
    return __hleu2_mask(*reinterpret_cast<const __half2*>(&w),
                        *reinterpret_cast<const __half2*>(&bound));
  }
}

/// Word w (0..3) of a vector, for a w known only at run time (a select chain, so the vector
/// stays in registers).
__device__ __forceinline__ std::uint32_t vector_word(const uint4& v, int w) {
  return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
}

/// Element j of a 16-byte vector of kVec elements (4 fp32 or 8 16-bit), as bits.
template <int kVec>
__device__ __forceinline__ std::uint32_t vector_element(const uint4& v, int j) {
  if constexpr (kVec == 4) {
    return vector_word(v, j);
  } else {
    // Element j's two bytes (little endian) from the pair of words holding it, by one byte
    // permute whose selector follows from j, instead of a chain of selects over four words.
    const bool high_pair = j >= 4;
    const std::uint32_t lo = high_pair ? v.z : v.x, hi = high_pair ? v.w : v.y;
    return __byte_perm(lo, hi, 0x10u + 0x22u * static_cast<std::uint32_t>(j & 3)) & 0xFFFFu;
  }
}

/// The first n (<= kVec) elements at p as a 16-byte vector, zeros after them, read element by
/// element: a row's last, partial vector (nothing past the row is touched), or a vector at an
/// address that is not 16-byte aligned.
template <int kVec, class Bits>
__device__ __forceinline__ uint4 load_vector_prefix(const Bits* p, int n) {
  constexpr int kPerWord = kVec / 4;  // elements in a 32-bit word
  std::uint32_t words[4] = {};
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    if (j < n) {
      words[j / kPerWord] |= static_cast<std::uint32_t>(p[j]) << ((j % kPerWord) * (32 / kPerWord));
    }
  }
  return uint4{words[0], words[1], words[2], words[3]};
}

/// The prefilter of a threshold: one packed comparison per 32-bit word tells whether any element of
/// a 16-byte vector may score above the threshold (word_may_pass). In the forms that take the
/// direction at run time, input words are XORed with `sign_flip` (the sign bits for largest=false,
/// else 0) and compared with `bound`, both replicated per 16-bit lane; the `_as<kSmallest>` forms
/// compare the words as loaded, with `<=` against `bound ^ sign_flip` for smallest;
/// add_flipped_bits compares words the caller has already XORed with `sign_flip` (the cluster
/// kernel's CTAs flip their registers once, except 16-bit ones of 512 threads), as does
/// `_as<false>` for either direction. The bound is prefilter_tight_bound_bits', exact for numbers
/// wherever it exists, so numbers equal to the threshold's value do not pass; `exact` says that the
/// comparison is the whole admission test (NaN, which passes every bound, beats the threshold too),
/// so callers may skip the exact scores.
template <class Traits>
struct Prefilter {
  std::uint32_t sign_flip = 0;
  std::uint32_t bound = 0;
  bool exact = false;

  /// Times an element's bits: them in every element of a word (one fp32, two 16-bit).
  static constexpr std::uint32_t kLanes = Traits::kBits == 32 ? 1u : 0x00010001u;

  /// The sign bits of every element of a word for largest=false, else 0.
  __device__ __forceinline__ static std::uint32_t sign_flip_of(const ScoreParams& sp) {
    return sp.flip == 0 ? 0u : Traits::kSign * kLanes;
  }

  __device__ void set(std::uint32_t threshold, const ScoreParams& sp) {
    sign_flip = sign_flip_of(sp);
    bool numbers_exact;
    const std::uint32_t b = prefilter_tight_bound_bits<Traits>(threshold, sp, numbers_exact);
    exact = numbers_exact && sp.nan_score > threshold;
    bound = ((b ^ (sp.flip == 0 ? 0u : Traits::kSign)) & Traits::kMask) * kLanes;
  }

  /// Whether some element of a 16-byte vector may beat the threshold.
  __device__ __forceinline__ bool vector_may_pass(const uint4& v) const {
    return (word_may_pass<Traits>(v.x ^ sign_flip, bound) |
            word_may_pass<Traits>(v.y ^ sign_flip, bound) |
            word_may_pass<Traits>(v.z ^ sign_flip, bound) |
            word_may_pass<Traits>(v.w ^ sign_flip, bound)) != 0;
  }

  /// The same test as a bit mask over the vector's elements (bit j: element j may pass).
  __device__ __forceinline__ std::uint32_t vector_may_pass_bits(const uint4& v) const {
    const std::uint32_t words[4] = {v.x, v.y, v.z, v.w};
    std::uint32_t m[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) m[i] = word_may_pass<Traits>(words[i] ^ sign_flip, bound);
    return pack_lane_masks(m);
  }

  /// vector_may_pass_bits for a direction known at compile time (kSmallest: sign_flip is the
  /// sign bits, else 0): the input is compared as it is, with "less or equal" against the
  /// bound's own value for smallest, so no word is XORed. `_as<false>` also takes words
  /// already XORed with `sign_flip`, for either direction (the cluster kernel's marking, and
  /// add_flipped_bits' 16-bit form).
  template <bool kSmallest>
  __device__ __forceinline__ std::uint32_t vector_may_pass_bits_as(const uint4& v) const {
    const std::uint32_t b = kSmallest ? bound ^ sign_flip : bound;
    const std::uint32_t words[4] = {v.x, v.y, v.z, v.w};
    std::uint32_t m[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      m[i] = kSmallest ? word_may_pass_smallest<Traits>(words[i], b)
                       : word_may_pass<Traits>(words[i], b);
    }
    return pack_lane_masks(m);
  }

  /// For words already XORed with `sign_flip` (sign_flip_of of the ScoreParams given to set, so
  /// compared as they are): ORs into `mask`, from bit `first` on, bit j for each element j of
  /// `v` that may pass (vector_may_pass_bits of the unflipped words). For fp32 one comparison and
  /// one predicated OR an element, where the compiler's select, shift and OR of each element's
  /// bit into place took about four instructions.
  __device__ __forceinline__ void add_flipped_bits(const uint4& v, int first,
                                                   std::uint32_t& mask) const {
    if constexpr (Traits::kBits == 32) {
      const std::uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        // !(x < bound), NaN included, as word_may_pass
        asm("{\n\t.reg .pred p;\n\tsetp.geu.f32 p, %1, %2;\n\t@p or.b32 %0, %0, %3;\n\t}"
            : "+r"(mask)
            : "f"(__uint_as_float(words[i])), "f"(__uint_as_float(bound)), "r"(1u << (first + i)));
      }
    } else {
      mask |= vector_may_pass_bits_as<false>(v) << first;
    }
  }

  /// Bit j of the result: element j's comparison (word_may_pass results of a vector's words).
  __device__ __forceinline__ static std::uint32_t pack_lane_masks(const std::uint32_t (&m)[4]) {
    if constexpr (Traits::kBits == 32) {
      return m[0] | m[1] << 1 | m[2] << 2 | m[3] << 3;
    } else {
      // A word's result is all ones in each 16-bit lane that passes, so its bits 15 and 16 are
      // elements 2i and 2i + 1, side by side: masked, the four pairs move next to each other
      // by multiplications (no carries, the bits are disjoint), seven instructions a vector.
      constexpr std::uint32_t kPair = 0x00018000u;
      const std::uint32_t packed = (m[0] & kPair) + (m[1] & kPair) * 4u + (m[2] & kPair) * 16u +
                                   (m[3] & kPair) * 64u;
      return packed >> 15;
    }
  }
};

// ---------------------------------------------------------------------------------------------
// The filter engine: per-CTA state and the steps every kernel shares
// ---------------------------------------------------------------------------------------------

/// Appends list `from` after the `to.n` entries of list `to`, once every thread's writes of
/// `from` have landed; ends with a barrier. Not inlined: make_room takes it only before the
/// first select, on plans whose newcomer list has room for the slack alone, and inlined into
/// every round it cost the other plans 0-3 % (run 170; 0-2 % out of line, run 171).
template <int kThreads>
__device__ __noinline__ void append_list(Candidates to, Candidates from) {
  __syncthreads();
  for (std::uint32_t p = threadIdx.x; p < from.n; p += kThreads) {
    to.key[to.n + p] = from.key[p];
    to.col[to.n + p] = from.col[p];
  }
  __syncthreads();
}

template <class Traits, int kThreads, bool kRolledPasses>
struct FilterEngine {
  static constexpr int kWarps = kThreads / kWarpSize;
  static constexpr int kMaxWords = 2;  // packed append counts: two 16-bit groups a word

  // The lists live in dynamic shared memory: survivor lists 0 and 1 (key [slots], col [slots]
  // each), then the newcomers (key [newcomer_slots], col [newcomer_slots]). Their addresses are
  // derived from the array when used rather than held, so that the stream's registers go to
  // data in flight (two CTAs an SM allow 128 a thread, three 80).
  std::uint32_t slots;           // per survivor list
  std::uint32_t newcomer_slots;
  std::uint32_t current = 0;     // the survivor list holding the survivors, column order
  std::uint32_t survivors_n = 0;
  std::uint32_t newcomers_n = 0;  // column order, all after the survivors
  SelectScratch<kThreads>& scratch;
  std::uint32_t* warp_hits;  // [2][kMaxWords][32] packed counts, double-buffered by parity
  std::uint32_t k;           // candidates a select keeps
  std::uint32_t limit;           // survivors + newcomers that trigger a select
  std::uint32_t newcomer_limit;  // newcomers that make room (newcomer_slots less a round)
  ScoreParams sp;
  std::uint32_t threshold = kExcludedScore;  // admit only scores above it
  Prefilter<Traits> pre;
  std::uint32_t parity = 0;
  bool floored = false;  // a sampled floor set the first threshold

  __device__ __forceinline__ Candidates list(std::uint32_t i, std::uint32_t n) const {
    std::uint32_t* base = dynamic_smem() + 2 * i * slots;
    return Candidates{base, base + slots, n};
  }
  __device__ __forceinline__ Candidates survivors() const { return list(current, survivors_n); }
  __device__ __forceinline__ Candidates spare() const { return list(current ^ 1u, 0); }
  __device__ __forceinline__ Candidates newcomers() const {
    std::uint32_t* base = dynamic_smem() + 4 * slots;
    return Candidates{base, base + newcomer_slots, newcomers_n};
  }

  __device__ void set_threshold(std::uint32_t t) {
    threshold = t;
    pre.set(t, sp);
  }

  /// Sets a floor from a spread sample of a range of `len` elements whose `vectors` aligned
  /// 16-byte vectors start at `vec` (filter_sample_vector; filter_samples_per_thread vectors a
  /// sampling thread): the score that about e + 5 sqrt(e) + 5 sampled elements reach, e =
  /// k * samples / len being the expected count above the k-th best. The margin is five
  /// deviations (the CPU and the cluster kernel take three), since one row of a batch that
  /// misses it is scanned twice and sets the time of the whole launch: a miss then takes more
  /// than 5 sigma, odds below 1e-6 a row on i.i.d. data, while ~k (1 + 5 / sqrt(e)) admissions
  /// still fit before the first select for e >= 25. Elements below the floor are never
  /// admitted, so the rounds start near the final threshold instead of appending the first
  /// rounds whole and selecting often while it rises. Exact whenever at least k elements reach
  /// the floor; rescan_needed() tells when fewer did. Call before any append; every thread
  /// calls it.
  template <int kVec>
  __device__ void sample_floor(const uint4* vec, std::int64_t vectors, std::int64_t len) {
    const int per_thread = filter_samples_per_thread(k, len, vectors, kVec, newcomer_slots);
    const std::uint32_t samples = kFilterSampleThreads * kVec * per_thread;
    const std::uint32_t rank = filter_floor_rank(k, samples, len);
    if (rank > samples / 4) return;  // uniform: a floor would let in much of the row anyway
    Candidates sample = newcomers();
    if (threadIdx.x < kFilterSampleThreads) {
      uint4 v[kFilterSampleMaxPerThread];  // all in flight at once
#pragma unroll
      for (int i = 0; i < kFilterSampleMaxPerThread; ++i) {
        const std::uint32_t s = threadIdx.x + i * kFilterSampleThreads;
        if (i < per_thread) {
          v[i] = __ldg(vec +
                       filter_sample_vector32(s, static_cast<std::uint32_t>(vectors), per_thread));
        }
      }
#pragma unroll
      for (int i = 0; i < kFilterSampleMaxPerThread; ++i) {
        const std::uint32_t s = threadIdx.x + i * kFilterSampleThreads;
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          if (i < per_thread)
            sample.key[s * kVec + j] = score_of<Traits>(vector_element<kVec>(v[i], j), sp);
        }
      }
    }
    std::uint32_t need;
    sample.n = samples;
    const std::uint32_t f = radix_kth<kThreads, Traits::kBits, kRolledPasses>(
        sample, Candidates{sample.key, sample.col, 0}, rank, 0, scratch, need);
    if (f > kExcludedScore + 1) {  // below that, it excludes nothing
      set_threshold(f - 1);
      floored = true;
    }
  }

  /// Whether the sampled floor was too high: fewer than k elements were admitted (so no select
  /// ran: a select leaves k survivors, and only the floor sets a threshold otherwise), and the
  /// best k may lie below it.
  __device__ bool rescan_needed() const {
    return floored && survivors_n + newcomers_n < k;
  }

  /// Back to an empty engine with no floor, for a rescan.
  __device__ void reset() {
    __syncthreads();  // every write of the first scan lands before the lists are reused
    survivors_n = 0;
    newcomers_n = 0;
    floored = false;
    set_threshold(kExcludedScore);
  }

  /// Exact admission test of one element.
  __device__ __forceinline__ bool admits(std::uint32_t bits) const {
    return score_of<Traits>(bits, sp) > threshold;
  }

  /// Keeps the best k of survivors ++ newcomers and raises the threshold.
  __device__ void select() {
    const Candidates out = spare();
    set_threshold(select_into<kThreads, Traits::kBits, kRolledPasses>(
        survivors(), newcomers(), out.key, out.col, k, threshold, scratch));
    current ^= 1u;
    survivors_n = k;
    newcomers_n = 0;
  }

  /// Appends the newcomers to the survivors, where they fit (at most k in all); the threshold
  /// stays. Every thread calls it after its appends.
  __device__ __forceinline__ void keep_newcomers() {
    append_list<kThreads>(survivors(), newcomers());
    survivors_n += newcomers_n;
    newcomers_n = 0;
  }

  /// After a round's appends: a select once survivors and newcomers reach the limit. Before
  /// the first select a plan may leave the newcomer list room for the slack and one round only
  /// (buffer_plan); once the newcomers fill that room, they are selected with the survivors if
  /// there are more than k of both, else they join the survivors. After the first select the
  /// limit comes first (survivors are k). One call site of select: inlined into every
  /// round's append, a second one made the filter kernels 8-14 % larger and the sliced rows,
  /// which wait on instruction fetch, 1-6 % slower (run 175).
  __device__ __forceinline__ void make_room() {
    const std::uint32_t n = survivors_n + newcomers_n;
    if (n >= limit || newcomers_n >= newcomer_limit) {
      if (n > k) {
        select();
      } else {
        keep_newcomers();
      }
    }
  }

  /// Appends this thread's winners of one round: for each of kU groups, the elements j whose
  /// bit is set in mask[u], with key key_of(u, j) and column col_of(u, j) (computed only for
  /// winners, which keeps them out of registers). Groups are ordered u-major then by thread,
  /// which is column order. Every thread calls it once per round.
  ///
  /// Warps publish their packed totals before the round's one barrier; a round without a
  /// winner anywhere in the block ends there. Otherwise every thread learns the totals of the
  /// warps before its own and of all (warp_totals_before; the running count stays uniform in
  /// registers), and only the warps with winners count and write theirs: in most rounds of a
  /// long row the block finds a newcomer and most of its warps none.
  template <int kU, int kV, class KeyFn, class ColFn>
  __device__ __forceinline__ void append(const std::uint32_t (&mask)[kU], KeyFn key_of,
                                         ColFn col_of) {
    static_assert(kU <= 2 * kMaxWords, "warp_hits holds 2 * kMaxWords groups");
    static_assert(kV <= 16 && kThreads * kV < 65536, "16-bit packed counts");
    constexpr int kWords = (kU + 1) / 2;
    const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
    std::uint32_t any = 0;
#pragma unroll
    for (int u = 0; u < kU; ++u) any |= mask[u];
    const bool warp_any = __any_sync(0xFFFFFFFFu, any != 0);
    // Per-thread hit counts, two groups a word (group 2w in the low half, 2w+1 in the high).
    std::uint32_t hits[kWords] = {};
    std::uint32_t inclusive[kWords] = {};
    if (warp_any) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        hits[u / 2] |= static_cast<std::uint32_t>(__popc(mask[u])) << (16 * (u % 2));
      }
#pragma unroll
      for (int w = 0; w < kWords; ++w) inclusive[w] = warp_inclusive_sum(hits[w]);
    }
    std::uint32_t* slot = warp_hits + parity * (kMaxWords * 32);
    if (lane == kWarpSize - 1) {
#pragma unroll
      for (int w = 0; w < kWords; ++w) slot[w * 32 + warp] = inclusive[w];
    }
    // Reusing this half of warp_hits two rounds later is safe: every thread reads it before
    // arriving at the next round's barrier.
    parity ^= 1u;
    if (!__syncthreads_or(any != 0)) return;  // no newcomer anywhere in the block this round
    const Candidates nc = newcomers();
    std::uint32_t base = newcomers_n;
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      std::uint32_t before, total;
      warp_totals_before<kWarps>(slot + w * 32, before, total);
      if (warp_any) {
        const std::uint32_t exclusive = before + inclusive[w] - hits[w];
#pragma unroll
        for (int h = 0; h < 2 && 2 * w + h < kU; ++h) {
          const int u = 2 * w + h;
          std::uint32_t m = mask[u];
          std::uint32_t pos = base + ((exclusive >> (16 * h)) & 0xFFFFu);
          if (h == 1) pos += total & 0xFFFFu;  // after all of group 2w
          while (m != 0) {
            const int j = __ffs(m) - 1;
            m &= m - 1;
            nc.key[pos] = key_of(u, j);
            nc.col[pos] = col_of(u, j);
            ++pos;
          }
        }
      }
      base += (total & 0xFFFFu) + (2 * w + 1 < kU ? total >> 16 : 0u);
    }
    newcomers_n = base;
    make_room();
  }

  /// Appends every element of a full round, for rounds that start below every score (before
  /// the first select) when no score can be excluded (nan != "ignore"): positions follow from
  /// the thread index alone, so no count is exchanged and no barrier is needed here.
  template <int kU, int kV, class KeyFn, class ColFn>
  __device__ __forceinline__ void append_all(KeyFn key_of, ColFn col_of) {
    const Candidates nc = newcomers();
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const std::uint32_t pos = newcomers_n + (u * kThreads + threadIdx.x) * kV;
#pragma unroll
      for (int j = 0; j < kV; ++j) {
        nc.key[pos + j] = key_of(u, j);
        nc.col[pos + j] = col_of(u, j);
      }
    }
    newcomers_n += kU * kThreads * kV;
    make_room();
  }

  /// Whether a round may take append_all.
  __device__ __forceinline__ bool admits_everything() const {
    return threshold == kExcludedScore && sp.nan_score != kExcludedScore;
  }

  /// Leaves the best min(k, candidates) in `survivors` (sorted best first for sorted="value",
  /// else in column order) and returns that list.
  __device__ Candidates finish(bool sort_by_value) {
    __syncthreads();
    if (survivors_n + newcomers_n > k) {
      select();
    } else if (newcomers_n > 0) {  // everything fits: append the newcomers to the survivors
      // Inline, with shared-memory addresses: a slice kept whole copies all its candidates here.
      const Candidates out = survivors(), nc = newcomers();
      for (std::uint32_t p = threadIdx.x; p < nc.n; p += kThreads) {
        out.key[out.n + p] = nc.key[p];
        out.col[out.n + p] = nc.col[p];
      }
      survivors_n += newcomers_n;
      newcomers_n = 0;
      __syncthreads();
    }
    const Candidates out = survivors();
    if (sort_by_value && out.n > 1) {
      // Through the spare list; the newcomer list, free now, holds at least kSortNewcomerSlots
      // (buffer_plan) for the sort's counts.
      const Candidates sorted =
          sort_best_first<kThreads>(out, spare(), newcomers().key, scratch.warp_totals);
      if (sorted.key != out.key) current ^= 1u;
    }
    return survivors();
  }
};

/// Filters a partial round, element j of vecs[u] being the one at column col0[u] + j (real
/// when j < valid[u]), and appends its newcomers. Full rounds take the prefilter path in
/// stream_row instead.
template <int kU, int kVec, class Traits, int kThreads, bool kRolled>
__device__ __forceinline__ void filter_partial_round(FilterEngine<Traits, kThreads, kRolled>& e,
                                                     const uint4 (&vecs)[kU],
                                                     const std::uint32_t (&col0)[kU],
                                                     const int (&valid)[kU], bool track_nan,
                                                     bool& any_nan) {
  std::uint32_t mask[kU];
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    mask[u] = 0;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const std::uint32_t bits = vector_element<kVec>(vecs[u], j);
      if (j < valid[u]) {
        if (track_nan) any_nan |= is_nan_bits<Traits>(bits);
        mask[u] |= e.admits(bits) ? 1u << j : 0u;
      }
    }
  }
  e.template append<kU, kVec>(
      mask, [&](int u, int j) { return score_of<Traits>(vector_element<kVec>(vecs[u], j), e.sp); },
      [&](int u, int j) { return col0[u] + static_cast<std::uint32_t>(j); });
}

/// Where a sampled floor is drawn from: the `vectors` aligned 16-byte vectors from `vec` of a
/// range of `len` elements whose best k are wanted. A CTA samples its own range; a slice samples
/// its whole row, so that every slice of a row starts from the same floor, one the row's best k
/// reach (topk_merge_kernel).
struct SampleRange {
  const uint4* vec = nullptr;  // nullptr: no floor
  std::uint32_t vectors = 0;
  std::uint32_t len = 0;
};

/// The SampleRange of columns [lo, hi) of `row`.
template <class Bits>
__device__ __forceinline__ SampleRange sample_range(const Bits* row, std::int64_t lo,
                                                    std::int64_t hi) {
  constexpr int kVec = 16 / sizeof(Bits);
  const std::int64_t a0 = lo + head_to_alignment(row, lo, hi);
  return SampleRange{reinterpret_cast<const uint4*>(row + a0),
                     static_cast<std::uint32_t>((hi - a0) / kVec),
                     static_cast<std::uint32_t>(hi - lo)};
}

/// Streams columns [lo, hi) of `row` through the engine in column order: a scalar head up to
/// 16-byte alignment, whole rounds of kU coalesced 16-byte vectors per thread (a round's fixed
/// cost, one barrier and one exchange of counts, is spread over kU vectors) with
/// kPrefetchVectors vectors per thread in flight, then the leftover vectors and scalars. With a
/// `sample` range of at least kFilterSampleMinVectors vectors the engine first gets a sampled
/// floor, while the first rounds' loads are in flight. Returns whether this thread saw a NaN
/// (only tracked when track_nan).
template <class Traits, int kThreads, int kPrefetchVectors, int kU, bool kRolled>
__device__ bool stream_row(FilterEngine<Traits, kThreads, kRolled>& e,
                           const typename Traits::Bits* row, std::uint32_t lo, std::uint32_t hi,
                           bool track_nan, SampleRange sample) {
  using Bits = typename Traits::Bits;
  constexpr int kVec = 16 / sizeof(Bits);
  constexpr int kPrefetch = kPrefetchVectors / kU > 0 ? kPrefetchVectors / kU : 1;  // rounds
  const int tid = threadIdx.x;
  bool any_nan = false;

  // One scalar element per thread: the head (< kVec elements).
  auto scalar_round = [&](std::uint32_t first, std::uint32_t n) {
    uint4 vecs[kU] = {};
    std::uint32_t col0[kU] = {};
    int valid[kU] = {};
    if (tid < n) {
      vecs[0].x = row[first + tid];
      col0[0] = first + tid;
      valid[0] = 1;
    }
    filter_partial_round<kU, kVec>(e, vecs, col0, valid, track_nan, any_nan);
  };

  const auto head = static_cast<std::uint32_t>(head_to_alignment(row, lo, hi));
  const std::uint32_t a0 = lo + head;
  const std::uint32_t vectors = (hi - a0) / kVec;
  constexpr std::uint32_t per_round = kThreads * kU;  // vectors
  const std::uint32_t rounds = vectors / per_round;
  const uint4* vec = reinterpret_cast<const uint4*>(row + a0);

  // Round r, group u covers vectors [(r * kU + u) * kThreads, +kThreads): coalesced loads.
  uint4 buf[kPrefetch][kU];
#pragma unroll
  for (int r = 0; r < kPrefetch; ++r) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (r < rounds) buf[r][u] = __ldg(vec + (r * kU + u) * kThreads + tid);
    }
  }
  if (sample.vec != nullptr && sample.vectors >= kFilterSampleMinVectors) {
    e.template sample_floor<kVec>(sample.vec, sample.vectors, sample.len);
  }
  if (head > 0) scalar_round(lo, head);
  // The next loads walk one pointer, which keeps the loop within the registers of two CTAs an
  // SM (three for the ragged-row policy).
  const uint4* next = vec + kPrefetch * kU * kThreads + tid;
  const std::uint32_t col_thread = a0 + tid * kVec;
  // The rounds, compiled once a direction so that the prefilter compares words as loaded.
  auto stream_rounds = [&](auto smallest) {
    constexpr bool kSmallest = decltype(smallest)::value;
    for (std::uint32_t r0 = 0; r0 < rounds; r0 += kPrefetch) {
#pragma unroll
      for (int q = 0; q < kPrefetch; ++q) {
        const std::uint32_t r = r0 + q;
        if (r < rounds) {  // uniform across the block
          uint4 cur[kU];
          // Every thread packs its prefilter bits: in most rounds some lane of each warp has a
          // flagged element, and the packing costs less than a branch that repeats the test.
          std::uint32_t mask[kU];
          std::uint32_t flagged = 0;
          const bool load = r + kPrefetch < rounds;
#pragma unroll
          for (int u = 0; u < kU; ++u) {
            cur[u] = buf[q][u];
            mask[u] = e.pre.template vector_may_pass_bits_as<kSmallest>(cur[u]);
            flagged |= mask[u];
            if (load) buf[q][u] = __ldg(next + u * kThreads);
          }
          next += kU * kThreads;
          auto col_of = [&](int u, int j) {
            return col_thread + (r * kU + u) * (kThreads * kVec) + j;
          };
          if (e.admits_everything()) {  // uniform: the rounds before the first select
            if (track_nan) {
#pragma unroll
              for (int u = 0; u < kU; ++u) {
#pragma unroll
                for (int j = 0; j < kVec; ++j)
                  any_nan |= is_nan_bits<Traits>(vector_element<kVec>(cur[u], j));
              }
            }
            e.template append_all<kU, kVec>(
                [&](int u, int j) {
                  return score_of<Traits>(vector_element<kVec>(cur[u], j), e.sp);
                },
                col_of);
            continue;
          }
          // Exact scores only where the prefilter let something through (after the first
          // rounds a thread rarely holds a newcomer), and none where the comparison decides.
          if (flagged != 0 && !(e.pre.exact && !track_nan)) {
#pragma unroll
            for (int u = 0; u < kU; ++u) {
              // Only the elements the prefilter let through; every NaN is among them.
              std::uint32_t maybe = mask[u];
              mask[u] = 0;
              while (maybe != 0) {
                const int j = __ffs(maybe) - 1;
                maybe &= maybe - 1;
                const std::uint32_t bits = vector_element<kVec>(cur[u], j);
                if (track_nan) any_nan |= is_nan_bits<Traits>(bits);
                mask[u] |= e.admits(bits) ? 1u << j : 0u;
              }
            }
          }
          e.template append<kU, kVec>(
              mask,
              [&](int u, int j) { return score_of<Traits>(vector_element<kVec>(cur[u], j), e.sp); },
              col_of);
        }
      }
    }
  };
  if (e.sp.flip == 0) {
    stream_rounds(std::false_type{});
  } else {
    stream_rounds(std::true_type{});
  }

  // Leftover vectors (fewer than a round), in the same group layout, and the last scalars as
  // one partial vector after them (vector `vectors` always falls in this round): one partial
  // round, so that nothing of the tail stays live across a select of the leftover vectors. The
  // loads continue from the loop's pointer (now at vector rest0 + kPrefetch rounds + tid),
  // which leaves no other pointer into the row live across the loop.
  const std::uint32_t rest0 = rounds * per_round;
  const std::uint32_t rest = (hi - a0) - vectors * kVec;  // < kVec
  if (rest0 < vectors || rest > 0) {
    const uint4* left = next - kPrefetch * kU * kThreads;  // vector rest0 + tid
    uint4 vecs[kU] = {};
    std::uint32_t col0[kU] = {};
    int valid[kU] = {};
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const std::uint32_t v = rest0 + u * kThreads + tid;
      if (v < vectors) {
        vecs[u] = __ldg(left + u * kThreads);
        col0[u] = a0 + v * kVec;
        valid[u] = kVec;
      } else if (v == vectors && rest > 0) {
        vecs[u] = load_vector_prefix<kVec>(reinterpret_cast<const Bits*>(left + u * kThreads),
                                           static_cast<int>(rest));
        col0[u] = a0 + v * kVec;
        valid[u] = static_cast<int>(rest);
      }
    }
    filter_partial_round<kU, kVec>(e, vecs, col0, valid, track_nan, any_nan);
  }
  return any_nan;
}

/// Writes output slot j of row b: column `col` (plus `offset`) and the value `bits` when `real`,
/// else the fills.
template <class Traits>
__device__ __forceinline__ void write_slot_bits(const TopkKernelParams& p, std::int64_t b,
                                                std::int64_t j, bool real, std::uint32_t col,
                                                std::int64_t offset, std::uint32_t bits) {
  using Bits = typename Traits::Bits;
  if (p.indices_int64) {
    static_cast<std::int64_t*>(p.indices)[b * p.indices_row_stride + j] =
        real ? offset_index64(col, offset) : p.index_fill;
  } else {
    static_cast<std::int32_t*>(p.indices)[b * p.indices_row_stride + j] =
        real ? offset_index32(col, offset) : static_cast<std::int32_t>(p.index_fill);
  }
  if (p.values != nullptr) {
    static_cast<Bits*>(p.values)[b * p.values_row_stride + j] =
        static_cast<Bits>(real ? bits : p.value_fill_bits);
  }
}

/// write_slot_bits with the value read back from x by column (a hit in L2, which just streamed
/// the row), so that it is the input's bits exactly: -0.0 and NaN payloads survive.
template <class Traits>
__device__ __forceinline__ void write_slot(const TopkKernelParams& p, std::int64_t b,
                                           std::int64_t j, bool real, std::uint32_t col,
                                           std::int64_t offset) {
  using Bits = typename Traits::Bits;
  const Bits* row = static_cast<const Bits*>(p.x) + b * p.row_stride;
  const std::uint32_t bits = real && p.values != nullptr ? row[col] : 0u;
  write_slot_bits<Traits>(p, b, j, real, col, offset, bits);
}

/// The bits of the value whose score is `score` in row `row`: from the score (bits_of_score),
/// or read back from the row at `col` for zeros and NaNs, whose scores several bit patterns
/// share, so that -0.0 and NaN payloads survive while most values skip the load's latency.
template <class Traits>
__device__ __forceinline__ std::uint32_t kept_value_bits(const typename Traits::Bits* row,
                                                         std::uint32_t score, std::uint32_t col,
                                                         const ScoreParams& sp) {
  bool unique;
  const std::uint32_t bits = bits_of_score<Traits>(score, sp, unique);
  return unique ? bits : row[col];
}

/// Writes the n kept slots of row b: indices as Index, values (when returned) from the scores
/// (bits_of_score); only zeros and NaNs, whose scores several bit patterns share, are read back
/// from x, so most slots skip that load's latency. 32-bit slot numbers and row pointers set up
/// once keep the per-slot work to a few instructions. Slot j's column is col_at(j), its score
/// score_at(j).
template <class Traits, int kThreads, class Index, class ColAt, class ScoreAt>
__device__ __forceinline__ void write_kept(const TopkKernelParams& p, std::int64_t b,
                                           std::uint32_t n, std::int64_t offset, ColAt col_at,
                                           ScoreAt score_at) {
  using Bits = typename Traits::Bits;
  const Bits* row = static_cast<const Bits*>(p.x) + b * p.row_stride;
  Index* indices = static_cast<Index*>(p.indices) + b * p.indices_row_stride;
  Bits* values =
      p.values != nullptr ? static_cast<Bits*>(p.values) + b * p.values_row_stride : nullptr;
  for (std::uint32_t j = threadIdx.x; j < n; j += kThreads) {
    const std::uint32_t col = col_at(j);
    if constexpr (sizeof(Index) == 8) {
      indices[j] = offset_index64(col, offset);
    } else {
      indices[j] = offset_index32(col, offset);
    }
    if (values != nullptr) {
      values[j] = static_cast<Bits>(kept_value_bits<Traits>(row, score_at(j), col, p.sp));
    }
  }
}

/// Writes row b's outputs, the n kept slots (write_kept) then the padding.
template <class Traits, int kThreads, class ColAt, class ScoreAt>
__device__ void write_outputs(const TopkKernelParams& p, std::int64_t b, std::uint32_t n,
                              ColAt col_at, ScoreAt score_at) {
  const std::int64_t offset =
      load_row_value(p.index_offset, p.index_offset_is_int64, p.index_offset_stride, b, 0);
  if (p.indices_int64) {
    write_kept<Traits, kThreads, std::int64_t>(p, b, n, offset, col_at, score_at);
  } else {
    write_kept<Traits, kThreads, std::int32_t>(p, b, n, offset, col_at, score_at);
  }
  for (std::int64_t j = n + threadIdx.x; j < p.k; j += kThreads) {
    write_slot_bits<Traits>(p, b, j, false, 0u, offset, 0u);
  }
}

/// Writes row b's outputs from the finished candidates (keys are scores), then the padding.
template <class Traits, int kThreads>
__device__ void write_outputs(const TopkKernelParams& p, std::int64_t b, const Candidates& c) {
  write_outputs<Traits, kThreads>(
      p, b, c.n, [&](std::uint32_t j) { return c.col[j]; },
      [&](std::uint32_t j) { return c.key[j]; });
}

/// Carves the dynamic shared memory and builds the engine.
template <class Traits, int kThreads, bool kRolledPasses>
__device__ __forceinline__ FilterEngine<Traits, kThreads, kRolledPasses> make_engine(
    const TopkKernelParams& p, SelectScratch<kThreads>& scratch, std::uint32_t* warp_hits) {
  FilterEngine<Traits, kThreads, kRolledPasses> e{
      p.survivor_slots, p.newcomer_slots, 0, 0, 0, scratch, warp_hits, p.k_select, p.limit,
      p.newcomer_limit, p.sp};
  e.set_threshold(kExcludedScore);
  return e;
}

// ---------------------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------------------

template <class Traits, int kThreads, int kPrefetchVectors, int kMinBlocks, int kU>
__global__ void __launch_bounds__(kThreads, kMinBlocks) topk_rows_kernel(const TopkKernelParams p) {
  __shared__ SelectScratch<kThreads> scratch;
  __shared__ __align__(16) std::uint32_t warp_hits[2 * 2 * 32];

  if (p.slices > 1) allow_dependent_launch();  // the merge kernel
  const std::int64_t b = row_of_block(blockIdx.x, p.slices);
  const std::int64_t s = blockIdx.x % p.slices;
  std::int64_t lo, hi;
  slice_range(p, b, s, lo, hi);
  // The range in 32 bits (N < 2^31): the rescan keeps it live across the first scan.
  const auto seg_lo = static_cast<std::uint32_t>(lo), seg_hi = static_cast<std::uint32_t>(hi);

  // fp32 selects run their digit passes as one copy in a loop in the kernels of one CTA an SM
  // (sliced rows, whose merge does too): 1.02-1.08x there; with two CTAs an SM it was
  // 0.98-1.00x, and the three-CTA policy's 80 registers spill with the loop.
  auto e = make_engine<Traits, kThreads, (kMinBlocks == 1)>(p, scratch, warp_hits);
  const auto* row = static_cast<const typename Traits::Bits*>(p.x) + b * p.row_stride;
  const bool track_nan = p.nan_flag != nullptr;
  // A slice samples its whole row for the row's k: every slice of the row gets the same floor,
  // which about k (1 + 5 / sqrt(e)) elements of the row reach, so the slices pass the merge a
  // few k candidates in all instead of k each.
  SampleRange sample;
  if (p.slices == 1) {
    sample = sample_range(row, lo, hi);
  } else {
    std::int64_t row_lo, row_hi;
    row_range(p, b, row_lo, row_hi);
    sample = sample_range(row, row_lo, row_hi);
  }
  bool any_nan =
      stream_row<Traits, kThreads, kPrefetchVectors, kU>(e, row, seg_lo, seg_hi, track_nan, sample);
  // A slice's floor is the row's, which a slice may hold fewer than k elements above: only the
  // merge can tell, from the slices' counts, whether the row has k (topk_merge_kernel).
  if (p.slices == 1 && e.rescan_needed()) {  // uniform; rare: the sample overestimated the range
    e.reset();
    // Hides from the compiler that the rescan reads the same row, which it would otherwise
    // exploit by keeping the first scan's addresses (the head's) live across that scan: three
    // CTAs an SM leave 80 registers a thread.
    asm volatile("" : "+l"(row));
    any_nan |= stream_row<Traits, kThreads, kPrefetchVectors, kU>(e, row, seg_lo, seg_hi, track_nan,
                                                                  SampleRange{});
  }
  if (track_nan && __syncthreads_or(any_nan) && threadIdx.x == 0) *p.nan_flag = 1;

  if (p.slices == 1) {
    write_outputs<Traits, kThreads>(p, b, e.finish(p.sort_by_value));
  } else {
    const Candidates c = e.finish(false);
    const std::int64_t at = b * p.slices + s;
    if (threadIdx.x == 0) {
      p.slice_threshold[at] = e.threshold;
      p.slice_count[at] = c.n | (e.floored ? kSliceFloored : 0u);
    }
    const std::int64_t base = at * p.slot_stride;
    for (std::uint32_t j = threadIdx.x; j < c.n; j += kThreads) {
      p.slice_key[base + j] = c.key[j];
      p.slice_col[base + j] = c.col[j];
    }
  }
}

/// One CTA per row: the slices' kept lists, concatenated slice after slice (column order), are
/// selected once when they all fit the newcomer list, else go through the filter from the
/// largest of the slices' final thresholds (a lower bound of the row's k-th best: a slice that
/// kept k scores them all at least its threshold); then the outputs are written. Used when B
/// is too small to fill the GPU with one CTA per row.
///
/// Exactness: every slice admitted only scores at or above the row's sampled floor F, and
/// dropped an element only for k better ones of its own. If the slices hold at least k
/// candidates, at least k elements score >= F, so nothing below F is among the best k and the
/// lists hold the answer. If they hold fewer (the sample overestimated the row), elements below
/// F may belong to it, and this CTA streams the whole row again from the bottom: exact either
/// way, and the sample decides only the time.
template <class Traits, int kThreads, int kPrefetchVectors, int kU>
__global__ void __launch_bounds__(kThreads, 1) topk_merge_kernel(const TopkKernelParams p) {
  static_assert(kThreads >= kMaxSlices, "one thread per slice");
  __shared__ SelectScratch<kThreads> scratch;
  __shared__ __align__(16) std::uint32_t warp_hits[2 * 2 * 32];
  __shared__ std::uint32_t first[kMaxSlices + 1];  // slice s's candidates: [first[s], first[s+1])
  __shared__ std::uint32_t row_floor;  // the largest slice threshold: candidates admitted from it
  __shared__ std::uint32_t row_base;   // the least: every candidate scores at least that

  const std::int64_t b = blockIdx.x;
  const int tid = threadIdx.x;
  auto e = make_engine<Traits, kThreads, true>(p, scratch, warp_hits);
  if (tid == 0) {
    row_floor = kExcludedScore;
    row_base = ~0u;
  }
  wait_for_prior_grid();  // the slices' lists
  const std::uint32_t word = tid < p.slices ? p.slice_count[b * p.slices + tid] : 0u;
  const std::uint32_t n = word & ~kSliceFloored;
  std::uint32_t total;
  const std::uint32_t before = block_exclusive_sum<kThreads>(n, scratch.warp_totals, total);
  if (tid < p.slices) {
    first[tid] = before;
    const std::uint32_t threshold = p.slice_threshold[b * p.slices + tid];
    atomicMax(&row_floor, threshold);
    atomicMin(&row_base, threshold);
  }
  if (tid == 0) first[p.slices] = total;
  const bool floored = __syncthreads_or((word & kSliceFloored) != 0);

  if (floored && total < p.k_select) {  // uniform; rare: the row's sample overestimated it
    std::int64_t lo, hi;
    row_range(p, b, lo, hi);
    const auto* row = static_cast<const typename Traits::Bits*>(p.x) + b * p.row_stride;
    // The slices saw every NaN already (nan="raise").
    stream_row<Traits, kThreads, kPrefetchVectors, kU>(e, row, static_cast<std::uint32_t>(lo),
                                                       static_cast<std::uint32_t>(hi), false,
                                                       SampleRange{});
    write_outputs<Traits, kThreads>(p, b, e.finish(p.sort_by_value));
    return;
  }

  const std::uint32_t* keys = p.slice_key + b * p.slices * static_cast<std::int64_t>(p.slot_stride);
  const std::uint32_t* cols = p.slice_col + b * p.slices * static_cast<std::int64_t>(p.slot_stride);
  // The slice holding candidate i: the last s with first[s] <= i (empty slices skipped).
  auto slice_of = [&](std::uint32_t i) {
    int lo_s = 0, hi_s = p.slices;  // first[lo_s] <= i < first[hi_s]
    while (hi_s - lo_s > 1) {
      const int mid = (lo_s + hi_s) / 2;
      if (first[mid] <= i) lo_s = mid; else hi_s = mid;
    }
    return lo_s;
  };
  if (total <= e.newcomer_slots) {
    // Every list fits the newcomer list: the concatenation, already in column order, is copied
    // there as it is (no admission test, no count exchange a round) and selected once. Four
    // candidates a thread at a time keep four lookups and their loads in flight together.
    const Candidates nc = e.newcomers();
    for (std::uint32_t i0 = tid; i0 < total; i0 += 4 * kThreads) {
      std::int64_t at[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const std::uint32_t i = i0 + j * kThreads;
        const int slice = i < total ? slice_of(i) : 0;
        at[j] = static_cast<std::int64_t>(slice) * p.slot_stride + (i - first[slice]);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const std::uint32_t i = i0 + j * kThreads;
        if (i < total) {
          nc.key[i] = keys[at[j]];
          nc.col[i] = cols[at[j]];
        }
      }
    }
    e.newcomers_n = total;
    // A base above 0 lets 16-bit keys take the select's one pass of scores counted from it
    // (every slice's list scores at least its threshold, the row's floor or higher).
    if (row_base > kExcludedScore) e.set_threshold(row_base);
    write_outputs<Traits, kThreads>(p, b, e.finish(p.sort_by_value));
    return;
  }
  if (row_floor > kExcludedScore + 1) e.set_threshold(row_floor - 1);
  // Thread t takes candidates v0 + 4 t .. +3 of the concatenation: the groups of append are
  // ordered by thread, so the list stays in column order.
  for (std::uint32_t v0 = 0; v0 < total; v0 += 4 * kThreads) {
    std::uint32_t mask[1] = {0};
    std::uint32_t key[4] = {}, col[4] = {};  // unrolled: registers
    const std::uint32_t i0 = v0 + 4 * tid;
    if (i0 < total) {
      int slice = slice_of(i0);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const std::uint32_t i = i0 + j;
        if (i < total) {
          while (i >= first[slice + 1]) ++slice;
          const std::int64_t at =
              static_cast<std::int64_t>(slice) * p.slot_stride + (i - first[slice]);
          key[j] = keys[at];
          col[j] = cols[at];
          mask[0] |= key[j] > e.threshold ? 1u << j : 0u;
        }
      }
    }
    const uint4 kv{key[0], key[1], key[2], key[3]}, cv{col[0], col[1], col[2], col[3]};
    e.template append<1, 4>(
        mask, [&](int, int j) { return vector_word(kv, j); },
        [&](int, int j) { return vector_word(cv, j); });
  }
  write_outputs<Traits, kThreads>(p, b, e.finish(p.sort_by_value));
}

}  // namespace attnkit::detail::cuda
