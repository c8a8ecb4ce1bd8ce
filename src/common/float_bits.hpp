// SPDX-License-Identifier: Apache-2.0
// Conversions between float and the 16-bit float formats, on bit patterns, so that host code
// needs neither compiler extensions (_Float16, __bf16) nor the CUDA headers. All conversions
// from float round to nearest, ties to even, and keep NaN a NaN.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/host_device.hpp"

namespace attnkit::detail {

ATTNKIT_HD std::uint32_t float_to_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

ATTNKIT_HD float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

ATTNKIT_HD float bf16_bits_to_float(std::uint16_t h) { return bits_to_float(std::uint32_t{h} << 16); }

ATTNKIT_HD std::uint16_t float_to_bf16_bits(float f) {
  std::uint32_t u = float_to_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

ATTNKIT_HD float f16_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  std::uint32_t mant = h & 0x3FFu;
  if (exp == 0x1Fu) return bits_to_float(sign | 0x7F800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return bits_to_float(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return bits_to_float(sign);
  // Subnormal half: value = mant * 2^-24, exact in float.
  float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
  return bits_to_float(sign | float_to_bits(v));
}

ATTNKIT_HD std::uint16_t float_to_f16_bits(float f) {
  const std::uint32_t u = float_to_bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u);
  if (abs >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // rounds to inf
  if (abs < 0x38800000u) {
    // Result is subnormal or zero: scale so that the half ulp (2^-24) becomes 1, then round.
    // The float addition rounds to nearest even exactly as the conversion must.
    const float scaled = bits_to_float(abs) * 16777216.0f;  // * 2^24, exact
    const float rounded = scaled + 8388608.0f;               // + 2^23 forces integer rounding
    return static_cast<std::uint16_t>(sign | (float_to_bits(rounded) - 0x4B000000u));
  }
  // Normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even.
  std::uint32_t r = abs - 0x38000000u;
  r += 0xFFFu + ((r >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | (r >> 13));
}

/// double -> float rounded to odd: toward zero, then the lowest mantissa bit set when the
/// conversion was inexact. Rounding that float to a narrower format (half, bfloat16) to
/// nearest-even then gives the correctly rounded result of the double, which a plain
/// double -> float -> narrow chain misses when both steps round (double rounding).
inline float double_to_float_round_odd(double d) {
  float f = static_cast<float>(d);
  if (d != d || static_cast<double>(f) == d) return f;  // NaN, or exact
  if (f != f || (f > 3.4e38f || f < -3.4e38f) || std::fabs(static_cast<double>(f)) > std::fabs(d)) {
    // Rounded away from zero (or overflowed to inf): step back toward zero.
    f = std::nextafter(f, 0.0f);
  }
  std::uint32_t u = float_to_bits(f);
  u |= 1u;  // inexact: the sticky bit
  return bits_to_float(u);
}

inline std::uint16_t double_to_bf16_bits(double d) {
  return float_to_bf16_bits(double_to_float_round_odd(d));
}

inline std::uint16_t double_to_f16_bits(double d) {
  return float_to_f16_bits(double_to_float_round_odd(d));
}

}  // namespace attnkit::detail
