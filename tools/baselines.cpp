// SPDX-License-Identifier: Apache-2.0
#include "baselines.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "attnkit/error.hpp"
#include "common/float_bits.hpp"
#include "core/thread_pool.hpp"

namespace attnkit::tools {
namespace {

float load_float(const void* row, DType dtype, std::int64_t i) {
  switch (dtype) {
    case DType::kFloat32: return static_cast<const float*>(row)[i];
    case DType::kBFloat16:
      return detail::bf16_bits_to_float(static_cast<const std::uint16_t*>(row)[i]);
    case DType::kFloat16:
      return detail::f16_bits_to_float(static_cast<const std::uint16_t*>(row)[i]);
    default: return 0.0f;
  }
}

}  // namespace

Baseline parse_baseline(const std::string& name) {
  if (name == "nth_element") return Baseline::kNthElement;
  if (name == "partial_sort") return Baseline::kPartialSort;
  throw Error(ErrorCode::kValue,
              "baseline: method = \"" + name + "\"; expected \"nth_element\" or \"partial_sort\"");
}

void baseline_topk(const TensorView& x, const TensorView& out_indices,
                   const TensorView& out_values, std::int64_t k, Baseline method,
                   bool sort_values) {
  if (x.ndim != 2 || x.device.type != DeviceType::kCPU || x.strides[1] != 1 ||
      out_indices.dtype != DType::kInt64 || out_values.dtype != x.dtype) {
    throw Error(ErrorCode::kValue,
                "baseline: expects CPU x [B, N] with contiguous rows, int64 indices and values "
                "of x's dtype");
  }
  const std::int64_t batch = x.shape[0], n = x.shape[1];
  k = std::min(k, n);
  const std::size_t elem = dtype_size(x.dtype);
  using Pair = std::pair<float, std::int32_t>;
  // Larger value first, then lower index: a strict weak order on numbers.
  const auto better = [](const Pair& a, const Pair& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  detail::ThreadPool::global().parallel_for(batch, [&](std::int64_t b) {
    thread_local std::vector<Pair> pairs;
    const char* row = static_cast<const char*>(x.data) + b * x.strides[0] * elem;
    pairs.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
      pairs[static_cast<std::size_t>(i)] = {load_float(row, x.dtype, i),
                                            static_cast<std::int32_t>(i)};
    }
    const auto first = pairs.begin(), kth = pairs.begin() + k;
    if (method == Baseline::kPartialSort) {
      std::partial_sort(first, kth, pairs.end(), better);
    } else {
      if (k > 0 && k < n) std::nth_element(first, kth - 1, pairs.end(), better);
      if (sort_values) std::sort(first, kth, better);
    }
    auto* idx = static_cast<std::int64_t*>(out_indices.data) + b * out_indices.strides[0];
    char* val = static_cast<char*>(out_values.data) + b * out_values.strides[0] * elem;
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int32_t c = pairs[static_cast<std::size_t>(j)].second;
      idx[j] = c;
      std::memcpy(val + j * elem, row + c * elem, elem);
    }
  });
}

}  // namespace attnkit::tools
