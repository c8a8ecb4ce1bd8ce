// SPDX-License-Identifier: Apache-2.0
// CPU top-k: one read of each row against a rising threshold, with a radix select over the
// survivors. Algorithm, invariants and cost bound: docs/topk.md.
//
//   1. Score: each element becomes an unsigned score (common/topk_keys.hpp); larger is better.
//   2. Floor: on rows long enough for k (cpu_row_floored), an evenly spaced sample of scores
//      gives a starting threshold that a little more than k elements beat, so the filter admits
//      few losers from the start. k = 1 on ranges of up to 4096 columns takes two plain passes
//      instead (select_best).
//   3. Filter: the row is read once, kBlock elements at a time, in column order. A block with
//      no element that may beat the threshold T is skipped after one vectorised pass; in the
//      others, elements with score > T are appended to a candidate buffer (score, column),
//      which so stays in column order.
//   4. Reconstruct: when the buffer holds k + slack candidates, keep the best k (a radix pass
//      over the top 12 bits, then an exact select inside the pivot bucket) and raise T to the
//      k-th best score. Equal scores arriving later have larger columns and so lose the tie;
//      that is why the filter can use a strict `>` and still return the lowest-index set.
//   5. Finish: a last reconstruct to k, order the row, write values (bit copies) and indices.
// Rows are spread over the thread pool; when there are fewer rows than threads, each row is cut
// into column-ordered segments whose top-k lists are concatenated and reconstructed once more.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "attnkit/error.hpp"
#include "common/float_bits.hpp"
#include "common/topk_keys.hpp"
#include "common/topk_sample.hpp"
#include "core/backends.hpp"
#include "core/thread_pool.hpp"
#include "cpu/topk_common.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(ATTNKIT_NO_TARGET_CLONES)
// AVX2 doubles the lanes of the scoring loops, and AVX-512 (x86-64-v4) doubles them again where
// the CPU has it (the tracked CPU cases 1.02-1.13x on an AVX-512 Xeon, docs/topk.md); the
// default clone keeps the library runnable on any x86-64. The loader picks one at startup
// (ifunc).
#define ATTNKIT_VECTOR_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define ATTNKIT_VECTOR_CLONES
#endif

