// SPDX-License-Identifier: Apache-2.0
// Running out of host memory in the CPU backend: every allocation a call makes is failed in
// turn (this binary replaces the global operator new), and each failing call must name the
// working buffers in its std::bad_alloc and leave the outputs exactly as they were, while the
// first call that gets all its memory returns the exact result; and a call whose memory does
// not grow with B stays under a cap on any one allocation. A separate binary, so that the
// replaced allocator touches no other test.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <new>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "attnkit/attnkit.hpp"

namespace {

std::atomic<bool> g_armed{false};
std::atomic<long> g_left{0};  // allocations that succeed before one fails, while armed
// Any allocation of more bytes fails (a memory limit that holds the call's fixed needs).
std::atomic<std::size_t> g_fail_above{~std::size_t{0}};

}  // namespace

void* operator new(std::size_t n) {
  if (n > g_fail_above.load(std::memory_order_relaxed)) throw std::bad_alloc();
  if (g_armed.load(std::memory_order_relaxed) &&
      g_left.fetch_sub(1, std::memory_order_relaxed) == 0) {
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
// GCC sees the replacement's own free() as a mismatch with the new it pairs with.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace {

using attnkit::DType;
using attnkit::TensorView;

struct Case {
  const char* name;
  std::int64_t batch, row_len, k;
  attnkit::TopkOrder order;
  attnkit::TopkBackend backend = attnkit::TopkBackend::kAuto;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class TopkOutOfMemory : public ::testing::TestWithParam<Case> {};

// What one call on a fresh thread (whose working buffers start empty) does when the
// allocation numbered `fail_at` fails: 1 when it threw std::bad_alloc, 0 when it returned.
int call_failing_at(long fail_at, const attnkit::TopkTensors& t, const attnkit::TopkOptions& o,
                    std::string& message) {
  int threw = 0;
  std::thread([&] {
    g_left.store(fail_at);
    g_armed.store(true);
    try {
      attnkit::topk(t, o);
    } catch (const std::bad_alloc& e) {
      g_armed.store(false);  // before the message is copied
      threw = 1;
      message = e.what();
    }
    g_armed.store(false);
  }).join();
  return threw;
}

TEST_P(TopkOutOfMemory, NothingIsWrittenWhenAnAllocationFails) {
  const Case c = GetParam();
  attnkit::set_num_threads(4);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<std::size_t>(c.batch * c.row_len));
  for (float& v : x) v = normal(rng);
  const auto out_len = static_cast<std::size_t>(c.batch * c.k);
  std::vector<float> want_values(out_len), values(out_len);
  std::vector<std::int64_t> want_indices(out_len), indices(out_len);
  const attnkit::Device cpu{};
  attnkit::TopkTensors t;
  t.x = TensorView::make(x.data(), DType::kFloat32, cpu, {c.batch, c.row_len});
  t.out_values = TensorView::make(want_values.data(), DType::kFloat32, cpu, {c.batch, c.k});
  t.out_indices = TensorView::make(want_indices.data(), DType::kInt64, cpu, {c.batch, c.k});
  attnkit::TopkOptions o;
  o.k = c.k;
  o.sorted = c.order;
  o.backend = attnkit::TopkBackend::kReference;
  attnkit::topk(t, o);
  o.backend = c.backend;
  t.out_values = TensorView::make(values.data(), DType::kFloat32, cpu, {c.batch, c.k});
  t.out_indices = TensorView::make(indices.data(), DType::kInt64, cpu, {c.batch, c.k});

  int failures = 0, named = 0;
  long fail_at = 0;
  for (;; ++fail_at) {
    ASSERT_LT(fail_at, 100000) << "the call never got all its memory";
    std::fill(values.begin(), values.end(), -7.0f);
    std::fill(indices.begin(), indices.end(), -7);
    std::string message;
    if (call_failing_at(fail_at, t, o, message) == 0) break;
    ++failures;
    named += message.find("k = " + std::to_string(c.k)) != std::string::npos;
    for (std::size_t i = 0; i < out_len; ++i) {
      ASSERT_EQ(values[i], -7.0f) << "allocation " << fail_at << " failed, slot " << i;
      ASSERT_EQ(indices[i], -7) << "allocation " << fail_at << " failed, slot " << i;
    }
  }
  EXPECT_GT(failures, 0) << "the call allocated nothing: the test exercised no failure";
  EXPECT_EQ(named, failures) << "a failure did not name the working buffers";
  EXPECT_EQ(values, want_values);
  EXPECT_EQ(indices, want_indices);
}

// Caps every allocation at `bytes` while in scope.
struct AllocationCap {
  explicit AllocationCap(std::size_t bytes) { g_fail_above.store(bytes); }
  ~AllocationCap() { g_fail_above.store(~std::size_t{0}); }
  AllocationCap(const AllocationCap&) = delete;
  AllocationCap& operator=(const AllocationCap&) = delete;
};

// nan = kRaise looks for the first row with a NaN without a buffer per row: over 2^22
// broadcast rows of one element (no outputs, k = 0) no allocation reaches 2 MiB.
TEST(TopkNanScanMemory, NoBufferPerRow) {
  const std::int64_t rows = std::int64_t{1} << 22;
  float nan_row[1] = {std::numeric_limits<float>::quiet_NaN()};
  float number_row[1] = {1.0f};
  const attnkit::Device cpu{};
  for (float* x : {nan_row, number_row}) {
    attnkit::TopkTensors t;
    t.x = TensorView::make(x, DType::kFloat32, cpu, {rows, 1}, {0, 1});
    t.out_indices = TensorView::make(nullptr, DType::kInt64, cpu, {rows, 0});
    attnkit::TopkOptions o;
    o.k = 0;
    o.nan = attnkit::NanPolicy::kRaise;
    bool out_of_memory = false, nan_found = false;
    try {
      const AllocationCap cap(std::size_t{2} << 20);
      attnkit::topk(t, o);
    } catch (const std::bad_alloc&) {
      out_of_memory = true;
    } catch (const attnkit::Error& e) {
      nan_found = e.code() == attnkit::ErrorCode::kNanFound;
    }
    EXPECT_FALSE(out_of_memory);
    EXPECT_EQ(nan_found, x == nan_row);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, TopkOutOfMemory,
    ::testing::Values(
        // Rows on every thread at once, each with a sampled floor and a filter.
        Case{"rows", 32, 40000, 100, attnkit::TopkOrder::kValue},
        // Fewer rows than threads: rows cut into segments, then merged row by row.
        Case{"segments", 2, 200000, 3000, attnkit::TopkOrder::kIndex},
        // Short rows whose k exceeds the direct select: reconstructs with a histogram.
        Case{"short_rows", 64, 3000, 700, attnkit::TopkOrder::kValue},
        // The reference backend, which writes row by row: its buffers are sized for the
        // longest row before the first is written.
        Case{"reference", 6, 5000, 40, attnkit::TopkOrder::kIndex,
             attnkit::TopkBackend::kReference}),
    [](const ::testing::TestParamInfo<Case>& param) { return std::string(param.param.name); });

}  // namespace
