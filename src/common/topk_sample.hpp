// SPDX-License-Identifier: Apache-2.0
// The register tiles of the CUDA short-row and cluster top-k kernels, and where the cluster
// kernel (kernels/topk_cluster.cuh, step 1), the filter kernel (kernels/topk_filter.cuh, the
// sampled floor) and the CPU backend (src/cpu/topk.cpp, sampled_floor) sample a row: shared
// with the tests, which plant the row's best values exactly there to make the sample
// overestimate the row and so exercise the second, full select or scan; the CPU floor's select
// of its sample (rank_th_best); and the cluster kernel's sample need (cluster_sample).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>

#include "common/host_device.hpp"

namespace attnkit::detail {

inline constexpr int kShortThreads = 256;   // threads per CTA
inline constexpr int kShortPerThread = 32;  // consecutive columns per thread
inline constexpr std::int64_t kShortMaxLen = kShortThreads * kShortPerThread;
inline constexpr int kMaxClusterCtas = 16;  // non-portable cluster size on sm_90
/// Threads per CTA of the clusters that hold rows beyond kMaxClusterCtas * kShortMaxLen
/// columns (e.g. vocabularies of 151936 or 202048 entries): twice the columns a CTA.
inline constexpr int kWideClusterThreads = 512;
inline constexpr std::int64_t kClusterMaxLen =
    std::int64_t{kWideClusterThreads} * kShortPerThread * kMaxClusterCtas;

/// Rows of more than kWideChoiceLen columns, up to kMaxClusterCtas * kShortMaxLen, may also run
/// with 512-thread CTAs, half as many a row: the dispatch takes them (`wide`) for batches of
/// rows whose 16-CTA clusters would not all be resident one CTA an SM.
inline constexpr std::int64_t kWideChoiceLen = kShortMaxLen * kMaxClusterCtas / 2;

/// Threads per CTA the cluster kernel runs a row of `row_len` columns with.
ATTNKIT_HD constexpr int short_cluster_threads(std::int64_t row_len, bool wide = false) {
  return row_len > kShortMaxLen * kMaxClusterCtas || (wide && row_len > kWideChoiceLen)
             ? kWideClusterThreads
             : kShortThreads;
}

/// Threads per sampling thread: every thread samples in a lone CTA, every 2nd in a pair and
/// every 4th in larger clusters, so that a row's sample holds 256 to 1024 elements (up to 2048
/// in clusters of 512-thread CTAs).
ATTNKIT_HD constexpr int short_sample_every(int ctas) { return ctas >= 4 ? 4 : ctas; }

/// The cluster kernel's sample (kernels/topk_cluster.cuh, step 1) of a row of `ctas` CTAs whose
/// best `k_select` are wanted: e = k_select / (kShortPerThread * short_sample_every(ctas)) sampled
/// elements are expected above the k-th best; the floor is the digit of the sample's `need`-th
/// best, need = e + 3 sqrt(e) + 2; the first fp32 select pass spans the floor up to, not
/// including, digit `top + past`, top being the sample's best digit: past = 2 (one digit past
/// the sample's best), or 3 where e < 0.3 (the k-th best then often lies more than a digit above
/// the sample's best). Worked out on the host: the float division and square root with their
/// slow paths were about 140 SASS instructions of the kernel.
struct ClusterSample {
  std::uint32_t need;
  std::uint32_t past;
};
inline ClusterSample cluster_sample(std::uint32_t k_select, int ctas) {
  const float expected = static_cast<float>(k_select) /
                         static_cast<float>(kShortPerThread * short_sample_every(ctas));
  return {static_cast<std::uint32_t>(expected + 3.0f * std::sqrt(expected) + 2.0f),
          expected < 0.3f ? 3u : 2u};
}

/// The element (0 .. 31) that sampling thread `tid` of cluster CTA `rank` samples: offsets vary
/// between threads so that no period of the data lines up with the sample.
ATTNKIT_HD constexpr int short_sample_element(int tid, int rank) {
  return (tid * 11 + rank * 5) & 31;
}

/// CTAs per row the kernel runs a row of `row_len` columns with: a power of two up to
/// kMaxClusterCtas * kShortMaxLen columns (`wide`: 8 beyond kWideChoiceLen), beyond as many
/// 512-thread CTAs as the row fills (a 151936-column row takes 10, not 16).
ATTNKIT_HD constexpr int short_cluster_ctas(std::int64_t row_len, bool wide = false) {
  if (short_cluster_threads(row_len, wide) == kWideClusterThreads) {
    constexpr std::int64_t per_cta = std::int64_t{kWideClusterThreads} * kShortPerThread;
    return static_cast<int>((row_len + per_cta - 1) / per_cta);
  }
  int ctas = 1;
  while (ctas * kShortMaxLen < row_len) ctas *= 2;
  return ctas;
}

/// Whether column `col` (counted from the row's `begin`) is sampled in a row of `row_len` laid
/// out with 512-thread CTAs (`wide`) or not.
ATTNKIT_HD constexpr bool short_sampled_in(std::int64_t col, std::int64_t row_len, bool wide) {
  const int ctas = short_cluster_ctas(row_len, wide);
  const int threads = short_cluster_threads(row_len, wide);
  const auto thread = static_cast<int>(col / kShortPerThread);
  const int tid = thread % threads, rank = thread / threads;
  return tid % short_sample_every(ctas) == 0 &&
         col % kShortPerThread == short_sample_element(tid, rank);
}

/// Whether column `col` of a row of `row_len` is sampled in either layout the dispatch may
/// take for it.
ATTNKIT_HD constexpr bool short_sampled(std::int64_t col, std::int64_t row_len) {
  return short_sampled_in(col, row_len, false) || short_sampled_in(col, row_len, true);
}

/// Threads of a filter CTA that sample its range, one 16-byte vector each, and the fewest
/// aligned vectors a range must hold to be sampled: 8 a sampling thread, 16K 16-bit or 8K fp32
/// elements (with twice that minimum, causal rows of 65536 columns ran 8-13 % slower, run 44).
inline constexpr int kFilterSampleThreads = 256;
inline constexpr std::int64_t kFilterSampleMinVectors = 8 * kFilterSampleThreads;
/// Most vectors a sampling thread reads, on long ranges with small k.
inline constexpr int kFilterSampleMaxPerThread = 8;

/// Vectors each sampling thread reads from a range of `len` elements held in `vectors` aligned
/// vectors of `vec` elements, when the best k are wanted and `slots` sampled keys fit in shared
/// memory: enough that about 16 of the best k are expected in the sample (the floor's margin,
/// 5 sqrt(e) + 5 samples, then costs ~2.6 k admissions instead of up to ~11 k with one vector a
/// thread on 1M-column rows), and only on ranges of at least 2 kFilterSampleMinVectors vectors
/// a vector read (shorter ranges read one). At most kFilterSampleMaxPerThread vectors of 16-bit
/// elements and two of fp32 (4 a vector), whose keys take four radix passes instead of two:
/// four vectors a thread made 256 x 129280 fp32 rows with k = 50 3 % slower, two made k = 1024
/// 5 % faster (run 51).
ATTNKIT_HD constexpr int filter_samples_per_thread(std::int64_t k, std::int64_t len,
                                                   std::int64_t vectors, int vec,
                                                   std::int64_t slots) {
  const int most = vec == 4 ? 2 : kFilterSampleMaxPerThread;
  int m = 1;
  while (m < most &&
         k * kFilterSampleThreads * vec * m < 16 * len &&  // expected count e below 16
         vectors >= 2 * kFilterSampleMinVectors * (2 * m) &&
         kFilterSampleThreads * vec * (2 * m) <= slots) {
    m *= 2;
  }
  return m;
}

/// Most keys a filter sample holds (kFilterSampleThreads sampling threads, 8 16-bit elements a
/// vector, kFilterSampleMaxPerThread vectors a thread).
inline constexpr std::int64_t kFilterSampleMaxKeys =
    kFilterSampleThreads * 8 * kFilterSampleMaxPerThread;

/// The rank in a sample of `samples` keys, from a range of `len` elements whose best k are
/// wanted, whose key the filter's floor is: e + 5 sqrt(e) + 5, e = k * samples / len being the
/// expected count of sampled keys among the best k (the margin: FilterEngine::sample_floor).
/// A rank beyond a quarter of the sample means no floor: it would let in much of the range.
ATTNKIT_HD std::uint32_t filter_floor_rank(std::int64_t k, std::uint32_t samples,
                                           std::int64_t len) {
  const float expected =
      static_cast<float>(k) * static_cast<float>(samples) / static_cast<float>(len);
  return static_cast<std::uint32_t>(expected + 5.0f * sqrtf(expected) + 5.0f);
}

/// Whether the filter kernel samples a floor for a row of `len` elements (about len / vec
/// aligned vectors of `vec`) whose best k are wanted, with the largest sample a slice holds.
ATTNKIT_HD bool filter_row_floored(std::int64_t k, std::int64_t len, std::int64_t vec) {
  const std::int64_t vectors = len / vec;
  if (vectors < kFilterSampleMinVectors) return false;
  const int per_thread =
      filter_samples_per_thread(k, len, vectors, static_cast<int>(vec), kFilterSampleMaxKeys);
  const auto samples = static_cast<std::uint32_t>(kFilterSampleThreads * vec * per_thread);
  return filter_floor_rank(k, samples, len) <= samples / 4;
}

/// The vector (0 .. vectors - 1, counted from the range's first 16-byte boundary) that sample
/// `s` of kFilterSampleThreads * per_thread reads (sampling thread t reads samples t,
/// t + kFilterSampleThreads, ...): one per stretch of vectors / (kFilterSampleThreads *
/// per_thread), at an offset that varies by sample so that no period of the data lines up with
/// the sample.
template <class Int>
ATTNKIT_HD constexpr Int filter_sample_vector_as(Int s, Int vectors, int per_thread) {
  const Int stretch =
      vectors / (static_cast<Int>(kFilterSampleThreads) * static_cast<Int>(per_thread));
  return s * stretch + (s * 37) % stretch;
}

ATTNKIT_HD constexpr std::int64_t filter_sample_vector(std::int64_t s, std::int64_t vectors,
                                                       int per_thread = 1) {
  return filter_sample_vector_as<std::int64_t>(s, vectors, per_thread);
}

/// filter_sample_vector in 32-bit arithmetic, the same vector for every range of fewer than
/// 2^32 vectors (N < 2^31): the filter kernel's sample loads, where 64-bit divisions would cost
/// calls and registers.
ATTNKIT_HD constexpr std::uint32_t filter_sample_vector32(std::uint32_t s, std::uint32_t vectors,
                                                         int per_thread) {
  return filter_sample_vector_as<std::uint32_t>(s, vectors, per_thread);
}

/// Whether vector `v` of an aligned range of `vectors` vectors is sampled by the filter kernel
/// when its sampling threads read `per_thread` vectors each (one: every range shorter than 4
/// kFilterSampleMinVectors, and longer ones when 16 of the best k are expected in such a
/// sample; filter_samples_per_thread gives the count for a k).
ATTNKIT_HD constexpr bool filter_sampled_vector(std::int64_t v, std::int64_t vectors,
                                                int per_thread = 1) {
  if (vectors < kFilterSampleMinVectors) return false;
  const std::int64_t samples = std::int64_t{kFilterSampleThreads} * per_thread;
  const std::int64_t t = v / (vectors / samples);
  return t < samples && filter_sample_vector(t, vectors, per_thread) == v;
}

/// The CPU backend's sampled floor (docs/topk.md, "CPU", "Sampled floor"). A row of `len`
/// columns takes one for k <= len / 4 when it has at least 16K columns, or at least 4K and
/// k >= 32: on shorter rows, or with a smaller k there, the sample costs more than it saves
/// (its 256 scores are a sixteenth of a 4K row, while a small k's threshold rises within a
/// few hundred columns anyway). One thread, fp32 rows of 8192 (with 512 samples then): k=24
/// 0.85x with a floor, k=32 0.94-1.24x, k=48 2.3-3.0x; rows of 4096: k=16 0.62x, k=32 2.1x.
inline constexpr std::int64_t kCpuSampleMinRow = std::int64_t{1} << 14;
inline constexpr std::int64_t kCpuSampleShortRow = std::int64_t{1} << 12;
inline constexpr std::int64_t kCpuSampleShortMinK = 32;
inline constexpr std::int64_t kCpuSampleMinRatio = 4;

/// Whether the CPU backend samples a floor for the best k of a row of `len` columns (it may
/// still drop it when the sample's rank would let in half the row).
ATTNKIT_HD constexpr bool cpu_row_floored(std::int64_t k, std::int64_t len) {
  return len >= kCpuSampleShortRow && k * kCpuSampleMinRatio <= len &&
         (len >= kCpuSampleMinRow || k >= kCpuSampleShortMinK);
}

/// Scores in the CPU floor's sample of a row of `len` >= kCpuSampleShortRow columns: 1/64 of
/// the row, 256 to 2048. At least 256 rather than 512 (rows under 32K columns): one thread,
/// fp32 [64, 4096] k=32 154 -> 123 us, k=512 539 -> 505, [32, 12000] k=48 117 -> 108, rows of
/// 4096 equal or descending values with k=32 1.26-1.33x; k=128 on 4096 and k=2048 on 8K-16K
/// columns 0.93-0.99x (the floor's wider margin admits more).
ATTNKIT_HD constexpr std::int64_t cpu_floor_samples(std::int64_t len) {
  const std::int64_t size = len / 64;
  return size < 256 ? 256 : size > 2048 ? 2048 : size;
}

/// Column (counted from the row's begin) of sample j of `samples`: evenly spaced, at the middle
/// of each of `samples` equal parts of the row.
ATTNKIT_HD constexpr std::int64_t cpu_floor_sample_column(std::int64_t j, std::int64_t len,
                                                          std::int64_t samples) {
  return (2 * j + 1) * len / (2 * samples);
}

/// The columns cpu_floor_sample_column gives for j = 0, 1, ..., in order, with no division:
/// (2j + 1) len / (2 samples) advances by len / samples, and by one more whenever the
/// remainder of the step carries (a 64-bit division a sample was 13 % of the time of 4096-column
/// descending rows with k = 32, whose threshold otherwise rises at once).
class CpuFloorColumns {
 public:
  ATTNKIT_HD constexpr CpuFloorColumns(std::int64_t len, std::int64_t samples)
      : den_(2 * samples), col_(len / den_), rem_(len % den_), step_(2 * len / den_),
        step_rem_(2 * len % den_) {}
  /// The current column; then advances to the next j.
  ATTNKIT_HD constexpr std::int64_t next() {
    const std::int64_t col = col_;
    col_ += step_;
    rem_ += step_rem_;
    if (rem_ >= den_) {
      rem_ -= den_;
      ++col_;
    }
    return col;
  }

