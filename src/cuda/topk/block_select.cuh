// SPDX-License-Identifier: Apache-2.0
// Block-wide selection over candidate lists in shared memory: the select that keeps the best
// k of the survivors and the newcomers (a radix select on keys), and the best-first sort.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/common/block_scan.cuh"

namespace attnkit::detail::cuda {

/// Shared scratch of select_into: one 256-bin histogram, which warp 0 alone scans and clears
/// (two barriers a digit instead of one scan over the block's threads), the block scan's warp
/// totals (also the warps' key bounds) and the pivot that warp 0 publishes.
template <int kThreads>
struct SelectScratch {
  alignas(16) std::uint32_t hist[256];
  std::uint32_t warp_totals[32];
  std::uint32_t pivot_digit;
  std::uint32_t pivot_need;
  std::uint32_t pivot_count;
};

/// A candidate list in shared memory: key[i] (score) and col[i] (column) for i < n.
struct Candidates {
  std::uint32_t* key;
  std::uint32_t* col;
  std::uint32_t n;
};

/// The kernel's dynamic shared memory (every extern __shared__ array names it).
__device__ __forceinline__ std::uint32_t* dynamic_smem() {
  extern __shared__ __align__(16) std::uint32_t dynamic_smem_words[];
  return dynamic_smem_words;
}

/// `p`, a pointer into the kernel's dynamic shared memory, re-derived from that array: a
/// function that receives lists as generic pointers (select_into is not inlined) then reads
/// them with shared loads rather than generic ones.
__device__ __forceinline__ std::uint32_t* as_shared(std::uint32_t* p) {
  const std::size_t words =
      (__cvta_generic_to_shared(p) - __cvta_generic_to_shared(dynamic_smem())) /
      sizeof(std::uint32_t);
  return dynamic_smem() + words;
}

__device__ __forceinline__ Candidates as_shared(Candidates c) {
  return Candidates{as_shared(c.key), as_shared(c.col), c.n};
}

/// Warp 0 scans the select's 256-bin histogram (counts by digit, best digit last): lane l owns
/// digits 255 - 8l down to 248 - 8l, the words [248 - 8l, 256 - 8l), and one warp scan finds
/// the digit holding the need-th best; it publishes that digit, need less the count above it
/// and the digit's count in s.pivot_digit / pivot_need / pivot_count, and clears the
/// histogram for the next pass. One warp scanning instead of per-warp histograms summed by 256
/// threads and a block-wide scan took one select of a 512-thread CTA from about 6300 to 3900
/// cycles over 586 32-bit keys and from 3900 to 2400 over 2048 16-bit keys (H200, run 117).
/// Every thread calls it after the barrier that completes the histogram; it ends with the
/// barrier that publishes the pivot.
template <int kThreads>
__device__ __forceinline__ void publish_pivot(SelectScratch<kThreads>& s, std::uint32_t need) {
  if (threadIdx.x < kWarpSize) {
    const int lane = static_cast<int>(threadIdx.x);
    uint4* bins = reinterpret_cast<uint4*>(s.hist + 248 - 8 * lane);
    const uint4 lo4 = bins[0], hi4 = bins[1];
    // Digits descending.
    const std::uint32_t c[8] = {hi4.w, hi4.z, hi4.y, hi4.x, lo4.w, lo4.z, lo4.y, lo4.x};
    std::uint32_t count = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) count += c[j];
    const std::uint32_t inclusive = warp_inclusive_sum(count);
    std::uint32_t before = inclusive - count;  // candidates of higher digits
    if (before < need && need <= inclusive) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (before < need && need <= before + c[j]) {
          s.pivot_digit = static_cast<std::uint32_t>(255 - 8 * lane - j);
          s.pivot_need = need - before;
          s.pivot_count = c[j];
        }
        before += c[j];
      }
    }
    bins[0] = make_uint4(0, 0, 0, 0);
    bins[1] = make_uint4(0, 0, 0, 0);
  }
  // Every thread reads the pivot before it arrives at the next pass's barrier, after which
  // warp 0 rewrites it.
  __syncthreads();
}