namespace attnkit::detail {
namespace {

// ---------------------------------------------------------------------------------------------
// Constants
// ---------------------------------------------------------------------------------------------

// Elements marked per filter step. A block with no mark is skipped after one vectorised pass;
// a marked block costs a scan of kBlock / 8 words, so blocks are small enough that most of
// them hold no mark once the threshold has risen, and large enough to amortise that scan.
constexpr int kBlock = 64;
// Candidates gathered beyond k before a reconstruct. The reconstruct costs O(k + slack), and
// its number falls as 1/slack, so the slack follows k (2k) with a floor that keeps small k
// cheap. A floor of 32 rather than 256 lets the threshold rise 32 + k elements into a row that
// starts without a sampled floor (cpu_row_floored, e.g. short rows with a small k), instead
// of gathering up to 256 + k first: 2 threads, best of 7, fp32 [100000, 256] k=8 2.10 -> 1.19
// us a row, [10000, 1000] k=10 3.87 -> 2.58, [64, 8192] k=1 3.58 -> 1.57, [8, 65536] k=16 1.39x
// faster; rows with a floor within 5 % ([1, 129280] k=1, 8, 50; [16, 131072] k=100).
constexpr std::int64_t kMinSlack = 32;
// Bits of the first radix digit: 4096 bins (16 KB of counts) fit in L1 and split float
// scores by sign, exponent and 3-4 mantissa bits, which leaves a small pivot bucket.
constexpr int kDigitBits = 12;
// Lists of at most this many candidates skip the histogram: clearing and walking its 4096 bins
// costs more than selecting among a few hundred (score, column) keys directly.
constexpr std::size_t kDirectSelectMax = 512;
// Ranges of at most this many columns rank their elements by counting (select_tiny).
constexpr std::int64_t kTinyRange = 32;
// Ranges of at most this many columns find a k = 1 element in two plain passes (select_best).
constexpr std::int64_t kBestMaxRange = 4096;
// The shortest row segment worth a task of its own when rows are cut for more parallelism.
constexpr std::int64_t kMinSegment = std::int64_t{1} << 15;

// ---------------------------------------------------------------------------------------------
// Vectorised filter
// ---------------------------------------------------------------------------------------------

// float32 and bfloat16 widen to float with a move or a shift, which vectorises; float16 needs a
// branchy conversion, so its blocks are tested on scores instead.
template <class Traits>
inline constexpr bool kFloatPrefilter = !std::is_same_v<Traits, Float16Traits>;

template <class Traits>
inline float to_float(std::uint32_t bits) {
  if constexpr (std::is_same_v<Traits, BFloat16Traits>) return bits_to_float(bits << 16);
  if constexpr (std::is_same_v<Traits, Float16Traits>) {
    return f16_bits_to_float(static_cast<std::uint16_t>(bits));
  }
  return bits_to_float(bits);
}

struct FilterResult {
  std::int64_t consumed;  // elements read
  std::size_t appended;   // candidates written
};

/// The float bound of the prefilter (prefilter_tight_bound_bits): score(v) > threshold implies
/// v >= bound (largest) or v <= bound (smallest), or v is a NaN, and for numbers the converse
/// holds too wherever the bound of threshold + 1 exists, so values tied with the threshold are
/// not marked. Comparing floats costs fewer vector instructions than computing scores, so
/// blocks are tested with it first.
/// At or above the best number's score (+inf's, or -inf's when smallest) no number beats the
/// threshold, and the bound is a NaN, which no ordered comparison passes: only NaNs are marked,
/// where the threshold's own bound would mark its every tie (a row of +inf, a NaN a column).
template <class Traits>
float prefilter_bound(std::uint32_t threshold, ScoreParams sp) {
  bool numbers_exact;
  const std::uint32_t bits = prefilter_tight_bound_bits<Traits>(threshold, sp, numbers_exact);
  return numbers_exact ? to_float<Traits>(bits) : std::numeric_limits<float>::quiet_NaN();
}

/// The highest score an element can have: NaN's, or the best number's when NaN ranks below it
/// (largest=False) or is ignored.
template <class Traits>
std::uint32_t best_score(ScoreParams sp) {
  const std::uint32_t best_number =
      (sp.flip == 0 ? Traits::kSign + Traits::kInf : Traits::kSign - Traits::kInf) ^ sp.flip;
  return std::max(best_number, sp.nan_score);
}

/// Whether element j of a block may beat the threshold: a superset test (prefilter_bound).
template <class Traits, bool kLargest>
inline std::uint32_t may_pass(typename Traits::Bits bits, float bound, ScoreParams sp,
                              std::uint32_t threshold) {
  if constexpr (kFloatPrefilter<Traits>) {
    const float v = to_float<Traits>(bits);
    return static_cast<std::uint32_t>((kLargest ? v >= bound : v <= bound) | (v != v));
  } else {
    return static_cast<std::uint32_t>(score_of<Traits>(bits, sp) > threshold);
  }
}

/// True if any element of the block may beat the threshold. Branch-free and store-free, so it
/// vectorises to a few instructions per vector; most blocks end here once T has risen.
template <class Traits, bool kLargest>
inline bool block_may_pass(const typename Traits::Bits* __restrict p, float bound, ScoreParams sp,
                           std::uint32_t threshold) {
  std::uint32_t any = 0;  // an integer OR-reduction vectorises; a bool one does not
  for (int j = 0; j < kBlock; ++j) any |= may_pass<Traits, kLargest>(p[j], bound, sp, threshold);
  return any != 0;
}

/// Marks in m[] the elements of a block that may beat the threshold (vectorised).
template <class Traits, bool kLargest>
inline void mark_block(const typename Traits::Bits* __restrict p, std::uint8_t* __restrict m,
                       float bound, ScoreParams sp, std::uint32_t threshold) {
  for (int j = 0; j < kBlock; ++j) {
    m[j] = static_cast<std::uint8_t>(may_pass<Traits, kLargest>(p[j], bound, sp, threshold));
  }
}

/// Appends (score, column) of every element of p[0, n) whose score beats `threshold`, in
/// column order, and stops early at the end of the block that leaves fewer than kBlock free
/// slots of `room`. Each block is marked with vector instructions first; only the marked
/// elements, a few percent after the first reconstruct, are scored and appended one by one.
template <class Traits, bool kLargest>
inline FilterResult filter_body(const typename Traits::Bits* p, std::int64_t n, std::uint32_t col0,
                                ScoreParams sp, std::uint32_t threshold, std::uint32_t* score,
                                std::uint32_t* col, std::size_t room) {
  const float bound = prefilter_bound<Traits>(threshold, sp);
  std::size_t appended = 0;
  std::int64_t i = 0;
  alignas(64) std::uint8_t marks[kBlock];
  // Without a threshold yet (a row's first columns, when no sampled floor starts it) every
  // element but an excluded one (a NaN that nan="ignore" drops) is appended: whole blocks,
  // branch-free, where the loop over marks below would mispredict its exits.
  if (threshold == kExcludedScore) {
    for (; i + kBlock <= n && appended + kBlock <= room; i += kBlock) {
      for (int j = 0; j < kBlock; ++j) {
        const std::uint32_t s = score_of<Traits>(p[i + j], sp);
        score[appended] = s;
        col[appended] = col0 + static_cast<std::uint32_t>(i + j);
        appended += s > threshold;
      }
    }
  }
  for (; i + kBlock <= n && appended + kBlock <= room; i += kBlock) {
    if (!block_may_pass<Traits, kLargest>(p + i, bound, sp, threshold)) continue;
    mark_block<Traits, kLargest>(p + i, marks, bound, sp, threshold);
    for (int w = 0; w < kBlock; w += 8) {
      std::uint64_t word;
      std::memcpy(&word, marks + w, sizeof word);
      while (word != 0) {
        const int j = w + __builtin_ctzll(word) / 8;
        word &= word - 1;  // marks are 0 or 1, so this clears exactly the byte just taken
        const std::uint32_t s = score_of<Traits>(p[i + j], sp);
        score[appended] = s;
        col[appended] = col0 + static_cast<std::uint32_t>(i + j);
        appended += s > threshold;
      }
    }
  }
  if (i + kBlock > n && appended + kBlock <= room) {  // the last, partial block
    for (; i < n; ++i) {
      const std::uint32_t s = score_of<Traits>(p[i], sp);
      score[appended] = s;
      col[appended] = col0 + static_cast<std::uint32_t>(i);
      appended += s > threshold;
    }
  }
  return {i, appended};
}

template <class Traits>
inline bool block_has_nan(const typename Traits::Bits* p, std::int64_t n) {
  std::uint32_t found = 0;  // an integer reduction, which vectorises; a bool one does not
  for (std::int64_t i = 0; i < n; ++i) found |= is_nan_bits<Traits>(p[i]) ? 1u : 0u;
  return found != 0;
}

/// The best score of p[0, n), kExcludedScore when there is none (select_best's first pass, a
/// vectorised reduction).
template <class Traits>
inline std::uint32_t max_score_body(const typename Traits::Bits* __restrict p, std::int64_t n,
                                    ScoreParams sp) {
  std::uint32_t best = kExcludedScore;
  for (std::int64_t i = 0; i < n; ++i) best = std::max(best, score_of<Traits>(p[i], sp));
  return best;
}

/// The first column of p[0, n) whose score is `score`, which must occur there (select_best's
/// second pass): blocks are tested with vector instructions until one holds it.
template <class Traits>
inline std::int64_t first_with_score_body(const typename Traits::Bits* __restrict p,
                                          std::int64_t n, ScoreParams sp, std::uint32_t score) {
  std::int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    std::uint32_t found = 0;
    for (int j = 0; j < kBlock; ++j) found |= score_of<Traits>(p[i + j], sp) == score ? 1u : 0u;
    if (found != 0) break;
  }
  while (score_of<Traits>(p[i], sp) != score) ++i;
  return i;
}

// The vectorised loops, one copy a dtype with its vector clones, chosen by overload on the
// dtype's traits (`filter(Traits{}, ...)`).
#define ATTNKIT_DEFINE_VECTOR_LOOPS(Traits)                                                      \
  ATTNKIT_VECTOR_CLONES FilterResult filter(Traits, const Traits::Bits* p, std::int64_t n,      \
                                            std::uint32_t col0, ScoreParams sp,                 \
                                            std::uint32_t threshold, std::uint32_t* score,      \
                                            std::uint32_t* col, std::size_t room) {             \
    return sp.flip == 0 ? filter_body<Traits, true>(p, n, col0, sp, threshold, score, col, room) \
                        : filter_body<Traits, false>(p, n, col0, sp, threshold, score, col, room); \
  }                                                                                             \
  ATTNKIT_VECTOR_CLONES bool has_nan(Traits, const Traits::Bits* p, std::int64_t n) {           \
    return block_has_nan<Traits>(p, n);                                                         \
  }                                                                                             \
  ATTNKIT_VECTOR_CLONES std::uint32_t max_score(Traits, const Traits::Bits* p, std::int64_t n,  \
                                                ScoreParams sp) {                               \
    return max_score_body<Traits>(p, n, sp);                                                    \
  }                                                                                             \
  ATTNKIT_VECTOR_CLONES std::int64_t first_with_score(Traits, const Traits::Bits* p,            \
                                                      std::int64_t n, ScoreParams sp,           \
                                                      std::uint32_t score) {                    \
    return first_with_score_body<Traits>(p, n, sp, score);                                      \
  }
ATTNKIT_DEFINE_VECTOR_LOOPS(Float32Traits)
ATTNKIT_DEFINE_VECTOR_LOOPS(BFloat16Traits)
ATTNKIT_DEFINE_VECTOR_LOOPS(Float16Traits)
#undef ATTNKIT_DEFINE_VECTOR_LOOPS

// ---------------------------------------------------------------------------------------------
// Candidate buffer and its reconstruct
// ---------------------------------------------------------------------------------------------

/// Candidates in ascending column order, plus the scratch a reconstruct needs. One per task
/// that runs at once (CallBuffers), reserved before a call writes any row and reused across
/// calls, so the steady state allocates nothing; a call that needed more than kKeptCandidates
/// gives its excess back (trim), so one huge k does not hold memory for the life of the
/// process.
struct Candidates {
  static constexpr std::size_t kKeptCandidates = std::size_t{1} << 20;  // 16-24 MB a thread

