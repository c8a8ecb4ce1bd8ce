// SPDX-License-Identifier: Apache-2.0
// Scores (src/common/topk_keys.hpp): score_pair_of, the packed form the CUDA kernels use for
// 16-bit types, must equal score_of on each half for every bit pattern; score_of must order
// numbers as the floats they encode (-0.0 tying +0.0, NaN above +inf, all NaNs tied);
// bits_of_score must invert score_of wherever one bit pattern owns the score; and the prefilter
// bound must let through, with an ordered float comparison, every number that beats a threshold,
// and the exact bound exactly those numbers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/float_bits.hpp"
#include "common/topk_keys.hpp"

namespace {

using attnkit::detail::BFloat16Traits;
using attnkit::detail::bits_of_score;
using attnkit::detail::Float16Traits;
using attnkit::detail::Float32Traits;
using attnkit::detail::make_score_params;
using attnkit::detail::prefilter_bound_bits;
using attnkit::detail::prefilter_tight_bound_bits;
using attnkit::detail::score_of;
using attnkit::detail::score_pair_of;
using attnkit::detail::ScoreParams;

template <class Traits>
void expect_pairs_match_singles(ScoreParams sp) {
  // Every pattern in each half, against a few partners in the other half (a carry or borrow
  // across halves would show against any partner).
  const std::uint32_t partners[] = {0x0000u, 0x8000u, 0x7FFFu, 0xFFFFu, Traits::kInf,
                                    Traits::kSign | Traits::kInf, 0x3C00u, 0xBF80u, 0x0001u};
  int failures = 0;
  for (std::uint32_t x = 0; x <= 0xFFFFu && failures < 5; ++x) {
    for (std::uint32_t other : partners) {
      const std::uint32_t lo = score_pair_of<Traits>(other << 16 | x, sp);
      const std::uint32_t hi = score_pair_of<Traits>(x << 16 | other, sp);
      const std::uint32_t want_x = score_of<Traits>(x, sp),
                          want_other = score_of<Traits>(other, sp);
      if (lo != (want_other << 16 | want_x) || hi != (want_x << 16 | want_other)) {
        ADD_FAILURE() << std::hex << "x=0x" << x << " other=0x" << other << " pair(lo)=0x" << lo
                      << " pair(hi)=0x" << hi << " score_of: 0x" << want_x << ", 0x" << want_other;
        ++failures;
      }
    }
  }
}

TEST(TopkKeys, PairScoresEqualSingleScores) {
  for (bool largest : {true, false}) {
    for (bool ignore_nan : {false, true}) {
      SCOPED_TRACE(testing::Message() << "largest=" << largest << " ignore_nan=" << ignore_nan);
      expect_pairs_match_singles<BFloat16Traits>(
          make_score_params<BFloat16Traits>(largest, ignore_nan));
      expect_pairs_match_singles<Float16Traits>(
          make_score_params<Float16Traits>(largest, ignore_nan));
    }
  }
}

float bf16_to_float(std::uint32_t bits) {
  const std::uint32_t f = bits << 16;
  float v;
  std::memcpy(&v, &f, sizeof v);
  return v;
}

TEST(TopkKeys, Bf16ScoresOrderAsFloats) {
  const ScoreParams sp = make_score_params<BFloat16Traits>(true, false);
  // Every 64th pattern against every 61st: both signs, zeros, denormals, infinities and NaNs.
  for (std::uint32_t a = 0; a <= 0xFFFFu; a += 64) {
    for (std::uint32_t b = 0; b <= 0xFFFFu; b += 61) {
      const float x = bf16_to_float(a), y = bf16_to_float(b);
      const std::uint32_t sx = score_of<BFloat16Traits>(a, sp),
                          sy = score_of<BFloat16Traits>(b, sp);
      if (std::isnan(x) || std::isnan(y)) {
        if (std::isnan(x) && std::isnan(y)) {
          ASSERT_EQ(sx, sy) << std::hex << a << " " << b;
        } else {
          ASSERT_EQ(sx > sy, std::isnan(x)) << std::hex << a << " " << b;
        }
      } else {
        ASSERT_EQ(sx < sy, x < y) << std::hex << a << " " << b;
        ASSERT_EQ(sx == sy, x == y) << std::hex << a << " " << b;
      }
    }
  }
}

/// Zero or NaN: the patterns whose score others share.
template <class Traits>
bool shares_score(std::uint32_t x) {
  const std::uint32_t mag = x & Traits::kMag;
  return mag == 0 || mag > Traits::kInf;
}

template <class Traits>
void expect_inverse(std::uint32_t x, ScoreParams sp) {
  bool unique = false;
  const std::uint32_t back = bits_of_score<Traits>(score_of<Traits>(x, sp), sp, unique);
  ASSERT_EQ(unique, !shares_score<Traits>(x)) << std::hex << "x=0x" << x;
  if (unique) {
    ASSERT_EQ(back, x) << std::hex << "x=0x" << x;
  } else if ((x & Traits::kMag) == 0) {
    ASSERT_EQ(back, 0u) << std::hex << "x=0x" << x;  // +0.0, whose bits a -0.0 must be read for
  }
}

TEST(TopkKeys, BitsOfScoreInvertsScores) {
  for (bool largest : {true, false}) {
    SCOPED_TRACE(testing::Message() << "largest=" << largest);
    for (std::uint32_t x = 0; x <= 0xFFFFu; ++x) {
      expect_inverse<BFloat16Traits>(x, make_score_params<BFloat16Traits>(largest, false));
      expect_inverse<Float16Traits>(x, make_score_params<Float16Traits>(largest, false));
    }
    // fp32: every exponent and sign with spread mantissas, the specials among them.
    for (std::uint64_t x = 0; x <= 0xFFFFFFFFu; x += 0x10001u) {
      expect_inverse<Float32Traits>(static_cast<std::uint32_t>(x),
                                    make_score_params<Float32Traits>(largest, false));
    }
    for (std::uint32_t x : {0x0u, 0x80000000u, 0x1u, 0x807FFFFFu, 0x7F800000u, 0xFF800000u,
                            0x7F800001u, 0xFFFFFFFFu, 0x7F7FFFFFu, 0xFF7FFFFFu}) {
      expect_inverse<Float32Traits>(x, make_score_params<Float32Traits>(largest, false));
    }
  }
}

/// For every threshold (every 16-bit score, and 0), with both directions: each number x whose
/// score beats the threshold passes the CPU's ordered test (x >= B, or x <= B when smallest).
TEST(TopkKeys, Bf16PrefilterBoundPassesEveryBetterNumber) {
  for (bool largest : {true, false}) {
    const ScoreParams sp = make_score_params<BFloat16Traits>(largest, false);
    for (std::uint32_t t = 0; t <= 0xFFFFu; ++t) {
      const float bound = bf16_to_float(prefilter_bound_bits<BFloat16Traits>(t, sp));
      ASSERT_FALSE(std::isnan(bound)) << std::hex << "threshold=0x" << t << " largest=" << largest;
      for (std::uint32_t x = 0; x <= 0xFFFFu; x += 7) {
        const float v = bf16_to_float(x);
        if (std::isnan(v) || score_of<BFloat16Traits>(x, sp) <= t) continue;
        ASSERT_TRUE(largest ? v >= bound : v <= bound)
            << std::hex << "threshold=0x" << t << " x=0x" << x << " largest=" << largest;
      }
    }
  }
}

/// One threshold against every pattern in `xs`: prefilter_tight_bound_bits must say its bound
/// is exact for every threshold below the best number's score, and then the ordered float
/// comparison with it must equal "score beats the threshold" on every number; above, it must
/// fall back to prefilter_bound_bits.
template <class Traits, class ToFloat, class Patterns>
void expect_exact_bound(std::uint32_t t, ScoreParams sp, ToFloat to_float, const Patterns& xs,
                        std::uint32_t best_number_score) {
  const bool largest = sp.flip == 0;
  bool exact = false;
  const std::uint32_t bits = prefilter_tight_bound_bits<Traits>(t, sp, exact);
  ASSERT_EQ(exact, t < best_number_score)
      << std::hex << "threshold=0x" << t << " largest=" << largest;
  if (!exact) {
    ASSERT_EQ(bits, prefilter_bound_bits<Traits>(t, sp)) << std::hex << "threshold=0x" << t;
    return;
  }
  const float bound = to_float(bits);
  ASSERT_FALSE(std::isnan(bound)) << std::hex << "threshold=0x" << t;
  for (std::uint32_t x : xs) {
    const float v = to_float(x);
    if (std::isnan(v)) continue;
    ASSERT_EQ(largest ? v >= bound : v <= bound, score_of<Traits>(x, sp) > t)
        << std::hex << "threshold=0x" << t << " x=0x" << x << " bound=0x" << bits
        << " largest=" << largest;
  }
}

/// Every 16-bit threshold, both formats and directions, against every 61st pattern and the
/// patterns whose scores neighbour the threshold (where "beats" changes, both zeros included).
template <class Traits, class ToFloat>
void expect_exact_bounds_16(bool largest, ToFloat to_float, std::uint32_t best_pattern) {
  const ScoreParams sp = make_score_params<Traits>(largest, false);
  const std::uint32_t best = score_of<Traits>(best_pattern, sp);
  std::vector<std::uint32_t> xs;
  for (std::uint32_t x = 0; x <= 0xFFFFu; x += 61) xs.push_back(x);
  const std::size_t spread = xs.size();
  for (std::uint32_t t = 0; t <= 0xFFFFu; ++t) {
    xs.resize(spread);
    for (std::uint32_t d = 0; d < 4; ++d) {
      bool unique = false;
      const std::uint32_t x = bits_of_score<Traits>((t + d - 1u) & Traits::kMask, sp, unique);
      xs.push_back(x);
      xs.push_back(x ^ Traits::kSign);
    }
    expect_exact_bound<Traits>(t, sp, to_float, xs, best);
    if (testing::Test::HasFatalFailure()) return;
  }
}

TEST(TopkKeys, ExactBoundDecidesEvery16BitNumber) {
  const auto bf16 = [](std::uint32_t b) {
    return attnkit::detail::bf16_bits_to_float(static_cast<std::uint16_t>(b));
  };
  const auto f16 = [](std::uint32_t b) {
    return attnkit::detail::f16_bits_to_float(static_cast<std::uint16_t>(b));
  };
  for (bool largest : {true, false}) {
    SCOPED_TRACE(testing::Message() << "largest=" << largest);
    // The best number: +inf when largest, -inf when smallest.
    expect_exact_bounds_16<BFloat16Traits>(largest, bf16, largest ? 0x7F80u : 0xFF80u);
    expect_exact_bounds_16<Float16Traits>(largest, f16, largest ? 0x7C00u : 0xFC00u);
  }
}

/// fp32: thresholds and patterns over every exponent and sign with spread mantissas, plus the
/// neighbours of zero, the denormal edge and the infinities, where consecutive scores change
/// sign or class.
TEST(TopkKeys, ExactBoundDecidesFloat32Numbers) {
  std::vector<std::uint32_t> xs;
  for (std::uint64_t x = 0; x <= 0xFFFFFFFFu; x += 0x100003u)
    xs.push_back(static_cast<std::uint32_t>(x));
  for (std::uint32_t edge : {0x0u, 0x800000u, 0x7F800000u}) {
    for (std::uint32_t d = 0; d < 3; ++d) {
      for (std::uint32_t sign : {0x0u, 0x80000000u}) {
        xs.push_back(sign | (edge + d));
        if (edge >= d) xs.push_back(sign | (edge - d));
      }
    }
  }
  const auto f32 = [](std::uint32_t b) { return attnkit::detail::bits_to_float(b); };
  for (bool largest : {true, false}) {
    const ScoreParams sp = make_score_params<Float32Traits>(largest, false);
    const std::uint32_t best = score_of<Float32Traits>(largest ? 0x7F800000u : 0xFF800000u, sp);
    std::vector<std::uint32_t> thresholds{0u, best - 1u, best, best + 1u, 0xFFFFFFFFu};
    for (std::uint32_t x : xs) {
      const std::uint32_t s = score_of<Float32Traits>(x, sp);
      for (std::uint32_t d : {0u, 1u}) thresholds.push_back(s - d);
    }
    for (std::uint32_t t : thresholds) {
      expect_exact_bound<Float32Traits>(t, sp, f32, xs, best);
      if (testing::Test::HasFatalFailure()) return;
    }
  }
}

}  // namespace
