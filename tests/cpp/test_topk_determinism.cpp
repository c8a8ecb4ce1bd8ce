// SPDX-License-Identifier: Apache-2.0
// Determinism of the CPU top-k (SPEC: the same inputs give the same output bits on every run):
// repeated calls, thread counts 1/2/4 (which change how rows are split into tasks and segments),
// what the output buffers held before, where x lives, and what earlier calls left in the
// per-thread scratch.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "topk_test_util.hpp"

namespace {

using namespace attnkit_test;

/// Cases that reach each part of the fast path: short rows, rows with a sampled threshold,
/// rows long enough to be cut into segments when there are fewer rows than threads, and
/// batches large enough to be spread over tasks.
std::vector<TopkCase> determinism_cases() {
  struct Shape {
    std::int64_t batch, n, k;
  };
  const Shape shapes[] = {{1, 3, 2},      {3, under_pow2(12), 100}, {1, 200000, 4096},
                          {1, 131072, 1}, {2, 100000, 2048},        {3, 70000, 512},
                          {1000, 97, 10}, {5, 65536 + 7, 3000}};
  const Dist dists[] = {Dist::kNormal,    Dist::kFewDistinct, Dist::kAllEqual, Dist::kWithNan,
                        Dist::kMostlyNan, Dist::kAscending,   Dist::kRawBits};
  std::vector<TopkCase> cases;
  std::uint64_t v = 0;
  for (const Shape& s : shapes) {
    for (Dist dist : dists) {
      TopkCase c;
      c.dtype = kFloatDTypes[v % 3];
      c.dist = dist;
      c.seed = 100 + v;
      c.batch = s.batch;
      c.n = s.n;
      c.k = s.k;
      c.largest = v % 2 == 0;
      c.sorted = kAllOrders[v % 3];
      c.nan = v % 4 == 3 ? NanPolicy::kIgnore : NanPolicy::kLargest;
      c.ties = v % 5 == 2 ? TiePolicy::kAny : TiePolicy::kLowestIndex;
      c.ranges = v % 3 == 0 ? Ranges::kBoth : Ranges::kNone;
      c.with_offset = v % 2 == 1;
      ++v;
      cases.push_back(c);
    }
  }
  return cases;
}

std::string buffer_difference(const TopkOutputs& a, const TopkOutputs& b) {
  std::string s;
  const std::int64_t di = a.indices.first_difference(b.indices);
  const std::int64_t dv = a.values.first_difference(b.values);
  if (di >= 0) {
    s += "out_indices element " + std::to_string(di - kGuard) + ": " + hex(a.indices.get(di)) +
         " vs " + hex(b.indices.get(di)) + "\n";
  }
  if (dv >= 0) {
    s += "out_values element " + std::to_string(dv - kGuard) + ": " + hex(a.values.get(dv)) +
         " vs " + hex(b.values.get(dv)) + "\n";
  }
  return s;
}

TEST(TopkDeterminism, RepeatedCallsGiveSameBits) {
  for (const TopkCase& c : determinism_cases()) {
    SCOPED_TRACE(c.describe());
    TopkInputs in = make_inputs(c);
    for (TopkBackend backend : {TopkBackend::kAuto, TopkBackend::kReference}) {
      const TopkOutputs first = run_once(c, in, backend);
      for (int run = 1; run < 3; ++run) {
        const TopkOutputs again = run_once(c, in, backend);
        EXPECT_EQ(buffer_difference(first, again), "")
            << "run " << run << " of backend "
            << (backend == TopkBackend::kAuto ? "auto" : "reference");
      }
    }
  }
}

/// 1, 2 and 4 threads split the same rows differently (tasks per row group; segments per row
/// when rows are fewer than threads); the bits must not change, and must be the reference's.
TEST(TopkDeterminism, ThreadCountsGiveSameBits) {
  ThreadCountGuard restore;
  const std::vector<TopkCase> cases = determinism_cases();
  std::vector<TopkInputs> inputs;
  for (const TopkCase& c : cases) inputs.push_back(make_inputs(c));
  std::vector<TopkOutputs> baseline;
  attnkit::set_num_threads(1);
  ASSERT_EQ(attnkit::num_threads(), 1);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    baseline.push_back(run_once(cases[i], inputs[i], TopkBackend::kAuto));
    const TopkOutputs ref = run_once(cases[i], inputs[i], TopkBackend::kReference);
    EXPECT_EQ(buffer_difference(baseline.back(), ref), "")
        << "1 thread vs reference backend; " << cases[i].describe();
  }
  for (int threads : {2, 4, 3, 1}) {
    attnkit::set_num_threads(threads);
    ASSERT_EQ(attnkit::num_threads(), threads);
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const TopkOutputs out = run_once(cases[i], inputs[i], TopkBackend::kAuto);
      EXPECT_EQ(buffer_difference(baseline[i], out), "")
          << threads << " threads vs 1 thread; " << cases[i].describe();
    }
  }
}

