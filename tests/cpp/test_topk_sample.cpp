// SPDX-License-Identifier: Apache-2.0
// Where the CUDA kernels sample a row (src/common/topk_sample.hpp). The filter kernel's sample
// reads vectors through filter_sample_vector, so every position must lie inside the range,
// one per stretch of vectors / 256 (spread over the whole row); the tests plant a row's best
// values through filter_sampled_vector, which must name exactly those positions. The register
// kernels' columns (short_sampled) must number 64 to 256 per 8192-column CTA.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>

#include "common/topk_sample.hpp"

namespace {

using attnkit::detail::filter_sample_vector;
using attnkit::detail::filter_sampled_vector;
using attnkit::detail::kFilterSampleMinVectors;
using attnkit::detail::kFilterSampleThreads;
using attnkit::detail::kShortMaxLen;
using attnkit::detail::short_sampled;

TEST(TopkSample, FilterSampleOnePerStretchInsideTheRange) {
  for (std::int64_t vectors : {kFilterSampleMinVectors, kFilterSampleMinVectors + 1,
                               kFilterSampleMinVectors + 255, std::int64_t{4500}, std::int64_t{9000},
                               std::int64_t{131072} / 8 + 3, std::int64_t{1} << 21,
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
  for (std::int64_t vectors : {kFilterSampleMinVectors, std::int64_t{4500}, std::int64_t{9000},
                               std::int64_t{65536} + 17}) {
    std::set<std::int64_t> sampled;
    for (int t = 0; t < kFilterSampleThreads; ++t) sampled.insert(filter_sample_vector(t, vectors));
    EXPECT_EQ(sampled.size(), static_cast<std::size_t>(kFilterSampleThreads));
    for (std::int64_t v = 0; v < vectors; ++v) {
      ASSERT_EQ(filter_sampled_vector(v, vectors), sampled.count(v) == 1)
          << "vectors=" << vectors << " v=" << v;
    }
  }
}

TEST(TopkSample, FilterRangesBelowTheMinimumAreNotSampled) {
  const std::int64_t vectors = kFilterSampleMinVectors - 1;
  for (std::int64_t v = 0; v < vectors; ++v) ASSERT_FALSE(filter_sampled_vector(v, vectors));
}

TEST(TopkSample, ShortSampleCountPerCta) {
  // A lone CTA samples with every thread, clusters of 2 with every 2nd, larger with every 4th:
  // 256 samples a CTA, 128 or 64 in clusters.
  for (std::int64_t n : {std::int64_t{8192}, std::int64_t{16384}, std::int64_t{20003},
                         std::int64_t{131072}}) {
    std::int64_t count = 0;
    for (std::int64_t c = 0; c < n; ++c) count += short_sampled(c, n) ? 1 : 0;
    const std::int64_t ctas = (n + kShortMaxLen - 1) / kShortMaxLen;
    EXPECT_GT(count, 0) << "n=" << n;
    EXPECT_LE(count, 256 * ctas) << "n=" << n;
    EXPECT_GE(count, 256 / 4 * (n / kShortMaxLen)) << "n=" << n;
  }
}

}  // namespace
