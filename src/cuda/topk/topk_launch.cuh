// SPDX-License-Identifier: Apache-2.0
// Kernel configurations (policies) of the CUDA top-k, the launch plan dispatch.cu computes,
// and launch_topk<Traits>, instantiated once per dtype in a generated translation unit
// (CMake: topk_<dtype>.cu from topk_instantiate.cu.in).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/common/cuda_check.cuh"
#include "cuda/topk/kernels/topk_filter.cuh"
#include "cuda/topk/kernels/topk_radix.cuh"
#include "cuda/topk/topk_params.cuh"

namespace attnkit::detail::cuda {

// ---------------------------------------------------------------------------------------------
// Policies
// ---------------------------------------------------------------------------------------------

/// One filter-kernel configuration. kItems * kThreads is the candidate buffer's capacity.
template <int kThreadsV, int kItemsV, int kPrefetchV, int kMinBlocksV>
struct FilterPolicy {
  static constexpr int kThreads = kThreadsV;
  static constexpr int kItems = kItemsV;
  static constexpr int kPrefetch = kPrefetchV;
  static constexpr int kMinBlocks = kMinBlocksV;
  static constexpr std::uint32_t kCapacity = kThreadsV * kItemsV;
  static_assert(kThreadsV % 32 == 0 && kThreadsV >= 256, "whole warps; one thread per radix bin");
  static_assert(kItemsV % 2 == 1, "odd staging stride: conflict-free shared-memory reads");
  static_assert(kThreadsV * kItemsV <= 65535, "select_best packs counts in 16 bits");
  static_assert(kThreadsV * kItemsV * 8 <= 227 * 1024, "key and column buffers fit shared memory");
};

// 512 threads, 12800 slots (100 KB): long rows, small batches (slices), k up to 4096.
using WidePolicy = FilterPolicy<512, 25, 4, 1>;
// 256 threads, 6400 slots, two CTAs per SM: many rows, k up to 2048, so that one CTA's
// selects and epilogue overlap another's loads.
using NarrowPolicy = FilterPolicy<256, 25, 4, 2>;
// The radix path for larger k.
constexpr int kRadixThreads = 512;
// Largest k the filter kernels take: the buffer must hold k, one tile of appends and slack.
constexpr std::uint32_t kMaxFilterK = 4096;
static_assert(kMaxFilterK + 512 * 8 + 1024 <= WidePolicy::kCapacity,
              "the wide policy holds k = kMaxFilterK with a bf16 tile and 1024 slack");

// ---------------------------------------------------------------------------------------------
// Plan
// ---------------------------------------------------------------------------------------------

enum class TopkPath { kFilter, kRadix };

struct TopkPlan {
  TopkPath path = TopkPath::kFilter;
  bool narrow = false;       // NarrowPolicy for the rows kernel (else WidePolicy)
  std::int64_t batch = 0;
  int slices = 1;
  std::uint32_t rows_limit = 0, rows_cap = 0;    // rows kernel buffer
  std::uint32_t merge_limit = 0, merge_cap = 0;  // merge kernel buffer (WidePolicy)
  std::size_t cub_bytes = 0;                     // radix path, sorted="value"
};

// ---------------------------------------------------------------------------------------------
// Launch
// ---------------------------------------------------------------------------------------------

template <class Kernel>
void launch(Kernel kernel, std::int64_t blocks, int threads, std::size_t smem,
            cudaStream_t stream, const TopkKernelParams& p, const char* name) {
  if (smem > 48 * 1024) {
    cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem)),
               name);
  }
  kernel<<<static_cast<unsigned>(blocks), threads, smem, stream>>>(p);
  cuda_check_launch(name);
}

/// Launches the top-k kernels of `plan` for one dtype. For the radix path with
/// sorted="value" the caller then sorts params.ranked and calls launch_ranked.
template <class Traits>
void launch_topk(const TopkPlan& plan, const TopkKernelParams& params, cudaStream_t stream) {
  if (plan.path == TopkPath::kRadix) {
    launch(topk_radix_kernel<Traits, kRadixThreads>, plan.batch, kRadixThreads, 0, stream, params,
           "topk_radix_kernel");
    return;
  }
  TopkKernelParams p = params;
  p.limit = plan.rows_limit;
  p.cap = plan.rows_cap;
  const std::size_t smem = std::size_t{plan.rows_cap} * 8;
  const std::int64_t blocks = plan.batch * plan.slices;
  if (plan.narrow) {
    using P = NarrowPolicy;
    launch(topk_rows_kernel<Traits, P::kThreads, P::kItems, P::kPrefetch, P::kMinBlocks>, blocks,
           P::kThreads, smem, stream, p, "topk_rows_kernel<256>");
  } else {
    using P = WidePolicy;
    launch(topk_rows_kernel<Traits, P::kThreads, P::kItems, P::kPrefetch, P::kMinBlocks>, blocks,
           P::kThreads, smem, stream, p, "topk_rows_kernel<512>");
  }
  if (plan.slices > 1) {
    using P = WidePolicy;
    p.limit = plan.merge_limit;
    p.cap = plan.merge_cap;
    launch(topk_merge_kernel<Traits, P::kThreads, P::kItems>, plan.batch, P::kThreads,
           std::size_t{plan.merge_cap} * 8, stream, p, "topk_merge_kernel");
  }
}

template <class Traits>
void launch_ranked(const TopkPlan& plan, const TopkKernelParams& params,
                   const std::uint64_t* sorted, cudaStream_t stream) {
  topk_ranked_kernel<Traits, kRadixThreads>
      <<<static_cast<unsigned>(plan.batch), kRadixThreads, 0, stream>>>(params, sorted);
  cuda_check_launch("topk_ranked_kernel");
}

}  // namespace attnkit::detail::cuda
