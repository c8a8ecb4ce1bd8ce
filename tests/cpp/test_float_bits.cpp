// SPDX-License-Identifier: Apache-2.0
// The conversions of src/common/float_bits.hpp that turn a caller's value_fill into x's dtype:
// double -> float to nearest even must agree with the hardware cast (in the default
// floating-point mode) on every double, rounded to odd it must make the one rounding to a
// 16-bit format exact, float -> float16 must round half subnormals to nearest even, and none
// may depend on the thread's rounding, flush-to-zero and denormals-are-zero modes.
#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#if defined(__x86_64__) || defined(__SSE__)
#include <xmmintrin.h>
#define ATTNKIT_TEST_MXCSR 1
#endif

#include "attnkit/topk.hpp"
#include "common/float_bits.hpp"

namespace {

using attnkit::detail::double_to_bf16_bits;
using attnkit::detail::double_to_f16_bits;
using attnkit::detail::double_to_float_bits;
using attnkit::detail::float_to_bits;
using attnkit::detail::float_to_f16_bits;

double from_bits(std::uint64_t u) {
  double d;
  std::memcpy(&d, &u, sizeof d);
  return d;
}

/// Doubles spread over every exponent that matters to a float (overflow, normal, subnormal,
/// below the least subnormal), with the float's rounding boundaries (halfway cases, one ulp of
/// the double either side) among them.
std::vector<double> sample_doubles() {
  std::vector<double> out;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const std::uint64_t exp = 1023 - 160 + rng() % 300;  // 2^-160 .. 2^139
    const std::uint64_t sign = (rng() & 1) << 63;
    std::uint64_t mant = rng() & 0xFFFFFFFFFFFFFull;
    // The low 29 bits are what a normal float drops: its half ulp, and one double ulp either side.
    const std::uint64_t high = mant & ~0x1FFFFFFFull;
    switch (i % 4) {
      case 1: mant = high | 0x10000000ull; break;
      case 2: mant = high | 0x10000001ull; break;
      case 3: mant = high | 0x0FFFFFFFull; break;
      default: break;
    }
    out.push_back(from_bits(sign | exp << 52 | mant));
  }
  const double inf = INFINITY;
  for (double d : {0.0, -0.0, 1e-40, -1e-40, 1e-45, 7e-46, 1.4e-45, 3.4028234663852886e38,
                   3.4028235677973366e38, 3.5e38, 1e300, -1e300, 4.9e-324, inf, -inf}) {
    out.push_back(d);
  }
  return out;
}

