// SPDX-License-Identifier: Apache-2.0
// Behaviour of the CPU top-k: the fast path (backend auto) and the reference backend held to
// the independent float64 reference of topk_test_util.hpp, and to each other bit for bit, over
// sweeps of generated inputs, sizes, options and layouts.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "topk_test_util.hpp"

namespace {

using namespace attnkit_test;

constexpr std::int64_t kInt32Max = std::numeric_limits<std::int32_t>::max();
constexpr std::int64_t kInt32Min = std::numeric_limits<std::int32_t>::min();

/// Short rows (one of each size class: 1, 3, 2^6 - 31, 2^7 - 31 and a random size) over every
/// dtype, distribution, k, direction and order. The remaining options (nan, ties, per-row
/// tensors, index and value outputs) rotate with a counter, so each meets every combination of
/// the others across the sweep.
TEST(Topk, ShortRowsEveryOption) {
  std::mt19937_64 sizes(20240601);
  const std::int64_t random_n = 2 + static_cast<std::int64_t>(sizes() % 300);
  const std::int64_t ns[] = {1, 3, under_pow2(6), under_pow2(7), random_n};
  CaseChecker check;
  std::uint64_t seed = 1;
  for (DType dtype : kFloatDTypes) {
    for (Dist dist : kAllDists) {
      for (std::int64_t n : ns) {
        for (std::int64_t k : k_axis(n)) {
          for (bool largest : {true, false}) {
            for (TopkOrder sorted : kAllOrders) {
              const std::uint64_t v = seed;
              TopkCase c;
              c.dtype = dtype;
              c.dist = dist;
              c.seed = seed++;
              c.batch = 3;
              c.n = n;
              c.k = k;
              c.largest = largest;
              c.sorted = sorted;
              c.nan = kAllNanPolicies[v % 3];
              c.ties = kAllTiePolicies[(v / 3) % 2];
              c.ranges = static_cast<Ranges>((v / 2) % 4);
              c.begin_dtype = v % 5 < 2 ? DType::kInt32 : DType::kInt64;
              c.end_dtype = v % 7 < 3 ? DType::kInt32 : DType::kInt64;
              c.with_offset = v % 4 == 1;
              c.offset_dtype = v % 9 < 4 ? DType::kInt32 : DType::kInt64;
              c.index_dtype = v % 11 < 5 ? DType::kInt32 : DType::kInt64;
              c.return_values = v % 13 != 0;
              c.out_pad = static_cast<std::int64_t>(v % 3);
              check(c);
            }
          }
        }
      }
    }
  }
}

/// Rows of 511-513 columns, whose last select (one, over the whole row: k + max(2k, 32)
/// exceeds N) runs on either side of the size where the CPU backend stops using its 12-bit
/// histogram and selects among the (score, column) keys directly.
TEST(Topk, RowsAroundTheDirectSelectSize) {
  CaseChecker check;
  std::uint64_t v = 0;
  for (DType dtype : kFloatDTypes) {
    for (Dist dist : kAllDists) {
      for (std::int64_t n : {511, 512, 513}) {
        for (std::int64_t k : {1, 192, 510}) {
          TopkCase c;
          c.dtype = dtype;
          c.dist = dist;
          c.seed = 5000 + v;
          c.batch = 2;
          c.n = n;
          c.k = k;
          c.largest = v % 2 == 0;
          c.sorted = kAllOrders[v % 3];
          c.nan = kAllNanPolicies[(v / 2) % 3];
          ++v;
          check(c);
        }
      }
    }
  }
}

/// Rows long enough for the fast path's sampled starting threshold (cpu_row_floored: rows of
/// >= 2^14 with k <= N / 4, or >= 2^12 with 32 <= k <= N / 4), several reconstructs
/// (k + max(2k, 32) candidates each) and, where there are fewer rows than threads, rows cut
/// into segments.
TEST(Topk, LongRowsSampledThresholdAndReconstructs) {
  const std::int64_t ns[] = {16384, under_pow2(15), under_pow2(16), 131072, 200000};
  const std::int64_t ks[] = {1, 64, 1000, 2048, 4096};
  CaseChecker check;
  std::uint64_t v = 0;
  for (DType dtype : kFloatDTypes) {
    for (Dist dist : kAllDists) {
      for (bool largest : {true, false}) {
        TopkCase c;
        c.dtype = dtype;
        c.dist = dist;
        c.seed = 1000 + v;
        c.n = ns[v % 5];
        c.k = ks[(v / 5 + v) % 5];
        c.batch = v % 4 == 3 ? 3 : 1;
        c.largest = largest;
        c.sorted = kAllOrders[v % 3];
        c.nan = v % 7 == 2 ? NanPolicy::kRaise : v % 2 ? NanPolicy::kIgnore : NanPolicy::kLargest;
        c.ties = v % 5 == 4 ? TiePolicy::kAny : TiePolicy::kLowestIndex;
        c.ranges = v % 3 == 1 ? Ranges::kBoth : Ranges::kNone;
        c.index_dtype = v % 2 ? DType::kInt32 : DType::kInt64;
        c.return_values = v % 6 != 5;
        c.x_offset = v % 8 == 1 ? 3 : 0;
        ++v;
        check(c);
      }
    }
  }
}

/// Rows of 4K-16K columns, floored from k = 32 up to a quarter of the row, over every
/// distribution (ties at the floor, mostly NaN or +-inf, ascending rows...), and k = 1 on ranges
/// either side of the 4096 columns up to which it takes its two passes (select_best).
TEST(Topk, MidRowsEveryDistribution) {
  CaseChecker check;
  std::uint64_t v = 0;
  for (DType dtype : kFloatDTypes) {
    for (Dist dist : kAllDists) {
      for (std::int64_t n : {4096, 4097, 8192, 12000}) {
        for (std::int64_t k : {std::int64_t{1}, std::int64_t{31}, std::int64_t{32}, n / 4,
                               n / 4 + 1}) {
          TopkCase c;
          c.dtype = dtype;
          c.dist = dist;
          c.seed = 7000 + v;
          c.n = n;
          c.k = k;
          c.batch = 2;
          c.largest = v % 2 == 0;
          c.sorted = kAllOrders[(v / 2) % 3];
          c.nan = kAllNanPolicies[(v / 3) % 3];
          c.ranges = static_cast<Ranges>((v / 5) % 4);
          ++v;
          check(c);
        }
      }
    }
  }
}

/// Periodic spikes every 64 columns fill an evenly spaced sample of a 2^17 row, so the sampled
/// floor admits fewer than k elements and the fast path must scan again from the bottom.
TEST(Topk, MisleadingSampleFallsBackToFullScan) {
  CaseChecker check;
  std::uint64_t seed = 5000;
  for (DType dtype : kFloatDTypes) {
    for (bool largest : {true, false}) {
      for (std::int64_t k : {256, 1024, 4096}) {
        TopkCase c;
        c.dtype = dtype;
        c.dist = Dist::kPeriodicSpikes;
        c.seed = seed++;
        c.n = 131072;
        c.k = k;
        c.largest = largest;
        c.sorted = TopkOrder::kValue;
        check(c);
      }
    }
  }
}

/// Rows of 4K-16K columns take a sampled floor from k = 64 (cpu_row_floored). Spikes at exactly
/// the sampled columns make the floor admit fewer than k elements, so the row must be scanned
/// again from the bottom; rows of 16K and more, and a k below 64, take the same checks.
TEST(Topk, MisleadingSampleOnShortRowsFallsBackToFullScan) {
  CaseChecker check;
  std::uint64_t seed = 6000;
  for (DType dtype : kFloatDTypes) {
    for (bool largest : {true, false}) {
      for (std::int64_t n : {4096, 8192, 12000, 16384}) {
        for (std::int64_t k : {32, 64, 300, 1024}) {
          TopkCase c;
          c.dtype = dtype;
          c.dist = Dist::kCpuSampleBait;
          c.seed = seed++;
          c.n = n;
          c.k = k;
          c.batch = 2;
          c.largest = largest;
          c.sorted = seed % 2 ? TopkOrder::kValue : TopkOrder::kNone;
          check(c);
        }
      }
    }
  }
}

/// Batches of 1, 3 and 1000 rows over every x layout (contiguous, padded, broadcast, negative
/// row stride) and unaligned base (0, 1, 3, 7 elements), with ragged begin/end, index_offset
/// and output row strides larger than k rotating through their variants.
TEST(Topk, BatchesLayoutsAndRowTensors) {
  CaseChecker check;
  std::uint64_t v = 0;
  for (std::int64_t batch : {1, 3, 1000}) {
    const std::vector<std::int64_t> ns =
        batch == 1000
            ? std::vector<std::int64_t>{1, 3, under_pow2(6), under_pow2(7)}
            : std::vector<std::int64_t>{1, 3, under_pow2(7), under_pow2(10), under_pow2(12)};
    for (std::int64_t n : ns) {
      for (XLayout layout :
           {XLayout::kContiguous, XLayout::kPadded, XLayout::kBroadcast, XLayout::kNegative}) {
        for (std::int64_t x_offset : {0, 1, 3, 7}) {
          const std::vector<std::int64_t> ks = k_axis(n);
          TopkCase c;
          c.dtype = kFloatDTypes[v % 3];
          c.dist = kAllDists[v % kNumDists];
          c.seed = 20000 + v;
          c.batch = batch;
          c.n = n;
          c.k = ks[v % ks.size()];
          c.layout = layout;
          c.row_pad = 1 + static_cast<std::int64_t>(v % 9);
          c.x_offset = x_offset;
          c.largest = v % 2 == 0;
          c.sorted = kAllOrders[(v / 2) % 3];
          c.nan = kAllNanPolicies[(v / 3) % 3];
          c.ties = kAllTiePolicies[(v / 7) % 2];
          c.ranges = static_cast<Ranges>((v / 5) % 4);
          c.begin_dtype = (v / 3) % 2 ? DType::kInt32 : DType::kInt64;
          c.end_dtype = (v / 4) % 2 ? DType::kInt32 : DType::kInt64;
          c.range_stride = 1 + static_cast<std::int64_t>((v / 6) % 2);
          c.with_offset = v % 3 != 0;
          c.offset_dtype = (v / 8) % 2 ? DType::kInt32 : DType::kInt64;
          c.index_dtype = (v / 10) % 2 ? DType::kInt32 : DType::kInt64;
          c.return_values = v % 5 != 4;
          c.out_pad = static_cast<std::int64_t>((v % 4) * 3);
          ++v;
          check(c);
        }
      }
    }
  }
}

/// x of rank 1 ([N], outputs [k]) over sizes 0 to past the sampled-threshold size.
TEST(Topk, OneDimensionalX) {
  CaseChecker check;
  std::uint64_t v = 0;
  for (DType dtype : kFloatDTypes) {
    for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{3}, under_pow2(6),
                           under_pow2(12), std::int64_t{20000}}) {
      for (std::int64_t k : k_axis(n)) {
        TopkCase c;
        c.dtype = dtype;
        c.dist = kAllDists[v % kNumDists];
        c.seed = 30000 + v;
        c.one_dim = true;
        c.n = n;
        c.k = k;
        c.largest = v % 2 == 0;
        c.sorted = kAllOrders[v % 3];
        c.nan = kAllNanPolicies[(v / 2) % 3];
        c.ranges = static_cast<Ranges>(v % 4);
        c.with_offset = v % 3 == 2;
        c.index_dtype = v % 5 < 2 ? DType::kInt32 : DType::kInt64;
        ++v;
        check(c);
      }
    }
  }
}

