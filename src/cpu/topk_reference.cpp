// SPDX-License-Identifier: Apache-2.0
// The reference CPU top-k (TopkBackend::kReference): per row, a stable sort of the selectable
// elements by score, the first k kept. Slow and obviously right; the tests and the fuzzer hold
// the fast paths to it.
#include <algorithm>
#include <cstdint>
#include <new>
#include <vector>

#include "attnkit/error.hpp"
#include "common/topk_keys.hpp"
#include "core/backends.hpp"
#include "cpu/topk_common.hpp"

namespace attnkit::detail {
namespace {

template <class Traits>
void reference_rows(const TopkProblem& p) {
  using Bits = typename Traits::Bits;
  const ScoreParams sp = make_score_params<Traits>(p.largest, p.nan == NanPolicy::kIgnore);
  struct Item {
    std::uint32_t score;
    std::uint32_t col;
  };
  // Reserved for the longest range before any row is written, so that running out of memory
  // leaves the outputs as they were.
  std::int64_t longest = 0;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const cpu::RowRange r = cpu::row_range(p, b);
    longest = std::max(longest, r.hi - r.lo);
  }
  const auto items_max = static_cast<std::size_t>(longest);
  const std::size_t cols_max = std::min(items_max, static_cast<std::size_t>(p.k));
  std::vector<Item> items;
  std::vector<std::uint32_t> cols;
  try {
    items.reserve(items_max);
    cols.reserve(cols_max);
  } catch (const std::bad_alloc&) {
    throw cpu::WorkingMemoryError(p, 1,
                                  items_max * sizeof(Item) + cols_max * sizeof(std::uint32_t));
  }
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const cpu::RowRange r = cpu::row_range(p, b);
    const Bits* row = static_cast<const Bits*>(p.x) + b * p.row_stride;
    items.clear();
    for (std::int64_t c = r.lo; c < r.hi; ++c) {
      const std::uint32_t s = score_of<Traits>(row[c], sp);
      if (s != kExcludedScore) items.push_back({s, static_cast<std::uint32_t>(c)});
    }
    std::stable_sort(items.begin(), items.end(),
                     [](const Item& u, const Item& v) { return u.score > v.score; });
    const std::size_t n = std::min<std::size_t>(items.size(), static_cast<std::size_t>(p.k));
    items.resize(n);
    if (p.order != TopkOrder::kValue) {
      std::sort(items.begin(), items.end(),
                [](const Item& u, const Item& v) { return u.col < v.col; });
    }
    cols.resize(n);
    for (std::size_t i = 0; i < n; ++i) cols[i] = items[i].col;
    cpu::write_row<Bits>(p, b, cols.data(), static_cast<std::int64_t>(n));
  }
}

}  // namespace

void cpu_topk_reference(const TopkProblem& p) {
  if (p.k == 0) return;
  switch (p.dtype) {
    case DType::kFloat32: return reference_rows<Float32Traits>(p);
    case DType::kBFloat16: return reference_rows<BFloat16Traits>(p);
    case DType::kFloat16: return reference_rows<Float16Traits>(p);
    default: break;
  }
  throw Error(ErrorCode::kInternal, "cpu topk reference: unexpected dtype after checks");
}

}  // namespace attnkit::detail