  std::vector<std::uint32_t> score;
  std::vector<std::uint32_t> col;
  std::vector<std::uint32_t> hist;
  std::vector<std::uint64_t> bucket;
  std::vector<std::uint32_t> sample;

  void reserve(std::size_t n) {
    if (score.size() < n) {
      score.resize(n);
      col.resize(n);
    }
    if (hist.size() < (std::size_t{1} << kDigitBits)) hist.resize(std::size_t{1} << kDigitBits);
  }

  /// Room for `n` candidates through every step of a row (the lists, a reconstruct's bucket
  /// with its one slot of overrun, the final order) and `samples` sampled scores.
  void reserve_all(std::size_t n, std::size_t samples) {
    reserve(n);
    if (bucket.size() < n + 1) bucket.resize(n + 1);
    if (sample.size() < samples) sample.resize(samples);
  }

  /// Frees every list grown past kKeptCandidates; the next call regrows what it needs.
  void trim() {
    release_past(score);
    release_past(col);
    release_past(bucket);
    release_past(sample);
  }

 private:
  template <class T>
  static void release_past(std::vector<T>& v) {
    if (v.size() > kKeptCandidates) std::vector<T>().swap(v);
  }
};

/// (score, column) as one integer whose order is the selection order: higher score first, then
/// lower column. Columns are < 2^31, so ~col fits the low half.
inline std::uint64_t rank_key(std::uint32_t score, std::uint32_t col) {
  return (std::uint64_t{score} << 32) | static_cast<std::uint32_t>(~col);
}

/// Keeps the best k of c's first n candidates (n > k >= 1), in place and in column order.
/// Returns the k-th best score: every kept candidate scores >= it, every dropped one <= it.
std::uint32_t reconstruct(Candidates& c, std::size_t n, std::size_t k, int score_bits) {
  std::uint32_t* __restrict score = c.score.data();
  std::uint32_t* __restrict col = c.col.data();
  std::size_t need = k;
  std::size_t m = 0;
  std::uint64_t* bucket;
  if (n <= kDirectSelectMax) {
    if (c.bucket.size() < n) c.bucket.resize(n);
    bucket = c.bucket.data();
    for (std::size_t i = 0; i < n; ++i) bucket[i] = rank_key(score[i], col[i]);
    m = n;
  } else {
    std::uint32_t* __restrict hist = c.hist.data();
    const int shift = score_bits - kDigitBits;
    std::fill(hist, hist + (std::size_t{1} << kDigitBits), 0u);
    for (std::size_t i = 0; i < n; ++i) ++hist[score[i] >> shift];
    std::uint32_t digit = (1u << kDigitBits) - 1;
    while (hist[digit] < need) need -= hist[digit--];

    // The pivot bucket holds >= need candidates; the need-th best of them by rank_key is the
    // exact k-th of the whole buffer, ties broken by column.
    // The loop below writes one slot past the last bucket member; size for it (grows only).
    if (c.bucket.size() <= hist[digit]) c.bucket.resize(hist[digit] + 1);
    bucket = c.bucket.data();
    for (std::size_t i = 0; i < n; ++i) {
      bucket[m] = rank_key(score[i], col[i]);
      m += (score[i] >> shift) == digit;
    }
  }
  std::nth_element(bucket, bucket + (need - 1), bucket + m, std::greater<>());
  const std::uint32_t pivot_score = static_cast<std::uint32_t>(bucket[need - 1] >> 32);
  const std::uint32_t pivot_col = ~static_cast<std::uint32_t>(bucket[need - 1]);

  std::size_t out = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t s = score[i], cc = col[i];
    score[out] = s;
    col[out] = cc;
    out += (s > pivot_score) | ((s == pivot_score) & (cc <= pivot_col));
  }
  return pivot_score;
}

