// SPDX-License-Identifier: Apache-2.0
// Floating-point specials in the CPU top-k: the three NaN policies, +-inf as ordinary values,
// -0.0 == +0.0 (ties by index; the returned value keeps its sign bit), denormals compared as
// numbers (never flushed), and NaN payloads returned bit for bit. Each test runs generated
// inputs through the reference comparison and then asserts the property it is about directly
// on the output, so a failure names the property rather than only a mismatching slot.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <vector>

#include "topk_test_util.hpp"

namespace {

using namespace attnkit_test;

/// Short rows and rows long enough for the vectorised filter and the sampled threshold.
const std::int64_t kSizes[] = {1, 3, under_pow2(7), under_pow2(11), 20000, 70000};

std::vector<std::int64_t> ks_for(std::int64_t n) {
  std::vector<std::int64_t> ks = {1, std::max<std::int64_t>(n / 20, 2), n + 3};
  return ks;
}

/// The selected (index, value bits) pairs of row b, padding excluded; indices are columns
/// (cases here carry no index_offset).
struct Selection {
  std::vector<std::int64_t> cols;
  std::vector<std::uint32_t> bits;
};

Selection selection(const TopkCase& c, const TopkOutputs& out, std::int64_t b) {
  Selection s;
  for (std::int64_t j = 0; j < c.k; ++j) {
    const std::int64_t i = kGuard + b * out.stride + j;
    const std::int64_t col = out.indices.get_int(i);
    if (col == c.index_fill) break;  // padding, always last
    s.cols.push_back(col);
    s.bits.push_back(static_cast<std::uint32_t>(out.values.get(i)));
  }
  return s;
}

/// Runs the case through the full reference comparison, then hands the fast path's outputs to
/// `property` for the direct check.
template <class Property>
void check_with_property(CaseChecker& check, const TopkCase& c, Property&& property) {
  check(c);
  SCOPED_TRACE(c.describe());
  TopkInputs in = make_inputs(c);
  TopkOutputs out = make_outputs(c);
  const CallResult r = call_topk(c, in, out, TopkBackend::kAuto);
  if (r.threw) return;  // the reference comparison has judged the error already
  property(in, out);
}

/// The cases of one property sweep: every dtype, each of `dists`, every size of kSizes, every
/// k of ks_for, both directions and each of `orders`; batch 2, seeds counting up from `seed`.
/// `sizes` replaces kSizes when given.
std::vector<TopkCase> sweep_cases(std::uint64_t seed, std::initializer_list<Dist> dists,
                                  std::initializer_list<TopkOrder> orders = {TopkOrder::kValue},
                                  std::initializer_list<std::int64_t> sizes = {}) {
  std::vector<TopkCase> cases;
  const std::vector<std::int64_t> ns =
      sizes.size() > 0 ? std::vector<std::int64_t>(sizes)
                       : std::vector<std::int64_t>(std::begin(kSizes), std::end(kSizes));
  for (DType dtype : kFloatDTypes) {
    for (Dist dist : dists) {
      for (std::int64_t n : ns) {
        for (std::int64_t k : ks_for(n)) {
          for (bool largest : {true, false}) {
            for (TopkOrder sorted : orders) {
              TopkCase c;
              c.dtype = dtype;
              c.dist = dist;
              c.seed = seed++;
              c.batch = 2;
              c.n = n;
              c.k = k;
              c.largest = largest;
              c.sorted = sorted;
              cases.push_back(c);
            }
          }
        }
      }
    }
  }
  return cases;
}

/// Rows of almost only -inf, long enough for the sampled floor (cpu_row_floored), so that it is
/// -inf itself and the filter starts one score below it. Every number must still reach the
/// exact test: with largest=true the k best are the few normals and NaNs, never -inf padding.
/// Lengths that are not multiples of the 64-element block leave a tail that could supply k
/// candidates on its own and hide skipped blocks.
TEST(TopkFpSpecials, MostlyNegativeInfinity) {
  CaseChecker check;
  for (const TopkCase& base : sweep_cases(900, {Dist::kMostlyNegInf}, {TopkOrder::kValue},
                                          {16384, 16447, 20000, 100000})) {
    for (NanPolicy nan : {NanPolicy::kLargest, NanPolicy::kIgnore}) {
      for (std::int64_t k : {base.k, std::int64_t{7}, std::int64_t{50}}) {
        TopkCase c = base;
        c.nan = nan;
        c.k = k;
        check(c);
      }
    }
  }
}

TEST(TopkFpSpecials, NanLargestRanksAboveInfinity) {
  CaseChecker check;
  for (TopkCase c : sweep_cases(1, {Dist::kWithNan, Dist::kMostlyNan, Dist::kRawBits})) {
    c.nan = NanPolicy::kLargest;
    check_with_property(check, c, [&](const TopkInputs& in, const TopkOutputs& out) {
      for (std::int64_t b = 0; b < c.batch; ++b) {
        std::int64_t nans = 0;
        for (std::int64_t col = 0; col < c.n; ++col) nans += is_nan(c.dtype, in.bits(b, col));
        const Selection s = selection(c, out, b);
        ASSERT_EQ(static_cast<std::int64_t>(s.cols.size()), std::min(c.k, c.n)) << "row " << b;
        // Largest: the NaNs come first. Smallest: NaN is the last choice, after +inf.
        const std::int64_t want =
            c.largest ? std::min(c.k, nans)
                    : std::max<std::int64_t>(0, std::min(c.k, c.n) - (c.n - nans));
        std::int64_t got = 0;
        for (std::uint32_t bits : s.bits) got += is_nan(c.dtype, bits);
        EXPECT_EQ(got, want) << "row " << b << ": NaNs selected";
        const std::size_t first_nan =
            c.largest ? 0 : static_cast<std::size_t>(std::min(c.k, c.n) - want);
        for (std::size_t j = first_nan; j < first_nan + static_cast<std::size_t>(want);
             ++j) {
          EXPECT_TRUE(is_nan(c.dtype, s.bits[j])) << "row " << b << " slot " << j;
        }
      }
    });
  }
}

TEST(TopkFpSpecials, NanIgnoreNeverSelectsNan) {
  CaseChecker check;
  for (TopkCase c : sweep_cases(1000, {Dist::kWithNan, Dist::kMostlyNan, Dist::kRawBits})) {
    c.sorted = kAllOrders[(c.seed + 1) % 3];
    c.nan = NanPolicy::kIgnore;
    check_with_property(check, c, [&](const TopkInputs& in, const TopkOutputs& out) {
      for (std::int64_t b = 0; b < c.batch; ++b) {
        std::int64_t numbers = 0;
        for (std::int64_t col = 0; col < c.n; ++col)
          numbers += !is_nan(c.dtype, in.bits(b, col));
        const Selection s = selection(c, out, b);
        // The row pads instead of taking a NaN.
        EXPECT_EQ(static_cast<std::int64_t>(s.cols.size()), std::min(c.k, numbers))
            << "row " << b;
        for (std::size_t j = 0; j < s.bits.size(); ++j) {
          EXPECT_FALSE(is_nan(c.dtype, s.bits[j])) << "row " << b << " slot " << j;
        }
      }
    });
  }
}

/// Rows of NaNs only: with nan="ignore" nothing is selectable and every slot is padding (k = 1
/// included, whose short rows take a path of their own); with nan="largest" the NaNs are
/// ordinary elements, all tied, and the lowest columns win.
TEST(TopkFpSpecials, RowsOfOnlyNan) {
  CaseChecker check;
  for (TopkCase c : sweep_cases(1100, {Dist::kAllNan})) {
    for (NanPolicy nan : {NanPolicy::kIgnore, NanPolicy::kLargest}) {
      c.nan = nan;
      check_with_property(check, c, [&](const TopkInputs&, const TopkOutputs& out) {
        for (std::int64_t b = 0; b < c.batch; ++b) {
          const Selection s = selection(c, out, b);
          const std::int64_t want = nan == NanPolicy::kIgnore ? 0 : std::min(c.k, c.n);
          ASSERT_EQ(static_cast<std::int64_t>(s.cols.size()), want) << "row " << b;
          for (std::int64_t j = 0; j < want; ++j) EXPECT_EQ(s.cols[j], j) << "row " << b;
        }
      });
    }
  }
}

TEST(TopkFpSpecials, NanRaise) {
  CaseChecker check;
  std::uint64_t seed = 2000;
  int raised = 0, passed = 0;
  for (DType dtype : kFloatDTypes) {
    for (Dist dist : {Dist::kWithNan, Dist::kMostlyNan, Dist::kNormal, Dist::kWithInf}) {
      for (std::int64_t n :
           {std::int64_t{1}, std::int64_t{3}, under_pow2(7), std::int64_t{20000}}) {
        for (Ranges ranges : {Ranges::kNone, Ranges::kBoth}) {
          TopkCase c;
          c.dtype = dtype;
          c.dist = dist;
          c.seed = seed++;
          c.batch = 3;
          c.n = n;
          c.k = std::max<std::int64_t>(1, n / 4);
          c.ranges = ranges;
          c.nan = NanPolicy::kRaise;
          check(c);
          TopkInputs in = make_inputs(c);
          (reference_topk(c, in).error ? raised : passed) += 1;
        }
      }
    }
  }
  // Both outcomes must have been exercised, or the sweep proves half of the rule.
  EXPECT_GT(raised, 5);
  EXPECT_GT(passed, 5);
}

TEST(TopkFpSpecials, InfinitiesAreOrdinaryValues) {
  CaseChecker check;
  for (TopkCase c : sweep_cases(3000, {Dist::kWithInf})) {
    check_with_property(check, c, [&](const TopkInputs& in, const TopkOutputs& out) {
      const std::uint32_t best = inf_bits(c.dtype, !c.largest);
      for (std::int64_t b = 0; b < c.batch; ++b) {
        std::int64_t infs = 0;
        for (std::int64_t col = 0; col < c.n; ++col) infs += in.bits(b, col) == best;
        const Selection s = selection(c, out, b);
        // The infinity on the preferred side fills the first slots, lowest column first.
        const std::int64_t lead = std::min(c.k, infs);
        for (std::int64_t j = 0; j < lead; ++j) {
          const auto ji = static_cast<std::size_t>(j);
          EXPECT_EQ(s.bits[ji], best) << "row " << b << " slot " << j;
          if (j > 0) {
            EXPECT_LT(s.cols[ji - 1], s.cols[ji]) << "row " << b << " slot " << j;
          }
        }
      }
    });
  }
}

TEST(TopkFpSpecials, SignedZerosAreEqualAndKeepTheirSign) {
  CaseChecker check;
  const auto all_orders = {TopkOrder::kNone, TopkOrder::kIndex, TopkOrder::kValue};
  for (TopkCase c : sweep_cases(4000, {Dist::kSignedZeros}, all_orders)) {
    check_with_property(check, c, [&](const TopkInputs& in, const TopkOutputs& out) {
      for (std::int64_t b = 0; b < c.batch; ++b) {
        const Selection s = selection(c, out, b);
        std::vector<std::int64_t> zero_cols;
        for (std::size_t j = 0; j < s.cols.size(); ++j) {
          // The value is the element's own bits: a -0.0 stays -0.0, a +0.0 stays +0.0.
          EXPECT_EQ(s.bits[j], in.bits(b, s.cols[j])) << "row " << b << " slot " << j;
          if (decode(c.dtype, s.bits[j]) == 0.0) zero_cols.push_back(s.cols[j]);
        }
        // Zeros of either sign tie: the selected ones are the lowest columns holding a
        // zero, and by value order they come out in column order.
        std::vector<std::int64_t> all_zero_cols;
        for (std::int64_t col = 0; col < c.n; ++col) {
          if (decode(c.dtype, in.bits(b, col)) == 0.0) all_zero_cols.push_back(col);
        }
        all_zero_cols.resize(std::min(all_zero_cols.size(), zero_cols.size()));
        std::vector<std::int64_t> sorted_zero_cols = zero_cols;
        std::sort(sorted_zero_cols.begin(), sorted_zero_cols.end());
        EXPECT_EQ(sorted_zero_cols, all_zero_cols) << "row " << b;
        if (c.sorted != TopkOrder::kNone) {
          EXPECT_EQ(zero_cols, sorted_zero_cols) << "row " << b;
        }
      }
    });
  }
}

TEST(TopkFpSpecials, DenormalsAreComparedNotFlushed) {
  CaseChecker check;
  for (TopkCase c : sweep_cases(5000, {Dist::kDenormals})) {
    check_with_property(check, c, [&](const TopkInputs& in, const TopkOutputs& out) {
      for (std::int64_t b = 0; b < c.batch; ++b) {
        // The first slot holds the row's extreme as a real number: a flushed subnormal
        // would tie with zero and lose to the lowest column instead.
        double extreme = decode(c.dtype, in.bits(b, 0));
        for (std::int64_t col = 1; col < c.n; ++col) {
          const double v = decode(c.dtype, in.bits(b, col));
          extreme = c.largest ? std::max(extreme, v) : std::min(extreme, v);
        }
        const Selection s = selection(c, out, b);
        ASSERT_FALSE(s.bits.empty()) << "row " << b;
        EXPECT_EQ(decode(c.dtype, s.bits[0]), extreme) << "row " << b;
        // The rest follow in value order.
        for (std::size_t j = 1; j < s.bits.size(); ++j) {
          const double prev = decode(c.dtype, s.bits[j - 1]), cur = decode(c.dtype, s.bits[j]);
          EXPECT_TRUE(c.largest ? prev >= cur : prev <= cur) << "row " << b << " slot " << j;
        }
      }
    });
  }
}

TEST(TopkFpSpecials, NanPayloadsReturnedBitExact) {
  CaseChecker check;
  std::uint64_t seed = 6000;
  for (DType dtype : kFloatDTypes) {
    for (std::int64_t n : {std::int64_t{3}, under_pow2(7), under_pow2(11), std::int64_t{20000}}) {
      for (TopkOrder sorted : kAllOrders) {
        for (bool largest : {true, false}) {
          TopkCase c;
          c.dtype = dtype;
          c.dist = Dist::kWithNan;
          c.seed = seed++;
          c.batch = 2;
          c.n = n;
          c.k = n;
          c.largest = largest;
          c.sorted = sorted;
          check_with_property(check, c, [&](const TopkInputs& in, const TopkOutputs& out) {
            for (std::int64_t b = 0; b < c.batch; ++b) {
              std::vector<std::uint32_t> row;
              for (std::int64_t col = 0; col < n; ++col) row.push_back(in.bits(b, col));
              std::vector<std::uint32_t> got = selection(c, out, b).bits;
              std::sort(row.begin(), row.end());
              std::sort(got.begin(), got.end());
              EXPECT_EQ(got, row) << "row " << b;
            }
          });
        }
      }
    }
  }
}

/// Sweeps every special-valued distribution through every order, NaN policy and tie policy
/// on both short and long rows.
TEST(TopkFpSpecials, SpecialDistributionsEveryOption) {
  CaseChecker check;
  std::uint64_t seed = 7000;
  for (DType dtype : kFloatDTypes) {
    for (Dist dist : {Dist::kWithNan, Dist::kMostlyNan, Dist::kWithInf, Dist::kSignedZeros,
                      Dist::kDenormals, Dist::kRawBits}) {
      for (std::int64_t n : {std::int64_t{3}, under_pow2(9), std::int64_t{40000}}) {
        for (TopkOrder sorted : kAllOrders) {
          for (NanPolicy nan : kAllNanPolicies) {
            for (TiePolicy ties : kAllTiePolicies) {
              TopkCase c;
              c.dtype = dtype;
              c.dist = dist;
              c.seed = seed++;
              c.batch = 2;
              c.n = n;
              c.k = std::max<std::int64_t>(1, n / 8);
              c.largest = seed % 2 == 0;
              c.sorted = sorted;
              c.nan = nan;
              c.ties = ties;
              c.ranges = seed % 3 == 0 ? Ranges::kBoth : Ranges::kNone;
              check(c);
            }
          }
        }
      }
    }
  }
}

}  // namespace