/// A radix-select threshold of the concatenation a ++ b (1 <= k <= n = a.n + b.n), whose keys
/// are all at least `base` (0 when no bound is known): returns K and `need` such that the keys
/// > K, with the first `need` keys == K, are the best k. K is the k-th best key when the passes
/// run down to the last bit; when a pass finds the digit holding the k-th best kept whole (its
/// count is what is still needed), they stop there, and K is that digit's least key (at most
/// the k-th best, and every key of the digit is kept: `need` is the digit's count).
///
/// Digits are 8 bits. Candidates of a select beat a threshold (`base`) and those of a sampled
/// floor start near it, so their range is narrow:
/// - 16-bit keys with base > 0: one pass over min(key - base, 255), a bin a score, gives the
///   k-th best exactly unless it lies 255 or more scores above base (16-bit scores above a
///   floor usually span 100-200); only then the two passes below follow, over those keys.
/// - 16-bit keys otherwise: two passes, the key's top byte then its low one.
/// - 32-bit keys: digits of (key - least key) from the top bit of their range: fp32
///   candidates span some 20-24 bits, where a 256-bin digit rarely holds more than a few keys
///   and is often kept whole: one to three passes instead of four. The range costs a read of
///   the keys and a barrier, more than it saves on 16-bit keys, whose second pass counts only
///   the pivot digit's keys: read for 16-bit keys too, it made the bf16 filter shapes 1-7 %
///   slower (run 143).
/// With kRolledPasses, 32-bit keys run one copy of the pass in a loop instead of four unrolled
/// (the filter kernels of one CTA an SM and the merge take it; see topk_rows_kernel).
/// A pass counts the digits into one shared histogram that warp 0 scans (publish_pivot), so
/// it costs two barriers. Every thread calls it; the lists must be shared-memory pointers
/// (as_shared). The first barrier publishes the appends that filled b; the last one follows
/// every read of the lists.
template <int kThreads, int kKeyBits, bool kRolledPasses>
__device__ __forceinline__ std::uint32_t radix_kth(const Candidates& a, const Candidates& b,
                                                   std::uint32_t k, std::uint32_t base,
                                                   SelectScratch<kThreads>& s,
                                                   std::uint32_t& need) {
  static_assert(kThreads >= 256, "the histogram is cleared by one thread a bin");
  static_assert(kKeyBits == 16 || kKeyBits == 32, "keys of 16 or 32 bits");
  const std::uint32_t n = a.n + b.n;
  auto key_at = [&](std::uint32_t p) { return p < a.n ? a.key[p] : b.key[p - a.n]; };
  // The previous call's last pass left the histogram clear; this covers the first call.
  if (threadIdx.x < 256) s.hist[threadIdx.x] = 0;
  __syncthreads();
  need = k;
  std::uint32_t lo = 0;
  std::uint32_t least = 0;  // 16-bit keys: only keys >= least take part in the passes
  int bits = 16;  // of the range of (key - lo)
  if constexpr (kKeyBits == 16) {
    if (base != 0) {
      for (std::uint32_t p = threadIdx.x; p < n; p += kThreads) {
        atomicAdd(&s.hist[min(key_at(p) - base, 255u)], 1u);
      }
      __syncthreads();
      publish_pivot(s, need);
      need = s.pivot_need;
      if (s.pivot_digit < 255) return base + s.pivot_digit;  // uniform
      least = base + 255;  // the best k all score at least that
    }
  } else {
    (void)base;
    std::uint32_t hi = 0;
    lo = 0xFFFFFFFFu;
    for (std::uint32_t p = threadIdx.x; p < n; p += kThreads) {
      const std::uint32_t key = key_at(p);
      lo = min(lo, key);
      hi = max(hi, key);
    }
    block_min_max<kThreads>(lo, hi, s.warp_totals);
    bits = 32 - __clz(static_cast<int>(hi - lo));
    if (bits == 0) {  // one key
      __syncthreads();  // the bounds are read before warp_totals is reused
      return lo;
    }
  }
  std::uint32_t prefix = 0;  // bits of (key - lo) fixed so far: those >= above
  int above = 32;
  int shift = bits > 8 ? bits - 8 : 0;
#pragma unroll(kKeyBits == 32 && kRolledPasses ? 1 : kKeyBits / 8)
  for (int pass = 0; pass < kKeyBits / 8; ++pass) {
    // A digit narrower than 8 bits (the last, or the first of a range of fewer than 8) reads
    // fixed bits above it too: equal for every key counted, they only offset the bins.
    for (std::uint32_t p = threadIdx.x; p < n; p += kThreads) {
      const std::uint32_t key = key_at(p), rel = key - lo;
      if ((pass == 0 || (rel >> above) == (prefix >> above)) && (kKeyBits == 32 || key >= least)) {
        atomicAdd(&s.hist[(rel >> shift) & 0xFFu], 1u);
      }
    }
    __syncthreads();
    publish_pivot(s, need);
    prefix |= s.pivot_digit << shift;
    need = s.pivot_need;
    if (shift == 0 || need == s.pivot_count) break;  // uniform
    above = shift;
    shift = shift > 8 ? shift - 8 : 0;
  }
  // A digit kept whole may reach below `least`, whose keys were not counted: K is then least
  // (every key at or above it is kept; those equal to it number at most the digit's count).
  return max(lo + prefix, least);
}

