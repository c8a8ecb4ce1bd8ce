// SPDX-License-Identifier: Apache-2.0
// Shared pieces of the top-k tests and of the top-k fuzzer: seeded input generators, the layouts
// a case can take, an independent float64 reference and the checks that hold attnkit's output
// to it. The header does not use GoogleTest, so that tests/fuzz can share it: every check
// returns a description of what went wrong, empty when nothing did.
//
// The reference here deliberately shares no code with attnkit's selection: it decodes the bit
// patterns to double itself and orders by (preference, column), the order of a stable sort by
// preference, so a bug in the library's score function cannot hide in the expected results too.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "attnkit/attnkit.hpp"
#include "common/float_bits.hpp"
#include "common/topk_sample.hpp"

#if !defined(ATTNKIT_TOPK_TEST_NO_GTEST)
#include <gtest/gtest.h>
#endif

namespace attnkit_test {

using attnkit::CheckMode;
using attnkit::DType;
using attnkit::ErrorCode;
using attnkit::NanPolicy;
using attnkit::TensorView;
using attnkit::TiePolicy;
using attnkit::TopkBackend;
using attnkit::TopkOptions;
using attnkit::TopkOrder;
using attnkit::TopkTensors;

// Buffer::get/set move the low bytes of a uint64 with memcpy.
static_assert(std::endian::native == std::endian::little, "the test buffers assume little endian");

inline constexpr DType kFloatDTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

// ---------------------------------------------------------------------------------------------
// Bit patterns of the three float formats, decoded without attnkit's helpers
// ---------------------------------------------------------------------------------------------

struct Format {
  int exp_bits;
  int mant_bits;
};

inline Format format_of(DType d) {
  switch (d) {
    case DType::kBFloat16:
      return {8, 7};
    case DType::kFloat16:
      return {5, 10};
    default:
      return {8, 23};
  }
}

inline std::size_t float_bytes(DType d) { return d == DType::kFloat32 ? 4 : 2; }

inline std::uint32_t exp_mask(DType d) {
  const Format f = format_of(d);
  return ((1u << f.exp_bits) - 1u) << f.mant_bits;
}
inline std::uint32_t mant_mask(DType d) { return (1u << format_of(d).mant_bits) - 1u; }
inline std::uint32_t sign_bit(DType d) { return d == DType::kFloat32 ? 0x80000000u : 0x8000u; }
inline std::uint32_t inf_bits(DType d, bool negative) {
  return exp_mask(d) | (negative ? sign_bit(d) : 0u);
}

inline bool is_nan(DType d, std::uint32_t bits) {
  return (bits & exp_mask(d)) == exp_mask(d) && (bits & mant_mask(d)) != 0;
}

/// The real number a pattern stands for (NaN for every NaN; -0.0 for a negative zero), from
/// the format's definition: sign, biased exponent, implicit leading bit, subnormals.
inline double decode_by_definition(DType d, std::uint32_t bits) {
  const Format f = format_of(d);
  const bool negative = (bits & sign_bit(d)) != 0;
  const std::uint32_t e = (bits & exp_mask(d)) >> f.mant_bits;
  const std::uint32_t m = bits & mant_mask(d);
  const int bias = (1 << (f.exp_bits - 1)) - 1;
  double mag;
  if (e == (1u << f.exp_bits) - 1u) {
    mag =
        m != 0 ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (e == 0) {
    mag = std::ldexp(static_cast<double>(m), 1 - bias - f.mant_bits);
  } else {
    mag = std::ldexp(static_cast<double>(m | (1u << f.mant_bits)),
                     static_cast<int>(e) - bias - f.mant_bits);
  }
  return negative ? -mag : mag;
}

/// decode_by_definition, fast: float32 and bfloat16 (the top half of a float32) widen through
/// the host's float, float16 reads a table built once from the definition.
inline double decode(DType d, std::uint32_t bits) {
  if (d == DType::kFloat16) {
    static const std::vector<double> table = [] {
      std::vector<double> t(65536);
      for (std::uint32_t b = 0; b < 65536; ++b) t[b] = decode_by_definition(DType::kFloat16, b);
      return t;
    }();
    return table[bits & 0xFFFFu];
  }
  const std::uint32_t f32 = d == DType::kBFloat16 ? bits << 16 : bits;
  float f;
  std::memcpy(&f, &f32, sizeof f);
  return static_cast<double>(f);
}

/// The pattern of `v` when the format holds it exactly; nullopt otherwise (and for NaN).
inline std::optional<std::uint32_t> encode_exact(DType d, double v) {
  if (std::isnan(v)) return std::nullopt;
  const Format f = format_of(d);
  const std::uint32_t sign = std::signbit(v) ? sign_bit(d) : 0u;
  const double a = std::fabs(v);
  if (std::isinf(a)) return sign | exp_mask(d);
  if (a == 0.0) return sign;
  const int bias = (1 << (f.exp_bits - 1)) - 1;
  int exp2 = 0;
  (void)std::frexp(a, &exp2);  // a = fr * 2^exp2 with fr in [0.5, 1)
  const int unbiased = exp2 - 1;
  const int e = unbiased + bias;
  if (e >= (1 << f.exp_bits) - 1) return std::nullopt;
  if (e <= 0) {
    const double m = std::ldexp(a, bias - 1 + f.mant_bits);
    if (m != std::floor(m) || m >= std::ldexp(1.0, f.mant_bits)) return std::nullopt;
    return sign | static_cast<std::uint32_t>(m);
  }
  const double m = std::ldexp(a, f.mant_bits - unbiased);
  if (m != std::floor(m)) return std::nullopt;
  return sign | (static_cast<std::uint32_t>(e) << f.mant_bits) |
         (static_cast<std::uint32_t>(m) - (1u << f.mant_bits));
}

/// Rounds a float into the format: generators only (the reference never encodes).
inline std::uint32_t round_to(DType d, float v) {
  switch (d) {
    case DType::kBFloat16:
      return attnkit::detail::float_to_bf16_bits(v);
    case DType::kFloat16:
      return attnkit::detail::float_to_f16_bits(v);
    default:
      return attnkit::detail::float_to_bits(v);
  }
}

/// NaN patterns of both signs, quiet and signalling, smallest and largest payloads.
inline std::vector<std::uint32_t> nan_payloads(DType d) {
  switch (d) {
    case DType::kBFloat16:
      return {0x7FC0u, 0xFFC0u, 0x7F81u, 0x7FBFu, 0xFFFFu, 0x7FD3u, 0xFF81u};
    case DType::kFloat16:
      return {0x7E00u, 0xFE00u, 0x7C01u, 0x7DFFu, 0xFFFFu, 0x7E5Au, 0xFC01u};
    default:
      return {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0x7FBFFFFFu,
              0xFFFFFFFFu, 0x7FC12345u, 0xFF800001u};
  }
}

inline std::string hex(std::uint64_t v) {
  std::ostringstream s;
  s << "0x" << std::hex << v;
  return s.str();
}

// ---------------------------------------------------------------------------------------------
// Ordering keys of the reference
// ---------------------------------------------------------------------------------------------

/// An element as a real number, with NaN above +inf (the nan = "largest" order).
struct Key {
  bool nan;
  double v;
};

inline Key key_of(DType d, std::uint32_t bits) {
  const bool n = is_nan(d, bits);
  return {n, n ? 0.0 : decode(d, bits)};
}

/// a < b in the real order; -0.0 and +0.0 compare equal because doubles do.
inline bool key_below(Key a, Key b) {
  if (a.nan || b.nan) return !a.nan && b.nan;
  return a.v < b.v;
}
inline bool key_equal(Key a, Key b) { return !key_below(a, b) && !key_below(b, a); }
/// a is a strictly better choice than b.
inline bool preferred(Key a, Key b, bool largest) {
  return largest ? key_below(b, a) : key_below(a, b);
}

// ---------------------------------------------------------------------------------------------
// Raw buffers
// ---------------------------------------------------------------------------------------------

/// `count` elements of `elem` bytes each, every byte set to `fill` at first. Elements are
/// addressed by position, so views may start at any element (unaligned base pointers).
class Buffer {
 public:
  Buffer() = default;
  Buffer(std::size_t elem, std::int64_t count, std::uint8_t fill)
      : elem_(elem),
        count_(count),
        words_((elem * static_cast<std::size_t>(std::max<std::int64_t>(count, 0)) + 7) / 8 + 1) {
    std::memset(words_.data(), fill, words_.size() * 8);
  }

  std::int64_t size() const { return count_; }
  std::size_t elem() const { return elem_; }
  void* at(std::int64_t i) { return bytes() + static_cast<std::size_t>(i) * elem_; }
  const void* at(std::int64_t i) const { return bytes() + static_cast<std::size_t>(i) * elem_; }
  // Fixed-size copies compile to plain loads and stores (a variable-size memcpy would be a
  // call, and an intercepted one under ASan).
  std::uint64_t get(std::int64_t i) const {
    const void* p = at(i);
    switch (elem_) {
      case 2:
        return load<std::uint16_t>(p);
      case 4:
        return load<std::uint32_t>(p);
      case 8:
        return load<std::uint64_t>(p);
      default:
        return load<std::uint8_t>(p);
    }
  }
  void set(std::int64_t i, std::uint64_t v) {
    void* p = at(i);
    switch (elem_) {
      case 2:
        store(p, static_cast<std::uint16_t>(v));
        break;
      case 4:
        store(p, static_cast<std::uint32_t>(v));
        break;
      case 8:
        store(p, v);
        break;
      default:
        store(p, static_cast<std::uint8_t>(v));
        break;
    }
  }
  /// Signed view of a 4- or 8-byte element.
  std::int64_t get_int(std::int64_t i) const {
    const std::uint64_t v = get(i);
    return elem_ == 4 ? static_cast<std::int32_t>(static_cast<std::uint32_t>(v))
                      : static_cast<std::int64_t>(v);
  }
  bool same_bytes(const Buffer& o) const {
    return elem_ == o.elem_ && count_ == o.count_ &&
           std::memcmp(words_.data(), o.words_.data(), words_.size() * 8) == 0;
  }
  /// First element whose bytes differ, or -1.
  std::int64_t first_difference(const Buffer& o) const {
    for (std::int64_t i = 0; i < std::min(count_, o.count_); ++i) {
      if (get(i) != o.get(i)) return i;
    }
    return count_ == o.count_ ? -1 : std::min(count_, o.count_);
  }

 private:
  template <class T>
  static std::uint64_t load(const void* p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  template <class T>
  static void store(void* p, T v) {
    std::memcpy(p, &v, sizeof v);
  }
  unsigned char* bytes() { return reinterpret_cast<unsigned char*>(words_.data()); }
  const unsigned char* bytes() const {
    return reinterpret_cast<const unsigned char*>(words_.data());
  }

  std::size_t elem_ = 1;
  std::int64_t count_ = 0;
  std::vector<std::uint64_t> words_;
};

/// What output buffers hold before a call; 0xA5 is not -1, not a small index and not a
/// default fill in any dtype.
inline constexpr std::uint8_t kPoison = 0xA5;
/// Elements of poison kept before and after every output, to catch writes past a row.
inline constexpr std::int64_t kGuard = 8;

// ---------------------------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------------------------

enum class Dist : std::uint8_t {
  kNormalMilli,     // normal, sigma 1e-3
  kNormal,          // normal, sigma 1
  kNormalKilo,      // normal, sigma 1e3
  kFewDistinct,     // 4 distinct values: massive ties
  kAllEqual,        // one value everywhere
  kSignedZeros,     // mostly +0.0 and -0.0, a few small numbers
  kWithInf,         // normal with 15% +inf and 15% -inf
  kWithNan,         // normal with planted NaNs of every sign and payload, and some infs
  kMostlyNan,       // 90% NaN: a selection whose k-th best so far is a NaN
  kDenormals,       // subnormals of both signs, zeros and the smallest normals
  kAscending,       // a sorted row, the filter's worst case (the threshold rises every step)
  kDescending,      // the reverse
  kRawBits,         // uniform over all bit patterns
  kPeriodicSpikes,  // +-1000 spikes every 64 columns: an evenly spaced sample sees only them
  kFuzzBytes,       // the fuzzer's bytes, repeated
  kMostlyNegInf,    // 99.7% -inf, a few NaNs and normals: a sampled floor of -inf itself
  kCpuSampleBait,   // normal, +-1000 spikes exactly at the CPU floor's sampled columns
  kAllNan,          // NaNs of every sign and payload only: nan="ignore" leaves nothing to take
};

inline constexpr Dist kAllDists[] = {
    Dist::kNormalMilli, Dist::kNormal,         Dist::kNormalKilo, Dist::kFewDistinct,
    Dist::kAllEqual,    Dist::kSignedZeros,    Dist::kWithInf,    Dist::kWithNan,
    Dist::kMostlyNan,   Dist::kDenormals,      Dist::kAscending,  Dist::kDescending,
    Dist::kRawBits,     Dist::kPeriodicSpikes,
};
inline constexpr std::size_t kNumDists = sizeof(kAllDists) / sizeof(kAllDists[0]);

inline const char* dist_name(Dist d) {
  switch (d) {
    case Dist::kNormalMilli:
      return "normal(1e-3)";
    case Dist::kNormal:
      return "normal(1)";
    case Dist::kNormalKilo:
      return "normal(1e3)";
    case Dist::kFewDistinct:
      return "few_distinct";
    case Dist::kAllEqual:
      return "all_equal";
    case Dist::kSignedZeros:
      return "signed_zeros";
    case Dist::kWithInf:
      return "with_inf";
    case Dist::kWithNan:
      return "with_nan";
    case Dist::kMostlyNan:
      return "mostly_nan";
    case Dist::kDenormals:
      return "denormals";
    case Dist::kAscending:
      return "ascending";
    case Dist::kDescending:
      return "descending";
    case Dist::kRawBits:
      return "raw_bits";
    case Dist::kPeriodicSpikes:
      return "periodic_spikes";
    case Dist::kFuzzBytes:
      return "fuzz_bytes";
    case Dist::kMostlyNegInf:
      return "mostly_neg_inf";
    case Dist::kCpuSampleBait:
      return "cpu_sample_bait";
    case Dist::kAllNan:
      return "all_nan";
  }
  return "?";
}

/// A small, fast generator (splitmix64) for the standard distributions: seeding is one hash,
/// so every row can have a stream of its own.
class Rng {
 public:
  using result_type = std::uint64_t;
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  static constexpr result_type min() { return 0; }
  static constexpr result_type max() { return ~result_type{0}; }
  result_type operator()() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

 private:
  std::uint64_t state_;
};

/// One generator stream per (seed, row, purpose): a row's contents do not depend on how many
/// other rows a case has, and each seed reruns the same case.
inline Rng stream(std::uint64_t seed, std::uint64_t row, std::uint64_t salt) {
  Rng mix(seed * 0x100000001B3ull ^ (row + 0x51ED270B27ull) * 0x9E3779B97F4A7C15ull ^ salt);
  (void)mix();
  return Rng(mix());
}

/// Fills out[0, n) with row `row` of distribution `dist`.
inline void generate_row(Dist dist, DType d, std::uint64_t seed, std::uint64_t row, std::int64_t n,
                         std::uint32_t* out, const std::vector<std::uint8_t>* bytes = nullptr) {
  Rng rng = stream(seed, row, 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const auto nan_list = nan_payloads(d);
  auto normal_bits = [&](float scale) { return round_to(d, normal(rng) * scale); };
  switch (dist) {
    case Dist::kNormalMilli:
    case Dist::kNormal:
    case Dist::kNormalKilo: {
      const float scale = dist == Dist::kNormalMilli ? 1e-3f : dist == Dist::kNormal ? 1.0f : 1e3f;
      for (std::int64_t i = 0; i < n; ++i) out[i] = normal_bits(scale);
      break;
    }
    case Dist::kFewDistinct: {
      const std::uint32_t values[4] = {normal_bits(1.0f), normal_bits(1.0f), normal_bits(1.0f),
                                       normal_bits(1.0f)};
      for (std::int64_t i = 0; i < n; ++i) out[i] = values[rng() % 4];
      break;
    }
    case Dist::kAllEqual: {
      const std::uint32_t v = rng() % 4 == 0 ? 0u : normal_bits(1.0f);
      for (std::int64_t i = 0; i < n; ++i) out[i] = v;
      break;
    }
    case Dist::kSignedZeros:
      for (std::int64_t i = 0; i < n; ++i) {
        const double u = unit(rng);
        out[i] = u < 0.4 ? 0u : u < 0.8 ? sign_bit(d) : normal_bits(1e-2f);
      }
      break;
    case Dist::kWithInf:
      for (std::int64_t i = 0; i < n; ++i) {
        const double u = unit(rng);
        out[i] = u < 0.15 ? inf_bits(d, false) : u < 0.3 ? inf_bits(d, true) : normal_bits(1.0f);
      }
      break;
    case Dist::kWithNan:
      for (std::int64_t i = 0; i < n; ++i) {
        const double u = unit(rng);
        out[i] = u < 0.12   ? nan_list[rng() % nan_list.size()]
                 : u < 0.15 ? inf_bits(d, rng() % 2 == 0)
                            : normal_bits(1.0f);
      }
      break;
    case Dist::kMostlyNan:
      for (std::int64_t i = 0; i < n; ++i) {
        out[i] = unit(rng) < 0.9 ? nan_list[rng() % nan_list.size()] : normal_bits(1.0f);
      }
      break;
    case Dist::kAllNan:
      for (std::int64_t i = 0; i < n; ++i) out[i] = nan_list[rng() % nan_list.size()];
      break;
    case Dist::kMostlyNegInf:
      for (std::int64_t i = 0; i < n; ++i) {
        const double u = unit(rng);
        out[i] = u < 0.997   ? inf_bits(d, true)
                 : u < 0.998 ? nan_list[rng() % nan_list.size()]
                             : normal_bits(1.0f);
      }
      break;
    case Dist::kDenormals:
      for (std::int64_t i = 0; i < n; ++i) {
        const double u = unit(rng);
        const std::uint32_t sign = rng() % 2 ? sign_bit(d) : 0u;
        std::uint32_t mag;
        if (u < 0.7) {
          mag = 1u + static_cast<std::uint32_t>(rng() % mant_mask(d));  // subnormal
        } else if (u < 0.8) {
          mag = 0u;
        } else {
          // The smallest normals, right above the subnormal range.
          mag = (1u << format_of(d).mant_bits) + static_cast<std::uint32_t>(rng() % 4);
        }
        out[i] = sign | mag;
      }
      break;
    case Dist::kAscending:
    case Dist::kDescending: {
      std::vector<std::pair<double, std::uint32_t>> v(static_cast<std::size_t>(n));
      for (auto& e : v) {
        e.second = normal_bits(1.0f);
        e.first = decode(d, e.second);
      }
      const bool up = dist == Dist::kAscending;
      std::stable_sort(v.begin(), v.end(), [&](const auto& a, const auto& b) {
        return up ? a.first < b.first : a.first > b.first;
      });
      for (std::int64_t i = 0; i < n; ++i) out[i] = v[static_cast<std::size_t>(i)].second;
      break;
    }
    case Dist::kRawBits:
      for (std::int64_t i = 0; i < n; ++i) {
        out[i] = static_cast<std::uint32_t>(rng()) & (d == DType::kFloat32 ? 0xFFFFFFFFu : 0xFFFFu);
      }
      break;
    case Dist::kCpuSampleBait: {
      // The sample sees only spikes, and the row holds no others: a floor at the sample's
      // rank-th best spike admits about that rank of elements, fewer than k.
      for (std::int64_t i = 0; i < n; ++i) out[i] = normal_bits(1.0f);
      if (n < attnkit::detail::kCpuSampleShortRow) break;
      const std::int64_t samples = attnkit::detail::cpu_floor_samples(n);
      for (std::int64_t j = 0; j < samples; ++j) {
        const float mag = 1000.0f * (1.0f + static_cast<float>(unit(rng)));
        out[attnkit::detail::cpu_floor_sample_column(j, n, samples)] =
            round_to(d, rng() % 2 ? mag : -mag);
      }
      break;
    }
    case Dist::kPeriodicSpikes:
      for (std::int64_t i = 0; i < n; ++i) {
        if (i % 64 == 32) {
          const float mag = 1000.0f * (1.0f + static_cast<float>(unit(rng)));
          out[i] = round_to(d, rng() % 2 ? mag : -mag);
        } else {
          out[i] = normal_bits(1.0f);
        }
      }
      break;
    case Dist::kFuzzBytes: {
      const std::size_t eb = float_bytes(d);
      const std::size_t len = bytes ? bytes->size() : 0;
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint32_t v = 0;
        for (std::size_t j = 0; j < eb && len > 0; ++j) {
          const std::size_t at = (static_cast<std::size_t>(row * static_cast<std::uint64_t>(n) +
                                                           static_cast<std::uint64_t>(i)) *
                                      eb +
                                  j) %
                                 len;
          v |= std::uint32_t{(*bytes)[at]} << (8 * j);
        }
        out[i] = v;
      }
      break;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------------------------

enum class XLayout : std::uint8_t {
  kContiguous,  // row stride N
  kPadded,      // row stride N + row_pad, the gap filled with values that would win
  kBroadcast,   // row stride 0: every row reads the same memory
  kNegative,    // row stride -(N + row_pad): row 0 is the last in memory
};

enum class Ranges : std::uint8_t { kNone, kBegin, kEnd, kBoth };

inline const char* layout_name(XLayout l) {
  switch (l) {
    case XLayout::kContiguous:
      return "contiguous";
    case XLayout::kPadded:
      return "padded";
    case XLayout::kBroadcast:
      return "broadcast";
    case XLayout::kNegative:
      return "negative";
  }
  return "?";
}
inline const char* ranges_name(Ranges r) {
  switch (r) {
    case Ranges::kNone:
      return "none";
    case Ranges::kBegin:
      return "begin";
    case Ranges::kEnd:
      return "end";
    case Ranges::kBoth:
      return "begin+end";
  }
  return "?";
}
inline const char* order_name(TopkOrder o) {
  switch (o) {
    case TopkOrder::kNone:
      return "none";
    case TopkOrder::kIndex:
      return "index";
    case TopkOrder::kValue:
      return "value";
  }
  return "?";
}
inline const char* nan_name(NanPolicy n) {
  switch (n) {
    case NanPolicy::kLargest:
      return "largest";
    case NanPolicy::kIgnore:
      return "ignore";
    case NanPolicy::kRaise:
      return "raise";
  }
  return "?";
}
inline const char* ties_name(TiePolicy t) {
  return t == TiePolicy::kLowestIndex ? "lowest_index" : "any";
}
inline const char* check_name(CheckMode c) {
  switch (c) {
    case CheckMode::kDefault:
      return "default";
    case CheckMode::kOn:
      return "on";
    case CheckMode::kOff:
      return "off";
  }
  return "?";
}

inline constexpr TopkOrder kAllOrders[] = {TopkOrder::kNone, TopkOrder::kIndex, TopkOrder::kValue};
inline constexpr NanPolicy kAllNanPolicies[] = {NanPolicy::kLargest, NanPolicy::kIgnore,
                                                NanPolicy::kRaise};
inline constexpr TiePolicy kAllTiePolicies[] = {TiePolicy::kLowestIndex, TiePolicy::kAny};

/// Everything that defines one top-k call. Per-row values are generated from the seed unless
/// given explicitly.
struct TopkCase {
  DType dtype = DType::kFloat32;
  Dist dist = Dist::kNormal;
  std::uint64_t seed = 1;
  std::int64_t batch = 1;
  std::int64_t n = 1;
  std::int64_t k = 1;
  bool one_dim = false;  // x is [N] (batch must be 1), outputs [k]

  XLayout layout = XLayout::kContiguous;
  std::int64_t row_pad = 5;   // gap between rows for kPadded and kNegative
  std::int64_t x_offset = 0;  // elements before x's first: 1, 3, 7 give unaligned bases

  Ranges ranges = Ranges::kNone;
  DType begin_dtype = DType::kInt64;
  DType end_dtype = DType::kInt64;
  std::int64_t range_stride = 1;  // element stride of begin/end/index_offset
  bool with_offset = false;
  DType offset_dtype = DType::kInt64;
  std::vector<std::int64_t> begin_values, end_values, offset_values;  // explicit when non-empty

  DType index_dtype = DType::kInt64;
  bool return_values = true;
  std::int64_t out_pad = 0;  // output row stride = k + out_pad

  bool largest = true;
  TopkOrder sorted = TopkOrder::kNone;
  NanPolicy nan = NanPolicy::kLargest;
  TiePolicy ties = TiePolicy::kLowestIndex;
  std::int64_t index_fill = -1;
  std::optional<double> value_fill;
  CheckMode check = CheckMode::kDefault;

  const std::vector<std::uint8_t>* bytes = nullptr;  // source of Dist::kFuzzBytes

  TopkOptions options(TopkBackend backend) const {
    TopkOptions o;
    o.k = k;
    o.largest = largest;
    o.sorted = sorted;
    o.nan = nan;
    o.ties = ties;
    o.index_fill = index_fill;
    o.value_fill = value_fill;
    o.check = check;
    o.backend = backend;
    return o;
  }

  std::string describe() const {
    std::ostringstream s;
    s << "dtype=" << attnkit::dtype_name(dtype) << " dist=" << dist_name(dist) << " seed=" << seed
      << " B=" << batch << " N=" << n << " k=" << k << (one_dim ? " x=[N]" : "")
      << " largest=" << largest << " sorted=" << order_name(sorted) << " nan=" << nan_name(nan)
      << " ties=" << ties_name(ties) << " x_layout=" << layout_name(layout);
    if (layout == XLayout::kPadded || layout == XLayout::kNegative) s << "(+" << row_pad << ")";
    s << " x_offset=" << x_offset << " ranges=" << ranges_name(ranges);
    if (ranges == Ranges::kBegin || ranges == Ranges::kBoth) {
      s << " begin=" << attnkit::dtype_name(begin_dtype);
    }
    if (ranges == Ranges::kEnd || ranges == Ranges::kBoth) {
      s << " end=" << attnkit::dtype_name(end_dtype);
    }
    if (with_offset) s << " index_offset=" << attnkit::dtype_name(offset_dtype);
    if (ranges != Ranges::kNone || with_offset) s << " row_value_stride=" << range_stride;
    auto list = [&](const char* name, const std::vector<std::int64_t>& v) {
      if (v.empty()) return;
      s << " " << name << "={";
      for (std::size_t i = 0; i < v.size() && i < 16; ++i) s << (i ? "," : "") << v[i];
      if (v.size() > 16) s << ",...";
      s << "}";
    };
    list("begin_values", begin_values);
    list("end_values", end_values);
    list("offset_values", offset_values);
    s << " indices=" << attnkit::dtype_name(index_dtype) << " values=" << return_values
      << " out_pad=" << out_pad << " index_fill=" << index_fill << " value_fill=";
    if (value_fill) {
      s << *value_fill;
    } else {
      s << "default";
    }
    s << " check=" << check_name(check);
    return s.str();
  }
};

// ---------------------------------------------------------------------------------------------
// Inputs and outputs of a case
// ---------------------------------------------------------------------------------------------

struct TopkInputs {
  Buffer x;
  std::int64_t x_first = 0;     // element of x's row 0, column 0
  std::int64_t row_stride = 0;  // elements
  Buffer begin, end, offset;
  // Per-row values as the case passes them (empty when the tensor is absent).
  std::vector<std::int64_t> begin_v, end_v, offset_v;

  std::uint32_t bits(std::int64_t b, std::int64_t c) const {
    return static_cast<std::uint32_t>(x.get(x_first + b * row_stride + c));
  }
};

namespace detail {

inline std::int64_t int_min(DType d) {
  return d == DType::kInt32 ? std::numeric_limits<std::int32_t>::min()
                            : std::numeric_limits<std::int64_t>::min();
}
inline std::int64_t int_max(DType d) {
  return d == DType::kInt32 ? std::numeric_limits<std::int32_t>::max()
                            : std::numeric_limits<std::int64_t>::max();
}

/// A per-row range that is valid, picked among the shapes that matter: full, empty, shorter
/// than k, a random window, a causal prefix, a suffix.
inline std::pair<std::int64_t, std::int64_t> random_range(Rng& rng, std::int64_t n,
                                                          std::int64_t k) {
  auto pick = [&](std::int64_t lo, std::int64_t hi) {  // uniform in [lo, hi]
    return lo + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(hi - lo + 1));
  };
  switch (rng() % 6) {
    case 0:
      return {0, n};
    case 1: {
      const std::int64_t at = pick(0, n);
      return {at, at};
    }
    case 2: {
      const std::int64_t len = pick(0, std::clamp<std::int64_t>(k - 1, 0, n));
      const std::int64_t lo = pick(0, n - len);
      return {lo, lo + len};
    }
    case 3: {
      std::int64_t a = pick(0, n), b = pick(0, n);
      if (a > b) std::swap(a, b);
      return {a, b};
    }
    case 4:
      return {0, pick(0, n)};
    default:
      return {pick(0, n), n};
  }
}

/// An index_offset for a row of columns [lo, hi) that keeps every index in the index dtype
/// and the offset in its own dtype, often right at an edge.
inline std::int64_t random_offset(Rng& rng, std::int64_t b, std::int64_t n, std::int64_t lo,
                                  std::int64_t hi, DType index_dtype, DType offset_dtype) {
  std::int64_t low =
      std::max(int_min(offset_dtype),
               index_dtype == DType::kInt32 ? int_min(DType::kInt32) - lo : int_min(DType::kInt64));
  std::int64_t high = int_max(offset_dtype);
  if (hi > lo) high = std::min(high, int_max(index_dtype) - (hi - 1));
  if (hi == lo) {
    // An empty row's offset is never applied, so any value of the dtype is allowed.
    low = int_min(offset_dtype);
    high = int_max(offset_dtype);
  }
  switch (rng() % 5) {
    case 0:
      return std::clamp<std::int64_t>(0, low, high);
    case 1:
      return std::clamp<std::int64_t>(b * n, low, high);  // batch folded into the index
    case 2:
      return low;
    case 3:
      return high;
    default: {
      const std::int64_t a = std::max<std::int64_t>(low, -(std::int64_t{1} << 40));
      const std::int64_t z = std::min<std::int64_t>(high, std::int64_t{1} << 40);
      return a + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(z - a + 1));
    }
  }
}

inline Buffer row_vector(DType d, std::int64_t batch, std::int64_t stride,
                         const std::vector<std::int64_t>& values) {
  // Unused slots between strided elements hold a value no rule accepts, so a stride mistake
  // shows up as an error or a wrong range.
  Buffer buf(d == DType::kInt32 ? 4 : 8, std::max<std::int64_t>(batch * stride, 1), 0);
  for (std::int64_t i = 0; i < buf.size(); ++i) {
    buf.set(i, static_cast<std::uint64_t>(std::int64_t{-123456789}));
  }
  for (std::int64_t b = 0; b < batch; ++b) {
    buf.set(b * stride, static_cast<std::uint64_t>(values[static_cast<std::size_t>(b)]));
  }
  return buf;
}

}  // namespace detail

inline TopkInputs make_inputs(const TopkCase& c) {
  TopkInputs in;
  const std::int64_t n = c.n;
  const std::int64_t pitch =
      c.layout == XLayout::kPadded || c.layout == XLayout::kNegative ? n + c.row_pad : n;
  const std::int64_t stored_rows =
      c.layout == XLayout::kBroadcast ? std::min<std::int64_t>(c.batch, 1) : c.batch;
  const std::int64_t span = stored_rows > 0 ? (stored_rows - 1) * pitch + n : 0;
  in.x = Buffer(float_bytes(c.dtype), c.x_offset + span + kGuard, 0);
  // Everything around the rows (before the base, gaps between rows, after the end) holds values
  // that would win any selection, so reading outside a row cannot go unnoticed.
  const std::uint32_t lure[3] = {nan_payloads(c.dtype)[0], inf_bits(c.dtype, false),
                                 inf_bits(c.dtype, true)};
  for (std::int64_t i = 0; i < in.x.size(); ++i) in.x.set(i, lure[i % 3]);
  switch (c.layout) {
    case XLayout::kContiguous:
    case XLayout::kPadded:
      in.row_stride = pitch;
      break;
    case XLayout::kBroadcast:
      in.row_stride = 0;
      break;
    case XLayout::kNegative:
      in.row_stride = -pitch;
      break;
  }
  in.x_first = c.x_offset +
               (c.layout == XLayout::kNegative && stored_rows > 0 ? (stored_rows - 1) * pitch : 0);
  std::vector<std::uint32_t> row(static_cast<std::size_t>(n));
  for (std::int64_t b = 0; b < stored_rows; ++b) {
    generate_row(c.dist, c.dtype, c.seed, static_cast<std::uint64_t>(b), n, row.data(), c.bytes);
    for (std::int64_t j = 0; j < n; ++j) {
      in.x.set(in.x_first + b * in.row_stride + j, row[static_cast<std::size_t>(j)]);
    }
  }

  // Per-row values.
  const bool has_begin = c.ranges == Ranges::kBegin || c.ranges == Ranges::kBoth;
  const bool has_end = c.ranges == Ranges::kEnd || c.ranges == Ranges::kBoth;
  std::vector<std::int64_t> lo(static_cast<std::size_t>(c.batch)), hi(lo.size());
  for (std::int64_t b = 0; b < c.batch; ++b) {
    Rng rng = stream(c.seed, static_cast<std::uint64_t>(b), 2);
    auto [l, h] = detail::random_range(rng, n, c.k);
    if (!has_begin) l = 0;
    if (!has_end) h = n;
    if (l > h) l = h;
    lo[static_cast<std::size_t>(b)] = l;
    hi[static_cast<std::size_t>(b)] = h;
  }
  if (has_begin) in.begin_v = c.begin_values.empty() ? lo : c.begin_values;
  if (has_end) in.end_v = c.end_values.empty() ? hi : c.end_values;
  if (c.with_offset) {
    if (!c.offset_values.empty()) {
      in.offset_v = c.offset_values;
    } else {
      in.offset_v.resize(static_cast<std::size_t>(c.batch));
      for (std::int64_t b = 0; b < c.batch; ++b) {
        Rng rng = stream(c.seed, static_cast<std::uint64_t>(b), 3);
        const auto i = static_cast<std::size_t>(b);
        in.offset_v[i] =
            detail::random_offset(rng, b, n, lo[i], hi[i], c.index_dtype, c.offset_dtype);
      }
    }
  }
  if (has_begin) in.begin = detail::row_vector(c.begin_dtype, c.batch, c.range_stride, in.begin_v);
  if (has_end) in.end = detail::row_vector(c.end_dtype, c.batch, c.range_stride, in.end_v);
  if (c.with_offset) {
    in.offset = detail::row_vector(c.offset_dtype, c.batch, c.range_stride, in.offset_v);
  }
  return in;
}

struct TopkOutputs {
  Buffer indices, values;   // values is empty when the case returns none
  std::int64_t stride = 0;  // row stride of both, elements
};

inline TopkOutputs make_outputs(const TopkCase& c, std::uint8_t poison = kPoison) {
  TopkOutputs out;
  out.stride = c.k + c.out_pad;
  const std::int64_t span = c.batch > 0 && c.k > 0 ? (c.batch - 1) * out.stride + c.k : 0;
  out.indices = Buffer(c.index_dtype == DType::kInt32 ? 4 : 8, span + 2 * kGuard, poison);
  if (c.return_values) out.values = Buffer(float_bytes(c.dtype), span + 2 * kGuard, poison);
  return out;
}

inline TopkTensors bind(const TopkCase& c, TopkInputs& in, TopkOutputs& out) {
  const attnkit::Device cpu{};
  TopkTensors t;
  void* x = in.x.at(in.x_first);
  t.x = c.one_dim ? TensorView::make(x, c.dtype, cpu, {c.n})
                  : TensorView::make(x, c.dtype, cpu, {c.batch, c.n}, {in.row_stride, 1});
  if (!in.begin_v.empty() || c.ranges == Ranges::kBegin || c.ranges == Ranges::kBoth) {
    t.begin = TensorView::make(in.begin.at(0), c.begin_dtype, cpu, {c.batch}, {c.range_stride});
  }
  if (!in.end_v.empty() || c.ranges == Ranges::kEnd || c.ranges == Ranges::kBoth) {
    t.end = TensorView::make(in.end.at(0), c.end_dtype, cpu, {c.batch}, {c.range_stride});
  }
  if (c.with_offset) {
    t.index_offset =
        TensorView::make(in.offset.at(0), c.offset_dtype, cpu, {c.batch}, {c.range_stride});
  }
  auto out_view = [&](Buffer& buf, DType d) {
    return c.one_dim ? TensorView::make(buf.at(kGuard), d, cpu, {c.k})
                     : TensorView::make(buf.at(kGuard), d, cpu, {c.batch, c.k}, {out.stride, 1});
  };
  t.out_indices = out_view(out.indices, c.index_dtype);
  if (c.return_values) t.out_values = out_view(out.values, c.dtype);
  return t;
}

struct CallResult {
  bool threw = false;
  ErrorCode code = ErrorCode::kInternal;
  std::string message;
};

inline std::string describe(const CallResult& r) {
  if (!r.threw) return "returned normally";
  return std::string("threw Error(") + attnkit::error_code_name(r.code) + "): " + r.message;
}

inline CallResult call_topk(const TopkCase& c, TopkInputs& in, TopkOutputs& out,
                            TopkBackend backend) {
  try {
    attnkit::topk(bind(c, in, out), c.options(backend));
  } catch (const attnkit::Error& e) {
    return {true, e.code(), e.what()};
  }
  return {};
}

// ---------------------------------------------------------------------------------------------
// The independent reference
// ---------------------------------------------------------------------------------------------

struct Expected {
  std::optional<ErrorCode> error;               // the call must throw this
  std::vector<std::int64_t> lo, hi;             // each row's valid range after clamping
  std::vector<std::vector<std::int64_t>> cols;  // selected columns in output order
  std::vector<std::int64_t> offset;             // index_offset per row, 0 when absent
};

/// The error the per-row rules call for (SPEC: 0 <= begin <= end <= N, indices fit the index
/// dtype), row by row as the rules read; nullopt when all rows pass.
inline std::optional<ErrorCode> row_value_error(const TopkCase& c, const TopkInputs& in) {
  for (std::int64_t b = 0; b < c.batch; ++b) {
    const auto i = static_cast<std::size_t>(b);
    const std::int64_t lo = in.begin_v.empty() ? 0 : in.begin_v[i];
    const std::int64_t hi = in.end_v.empty() ? c.n : in.end_v[i];
    if (lo < 0 || lo > c.n) return ErrorCode::kValue;
    if (hi < lo || hi > c.n) return ErrorCode::kValue;
    if (in.offset_v.empty() || hi == lo || c.k == 0) continue;
    const std::int64_t off = in.offset_v[i];
    std::int64_t first = 0, last = 0;
    if (__builtin_add_overflow(lo, off, &first) || __builtin_add_overflow(hi - 1, off, &last)) {
      return ErrorCode::kValue;
    }
    if (first < detail::int_min(c.index_dtype) || last > detail::int_max(c.index_dtype)) {
      return ErrorCode::kValue;
    }
  }
  return std::nullopt;
}

inline Expected reference_topk(const TopkCase& c, const TopkInputs& in) {
  Expected e;
  const bool check_on = c.check != CheckMode::kOff;  // kDefault means on for CPU tensors
  if (check_on) e.error = row_value_error(c, in);
  const auto rows = static_cast<std::size_t>(c.batch);
  e.lo.resize(rows);
  e.hi.resize(rows);
  e.offset.assign(rows, 0);
  e.cols.resize(rows);
  bool nan_in_range = false;
  struct Item {
    Key key;
    std::int64_t col;
  };
  std::vector<Item> items;
  for (std::size_t b = 0; b < rows; ++b) {
    // Unchecked per-row values are clamped, as topk.hpp documents.
    const std::int64_t hi = std::clamp<std::int64_t>(in.end_v.empty() ? c.n : in.end_v[b], 0, c.n);
    const std::int64_t lo = std::clamp<std::int64_t>(in.begin_v.empty() ? 0 : in.begin_v[b], 0, hi);
    e.lo[b] = lo;
    e.hi[b] = hi;
    if (!in.offset_v.empty()) e.offset[b] = in.offset_v[b];
    items.clear();
    for (std::int64_t col = lo; col < hi; ++col) {
      const Key key = key_of(c.dtype, in.bits(static_cast<std::int64_t>(b), col));
      nan_in_range |= key.nan;
      if (key.nan && c.nan == NanPolicy::kIgnore) continue;
      items.push_back({key, col});
    }
    // The first k of a stable sort by preference. Breaking every tie by the lower column
    // makes the order total, so a selection of the first k and a sort of them give exactly
    // those k, in that order, without sorting the whole row.
    auto before = [&](const Item& u, const Item& v) {
      return preferred(u.key, v.key, c.largest) ||
             (!preferred(v.key, u.key, c.largest) && u.col < v.col);
    };
    const std::size_t count = std::min<std::size_t>(items.size(), static_cast<std::size_t>(c.k));
    if (count < items.size()) {
      std::nth_element(items.begin(), items.begin() + static_cast<std::ptrdiff_t>(count),
                       items.end(), before);
      items.resize(count);
    }
    std::sort(items.begin(), items.end(), before);
    if (c.sorted != TopkOrder::kValue) {
      std::sort(items.begin(), items.end(),
                [](const Item& u, const Item& v) { return u.col < v.col; });
    }
    for (const Item& it : items) e.cols[b].push_back(it.col);
  }
  if (!e.error && c.nan == NanPolicy::kRaise && nan_in_range) e.error = ErrorCode::kNanFound;
  return e;
}

/// The value padding slots hold, in x's dtype.
inline std::optional<std::uint32_t> fill_bits(const TopkCase& c) {
  if (!c.value_fill) return inf_bits(c.dtype, c.largest);
  return encode_exact(c.dtype, *c.value_fill);
}

// ---------------------------------------------------------------------------------------------
// Checks
// ---------------------------------------------------------------------------------------------

/// Collects at most a few lines, so that a broken case reports its first mismatches only.
class Report {
 public:
  void add(const std::string& line) {
    if (lines_ < kMaxLines) text_ += "  " + line + "\n";
    ++lines_;
  }
  std::string str() const {
    if (lines_ <= kMaxLines) return text_;
    return text_ + "  ... " + std::to_string(lines_ - kMaxLines) + " more\n";
  }
  bool empty() const { return lines_ == 0; }

 private:
  static constexpr int kMaxLines = 12;
  std::string text_;
  int lines_ = 0;
};

/// Every output element is still poison: nothing was written.
inline std::string check_untouched(const TopkOutputs& out, std::uint8_t poison = kPoison) {
  Report r;
  auto scan = [&](const Buffer& buf, const char* name) {
    std::uint64_t p = 0;
    std::memset(&p, poison, buf.elem());
    for (std::int64_t i = 0; i < buf.size(); ++i) {
      if (buf.get(i) != p) {
        r.add(std::string(name) + " element " + std::to_string(i - kGuard) + " was written (" +
              hex(buf.get(i)) + ") although the call failed");
        return;
      }
    }
  };
  scan(out.indices, "out_indices");
  scan(out.values, "out_values");
  return r.str();
}

/// Compares one call's outputs with the reference. Rows: slots [0, count) hold the selection,
/// [count, k) padding; everything else in the buffers must still be poison.
inline std::string check_outputs(const TopkCase& c, const TopkInputs& in, const TopkOutputs& out,
                                 const Expected& e, std::uint8_t poison = kPoison) {
  Report r;
  const std::optional<std::uint32_t> vfill = fill_bits(c);
  if (c.return_values && !vfill) r.add("test bug: value_fill is not exact in the dtype");
  const bool int32_idx = c.index_dtype == DType::kInt32;
  // What the index dtype holds for a 64-bit index: int32 stores it modulo 2^32.
  auto stored_index = [&](std::int64_t v) {
    return int32_idx ? static_cast<std::int64_t>(static_cast<std::int32_t>(
                           static_cast<std::uint32_t>(static_cast<std::uint64_t>(v))))
                     : v;
  };
  // The column an output index names. Wrapping arithmetic: a wrong index must not overflow.
  auto column_of = [&](std::int64_t idx, std::int64_t off) {
    const std::uint64_t d = static_cast<std::uint64_t>(idx) - static_cast<std::uint64_t>(off);
    return int32_idx ? static_cast<std::int64_t>(static_cast<std::uint32_t>(d))
                     : static_cast<std::int64_t>(d);
  };
  for (std::int64_t b = 0; b < c.batch; ++b) {
    const auto bi = static_cast<std::size_t>(b);
    const std::vector<std::int64_t>& want = e.cols[bi];
    const auto count = static_cast<std::int64_t>(want.size());
    const std::int64_t off = e.offset[bi];
    const std::string row = "row " + std::to_string(b) + " [" + std::to_string(e.lo[bi]) + ", " +
                            std::to_string(e.hi[bi]) + ")";
    auto idx_at = [&](std::int64_t j) { return out.indices.get_int(kGuard + b * out.stride + j); };
    auto val_at = [&](std::int64_t j) {
      return static_cast<std::uint32_t>(out.values.get(kGuard + b * out.stride + j));
    };

    // Padding, always last.
    for (std::int64_t j = count; j < c.k; ++j) {
      if (idx_at(j) != stored_index(c.index_fill)) {
        r.add(row + " slot " + std::to_string(j) + ": index " + std::to_string(idx_at(j)) +
              ", expected padding index_fill " + std::to_string(stored_index(c.index_fill)));
      }
      if (c.return_values && vfill && val_at(j) != *vfill) {
        r.add(row + " slot " + std::to_string(j) + ": value bits " + hex(val_at(j)) +
              ", expected padding value_fill bits " + hex(*vfill));
      }
    }

    // The selection, as (column, value bits) read back from the outputs.
    std::vector<std::pair<std::int64_t, std::uint32_t>> got(static_cast<std::size_t>(count));
    for (std::int64_t j = 0; j < count; ++j) {
      got[static_cast<std::size_t>(j)] = {column_of(idx_at(j), off),
                                          c.return_values ? val_at(j) : 0u};
    }

    if (c.ties == TiePolicy::kLowestIndex) {
      std::vector<std::pair<std::int64_t, std::uint32_t>> sorted_got = got;
      std::vector<std::int64_t> sorted_want = want;
      // "none" promises a set, not an order: compare it sorted by column.
      if (c.sorted == TopkOrder::kNone) {
        std::sort(sorted_got.begin(), sorted_got.end());
        std::sort(sorted_want.begin(), sorted_want.end());
      }
      for (std::int64_t j = 0; j < count; ++j) {
        const auto ji = static_cast<std::size_t>(j);
        const std::int64_t col = sorted_want[ji];
        if (sorted_got[ji].first != col) {
          r.add(row + " slot " + std::to_string(j) + ": column " +
                std::to_string(sorted_got[ji].first) + ", expected " + std::to_string(col) +
                " (index_offset " + std::to_string(off) + ")");
        }
        if (c.return_values && sorted_got[ji].second != in.bits(b, col)) {
          r.add(row + " slot " + std::to_string(j) + ": value bits " + hex(sorted_got[ji].second) +
                ", expected " + hex(in.bits(b, col)) + " (x at column " + std::to_string(col) +
                ")");
        }
      }
    } else {
      // ties = "any": any valid top-k. Each index names a distinct selectable column of the
      // range, the value is that column's bits, the multiset of values equals the reference's,
      // and the requested order holds.
      std::vector<Key> keys_got, keys_want;
      std::vector<std::int64_t> cols_seen;
      for (std::int64_t j = 0; j < count; ++j) {
        const std::int64_t col = got[static_cast<std::size_t>(j)].first;
        if (col < e.lo[bi] || col >= e.hi[bi]) {
          r.add(row + " slot " + std::to_string(j) + ": column " + std::to_string(col) +
                " is outside the valid range");
          continue;
        }
        const std::uint32_t bits = in.bits(b, col);
        if (c.nan == NanPolicy::kIgnore && is_nan(c.dtype, bits)) {
          r.add(row + " slot " + std::to_string(j) + ": column " + std::to_string(col) +
                " holds a NaN although nan = ignore");
        }
        if (c.return_values && got[static_cast<std::size_t>(j)].second != bits) {
          r.add(row + " slot " + std::to_string(j) + ": value bits " +
                hex(got[static_cast<std::size_t>(j)].second) + " but x at column " +
                std::to_string(col) + " is " + hex(bits));
        }
        cols_seen.push_back(col);
        keys_got.push_back(key_of(c.dtype, bits));
      }
      std::vector<std::int64_t> dup = cols_seen;
      std::sort(dup.begin(), dup.end());
      if (std::adjacent_find(dup.begin(), dup.end()) != dup.end()) {
        r.add(row + ": a column is selected twice");
      }
      for (std::int64_t col : want) keys_want.push_back(key_of(c.dtype, in.bits(b, col)));
      std::sort(keys_got.begin(), keys_got.end(), key_below);
      std::sort(keys_want.begin(), keys_want.end(), key_below);
      bool same = keys_got.size() == keys_want.size();
      for (std::size_t i = 0; same && i < keys_got.size(); ++i)
        same = key_equal(keys_got[i], keys_want[i]);
      if (!same) r.add(row + ": the selected values are not the reference's multiset");
      for (std::size_t j = 1; j < cols_seen.size(); ++j) {
        const std::int64_t a = cols_seen[j - 1], z = cols_seen[j];
        const Key ka = key_of(c.dtype, in.bits(b, a)), kz = key_of(c.dtype, in.bits(b, z));
        const bool ok = c.sorted == TopkOrder::kIndex ? a < z
                        : c.sorted == TopkOrder::kValue
                            ? preferred(ka, kz, c.largest) || (key_equal(ka, kz) && a < z)
                            : true;
        if (!ok) {
          r.add(row + " slots " + std::to_string(j - 1) + ", " + std::to_string(j) + ": columns " +
                std::to_string(a) + ", " + std::to_string(z) +
                " break sorted = " + order_name(c.sorted));
        }
      }
    }
  }

  // Nothing outside the [B, k] slots may change.
  auto outside = [&](const Buffer& buf, const char* name) {
    std::uint64_t p = 0;
    std::memset(&p, poison, buf.elem());
    for (std::int64_t i = 0; i < buf.size(); ++i) {
      const std::int64_t rel = i - kGuard;
      const bool slot = rel >= 0 && c.k > 0 &&
                        rel / std::max<std::int64_t>(out.stride, 1) < c.batch &&
                        rel % std::max<std::int64_t>(out.stride, 1) < c.k;
      if (!slot && buf.get(i) != p) {
        r.add(std::string(name) + " element " + std::to_string(rel) +
              " lies outside every [B, k] slot but was written");
        return;
      }
    }
  };
  outside(out.indices, "out_indices");
  if (c.return_values) outside(out.values, "out_values");
  return r.str();
}

/// Checks one call against the reference: the expected error and untouched outputs, or the
/// expected outputs.
inline std::string check_call(const TopkCase& c, const TopkInputs& in, const TopkOutputs& out,
                              const CallResult& got, const Expected& e) {
  if (e.error) {
    if (!got.threw || got.code != *e.error) {
      return std::string("  expected Error(") + attnkit::error_code_name(*e.error) + "), " +
             describe(got) + "\n";
    }
    return check_untouched(out);
  }
  if (got.threw) return "  expected success, " + describe(got) + "\n";
  return check_outputs(c, in, out, e);
}

/// Runs a case on the fast path and on the reference backend, holds both to the independent
/// reference and to each other bit for bit. Returns "" when all holds, else what did not.
inline std::string run_topk_case(const TopkCase& c) {
  TopkInputs in = make_inputs(c);
  const Expected e = reference_topk(c, in);
  TopkOutputs fast = make_outputs(c), ref = make_outputs(c);
  const CallResult rf = call_topk(c, in, fast, TopkBackend::kAuto);
  const CallResult rr = call_topk(c, in, ref, TopkBackend::kReference);
  std::string report;
  const std::string fast_vs_expected = check_call(c, in, fast, rf, e);
  if (!fast_vs_expected.empty()) report += "fast path (backend auto):\n" + fast_vs_expected;
  if (rf.threw != rr.threw || rf.code != rr.code || rf.message != rr.message) {
    report += "fast path " + describe(rf) + " but reference backend " + describe(rr) + "\n";
  }
  const std::int64_t di = fast.indices.first_difference(ref.indices);
  const std::int64_t dv = fast.values.first_difference(ref.values);
  if (di >= 0 || dv >= 0) {
    report += "fast path and reference backend wrote different bits";
    if (di >= 0) {
      report += "; out_indices element " + std::to_string(di - kGuard) + ": " +
                hex(fast.indices.get(di)) + " vs " + hex(ref.indices.get(di));
    }
    if (dv >= 0) {
      report += "; out_values element " + std::to_string(dv - kGuard) + ": " +
                hex(fast.values.get(dv)) + " vs " + hex(ref.values.get(dv));
    }
    report += "\n";
  }
  if (!report.empty()) {
    const std::string ref_vs_expected = check_call(c, in, ref, rr, e);
    if (!ref_vs_expected.empty()) report += "reference backend:\n" + ref_vs_expected;
  }
  return report;
}

/// Runs a case once and returns its outputs, for bit-for-bit comparisons between runs.
inline TopkOutputs run_once(const TopkCase& c, TopkInputs& in, TopkBackend backend,
                            std::uint8_t poison = kPoison) {
  TopkOutputs out = make_outputs(c, poison);
  attnkit::topk(bind(c, in, out), c.options(backend));
  return out;
}

/// Outputs equal in every slot of the [B, k] rows (the buffers may differ outside them only
/// by their poison).
inline std::string compare_slots(const TopkCase& c, const TopkOutputs& a, const TopkOutputs& b) {
  Report r;
  for (std::int64_t row = 0; row < c.batch; ++row) {
    for (std::int64_t j = 0; j < c.k; ++j) {
      const std::int64_t i = kGuard + row * a.stride + j;
      if (a.indices.get(i) != b.indices.get(i)) {
        r.add("row " + std::to_string(row) + " slot " + std::to_string(j) + ": index " +
              hex(a.indices.get(i)) + " vs " + hex(b.indices.get(i)));
      }
      if (c.return_values && a.values.get(i) != b.values.get(i)) {
        r.add("row " + std::to_string(row) + " slot " + std::to_string(j) + ": value bits " +
              hex(a.values.get(i)) + " vs " + hex(b.values.get(i)));
      }
    }
  }
  return r.str();
}

/// Sizes just under a power of two: 2^p - 31.
inline std::int64_t under_pow2(int p) { return (std::int64_t{1} << p) - 31; }

/// The k axis of a row of n: 0, 1, mid, n and past n.
inline std::vector<std::int64_t> k_axis(std::int64_t n) {
  std::vector<std::int64_t> ks = {0, 1, n / 2, n, n + 7};
  std::sort(ks.begin(), ks.end());
  ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
  return ks;
}

// ---------------------------------------------------------------------------------------------
// GoogleTest glue (the fuzzer defines ATTNKIT_TOPK_TEST_NO_GTEST and has none)
// ---------------------------------------------------------------------------------------------
#if !defined(ATTNKIT_TOPK_TEST_NO_GTEST)

/// Runs the cases of one test, reporting each failing case with every parameter. After a few
/// failures it stops, so that the first failures are not buried under thousands like them.
class CaseChecker {
 public:
  CaseChecker() = default;
  CaseChecker(const CaseChecker&) = delete;
  CaseChecker& operator=(const CaseChecker&) = delete;
  ~CaseChecker() {
    // A sweep whose loops ran no case would pass without testing anything.
    EXPECT_GT(cases_, 0) << "the sweep generated no case";
  }

  void operator()(const TopkCase& c) {
    if (failures_ >= kMaxFailures) return;
    ++cases_;
    const std::string report = run_topk_case(c);
    if (report.empty()) return;
    ADD_FAILURE() << c.describe() << "\n" << report;
    if (++failures_ == kMaxFailures) {
      ADD_FAILURE() << "stopping this sweep after " << kMaxFailures << " failing cases";
    }
  }
  int cases() const { return cases_; }

 private:
  static constexpr int kMaxFailures = 10;
  int cases_ = 0;
  int failures_ = 0;
};

/// Runs `fn`, which must throw attnkit::Error with `code` and a message holding each of
/// `needles`.
template <class Fn>
void expect_throws(Fn&& fn, ErrorCode code, std::initializer_list<std::string> needles) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected " << attnkit::error_code_name(code);
  } catch (const attnkit::Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const std::string& needle : needles) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << "message \"" << e.what() << "\" does not contain \"" << needle << "\"";
    }
  }
}

template <class Fn>
void expect_throws(Fn&& fn, ErrorCode code, const std::string& needle) {
  expect_throws(std::forward<Fn>(fn), code, {needle});
}

/// Restores the CPU thread count when a test that changes it ends, however it ends.
class ThreadCountGuard {
 public:
  ThreadCountGuard() : saved_(attnkit::num_threads()) {}
  ~ThreadCountGuard() { attnkit::set_num_threads(saved_); }
  ThreadCountGuard(const ThreadCountGuard&) = delete;
  ThreadCountGuard& operator=(const ThreadCountGuard&) = delete;

 private:
  int saved_;
};

#endif  // !ATTNKIT_TOPK_TEST_NO_GTEST

}  // namespace attnkit_test