/// Rows shorter than k and empty rows (N = 0, or begin == end on every row): the valid
/// elements come first, padding fills the rest.
TEST(Topk, RowsShorterThanKAndEmptyRows) {
  CaseChecker check;
  std::uint64_t v = 0;
  for (DType dtype : kFloatDTypes) {
    for (std::int64_t n : {0, 1, 3, 17}) {
      for (std::int64_t k : {1, 4, 40}) {
        for (bool all_empty : {false, true}) {
          TopkCase c;
          c.dtype = dtype;
          c.dist = kAllDists[v % kNumDists];
          c.seed = 40000 + v;
          c.batch = 3;
          c.n = n;
          c.k = k;
          c.largest = v % 2 == 0;
          c.sorted = kAllOrders[v % 3];
          c.ranges = Ranges::kBoth;
          if (all_empty) {
            std::mt19937_64 rng(c.seed);
            for (int b = 0; b < 3; ++b) {
              const auto at = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(n + 1));
              c.begin_values.push_back(at);
              c.end_values.push_back(at);
            }
          }
          c.with_offset = v % 2 == 1;
          c.out_pad = 2;
          ++v;
          check(c);
        }
      }
    }
  }
}

/// B = 0: nothing to select and nothing to write.
TEST(Topk, EmptyBatch) {
  CaseChecker check;
  std::uint64_t seed = 50000;
  for (DType dtype : kFloatDTypes) {
    for (std::int64_t n : {0, 5}) {
      for (std::int64_t k : {0, 3}) {
        TopkCase c;
        c.dtype = dtype;
        c.seed = seed++;
        c.batch = 0;
        c.n = n;
        c.k = k;
        c.ranges = Ranges::kBoth;
        c.with_offset = true;
        check(c);
      }
    }
  }
}

