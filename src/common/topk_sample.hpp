// SPDX-License-Identifier: Apache-2.0
// The register tiles of the CUDA short-row and cluster top-k kernels, and where the cluster
// kernel samples a row (kernels/topk_cluster.cuh, step 1): shared with the tests, which plant
// the row's best values exactly there to make the sample overestimate the row and so exercise
// the kernel's second, full select.
#pragma once

#include <cstdint>

#include "common/host_device.hpp"

namespace attnkit::detail {

inline constexpr int kShortThreads = 256;   // threads per CTA
inline constexpr int kShortPerThread = 32;  // consecutive columns per thread
inline constexpr std::int64_t kShortMaxLen = kShortThreads * kShortPerThread;

/// Threads per sampling thread: every thread samples in a lone CTA, every 2nd in a pair and
/// every 4th in larger clusters, so that a row's sample holds 256 to 1024 elements.
ATTNKIT_HD constexpr int short_sample_every(int ctas) { return ctas >= 4 ? 4 : ctas; }

/// The element (0 .. 31) that sampling thread `tid` of cluster CTA `rank` samples: offsets vary
/// between threads so that no period of the data lines up with the sample.
ATTNKIT_HD constexpr int short_sample_element(int tid, int rank) {
  return (tid * 11 + rank * 5) & 31;
}

/// CTAs per row the kernel runs a row of `row_len` columns with (a power of two).
ATTNKIT_HD constexpr int short_cluster_ctas(std::int64_t row_len) {
  int ctas = 1;
  while (ctas * kShortMaxLen < row_len) ctas *= 2;
  return ctas;
}

/// Whether column `col` (counted from the row's `begin`) is sampled in a row of `row_len`.
ATTNKIT_HD constexpr bool short_sampled(std::int64_t col, std::int64_t row_len) {
  const int ctas = short_cluster_ctas(row_len);
  const auto thread = static_cast<int>(col / kShortPerThread);
  const int tid = thread % kShortThreads, rank = thread / kShortThreads;
  return tid % short_sample_every(ctas) == 0 &&
         col % kShortPerThread == short_sample_element(tid, rank);
}

}  // namespace attnkit::detail