std::size_t slack_for(std::size_t k) {
  return std::max<std::size_t>(2 * k, static_cast<std::size_t>(kMinSlack));
}

/// A score floor that at least k elements of columns [lo, hi) reach with high probability,
/// estimated from an evenly spaced sample; kExcludedScore when the row is too short for a
/// sample to pay off. See docs/topk.md, "CPU", "Sampled floor".
template <class Traits>
std::uint32_t sampled_floor(const typename Traits::Bits* row, std::int64_t lo, std::int64_t hi,
                            std::size_t k, ScoreParams sp, Candidates& c) {
  const std::int64_t len = hi - lo;
  if (!cpu_row_floored(static_cast<std::int64_t>(k), len)) return kExcludedScore;
  const std::int64_t size = cpu_floor_samples(len);
  // Rank in the sample whose score floor admits about k elements of the row, raised by three
  // standard deviations of the binomial count and two, so that fewer than k admitted (which
  // costs a second pass) is rare.
  const double expected = static_cast<double>(k) * static_cast<double>(size) /
                          static_cast<double>(len);
  const auto rank = static_cast<std::int64_t>(expected + 3.0 * std::sqrt(expected) + 2.0);
  if (rank >= size / 2) return kExcludedScore;  // the floor would filter too little to pay
  if (c.sample.size() < static_cast<std::size_t>(size))
    c.sample.resize(static_cast<std::size_t>(size));
  CpuFloorColumns columns(len, size);  // cpu_floor_sample_column(j, len, size), j = 0, 1, ...
  std::uint32_t least = ~0u, most = 0;
  for (std::int64_t j = 0; j < size; ++j) {
    const std::uint32_t s = score_of<Traits>(row[lo + columns.next()], sp);
    c.sample[static_cast<std::size_t>(j)] = s;
    least = std::min(least, s);
    most = std::max(most, s);
  }
  return rank_th_best(c.sample.data(), static_cast<std::size_t>(size),
                      static_cast<std::size_t>(rank), Traits::kBits, least, most);
}