TEST(FloatBits, DoubleToFloatNearestMatchesTheCast) {
  int failures = 0;
  for (double d : sample_doubles()) {
    const std::uint32_t want = float_to_bits(static_cast<float>(d));
    const std::uint32_t got = double_to_float_bits(d, false);
    if (got != want && ++failures <= 5) {
      ADD_FAILURE() << std::hexfloat << d << ": 0x" << std::hex << got << ", the cast 0x" << want;
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST(FloatBits, DoubleToFloatKeepsNaN) {
  const float f = attnkit::detail::bits_to_float(double_to_float_bits(std::nan(""), false));
  EXPECT_TRUE(std::isnan(f));
  EXPECT_TRUE(std::isnan(attnkit::detail::double_to_float_round_odd(-std::nan(""))));
}

/// Round to odd: d itself where a float holds it, else the odd one of the two floats around d.
TEST(FloatBits, RoundToOddPicksTheOddNeighbour) {
  int failures = 0;
  for (double d : sample_doubles()) {
    if (std::isinf(d)) continue;
    const std::uint32_t odd = double_to_float_bits(d, true);
    const float f = attnkit::detail::bits_to_float(odd);
    const double a = std::fabs(d), m = std::fabs(static_cast<double>(f));
    const double below = std::nextafter(static_cast<float>(m), 0.0f);
    const double above = std::nextafter(static_cast<float>(m), INFINITY);
    const bool ok = m == a || ((odd & 1u) == 1u && below < a && a < above &&
                               std::signbit(f) == std::signbit(d));
    if (!ok && ++failures <= 5) {
      ADD_FAILURE() << std::hexfloat << d << ": 0x" << std::hex << odd << " = " << f;
    }
  }
  EXPECT_EQ(failures, 0);
}

/// Values just beside a 16-bit format's halfway point, where rounding to float first lands on
/// the halfway point itself and its tie goes the wrong way.
TEST(FloatBits, SixteenBitValuesRoundOnce) {
  // bfloat16 keeps 7 fraction bits: 1 + 2^-8 is halfway between 1 (0x3F80) and 1 + 2^-7.
  EXPECT_EQ(double_to_bf16_bits(1.0 + 0x1p-8 + 0x1p-30), 0x3F81u);
  EXPECT_EQ(double_to_bf16_bits(1.0 + 0x1p-8 - 0x1p-30), 0x3F80u);
  EXPECT_EQ(double_to_bf16_bits(1.0 + 0x1p-8), 0x3F80u);  // the tie itself: to even
  EXPECT_EQ(double_to_bf16_bits(-(1.0 + 0x1p-8 + 0x1p-30)), 0xBF81u);
  // float16 keeps 10: 1 + 2^-11 is halfway between 1 (0x3C00) and 1 + 2^-10.
  EXPECT_EQ(double_to_f16_bits(1.0 + 0x1p-11 + 0x1p-40), 0x3C01u);
  EXPECT_EQ(double_to_f16_bits(1.0 + 0x1p-11 - 0x1p-40), 0x3C00u);
  // The least float16 subnormal is 2^-24: a hair above half of it rounds up to it.
  EXPECT_EQ(double_to_f16_bits(0x1p-25 + 0x1p-60), 0x0001u);
  EXPECT_EQ(double_to_f16_bits(0x1p-25), 0x0000u);
}

/// Floats whose half is subnormal or zero (below 2^-14) round to nearest even in every
/// rounding mode of the calling thread: a caller's fesetround must not move a value_fill.
/// Expected values come from the exact double product x * 2^24 rounded to nearest in the
/// default mode. The floats: every midpoint between neighbouring halves from 0 to the least
/// normal (h + 1/2) * 2^-24 and the floats either side of it, then random mantissas of every
/// exponent with, where the shift leaves room, the halfway case of the dropped bits and its
/// neighbours.
TEST(FloatBits, HalfSubnormalsRoundToNearestInEveryMode) {
  std::vector<std::uint32_t> bits;
  for (std::uint32_t h = 0; h < 0x400; ++h) {
    const float mid = (static_cast<float>(h) + 0.5f) * 0x1p-24f;  // exact: 12 significant bits
    const std::uint32_t u = float_to_bits(mid);
    bits.insert(bits.end(), {u - 1, u, u + 1, 0x80000000u | u});
  }
  std::mt19937 rng(11);
  for (std::uint32_t exp = 0; exp <= 112; ++exp) {
    const std::uint32_t shift = 126 - (exp != 0 ? exp : 1);
    for (int i = 0; i < 600; ++i) {
      std::uint32_t mant = rng() & 0x7FFFFFu;
      if (shift <= 24) {
        const std::uint32_t half = 1u << (shift - 1);
        const std::uint32_t high = (mant | 0x800000u) & ~((1u << shift) - 1u);
        if (i % 4 == 1) mant = (high | half) & 0x7FFFFFu;
        if (i % 4 == 2) mant = (high | (half + 1)) & 0x7FFFFFu;
        if (i % 4 == 3) mant = (high | (half - 1)) & 0x7FFFFFu;
      }
      bits.push_back(exp << 23 | mant);
      bits.push_back(0x80000000u | exp << 23 | mant);
    }
  }
  bits.push_back(0x387FFFFFu);  // rounds up to the least normal half, 0x0400
  std::vector<std::uint16_t> want;
  for (std::uint32_t u : bits) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    const double r = std::nearbyint(std::fabs(static_cast<double>(f)) * 16777216.0);
    want.push_back(static_cast<std::uint16_t>((u >> 16 & 0x8000u) | static_cast<std::uint32_t>(r)));
  }
  EXPECT_EQ(want.back(), 0x0400u);
  const int saved = std::fegetround();
  for (const int mode : {FE_TONEAREST, FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO}) {
    ASSERT_EQ(std::fesetround(mode), 0);
    std::vector<std::uint16_t> got;
    for (std::uint32_t u : bits) {
      float f;
      std::memcpy(&f, &u, sizeof f);
      got.push_back(float_to_f16_bits(f));
    }
    std::fesetround(saved);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < bits.size(); ++i) bad += got[i] != want[i];
    EXPECT_EQ(bad, 0u) << "rounding mode " << mode;
  }
}

#ifdef ATTNKIT_TEST_MXCSR
/// With flush-to-zero and denormals-are-zero on (as torch.set_flush_denormal(True) sets them),
/// a subnormal value_fill still pads as itself, through the conversions and through topk.
TEST(FloatBits, FlushToZeroModeDoesNotFlushTheFill) {
  const std::uint32_t want32 = float_to_bits(static_cast<float>(1e-40));  // default mode
  ASSERT_NE(want32 & 0x7FFFFFFFu, 0u);
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040u);  // FTZ (bit 15) and DAZ (bit 6)
  const std::uint32_t got32 = double_to_float_bits(1e-40, false);
  const std::uint16_t got_bf16 = double_to_bf16_bits(1e-40);
  float x = 0.0f;
  float values[2] = {-1.0f, -1.0f};
  std::int64_t indices[2] = {-7, -7};
  attnkit::TopkTensors t;
  const attnkit::Device cpu{};
  t.x = attnkit::TensorView::make(&x, attnkit::DType::kFloat32, cpu, {1});
  t.out_values = attnkit::TensorView::make(values, attnkit::DType::kFloat32, cpu, {2});
  t.out_indices = attnkit::TensorView::make(indices, attnkit::DType::kInt64, cpu, {2});
  attnkit::TopkOptions o;
  o.k = 2;
  o.value_fill = 1e-40;
  attnkit::topk(t, o);
  _mm_setcsr(saved);
  EXPECT_EQ(got32, want32);
  EXPECT_EQ(got_bf16, 0x0001u);  // 1e-40 / 2^-133 = 1.09: the least bfloat16 subnormal
  EXPECT_EQ(float_to_bits(values[1]), want32);
  EXPECT_EQ(indices[1], -1);
}
#endif

}  // namespace
