// SPDX-License-Identifier: Apache-2.0
// Scores: the unsigned integers that top-k selection compares instead of floats.
//
// score(x) is order-preserving in the direction of preference (larger score = better choice):
//  - sign-magnitude bits become offset binary: asc = SIGN + mag for x >= 0, SIGN - mag for x < 0,
//    so -0.0 and +0.0 map to the same score (they are equal, SPEC §1);
//  - every NaN maps to SIGN + INF + 1, one above +inf (torch.topk's order), whatever its sign
//    or payload, so NaNs tie with each other and ties break by index;
//  - largest = false flips every bit (asc ^ MASK), which reverses the order and keeps NaN the
//    least preferred value;
//  - nan = "ignore" gives NaN the score 0, which no number can have (the smallest number score
//    is SIGN - INF >= 0x80) and which selection never admits.
// See docs/topk.md, "Scores".
#pragma once

#include <cstdint>

#include "common/host_device.hpp"

namespace attnkit::detail {

struct Float32Traits {
  using Bits = std::uint32_t;
  static constexpr std::uint32_t kSign = 0x80000000u;
  static constexpr std::uint32_t kMag = 0x7FFFFFFFu;
  static constexpr std::uint32_t kInf = 0x7F800000u;
  static constexpr std::uint32_t kMask = 0xFFFFFFFFu;
  static constexpr int kBits = 32;
};

struct BFloat16Traits {
  using Bits = std::uint16_t;
  static constexpr std::uint32_t kSign = 0x8000u;
  static constexpr std::uint32_t kMag = 0x7FFFu;
  static constexpr std::uint32_t kInf = 0x7F80u;
  static constexpr std::uint32_t kMask = 0xFFFFu;
  static constexpr int kBits = 16;
};

struct Float16Traits {
  using Bits = std::uint16_t;
  static constexpr std::uint32_t kSign = 0x8000u;
  static constexpr std::uint32_t kMag = 0x7FFFu;
  static constexpr std::uint32_t kInf = 0x7C00u;
  static constexpr std::uint32_t kMask = 0xFFFFu;
  static constexpr int kBits = 16;
};

/// The score that never enters a selection (an ignored NaN); every other score is larger.
inline constexpr std::uint32_t kExcludedScore = 0;

/// Per-call constants of the score function.
struct ScoreParams {
  std::uint32_t flip;       // 0 for largest, MASK for smallest
  std::uint32_t nan_score;  // the score every NaN gets
};

template <class Traits>
ATTNKIT_HD ScoreParams make_score_params(bool largest, bool ignore_nan) {
  const std::uint32_t nan_asc = Traits::kSign + Traits::kInf + 1u;
  ScoreParams p;
  p.flip = largest ? 0u : Traits::kMask;
  p.nan_score = ignore_nan ? kExcludedScore : (nan_asc ^ p.flip);
  return p;
}

template <class Traits>
ATTNKIT_HD bool is_nan_bits(std::uint32_t bits) {
  return (bits & Traits::kMag) > Traits::kInf;
}

template <class Traits>
ATTNKIT_HD std::uint32_t score_of(std::uint32_t bits, ScoreParams p) {
  const std::uint32_t mag = bits & Traits::kMag;
  // kMag when x < 0, else 0: SIGN - mag = SIGN + (mag ^ kMag) - kMag, with no branch or select
  // on the sign (kernels score every element, and this is most of their per-element work).
  const std::uint32_t neg = (0u - ((bits >> (Traits::kBits - 1)) & 1u)) & Traits::kMag;
  const std::uint32_t asc = (mag ^ neg) + Traits::kSign - neg;
  return mag > Traits::kInf ? p.nan_score : (asc ^ p.flip);
}

/// The inverse of score_of: the bits of the value whose score is s. Exact for every score that
/// one bit pattern owns; `unique` is false for the two that several share, zero (+0.0 and -0.0)
/// and NaN (every sign and payload), whose bits the caller reads from the input instead.
template <class Traits>
ATTNKIT_HD std::uint32_t bits_of_score(std::uint32_t s, ScoreParams p, bool& unique) {
  const std::uint32_t asc = s ^ p.flip;
  unique = asc != Traits::kSign && asc <= Traits::kSign + Traits::kInf;
  return asc >= Traits::kSign ? asc - Traits::kSign : (Traits::kSign | (Traits::kSign - asc));
}

/// 0xFFFF in each 16-bit half of w whose top bit is set, 0 in the others.
ATTNKIT_HD std::uint32_t sign_fill_halves(std::uint32_t w) {
#if defined(__CUDA_ARCH__)
  std::uint32_t r;  // PRMT's sign mode: each byte becomes the sign of byte 1 (low) or 3 (high)
  asm("prmt.b32 %0, %1, 0, 0xBB99;" : "=r"(r) : "r"(w));
  return r;
#else
  return ((w >> 15) & 0x00010001u) * 0xFFFFu;
#endif
}

/// score_of of the two 16-bit elements of a 32-bit word at once (the element at the lower
/// address in the low half), packed the same way: about five instructions an element where two
/// calls of score_of take nine.
template <class Traits>
ATTNKIT_HD std::uint32_t score_pair_of(std::uint32_t w, ScoreParams p) {
  static_assert(Traits::kBits == 16, "two 16-bit elements a word");
  constexpr std::uint32_t kHalves = 0x00010001u;  // times a 16-bit constant: it in both halves
  const std::uint32_t negative = sign_fill_halves(w);
  const std::uint32_t neg = negative & (Traits::kMag * kHalves);
  // Per half: SIGN + mag, or SIGN + (mag ^ kMag) - kMag = SIGN - mag; each half's result lies
  // in [1, 0xFFFF] (NaN included), so no carry or borrow crosses from one half to the other.
  const std::uint32_t asc =
      ((w ^ negative) & (Traits::kMag * kHalves)) + Traits::kSign * kHalves - neg;
  // mag > INF exactly when mag + (kMag - INF) reaches the half's top bit (at most 0x83FE).
  const std::uint32_t nan =
      sign_fill_halves((w & (Traits::kMag * kHalves)) + (Traits::kMag - Traits::kInf) * kHalves);
  const std::uint32_t score = asc ^ (p.flip * kHalves);
  return (score & ~nan) | ((p.nan_score * kHalves) & nan);
}

/// The bit pattern (in Traits' format) of a value B such that, for every element x,
///   score(x) > threshold  implies  !(x < B) when largest, !(x > B) when smallest,
/// where a comparison with a NaN is false, so NaNs always pass. B is never a NaN, so for numbers
/// the ordered `x >= B` / `x <= B` (the CPU's vectorised form) says the same. The filters test
/// this one float comparison first and compute exact scores only for the elements that pass it.
template <class Traits>
ATTNKIT_HD std::uint32_t prefilter_bound_bits(std::uint32_t threshold, ScoreParams p) {
  const bool largest = p.flip == 0;
  const std::uint32_t neg_inf = Traits::kSign | Traits::kInf, pos_inf = Traits::kInf;
  if (threshold == kExcludedScore) return largest ? neg_inf : pos_inf;  // everything may pass
  const std::uint32_t asc = threshold ^ p.flip;
  // The threshold is NaN's score. Largest: nothing beats it (the bound lets only +inf and NaN
  // through, which the exact test then refuses); smallest: NaN is the worst choice and every
  // number beats it, which `!(x > +inf)` lets through.
  if (asc > Traits::kSign + Traits::kInf) return pos_inf;
  // Below -inf's score (a sampled floor of -inf, less one): every number beats it, and -inf lets
  // them all through. SIGN | (SIGN - asc) would be a NaN pattern here, which no ordered
  // comparison passes. (With smallest, -inf is the best value and no threshold lies above it.)
  if (asc < Traits::kSign - Traits::kInf) return neg_inf;
  bool unique;  // the value whose score is the threshold; zero's either sign bounds the same
  return bits_of_score<Traits>(threshold, p, unique);
}

/// The tightest prefilter bound of a threshold, the one the filters use. Where it exists it is
/// the bound of threshold + 1, which decides every number exactly: for every non-NaN x,
///   !(x < B) when largest, !(x > B) when smallest   <=>   score(x) > threshold,
/// since scores of consecutive numbers are consecutive integers and equal floats (-0.0, +0.0)
/// share one, so "score >= threshold + 1" is one float comparison; `numbers_exact` is then
/// true. When threshold + 1 lies above the best number's score (threshold is +inf's score, or
/// -inf's when smallest) no number beats the threshold and no bound of a number says so: the
/// result is prefilter_bound_bits(threshold), which also lets the threshold's ties through, and
/// `numbers_exact` is false. A NaN passes either bound (unordered comparisons); the test is
/// exact for NaN as well only when NaN beats the threshold (p.nan_score > threshold).
template <class Traits>
ATTNKIT_HD std::uint32_t prefilter_tight_bound_bits(std::uint32_t threshold, ScoreParams p,
                                                    bool& numbers_exact) {
  const std::uint32_t best_asc =
      p.flip == 0 ? Traits::kSign + Traits::kInf : Traits::kSign - Traits::kInf;
  numbers_exact = threshold < (best_asc ^ p.flip);
  if (numbers_exact) return prefilter_bound_bits<Traits>(threshold + 1u, p);
  return prefilter_bound_bits<Traits>(threshold, p);
}

}  // namespace attnkit::detail