/// Streams columns [lo, hi) of `row` once, admitting elements whose score beats `threshold`,
/// and leaves the best min(k, admitted) of them in c in column order. Returns their count.
template <class Traits>
std::size_t filter_row(const typename Traits::Bits* row, std::int64_t lo, std::int64_t hi,
                       std::size_t k, ScoreParams sp, std::uint32_t threshold, Candidates& c) {
  const std::size_t limit = k + slack_for(k);
  c.reserve(std::min(limit, static_cast<std::size_t>(hi - lo)) + kBlock);
  std::size_t n = 0;
  for (std::int64_t pos = lo; pos < hi;) {
    // room: free slots up to `limit`, plus the kBlock of headroom reserve() added, so the
    // filter stops right when a reconstruct is due.
    const std::size_t room = limit + kBlock - n;
    const FilterResult r = filter(Traits{}, row + pos, hi - pos, static_cast<std::uint32_t>(pos),
                                  sp, threshold, c.score.data() + n, c.col.data() + n, room);
    pos += r.consumed;
    n += r.appended;
    if (n >= limit) {
      threshold = reconstruct(c, n, k, Traits::kBits);
      n = k;
      // k kept at the best score there is: no later column beats them or wins a tie.
      if (threshold >= best_score<Traits>(sp)) break;
    }
  }
  return n;
}

/// scan_segment for ranges of at most kTinyRange columns: each admitted element's rank is the
/// count of those that beat it (a higher score, or the same at a lower column), and the best k
/// are those ranked below k. A few vectorised comparisons an element, where the filter's blocks
/// and a select cost a row hundreds of nanoseconds in calls and bookkeeping.
template <class Traits>
std::size_t select_tiny(const typename Traits::Bits* row, std::int64_t lo, std::int64_t hi,
                        std::size_t k, ScoreParams sp, Candidates& c) {
  std::uint32_t score[kTinyRange], col[kTinyRange];
  std::uint32_t n = 0;
  for (std::int64_t j = lo; j < hi; ++j) {
    const std::uint32_t s = score_of<Traits>(row[j], sp);
    score[n] = s;
    col[n] = static_cast<std::uint32_t>(j);
    n += s != kExcludedScore;  // NaN with nan="ignore"
  }
  c.reserve(n);
  std::uint32_t* __restrict out_score = c.score.data();
  std::uint32_t* __restrict out_col = c.col.data();
  std::size_t out = 0;
  for (std::uint32_t i = 0; i < n; ++i) {
    const std::uint32_t si = score[i];
    std::uint32_t rank = 0;
    for (std::uint32_t j = 0; j < i; ++j) rank += score[j] >= si;
    for (std::uint32_t j = i + 1; j < n; ++j) rank += score[j] > si;
    out_score[out] = si;
    out_col[out] = col[i];
    out += rank < k;
  }
  return out;
}