 private:
  std::int64_t den_, col_, rem_, step_, step_rem_;
};

/// The rank-th best (1-based, 1 <= rank <= n) of the n scores v[0, n), of `score_bits` (16
/// or 32) bits; reorders v. Two radix digits of a byte each narrow the scores to those that
/// share the rank-th best's top 16 bits (a histogram, then the bucket moved to the front), and
/// nth_element orders only those: nth_element over all of a 4096-column row's (512) sampled
/// scores took about a third of the row's time, most of it in mispredicted branches (the CPU
/// floor's select, host only).
/// `least` and `most` are the least and greatest of the scores (the caller finds them as it
/// gathers them): scores of one value are their own answer, and a digit that all scores share
/// needs no histogram (a histogram of one busy bin chains every increment through the one
/// before: a sample of equal scores took twice as long as the rest of its row).
inline std::uint32_t rank_th_best(std::uint32_t* __restrict v, std::size_t n, std::size_t rank,
                                  int score_bits, std::uint32_t least, std::uint32_t most) {
  constexpr std::size_t kFew = 32;  // fewer scores go to nth_element at once
  if (least == most) return least;
  for (int shift = score_bits - 8; shift >= score_bits - 16 && n > kFew; shift -= 8) {
    if (((least ^ most) >> shift) == 0) continue;  // one digit here for every score left
    // Two histograms, even and odd scores, so that a run of scores in one bin does not chain
    // each increment through the one before.
    std::uint32_t hist[2][256] = {};
    std::size_t i = 0;
    for (; i + 2 <= n; i += 2) {
      ++hist[0][(v[i] >> shift) & 255u];
      ++hist[1][(v[i + 1] >> shift) & 255u];
    }
    if (i < n) ++hist[0][(v[i] >> shift) & 255u];
    std::uint32_t digit = 255;
    while (hist[0][digit] + hist[1][digit] < rank) {
      rank -= hist[0][digit] + hist[1][digit];
      --digit;
    }
    std::size_t m = 0;
    for (i = 0; i < n; ++i) {  // the bucket's scores to the front, in place
      const std::uint32_t s = v[i];
      v[m] = s;
      m += ((s >> shift) & 255u) == digit;
    }
    n = m;
  }
  std::nth_element(v, v + (rank - 1), v + n, std::greater<>());
  return v[rank - 1];
}

}  // namespace attnkit::detail
