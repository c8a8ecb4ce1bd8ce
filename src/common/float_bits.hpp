// SPDX-License-Identifier: Apache-2.0
// Conversions between float and the 16-bit float formats, on bit patterns, so that host code
// needs neither compiler extensions (_Float16, __bf16) nor the CUDA headers. All conversions
// from float round to nearest, ties to even, whatever the thread's rounding and flush modes
// (integer arithmetic), and keep NaN a NaN.
#pragma once

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

ATTNKIT_HD float bf16_bits_to_float(std::uint16_t h) {
  return bits_to_float(std::uint32_t{h} << 16);
}

ATTNKIT_HD std::uint16_t float_to_bf16_bits(float f) {
  std::uint32_t u = float_to_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u)
    return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // quiet NaN
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
    // Result is subnormal or zero: abs = mant * 2^(exp - 150) and the half's ulp is 2^-24, so
    // the result is mant >> (126 - exp) rounded to nearest even, in integers (a float addition
    // would follow the thread's rounding mode). A carry into bit 10 gives the least normal.
    const std::uint32_t exp = abs >> 23;
    const std::uint32_t mant = (abs & 0x7FFFFFu) | (exp != 0 ? 0x800000u : 0u);
    const std::uint32_t shift = 126u - (exp != 0 ? exp : 1u);  // >= 14
    if (shift > 24u) return sign;  // below half the least subnormal (mant < 2^24)
    const std::uint32_t rest = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    std::uint32_t r = mant >> shift;
    r += (rest > half || (rest == half && (r & 1u))) ? 1u : 0u;
    return static_cast<std::uint16_t>(sign | r);
  }
  // Normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even.
  std::uint32_t r = abs - 0x38000000u;
  r += 0xFFFu + ((r >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | (r >> 13));
}

/// double -> float bits, by integer arithmetic so that the calling thread's floating-point
/// mode (flush-to-zero, denormals-are-zero, as `torch.set_flush_denormal(True)` sets) cannot
/// flush a subnormal result. Rounded to nearest even, or with `to_odd` to odd: toward zero,
/// then the lowest mantissa bit set when the conversion was inexact. Rounding a float rounded
/// to odd on to a narrower format (half, bfloat16) to nearest even gives the correctly rounded
/// result of the double, which a plain double -> float -> narrow chain misses when both steps
/// round (double rounding). NaN stays a NaN (quiet, its top payload bits kept).
inline std::uint32_t double_to_float_bits(double d, bool to_odd) {
  std::uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  const auto sign = static_cast<std::uint32_t>(u >> 32) & 0x80000000u;
  const std::uint64_t abs = u & 0x7FFFFFFFFFFFFFFFull;
  if (abs > 0x7FF0000000000000ull) {
    return sign | 0x7FC00000u | static_cast<std::uint32_t>((abs >> 29) & 0x3FFFFFu);
  }
  if (abs == 0x7FF0000000000000ull) return sign | 0x7F800000u;
  // abs = mant * 2^(exp - 1075) with a 53-bit mant (the implicit bit set) for normal doubles.
  int exp = static_cast<int>(abs >> 52);
  std::uint64_t mant = abs & 0xFFFFFFFFFFFFFull;
  if (exp != 0) {
    mant |= 1ull << 52;
  } else {
    exp = 1;
  }
  const int float_exp = exp - 896;  // the float's biased exponent, if normal
  if (float_exp > 254) return sign | (to_odd ? 0x7F7FFFFFu : 0x7F800000u);
  // Bits dropped: 29 to a normal float's 24-bit significand, more for a subnormal one.
  const int shift = 29 + (float_exp < 1 ? 1 - float_exp : 0);
  std::uint64_t kept = 0, rest = mant;
  bool above_half = false, half = false;
  if (shift < 64) {
    kept = mant >> shift;
    rest = mant & ((1ull << shift) - 1);
    const std::uint64_t h = 1ull << (shift - 1);
    above_half = rest > h;
    half = rest == h;
  }
  // A normal float's kept bits include the implicit one, which the exponent field absorbs.
  auto bits = static_cast<std::uint32_t>(
      (static_cast<std::uint64_t>(float_exp < 1 ? 0 : float_exp - 1) << 23) + kept);
  if (to_odd) {
    if (rest != 0) bits |= 1u;
  } else if (above_half || (half && (bits & 1u))) {
    ++bits;  // a carry into the exponent is right, up to +inf
  }
  return sign | bits;
}

inline float double_to_float_round_odd(double d) {
  return bits_to_float(double_to_float_bits(d, true));
}

inline std::uint16_t double_to_bf16_bits(double d) {
  return float_to_bf16_bits(double_to_float_round_odd(d));
}

inline std::uint16_t double_to_f16_bits(double d) {
  return float_to_f16_bits(double_to_float_round_odd(d));
}

}  // namespace attnkit::detail