/// index_fill and value_fill reach every padding slot, in every dtype, signed zero included.
TEST(Topk, PaddingFills) {
  const std::int64_t index_fills[] = {-1, 0, kInt32Min, kInt32Max, -(std::int64_t{1} << 40)};
  const double value_fills[] = {0.0, -0.0, 1.5, -3.0, 0.25, INFINITY, -INFINITY};
  CaseChecker check;
  std::uint64_t v = 0;
  for (DType dtype : kFloatDTypes) {
    for (std::int64_t index_fill : index_fills) {
      for (double value_fill : value_fills) {
        TopkCase c;
        c.dtype = dtype;
        c.dist = kAllDists[v % kNumDists];
        c.seed = 60000 + v;
        c.batch = 3;
        c.n = 7;
        c.k = 12;
        c.largest = v % 2 == 0;
        c.sorted = kAllOrders[v % 3];
        c.nan = v % 4 == 1 ? NanPolicy::kIgnore : NanPolicy::kLargest;
        c.ranges = Ranges::kBoth;
        c.index_fill = index_fill;
        // index_fill = -2^40 fits int64 indices only.
        c.index_dtype = index_fill < kInt32Min || v % 2 ? DType::kInt64 : DType::kInt32;
        c.value_fill = value_fill;
        ++v;
        check(c);
      }
    }
  }
}