/// Whatever the outputs held before, every slot of the result is the same: no slot is left
/// unwritten (a poison pattern that happens to equal an expected value cannot hide that here).
TEST(TopkDeterminism, PriorOutputContentsDoNotMatter) {
  for (const TopkCase& c : determinism_cases()) {
    SCOPED_TRACE(c.describe());
    TopkInputs in = make_inputs(c);
    const TopkOutputs a = run_once(c, in, TopkBackend::kAuto, 0x00);
    for (std::uint8_t poison : {std::uint8_t{0xA5}, std::uint8_t{0xFF}, std::uint8_t{0x7F}}) {
      const TopkOutputs b = run_once(c, in, TopkBackend::kAuto, poison);
      EXPECT_EQ(compare_slots(c, a, b), "") << "outputs prefilled with " << hex(poison);
    }
  }
}

/// The same rows at other addresses (unaligned bases, padded and reversed row strides) give the
/// same bits: alignment-dependent fast paths must not change the result.
TEST(TopkDeterminism, AddressAndLayoutDoNotMatter) {
  for (TopkCase c : determinism_cases()) {
    c.ranges = Ranges::kNone;
    TopkInputs in = make_inputs(c);
    const TopkOutputs base = run_once(c, in, TopkBackend::kAuto);
    for (XLayout layout : {XLayout::kContiguous, XLayout::kPadded, XLayout::kNegative}) {
      for (std::int64_t offset : {1, 3, 7}) {
        TopkCase moved = c;
        moved.layout = layout;
        moved.x_offset = offset;
        moved.row_pad = 3 + offset;
        SCOPED_TRACE(moved.describe());
        TopkInputs moved_in = make_inputs(moved);
        const TopkOutputs out = run_once(moved, moved_in, TopkBackend::kAuto);
        EXPECT_EQ(compare_slots(c, base, out), "");
      }
    }
  }
}

/// The fast path keeps per-thread scratch between calls; a call after larger or smaller ones
/// must give the bits it gives on its own.
TEST(TopkDeterminism, EarlierCallsDoNotLeakIntoLaterOnes) {
  const std::vector<TopkCase> cases = determinism_cases();
  std::vector<TopkInputs> inputs;
  std::vector<TopkOutputs> alone;
  for (const TopkCase& c : cases) {
    inputs.push_back(make_inputs(c));
    alone.push_back(run_once(c, inputs.back(), TopkBackend::kAuto));
  }
  // Reverse order, then interleaved with the largest case.
  for (std::size_t r = cases.size(); r-- > 0;) {
    const TopkOutputs out = run_once(cases[r], inputs[r], TopkBackend::kAuto);
    EXPECT_EQ(buffer_difference(alone[r], out), "") << "after later cases; " << cases[r].describe();
  }
  for (std::size_t i = 0; i < cases.size(); ++i) {
    (void)run_once(cases[2], inputs[2], TopkBackend::kAuto);
    const TopkOutputs out = run_once(cases[i], inputs[i], TopkBackend::kAuto);
    EXPECT_EQ(buffer_difference(alone[i], out), "")
        << "after a 200000-column case; " << cases[i].describe();
  }
}

}  // namespace