/// Keeps the best k of the concatenation a ++ b (n = a.n + b.n > k >= 1), written in order to
/// out_key/out_col (which overlap neither), and returns radix_kth's threshold: the k-th best key
/// or less, with nothing kept below it and nothing above it dropped. Best = larger key, then lower
/// column; a ++ b is in column order, so the lowest-index ties are the first ones met.
///
/// radix_kth finds a threshold K and how many candidates equal to K are kept; each thread
/// then takes an odd-length run of the concatenation (odd, so that the threads' reads fall in
/// distinct banks), and one block scan of packed (greater, equal) counts gives every run its
/// output position. Candidates never have key 0 (excluded scores are never admitted).
/// Requires n <= 65535 (packed 16-bit counts).
template <int kThreads, int kKeyBits, bool kRolledPasses>
__device__ __noinline__ std::uint32_t select_into(Candidates a, Candidates b,
                                                  std::uint32_t* out_key, std::uint32_t* out_col,
                                                  std::uint32_t k, std::uint32_t base,
                                                  SelectScratch<kThreads>& s) {
  a = as_shared(a);
  b = as_shared(b);
  out_key = as_shared(out_key);
  out_col = as_shared(out_col);
  const std::uint32_t n = a.n + b.n;
  auto key_at = [&](std::uint32_t p) { return p < a.n ? a.key[p] : b.key[p - a.n]; };
  auto col_at = [&](std::uint32_t p) { return p < a.n ? a.col[p] : b.col[p - a.n]; };
  std::uint32_t need;
  const std::uint32_t kth = radix_kth<kThreads, kKeyBits, kRolledPasses>(a, b, k, base, s, need);
  // The first `need` candidates equal to kth are kept.

  std::uint32_t run = (n + kThreads - 1) / kThreads;
  run += 1 - (run & 1);  // odd
  const std::uint32_t first = min(n, threadIdx.x * run), last = min(n, first + run);
  std::uint32_t greater = 0, equal = 0;
  for (std::uint32_t p = first; p < last; ++p) {
    const std::uint32_t key = key_at(p);
    greater += key > kth;
    equal += key == kth;
  }
  std::uint32_t total;
  const std::uint32_t before =
      block_exclusive_sum<kThreads>((greater << 16) | equal, s.warp_totals, total);
  std::uint32_t equal_seen = before & 0xFFFFu;
  std::uint32_t pos = (before >> 16) + min(equal_seen, need);
  for (std::uint32_t p = first; p < last; ++p) {
    const std::uint32_t key = key_at(p);
    const bool is_equal = key == kth;
    if (key > kth || (is_equal && equal_seen < need)) {
      out_key[pos] = key;
      out_col[pos] = col_at(p);
      ++pos;
    }
    equal_seen += is_equal;
  }
  __syncthreads();
  return kth;
}

/// Words of the digit counts sort_best_first needs: 256 a warp.
template <int kThreads>
constexpr std::uint32_t sort_count_words() {
  return static_cast<std::uint32_t>(kThreads / kWarpSize) * 256u;
}