/// scan_segment for k = 1 (greedy sampling, top-1 routing): the best score in one pass, then
/// its first column in a second, both over the row's scores alone. On short rows the filter's
/// blocks and its select cost more than the row itself.
template <class Traits>
std::size_t select_best(const typename Traits::Bits* row, std::int64_t lo, std::int64_t hi,
                        ScoreParams sp, Candidates& c) {
  const std::uint32_t best = max_score(Traits{}, row + lo, hi - lo, sp);
  if (best == kExcludedScore) return 0;  // only NaNs that nan="ignore" drops
  const std::int64_t at = lo + first_with_score(Traits{}, row + lo, hi - lo, sp, best);
  c.reserve(1);
  c.score[0] = best;
  c.col[0] = static_cast<std::uint32_t>(at);
  return 1;
}

/// The best min(k, selectable) elements of columns [lo, hi) of `row`, left in c in column
/// order; returns their count.
template <class Traits>
std::size_t scan_segment(const typename Traits::Bits* row, std::int64_t lo, std::int64_t hi,
                         std::size_t k, ScoreParams sp, Candidates& c) {
  if (k == 0 || hi <= lo) return 0;
  if (hi - lo <= kTinyRange) return select_tiny<Traits>(row, lo, hi, k, sp, c);
  if (k == 1 && hi - lo <= kBestMaxRange) return select_best<Traits>(row, lo, hi, sp, c);
  // Starting at a sampled floor F is exact when at least k elements score >= F: the k-th best
  // score is then >= F, so nothing below F could have been chosen. Fewer than k admitted
  // (a reconstruct never ran) means the sample misled: scan again from the bottom.
  const std::uint32_t floor = sampled_floor<Traits>(row, lo, hi, k, sp, c);
  std::size_t n =
      filter_row<Traits>(row, lo, hi, k, sp, floor == kExcludedScore ? floor : floor - 1, c);
  if (n < k && floor != kExcludedScore)
    n = filter_row<Traits>(row, lo, hi, k, sp, kExcludedScore, c);
  if (n > k) {
    reconstruct(c, n, k, Traits::kBits);
    n = k;
  }
  return n;
}

/// Puts the n candidates of c (column order) into the requested output order, in c.col.
void order_candidates(Candidates& c, std::size_t n, TopkOrder order) {
  if (order != TopkOrder::kValue) return;  // column order is both "index" and "none"
  if (c.bucket.size() < n) c.bucket.resize(n);
  for (std::size_t i = 0; i < n; ++i) c.bucket[i] = rank_key(c.score[i], c.col[i]);
  std::sort(c.bucket.begin(), c.bucket.begin() + static_cast<std::ptrdiff_t>(n), std::greater<>());
  for (std::size_t i = 0; i < n; ++i) c.col[i] = ~static_cast<std::uint32_t>(c.bucket[i]);
}

/// The working buffers of one call: a Candidates for each task that may run at once, all
/// reserved before the call writes any row, so that running out of memory leaves the outputs
/// as they were. Owned by the calling thread (t_buffers) and kept between its calls, so that
/// the steady state allocates nothing; tasks on the pool's threads lease them.
class CallBuffers {
 public:
  /// Makes `threads` buffers of reserve_all(candidates, samples) available to lease, one for
  /// each thread of a parallel_for capped at `threads`. Throws WorkingMemoryError, with every
  /// buffer trimmed, when host memory runs out.
  void reserve(const TopkProblem& p, int threads, std::size_t candidates, std::size_t samples) {
    const auto slots = static_cast<std::size_t>(threads);
    try {
      while (buffers_.size() < slots) buffers_.push_back(std::make_unique<Candidates>());
      for (std::size_t i = 0; i < slots; ++i) buffers_[i]->reserve_all(candidates, samples);
      free_.clear();
      free_.reserve(slots);
      for (std::size_t i = 0; i < slots; ++i) free_.push_back(buffers_[i].get());
    } catch (const std::bad_alloc&) {
      trim();
      free_.clear();
      const std::size_t each = candidates * (2 * sizeof(std::uint32_t) + sizeof(std::uint64_t)) +
                               samples * sizeof(std::uint32_t);
      throw cpu::WorkingMemoryError(p, slots, each);
    }
  }