/// index_offset at the edges of the index dtype: the largest index lands on INT32_MAX and the
/// smallest on INT32_MIN (random_offset picks the edges often), int32 and int64 offsets.
TEST(Topk, IndexOffsetEdges) {
  CaseChecker check;
  std::uint64_t v = 0;
  for (DType index_dtype : {DType::kInt32, DType::kInt64}) {
    for (DType offset_dtype : {DType::kInt32, DType::kInt64}) {
      for (int rep = 0; rep < 12; ++rep) {
        TopkCase c;
        c.dtype = kFloatDTypes[v % 3];
        c.dist = Dist::kNormal;
        c.seed = 70000 + v;
        c.batch = 16;
        c.n = 50;
        c.k = 1 + static_cast<std::int64_t>(v % 60);
        c.sorted = kAllOrders[v % 3];
        c.ranges = static_cast<Ranges>(v % 4);
        c.with_offset = true;
        c.index_dtype = index_dtype;
        c.offset_dtype = offset_dtype;
        ++v;
        check(c);
      }
    }
  }
}

/// check = off skips the per-row rules and clamps: end into [0, N], begin into [0, end].
/// check = on behaves as the CPU default and refuses the same values.
TEST(Topk, UncheckedRowValuesAreClamped) {
  const std::vector<std::vector<std::int64_t>> begins = {{-5, 3, 12}, {0, 9, -1}, {4, 4, 20}};
  const std::vector<std::vector<std::int64_t>> ends = {{4, 2, 30}, {-3, 11, 10}, {100, 0, 5}};
  CaseChecker check;
  std::uint64_t seed = 80000;
  for (DType dtype : kFloatDTypes) {
    for (std::size_t i = 0; i < begins.size(); ++i) {
      for (CheckMode mode : {CheckMode::kOff, CheckMode::kOn, CheckMode::kDefault}) {
        TopkCase c;
        c.dtype = dtype;
        c.dist = Dist::kNormal;
        c.seed = seed++;
        c.batch = 3;
        c.n = 10;
        c.k = 4;
        c.sorted = TopkOrder::kValue;
        c.ranges = Ranges::kBoth;
        c.begin_values = begins[i];
        c.end_values = ends[i];
        c.check = mode;
        check(c);
      }
    }
  }
}

}  // namespace
