// SPDX-License-Identifier: Apache-2.0
// Standard-library top-k baselines that `attnkit demo` and the benchmarks time beside attnkit:
// what a C++ user would write without a top-k library.
#pragma once

#include <cstdint>
#include <string>

#include "attnkit/tensor.hpp"

namespace attnkit::tools {

enum class Baseline {
  kNthElement,   ///< copy (value, index) pairs, std::nth_element, sort the k if asked
  kPartialSort,  ///< copy (value, index) pairs, std::partial_sort of the first k
};

/// "nth_element" or "partial_sort". \throws Error(kValue) otherwise.
Baseline parse_baseline(const std::string& name);

/// Largest-k of each row of x [B, N] (float32/bfloat16/float16, CPU, rows contiguous) into
/// out_indices [B, k] int64 and out_values [B, k] of x's dtype, rows spread over attnkit's
/// thread pool as the library spreads its own. NaN is not supported (the comparators need a
/// strict weak order). Ties are broken by lower index, like attnkit's default.
void baseline_topk(const TensorView& x, const TensorView& out_indices,
                   const TensorView& out_values, std::int64_t k, Baseline method,
                   bool sort_values);

}  // namespace attnkit::tools