  /// A reserved buffer for the calling task, returned to the others when the lease ends.
  class Lease {
   public:
    explicit Lease(CallBuffers& owner) : owner_(owner) {
      const std::lock_guard<std::mutex> lock(owner_.mutex_);
      c_ = owner_.free_.back();  // at most `slots` tasks run at once
      owner_.free_.pop_back();
    }
    ~Lease() {
      const std::lock_guard<std::mutex> lock(owner_.mutex_);
      owner_.free_.push_back(c_);
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Candidates& operator*() const { return *c_; }

   private:
    CallBuffers& owner_;
    Candidates* c_;
  };

  void trim() {
    for (auto& b : buffers_) b->trim();
  }

 private:
  std::vector<std::unique_ptr<Candidates>> buffers_;
  std::vector<Candidates*> free_;
  std::mutex mutex_;
};

thread_local CallBuffers t_buffers;

/// Candidates a task of scan_segment over at most `len` columns holds at most: the filter's
/// limit plus a block of headroom (filter_row), or the whole range for select_tiny.
std::size_t segment_candidates(std::size_t k, std::int64_t len) {
  const auto n = static_cast<std::size_t>(len);
  return std::max(std::min(k + slack_for(k), n) + kBlock,
                  std::min(n, static_cast<std::size_t>(kTinyRange)));
}

/// Sampled scores sampled_floor takes from at most `len` columns.
std::size_t segment_samples(std::int64_t len) {
  return len < kCpuSampleShortRow ? 0 : static_cast<std::size_t>(cpu_floor_samples(len));
}

// ---------------------------------------------------------------------------------------------
// Row drivers
// ---------------------------------------------------------------------------------------------

template <class Traits>
void run_rows(const TopkProblem& p, ScoreParams sp) {
  using Bits = typename Traits::Bits;
  ThreadPool& pool = ThreadPool::global();
  const std::int64_t threads = pool.size();
  // A row never yields more than N candidates, so buffers are sized by min(k, N); padding up
  // to k is written by write_row.
  const std::size_t k = static_cast<std::size_t>(std::min(p.k, p.row_len));
  const Bits* x = static_cast<const Bits*>(p.x);

  // Segments per row: enough tasks for every thread, none shorter than kMinSegment.
  std::int64_t segments = 1;
  if (p.batch < threads) {
    const std::int64_t want = (threads + p.batch - 1) / p.batch;
    segments = std::clamp<std::int64_t>(p.row_len / kMinSegment, 1, want);
  }

  CallBuffers& buffers = t_buffers;
  // Buffers for as many tasks as run at once; each parallel_for below runs at most that many
  // threads, even if set_num_threads grows the pool during the call.
  const auto slots = [&](std::int64_t tasks) {
    return static_cast<int>(std::min(tasks, threads));
  };
  if (segments == 1) {
    // Enough rows: a task per group of rows keeps scheduling overhead off short rows.
    const std::int64_t tasks = std::min<std::int64_t>(p.batch, threads * 8);
    const int running = slots(tasks);
    buffers.reserve(p, running, segment_candidates(k, p.row_len), segment_samples(p.row_len));
    pool.parallel_for(tasks, [&](std::int64_t t) {
      const CallBuffers::Lease lease(buffers);
      Candidates& c = *lease;
      const std::int64_t first = p.batch * t / tasks, last = p.batch * (t + 1) / tasks;
      for (std::int64_t b = first; b < last; ++b) {
        const cpu::RowRange r = cpu::row_range(p, b);
        const std::size_t n = scan_segment<Traits>(x + b * p.row_stride, r.lo, r.hi, k, sp, c);
        order_candidates(c, n, p.order);
        cpu::write_row<Bits>(p, b, c.col.data(), static_cast<std::int64_t>(n));
      }
    }, running);
    buffers.trim();
    return;
  }

  // Phase 1: each (row, segment) task keeps its own best k, in column order. A segment yields
  // at most its own length, so the lists take no more than the rows whatever the thread count.
  const std::int64_t tasks = p.batch * segments;
  const std::size_t seg_k =
      std::min(k, static_cast<std::size_t>((p.row_len + segments - 1) / segments));
  const auto lists = static_cast<std::size_t>(tasks);
  std::vector<std::uint32_t> seg_score, seg_col;
  std::vector<std::size_t> seg_count;
  try {
    seg_score.resize(lists * seg_k);
    seg_col.resize(lists * seg_k);
    seg_count.resize(lists);
  } catch (const std::bad_alloc&) {
    throw cpu::WorkingMemoryError(p, lists,
                                  seg_k * 2 * sizeof(std::uint32_t) + sizeof(std::size_t));
  }
  const std::int64_t seg_len = (p.row_len + segments - 1) / segments;
  const int running = slots(tasks);
  buffers.reserve(p, running, segment_candidates(k, seg_len), segment_samples(seg_len));
  pool.parallel_for(tasks, [&](std::int64_t t) {
    const CallBuffers::Lease lease(buffers);
    Candidates& c = *lease;
    const std::int64_t b = t / segments, s = t % segments;
    const cpu::RowRange r = cpu::row_range(p, b);
    const std::int64_t len = r.hi - r.lo;
    const std::int64_t lo = r.lo + len * s / segments, hi = r.lo + len * (s + 1) / segments;
    const std::size_t n = scan_segment<Traits>(x + b * p.row_stride, lo, hi, k, sp, c);
    std::copy_n(c.score.data(), n, seg_score.data() + t * seg_k);
    std::copy_n(c.col.data(), n, seg_col.data() + t * seg_k);
    seg_count[t] = n;
  }, running);
  // Phase 2: segments are consecutive column ranges, so their lists concatenate in column
  // order and one more reconstruct gives the row's exact top-k. Its buffers hold every
  // segment's list, reserved before the first row is written.
  const int merging = slots(p.batch);
  buffers.reserve(p, merging, static_cast<std::size_t>(segments) * seg_k, 0);
  pool.parallel_for(p.batch, [&](std::int64_t b) {
    const CallBuffers::Lease lease(buffers);
    Candidates& c = *lease;
    std::size_t n = 0;
    for (std::int64_t s = 0; s < segments; ++s) n += seg_count[b * segments + s];
    c.reserve(n);
    n = 0;
    for (std::int64_t s = 0; s < segments; ++s) {
      const std::int64_t t = b * segments + s;
      std::copy_n(seg_score.data() + t * seg_k, seg_count[t], c.score.data() + n);
      std::copy_n(seg_col.data() + t * seg_k, seg_count[t], c.col.data() + n);
      n += seg_count[t];
    }
    if (n > k) {
      reconstruct(c, n, k, Traits::kBits);
      n = k;
    }
    order_candidates(c, n, p.order);
    cpu::write_row<Bits>(p, b, c.col.data(), static_cast<std::int64_t>(n));
  }, merging);
  buffers.trim();
}

template <class Traits>
NanPosition find_nan(const TopkProblem& p) {
  using Bits = typename Traits::Bits;
  ThreadPool& pool = ThreadPool::global();
  // The lowest row found so far: no memory per row (B may be 2^31 - 1 broadcast rows), and
  // rows past it need no scan. A task per block of rows, each block in ascending order, keeps
  // scheduling off short rows, as run_rows does.
  std::atomic<std::int64_t> first{p.batch};
  const std::int64_t tasks = std::min<std::int64_t>(p.batch, pool.size() * 8);
  pool.parallel_for(tasks, [&](std::int64_t t) {
    const std::int64_t last = p.batch * (t + 1) / tasks;
    for (std::int64_t b = p.batch * t / tasks; b < last; ++b) {
      if (b > first.load(std::memory_order_relaxed)) return;
      const cpu::RowRange r = cpu::row_range(p, b);
      const Bits* row = static_cast<const Bits*>(p.x) + b * p.row_stride + r.lo;
      if (!has_nan(Traits{}, row, r.hi - r.lo)) continue;
      std::int64_t seen = first.load(std::memory_order_relaxed);
      while (b < seen && !first.compare_exchange_weak(seen, b, std::memory_order_relaxed)) {
      }
      return;  // the block's later rows cannot be first
    }
  });
  NanPosition at;
  at.row = first.load();
  if (at.row == p.batch) return {};
  const cpu::RowRange r = cpu::row_range(p, at.row);
  const Bits* row = static_cast<const Bits*>(p.x) + at.row * p.row_stride;
  for (at.col = r.lo; !is_nan_bits<Traits>(row[at.col]); ++at.col) {
  }
  return at;
}

}  // namespace

void cpu_topk(const TopkProblem& p) {
  if (p.batch == 0 || p.k == 0) return;
  with_traits(p.dtype, [&](auto traits) {
    using Traits = decltype(traits);
    const ScoreParams sp = make_score_params<Traits>(p.largest, p.nan == NanPolicy::kIgnore);
    run_rows<Traits>(p, sp);
  });
}

NanPosition cpu_topk_find_nan(const TopkProblem& p) {
  if (p.batch == 0) return {};
  return with_traits(p.dtype, [&](auto traits) { return find_nan<decltype(traits)>(p); });
}

}  // namespace attnkit::detail