/// Sorts list `a` best first: key descending, then column ascending. The list must be in
/// column order, as every kernel places its kept elements, so that a stable sort by key alone
/// leaves equal keys in column order. `b` is the other buffer (room for a.n); the sorted list
/// is returned, in whichever of the two it ends.
///
/// LSD radix sort of (key - least key) in 8-bit digits, as many passes as the keys' range
/// needs (one or two for the 16-bit scores of a row's best k, up to four for fp32). Warp w
/// owns positions [w T, (w + 1) T), T = 32 x tiles, and walks them a tile (32 positions) at a
/// time: eight ballots group the tile's lanes by digit, and the lowest lane of a group adds
/// the group to the warp's count of its digit (one shared atomic a group, on counts no other
/// warp touches). One scan over (digit, warp) turns the counts into each warp's first position
/// of each digit, and the same walk again claims the groups' places in tile order and writes
/// every element to its place in the other buffer. Five barriers a pass, against the
/// log2(n) (log2(n) + 1) / 2 barrier stages of a bitonic network (66 for 2048 keys).
/// \param counts shared scratch of sort_count_words<kThreads>() words.
/// \param warp_totals shared scratch of 32 words.
/// Every thread calls it; ends with a barrier.
template <int kThreads>
__device__ Candidates sort_best_first(Candidates a, Candidates b, std::uint32_t* counts,
                                      std::uint32_t* warp_totals) {
  constexpr int kWarps = kThreads / kWarpSize;
  static_assert(kThreads >= 256 && kWarps <= 16, "a thread a digit; bounds fit warp_totals");
  const std::uint32_t n = a.n;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const std::uint32_t lanes_below = (1u << lane) - 1u;
  const std::uint32_t tiles = (n + kThreads - 1) / kThreads;
  const std::uint32_t first = warp * tiles * kWarpSize + lane;  // position of tile 0's lane
  Candidates src = as_shared(a), dst = as_shared(b);
  dst.n = n;

  // The keys' range: passes over its significant bits only.
  std::uint32_t lo = 0xFFFFFFFFu, hi = 0;
#pragma unroll 1
  for (std::uint32_t j = 0, p = first; j < tiles; ++j, p += kWarpSize) {
    if (p < n) lo = min(lo, src.key[p]), hi = max(hi, src.key[p]);
  }
  block_min_max<kThreads>(lo, hi, warp_totals);
  const std::uint32_t range = hi - lo;
  if (range == 0) {  // one key: column order is the order
    __syncthreads();   // the bounds are read before warp_totals is reused
    return src;
  }
  const int passes = (32 - __clz(range) + 7) / 8;

  std::uint32_t* my_counts = counts + warp * 256;
#pragma unroll 1
  for (int pass = 0; pass < passes; ++pass) {
    const int shift = 8 * pass;
    // The lanes of a tile holding an element of this lane's digit (digit 0 holds the pass's
    // best keys, so that ascending digits run best first): eight ballots, one a digit bit.
    auto peers_of = [&](std::uint32_t p, std::uint32_t& d) {
      const bool valid = p < n;
      d = valid ? ~((src.key[p] - lo) >> shift) & 0xFFu : 0u;
      std::uint32_t peers = __ballot_sync(0xFFFFFFFFu, valid);
#pragma unroll
      for (int bit = 0; bit < 8; ++bit) {
        const std::uint32_t set = __ballot_sync(0xFFFFFFFFu, (d >> bit) & 1u);
        peers &= (d >> bit) & 1u ? set : ~set;
      }
      return valid ? peers : 0u;
    };
#pragma unroll
    for (int i = lane; i < 256; i += kWarpSize) my_counts[i] = 0;
    __syncwarp();
#pragma unroll 1
    for (std::uint32_t j = 0, p = first; j < tiles; ++j, p += kWarpSize) {
      std::uint32_t d;
      const std::uint32_t peers = peers_of(p, d);
      // The lowest lane of a group adds the group to the warp's count of its digit.
      if (peers != 0 && (peers & lanes_below) == 0) atomicAdd(&my_counts[d], __popc(peers));
    }
    __syncthreads();
    // Thread t owns digit t: its warps' counts become their first places within the digit,
    // then the digits' totals are scanned in digit order.
    std::uint32_t in_digit = 0;
    if (threadIdx.x < 256) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const std::uint32_t c = counts[w * 256 + threadIdx.x];
        counts[w * 256 + threadIdx.x] = in_digit;
        in_digit += c;
      }
    }
    std::uint32_t total;
    const std::uint32_t digit_first = block_exclusive_sum<kThreads>(in_digit, warp_totals, total);
    if (threadIdx.x < 256) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) counts[w * 256 + threadIdx.x] += digit_first;
    }
    __syncthreads();
    // The same walk again: each group's lowest lane claims the group's places, in tile order
    // (a tile's claims return before the next tile's are made, through the shuffle).
#pragma unroll 1
    for (std::uint32_t j = 0, p = first; j < tiles; ++j, p += kWarpSize) {
      std::uint32_t d;
      const std::uint32_t peers = peers_of(p, d);
      const int leader = peers != 0 ? __ffs(peers) - 1 : lane;
      std::uint32_t at = 0;
      if (peers != 0 && leader == lane) at = atomicAdd(&my_counts[d], __popc(peers));
      at = __shfl_sync(0xFFFFFFFFu, at, leader);
      if (peers != 0) {
        const std::uint32_t to = at + __popc(peers & lanes_below);
        dst.key[to] = src.key[p];
        dst.col[to] = src.col[p];
      }
    }
    __syncthreads();
    const Candidates t = src;
    src = dst;
    dst = t;
  }
  return src;
}

}  // namespace attnkit::detail::cuda
