// SPDX-License-Identifier: Apache-2.0
// Where the CUDA kernels sample a row (src/common/topk_sample.hpp). The filter kernel's sample
// reads vectors through filter_sample_vector, so every position must lie inside the range,
// one per stretch of vectors / 256 (spread over the whole row); the tests plant a row's best
// values through filter_sampled_vector, which must name exactly those positions. The register
// kernels' columns (short_sampled) must number 64 to 256 per 8192-column CTA. The CPU floor's
// columns (cpu_floor_sample_column) must be distinct, inside the row and one per equal part,
// and its select (rank_th_best) must return what a full sort puts at the rank. The cluster
// kernel's sample need and first span (cluster_sample) must follow e + 3 sqrt(e) + 2 and e < 0.3.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <set>
#include <vector>

#include "common/topk_sample.hpp"

namespace {

using attnkit::detail::cluster_sample;
using attnkit::detail::cpu_floor_sample_column;
using attnkit::detail::CpuFloorColumns;
using attnkit::detail::cpu_floor_samples;
using attnkit::detail::cpu_row_floored;
using attnkit::detail::filter_floor_rank;
using attnkit::detail::filter_row_floored;
using attnkit::detail::filter_sample_vector;
using attnkit::detail::filter_sample_vector32;
using attnkit::detail::filter_sampled_vector;
using attnkit::detail::filter_samples_per_thread;
using attnkit::detail::kFilterSampleMaxPerThread;
using attnkit::detail::kFilterSampleMinVectors;
using attnkit::detail::kFilterSampleThreads;
using attnkit::detail::kShortMaxLen;
using attnkit::detail::rank_th_best;
using attnkit::detail::short_sampled;
using attnkit::detail::short_sampled_in;

TEST(TopkSample, CpuSampleOnePerPartInsideTheRow) {
  for (std::int64_t len : {std::int64_t{4096}, std::int64_t{8191}, std::int64_t{12000},
                           std::int64_t{16384}, std::int64_t{32768}, std::int64_t{100003},
                           std::int64_t{131072}, std::int64_t{1} << 30}) {
    const std::int64_t samples = cpu_floor_samples(len);
    ASSERT_GE(samples, 256) << "len=" << len;
    ASSERT_LE(samples, 2048) << "len=" << len;
    CpuFloorColumns columns(len, samples);  // the CPU floor's loop: no division a sample
    for (std::int64_t j = 0; j < samples; ++j) {
      // Sample j lies in part j of `samples` equal parts of the row.
      const std::int64_t c = cpu_floor_sample_column(j, len, samples);
      ASSERT_GE(c * samples, j * len) << "len=" << len << " j=" << j;
      ASSERT_LT(c * samples, (j + 1) * len) << "len=" << len << " j=" << j;
      ASSERT_EQ(columns.next(), c) << "len=" << len << " j=" << j;
    }
  }
}

/// Every rank of score lists that its radix digits treat differently: random, a handful of
/// values (ties across the rank), all in one top byte or one top 16 bits (the nth_element
/// over the last bucket), all equal; list sizes on both sides of the 32 it orders directly.
TEST(TopkSample, RankThBestMatchesASort) {
  std::mt19937 rng(77);
  for (int bits : {16, 32}) {
    const std::uint32_t mask = bits == 32 ? ~0u : 0xFFFFu;
    for (std::size_t n : {1u, 2u, 31u, 32u, 33u, 100u, 512u, 2048u}) {
      for (int kind = 0; kind < 5; ++kind) {
        std::vector<std::uint32_t> v(n);
        for (std::uint32_t& s : v) {
          const std::uint32_t r = static_cast<std::uint32_t>(rng()) & mask;
          s = kind == 0 ? r
            : kind == 1 ? (r % 4) << (bits - 8) | 7u
            : kind == 2 ? (0x5Au << (bits - 8)) | (r >> 8)
            : kind == 3 ? (0xA5C3u << (bits - 16)) | (r & ((1u << (bits - 16)) - 1u))
            : 12345u;
        }
        std::vector<std::uint32_t> sorted = v;
        std::sort(sorted.begin(), sorted.end(), std::greater<>());
        for (std::size_t rank = 1; rank <= n; rank += rank < 40 ? 1 : n / 7 + 1) {
          std::vector<std::uint32_t> work = v;
          EXPECT_EQ(rank_th_best(work.data(), n, rank, bits, sorted.back(), sorted.front()),
                    sorted[rank - 1])
              << "bits " << bits << " n " << n << " kind " << kind << " rank " << rank;
        }
      }
    }
  }
}

TEST(TopkSample, CpuRowFlooredBounds) {
  EXPECT_FALSE(cpu_row_floored(64, 4095));   // too short
  EXPECT_TRUE(cpu_row_floored(32, 4096));
  EXPECT_FALSE(cpu_row_floored(31, 8192));   // a small k on a short row
  EXPECT_TRUE(cpu_row_floored(1, 16384));    // any k on a long row...
  EXPECT_TRUE(cpu_row_floored(4096, 16384));
  EXPECT_FALSE(cpu_row_floored(4097, 16384));  // ...up to a quarter of it
  EXPECT_FALSE(cpu_row_floored(1025, 4096));
}

TEST(TopkSample, FilterSampleOnePerStretchInsideTheRange) {
  for (std::int64_t vectors :
       {kFilterSampleMinVectors, kFilterSampleMinVectors + 1, kFilterSampleMinVectors + 255,
        std::int64_t{4500}, std::int64_t{9000}, std::int64_t{131072} / 8 + 3, std::int64_t{1} << 21,
        (std::int64_t{1} << 28) - 1}) {
    const std::int64_t stretch = vectors / kFilterSampleThreads;
    for (int t = 0; t < kFilterSampleThreads; ++t) {
      const std::int64_t v = filter_sample_vector(t, vectors);
      ASSERT_GE(v, t * stretch) << "vectors=" << vectors << " t=" << t;
      ASSERT_LT(v, (t + 1) * stretch) << "vectors=" << vectors << " t=" << t;
      ASSERT_LT(v, vectors);
    }
  }
}

TEST(TopkSample, FilterSampledNamesExactlyTheSampledVectors) {
  for (int per_thread : {1, 2, 4, 8}) {
    for (std::int64_t vectors : {kFilterSampleMinVectors, std::int64_t{4500}, std::int64_t{9000},
                                 std::int64_t{65536} + 17, std::int64_t{37500}}) {
      const std::int64_t samples = std::int64_t{kFilterSampleThreads} * per_thread;
      if (vectors < samples) continue;
      std::set<std::int64_t> sampled;
      for (std::int64_t s = 0; s < samples; ++s) {
        sampled.insert(filter_sample_vector(s, vectors, per_thread));
      }
      EXPECT_EQ(sampled.size(), static_cast<std::size_t>(samples));
      for (std::int64_t v = 0; v < vectors; ++v) {
        ASSERT_EQ(filter_sampled_vector(v, vectors, per_thread), sampled.count(v) == 1)
            << "vectors=" << vectors << " v=" << v << " per_thread=" << per_thread;
      }
    }
  }
}

// Whether a row takes a floor (the host's slice count depends on it): the floor's rank,
// e + 5 sqrt(e) + 5 with e = k * samples / len, must stay within a quarter of the sample,
// and the row must hold kFilterSampleMinVectors aligned vectors.
TEST(TopkSample, FilterRowFlooredFollowsTheFloorsRank) {
  // bf16, 1M columns, k = 512: 8 vectors a thread, 16384 keys, e = 8, rank 27.
  EXPECT_EQ(filter_floor_rank(512, 16384, 1 << 20), 27u);
  EXPECT_TRUE(filter_row_floored(512, 1 << 20, 8));
  // bf16, 16384 columns, k = 4096: one vector a thread, e = 512, rank 630 > 512.
  EXPECT_EQ(filter_floor_rank(4096, 2048, 16384), 630u);
  EXPECT_FALSE(filter_row_floored(4096, 16384, 8));
  // fp32, 8192 columns (the fewest vectors sampled), k = 50: e = 6.25, rank 23 <= 256.
  EXPECT_EQ(filter_floor_rank(50, 1024, 8192), 23u);
  EXPECT_TRUE(filter_row_floored(50, 8192, 4));
  EXPECT_FALSE(filter_row_floored(50, 8188, 4));  // 2047 vectors
}

// Several vectors a sampling thread: sample s of S = 256 * per_thread lies in the s-th of S
// equal stretches, so all are distinct and inside the range.
TEST(TopkSample, FilterSeveralVectorsAThreadOnePerStretch) {
  for (int per_thread : {2, 4, 8}) {
    for (std::int64_t vectors : {2 * kFilterSampleMinVectors * per_thread, std::int64_t{32320},
                                 std::int64_t{131072} + 5, std::int64_t{1} << 24}) {
      const std::int64_t samples = std::int64_t{kFilterSampleThreads} * per_thread;
      if (vectors < samples) continue;
      const std::int64_t stretch = vectors / samples;
      for (std::int64_t s = 0; s < samples; ++s) {
        const std::int64_t v = filter_sample_vector(s, vectors, per_thread);
        ASSERT_GE(v, s * stretch) << "vectors=" << vectors << " s=" << s;
        ASSERT_LT(v, (s + 1) * stretch) << "vectors=" << vectors << " s=" << s;
        ASSERT_LT(v, vectors);
      }
    }
  }
}

// The kernel's 32-bit form names the same vectors (ranges below 2^31 elements).
TEST(TopkSample, FilterSampleVector32MatchesTheWideForm) {
  for (int per_thread : {1, 2, 4, 8}) {
    for (std::int64_t vectors : {std::int64_t{4500}, std::int64_t{131072} + 5,
                                 std::int64_t{1} << 24, (std::int64_t{1} << 31) / 4 - 1}) {
      const std::int64_t samples = std::int64_t{kFilterSampleThreads} * per_thread;
      for (std::int64_t s = 0; s < samples; ++s) {
        ASSERT_EQ(filter_sample_vector32(static_cast<std::uint32_t>(s),
                                         static_cast<std::uint32_t>(vectors), per_thread),
                  filter_sample_vector(s, vectors, per_thread))
            << "vectors=" << vectors << " s=" << s << " per_thread=" << per_thread;
      }
    }
  }
}

// More vectors a thread only where few of the best k would land in one a thread (fewer than
// 16 expected), the range is long enough (a stretch of 16 vectors a sample or more) and the
// keys fit; never more than the maximum (two for fp32).
TEST(TopkSample, FilterSamplesPerThreadFollowsTheExpectedCount) {
  const std::int64_t slots = 1 << 20;
  // bf16 (8 a vector): 1M columns, k = 512: e = 1 with one vector a thread.
  EXPECT_EQ(filter_samples_per_thread(512, 1 << 20, (1 << 20) / 8, 8, slots), 8);
  EXPECT_EQ(filter_samples_per_thread(512, 1 << 20, (1 << 20) / 8, 8, 9216), 4);  // keys
  // 128K columns: e = 8 -> two vectors; k = 2048: e = 32 -> one.
  EXPECT_EQ(filter_samples_per_thread(512, 131072, 16384, 8, slots), 2);
  EXPECT_EQ(filter_samples_per_thread(2048, 131072, 16384, 8, slots), 1);
  // fp32 (4 a vector), 129280 columns: at most two a thread (four radix passes a sample).
  EXPECT_EQ(filter_samples_per_thread(50, 129280, 32320, 4, slots), 2);
  // Short ranges read one vector a thread whatever k.
  EXPECT_EQ(filter_samples_per_thread(1, 36000, 4500, 8, slots), 1);
  EXPECT_EQ(filter_samples_per_thread(1, 32000, 8000, 4, slots), 1);
  for (std::int64_t k : {1, 7, 64, 512, 4096}) {
    for (std::int64_t vectors :
         {kFilterSampleMinVectors, std::int64_t{1} << 17, std::int64_t{1} << 25}) {
      for (int vec : {4, 8}) {
        const int m = filter_samples_per_thread(k, vectors * vec, vectors, vec, slots);
        EXPECT_GE(m, 1);
        EXPECT_LE(m, vec == 4 ? 2 : kFilterSampleMaxPerThread);
        if (m > 1) {
          EXPECT_GE(vectors / (std::int64_t{kFilterSampleThreads} * m), 16) << "k=" << k;
          EXPECT_LT(k * kFilterSampleThreads * vec * (m / 2), 16 * vectors * vec) << "k=" << k;
        }
      }
    }
  }
}

TEST(TopkSample, FilterRangesBelowTheMinimumAreNotSampled) {
  const std::int64_t vectors = kFilterSampleMinVectors - 1;
  for (std::int64_t v = 0; v < vectors; ++v) ASSERT_FALSE(filter_sampled_vector(v, vectors));
}

TEST(TopkSample, ShortSampleCountPerCta) {
  // A lone CTA samples with every thread, clusters of 2 with every 2nd, larger with every 4th:
  // 256 samples a CTA, 128 or 64 in clusters; 128 a 512-thread CTA of 16384 columns (rows
  // beyond 16 x 8192), again 64 per 8192 columns.
  // The same holds for the 512-thread layout of rows of 64K-128K columns (`wide`).
  for (bool wide : {false, true}) {
    for (std::int64_t n : {std::int64_t{8192}, std::int64_t{16384}, std::int64_t{20003},
                           std::int64_t{65543}, std::int64_t{131072}, std::int64_t{151936},
                           std::int64_t{262144}}) {
      std::int64_t count = 0;
      for (std::int64_t c = 0; c < n; ++c) count += short_sampled_in(c, n, wide) ? 1 : 0;
      const std::int64_t ctas = (n + kShortMaxLen - 1) / kShortMaxLen;
      EXPECT_GT(count, 0) << "n=" << n << " wide=" << wide;
      EXPECT_LE(count, 256 * ctas) << "n=" << n << " wide=" << wide;
      EXPECT_GE(count, 256 / 4 * (n / kShortMaxLen)) << "n=" << n << " wide=" << wide;
    }
  }
}

TEST(TopkSample, ShortSampledFollowsTheClusterLayout) {
  // The planted columns must be the kernel's: thread 256 of a row holds columns 8192..8223 and
  // samples element (256 * 11 + rank * 5) % 32. In a row of 131072 it is thread 0 of CTA 1
  // (rank 1: element 5); beyond 16 x 8192 columns CTAs have 512 threads, so it is thread 256
  // of CTA 0 (rank 0: element 0).
  EXPECT_TRUE(short_sampled_in(8192 + 5, 131072, false));
  EXPECT_FALSE(short_sampled_in(8192, 131072, false));
  EXPECT_TRUE(short_sampled_in(8192, 151936, false));
  EXPECT_FALSE(short_sampled_in(8192 + 5, 151936, false));
  // A row of 131072 in 512-thread CTAs (8 a row): thread 256 of CTA 0, element 0. The planted
  // columns (short_sampled) cover both layouts; rows of 64K columns or fewer have only one.
  EXPECT_TRUE(short_sampled_in(8192, 131072, true));
  EXPECT_FALSE(short_sampled_in(8192 + 5, 131072, true));
  EXPECT_TRUE(short_sampled(8192, 131072));
  EXPECT_TRUE(short_sampled(8192 + 5, 131072));
  for (std::int64_t c = 0; c < 65536; ++c) {
    ASSERT_EQ(short_sampled_in(c, 65536, true), short_sampled_in(c, 65536, false)) << c;
  }
}

TEST(TopkSample, ClusterSampleNeedAndPast) {
  // e = k / (32 columns x every ctas-th thread up to 4): need = e + 3 sqrt(e) + 2, truncated;
  // the first fp32 pass reaches two digits past the sample's best where e < 0.3, else one.
  struct Case {
    std::uint32_t k;
    int ctas;
    std::uint32_t need, past;
  };
  const Case cases[] = {
      {50, 16, 4, 2},     // e = 50 / 128 = 0.390625: 0.39 + 1.875 + 2 = 4.27
      {38, 16, 3, 3},     // e = 0.296875: 0.30 + 1.63 + 2 = 3.93
      {39, 16, 3, 2},     // e = 0.3046875
      {2048, 16, 30, 2},  // e = 16: 16 + 12 + 2
      {512, 1, 30, 2},    // one CTA samples every thread: e = 512 / 32 = 16
      {512, 2, 18, 2},    // e = 8: 8 + 8.49 + 2 = 18.49
      {9, 1, 3, 3},       // e = 0.28125: 0.28 + 1.59 + 2 = 3.87
      {10, 1, 3, 2},      // e = 0.3125: 0.31 + 1.68 + 2 = 3.99
      {1, 16, 2, 3},      // e = 1 / 128: 0.008 + 0.27 + 2 = 2.27
  };
  for (const Case& c : cases) {
    const auto sample = cluster_sample(c.k, c.ctas);
    EXPECT_EQ(sample.need, c.need) << "k=" << c.k << " ctas=" << c.ctas;
    EXPECT_EQ(sample.past, c.past) << "k=" << c.k << " ctas=" << c.ctas;
  }
}

}  // namespace
