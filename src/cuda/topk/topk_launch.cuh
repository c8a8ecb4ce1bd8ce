// SPDX-License-Identifier: Apache-2.0
// Kernel configurations (policies) of the CUDA top-k, the launch plan dispatch.cu computes,
// and launch_topk<Traits>, instantiated once per dtype in a generated translation unit
// (CMake: topk_<dtype>.cu from topk_instantiate.cu.in).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "cuda/common/cuda_check.cuh"
#include "cuda/topk/kernels/topk_argmax.cuh"
#include "cuda/topk/kernels/topk_cluster.cuh"
#include "cuda/topk/kernels/topk_filter.cuh"
#include "cuda/topk/kernels/topk_nan_scan.cuh"
#include "cuda/topk/kernels/topk_radix.cuh"
#include "cuda/topk/kernels/topk_short.cuh"
#include "cuda/topk/topk_params.cuh"

namespace attnkit::detail::cuda {

// ---------------------------------------------------------------------------------------------
// Policies
// ---------------------------------------------------------------------------------------------

/// One rows-kernel configuration.
template <int kThreadsV, int kPrefetchV, int kMinBlocksV, int kUV>
struct FilterPolicy {
  static constexpr int kThreads = kThreadsV;
  // 16-byte vectors per thread in flight: four (64 bytes a thread, 32 KB an SM at two CTAs)
  // cover the DRAM latency at the per-SM share of bandwidth within 128 registers a thread
  // (eight, two rounds ahead, were 0.90-0.99x on B=256 rows, run 87; twelve spill); the
  // ragged-row policy keeps two (24 KB an SM at three CTAs) within 80 (four spill).
  static constexpr int kPrefetch = kPrefetchV;
  static constexpr int kMinBlocks = kMinBlocksV;  // CTAs per SM the registers must allow
  static constexpr int kU = kUV;                  // 16-byte vectors per thread per round
  static_assert(kThreadsV % 32 == 0 && kThreadsV >= 256, "whole warps; one thread per radix bin");
  /// Elements per round for elements of `elem_bytes` bytes.
  static constexpr std::uint32_t round(std::size_t elem_bytes) {
    return static_cast<std::uint32_t>(kThreadsV * kUV * (16 / elem_bytes));
  }
};

// 512 threads, one CTA per SM: long rows, small batches (sliced), k up to kMaxFilterK.
using WidePolicy = FilterPolicy<512, 4, 1, 2>;
// 256 threads, two CTAs per SM, when there are rows for every SM: one CTA's selects and
// epilogue overlap another's loads. Rounds of four vectors a thread halve the barriers and count
// exchanges of two (256 x 1M bf16 k=512 15 % faster, 256 x 128K 9 %, fp32 256 x 129280 10-12 %,
// run 45); where their newcomer list does not fit two CTAs an SM (16-bit k > 1024, fp32 k > 2048)
// rounds of two keep the CTAs narrow.
using NarrowPolicy = FilterPolicy<256, 4, 2, 4>;
using NarrowHalfRoundPolicy = FilterPolicy<256, 4, 2, 2>;
// Three 256-thread CTAs an SM with rounds of two vectors, for ragged rows (per-row ends, e.g.
// causal prefill, whose lengths vary from row to row): more resident CTAs even out rows of
// different lengths (2048 x 65536 bf16 causal k=512 and 1024 1.23-1.25x faster than the
// narrow policy, run 62). Rows of one length passed with `end` lose 4-10 % by it; the host
// cannot tell them apart without reading `end`.
using TriplePolicy = FilterPolicy<256, 2, 3, 2>;
// Dynamic shared memory that lets three such CTAs (under 2 KB static each, and 1 KB the driver
// keeps a CTA) share an H200 SM's 228 KB; the budget predates the single select histogram
// (8.6 KB static then) and is kept as measured. dispatch checks the occupancy on the device
// (triple_ctas_per_sm) before it takes the policy.
constexpr std::size_t kTripleSmem = 66 * 1024;
// The merge kernel: one CTA of the wide policy's shape a row, appending four candidates a
// thread a round, or WidePolicy's rounds when it streams the row again.
constexpr int kMergeThreads = WidePolicy::kThreads;
inline std::uint32_t merge_round(std::size_t elem_bytes) {
  return std::max<std::uint32_t>(kMergeThreads * 4, WidePolicy::round(elem_bytes));
}
// The radix path for larger k.
constexpr int kRadixThreads = 512;
// k = 0 with nan="raise": a scan of the valid ranges for NaN.
constexpr int kNanScanThreads = 256;
// The k = 1 path: 256 threads with 8 16-byte loads each in flight (32 KB per CTA).
constexpr int kArgmaxThreads = 256;
constexpr int kArgmaxUnroll = 8;
// Elements a k = 1 slice streams at least, when rows are cut for small batches.
constexpr std::int64_t kArgmaxMinSlice = 4096;
// Rows in registers, 32 elements a thread: 8192 a CTA in the short-row kernel and in the
// cluster kernel, which takes up to kMaxClusterCtas CTAs a row on sm_90, and 16384 a CTA (512
// threads) for rows beyond kMaxClusterCtas * 8192 columns and for some batches of shorter
// rows (dispatch.cu, wide_batch_clusters).
using detail::kClusterMaxLen;
using detail::kShortMaxLen;
using detail::kShortPerThread;
using detail::kShortThreads;
using detail::kWideClusterThreads;
// Largest k the filter kernels take.
constexpr std::uint32_t kMaxFilterK = 4096;
// Newcomer slots a filter kernel's plan holds at least with sorted="value": the finished list's
// sort counts digits in the newcomer list (two words a slot), 256 words a warp of 512 threads.
constexpr std::uint32_t kSortNewcomerSlots = sort_count_words<512>() / 2;
// Dynamic shared memory a CTA may take: 227 KB less the static part (under 2 KB since the
// select's single histogram; 16 KB of per-warp histograms when the budget was set).
constexpr std::size_t kMaxDynamicSmem = 200 * 1024;
// Dynamic shared memory that lets two narrow CTAs (under 2 KB static each, and 1 KB the driver
// keeps a CTA) share an SM's 228 KB: 104 KB holds the lists of 16-bit k = 2048 and fp32
// k = 4096 in rounds of four with a slack of 1024.
constexpr std::size_t kNarrowSmem = 104 * 1024;

/// Shared-memory plan of one filter kernel: survivors [2][survivor_slots] and newcomers
/// [newcomer_slots], keys and columns, 8 bytes a slot. select_into packs counts in 16 bits.
/// A select runs when survivors and newcomers reach `limit` (k + slack), and, before the first
/// select, when the newcomers reach `newcomer_limit` (newcomer_slots less one round), where a
/// list too small for k + slack + round leaves only that much room (FilterEngine::make_room).
struct BufferPlan {
  std::uint32_t limit = 0, survivor_slots = 0, newcomer_slots = 0, newcomer_limit = 0;
  bool small_room = false;  // newcomer_limit < limit: the room for the slack and a round only
  std::size_t smem() const { return std::size_t{8} * (2 * survivor_slots + newcomer_slots); }
};

/// The most kept slots for which 16-bit short rows take a candidate list (topk_short.cuh).
constexpr std::uint32_t kShortListSlots = 2048;
/// The fewest slots a 16-bit short-row CTA gets (4 KB of shared memory: the kept lists and a
/// candidate list of 512 words). The list must hold every candidate from the first digit's
/// pivot up, and with a small k that digit alone holds more than 2 x next_pow2(k) elements of
/// natural data (an 11-bit digit is a quarter of a binade of bf16: up to a few percent of a
/// row), which then resolved in the registers. Run 236 (H100, C++ benchmark, three rounds):
/// bf16 4096 x 8192 k=64 63.6 -> 52.2 us, k=8 54.2 -> 51.6, causal k=64 53.5 -> 49.7,
/// 4096 x 2048 k=16 54.9 -> 43.9; rows whose k already had 256 slots 0.998-1.006x; 512 or
/// 1024 slots no faster than 256.
constexpr std::uint32_t kShortListMinSlots = 256;

/// fp32 rows of more than kShortWideMinLen columns (and at most kShortMaxLen) take short-row
/// CTAs of kShortWideThreads threads holding 16 columns each, three an SM (39 registers), in
/// place of 256 x 32, four an SM (64 registers): 48 warps an SM instead of 32 hide more of the
/// latency of the select's barriers and shared-memory atomics. Runs 214-215 (H100, 4096 rows):
/// 6000 columns 1.04-1.06x faster, 8192 columns 1.08-1.13x (k = 16-4096, with and without
/// values), rows ending at 1..8192 (causal) 0.98-1.03x; at 1024-4096 columns 0.89-0.96x, and
/// on 16-bit rows 0.84-0.94x, which keep the narrower CTAs. With sorted="value" the rows keep
/// them too: the sort counts each warp's digits in the first pass's histogram, which holds
/// eight warps' counts.
constexpr int kShortWideThreads = 512;
constexpr std::int64_t kShortWideMinLen = 4096;
static_assert(kShortMaxLen % kShortWideThreads == 0, "whole columns a thread");

/// Dynamic shared memory of the short-row kernel: the kept keys and columns, and as many again
/// for the sort with sorted="value".
inline std::size_t kept_list_bytes(std::uint32_t survivor_slots, bool sorted = false) {
  return (sorted ? 4 : 2) * sizeof(std::uint32_t) * survivor_slots;
}

/// Dynamic shared memory of the cluster kernel with CTAs of `threads`: the kept lists, then
/// each thread's columns (topk_cluster_rows_kernel), where the sort's spare lists go after the
/// columns are read (so at least as many bytes as the kept lists with sorted="value").
template <class Traits>
std::size_t cluster_smem_bytes(std::uint32_t survivor_slots, int threads, bool sorted = false) {
  const std::size_t columns =
      sizeof(typename Traits::Bits) * kShortPerThread * static_cast<std::size_t>(threads);
  return kept_list_bytes(survivor_slots) +
         std::max(columns, sorted ? kept_list_bytes(survivor_slots) : 0);
}

inline std::uint32_t next_pow2_host(std::uint32_t v) {
  std::uint32_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

/// Slack (newcomers gathered before a select) follows k, since a select costs O(k + slack)
/// and comes every `slack` admissions; it shrinks only when shared memory runs out. A slack
/// of max(k, 256) measured 5-18 % faster than max(2k, 2048) on long rows with k <= 512 (the
/// threshold rises sooner, so fewer rounds carry newcomers) and within 4 % elsewhere. A row
/// (slice) of `len` elements short enough that the filter would select about once anyway
/// (len <= 2 (k + max(2k, 2048))) is kept whole and selected once, at the end; on longer rows
/// the rising threshold saves far more than the extra selects cost.
/// With `sorted`, the newcomer list holds at least kSortNewcomerSlots (the sort's counts).
inline BufferPlan buffer_plan(std::uint32_t k, std::uint32_t round, std::size_t max_smem,
                              std::int64_t len, bool sorted) {
  BufferPlan b;
  b.survivor_slots = next_pow2_host(k);
  const std::int64_t least = sorted ? kSortNewcomerSlots : 1;
  const std::int64_t default_limit = k + std::max<std::uint32_t>(2 * k, 2048);
  if (len <= 2 * default_limit && len <= 65535 - 2 * static_cast<std::int64_t>(b.survivor_slots)) {
    b.newcomer_slots = static_cast<std::uint32_t>(std::max(len, least));
    b.limit = b.newcomer_slots + k + 1;  // never reached
    b.newcomer_limit = b.newcomer_slots + 1;
    if (b.smem() <= max_smem) return b;
  }
  for (std::uint32_t slack = std::max<std::uint32_t>(k, 256); ; slack /= 2) {
    b.limit = k + slack;
    // Room for k + slack newcomers and a round, so that the first select waits for k + slack
    // candidates as every later one does; where that does not fit, room for the slack and a
    // round: the newcomers then join the survivors, or are selected with them once more than
    // k, each time they reach the slack (an earlier first select: 0.95-0.97x on rows whose
    // lists fit either way, run 169).
    for (const std::int64_t room : {std::int64_t{b.limit}, std::int64_t{slack}}) {
      b.newcomer_slots = static_cast<std::uint32_t>(std::max<std::int64_t>(room + round, least));
      b.newcomer_limit = b.newcomer_slots - round;
      b.small_room = b.newcomer_limit < b.limit;
      if (b.smem() <= max_smem) return b;
    }
    if (slack <= 256) break;
  }
  return b;
}

// ---------------------------------------------------------------------------------------------
// Plan
// ---------------------------------------------------------------------------------------------

enum class TopkPath { kFilter, kRadix, kArgmax, kShort, kCluster, kNanScan };

/// The rows kernel's policy.
enum class RowsPolicy { kWide, kNarrow, kNarrowHalfRound, kTriple };

struct TopkPlan {
  TopkPath path = TopkPath::kFilter;
  RowsPolicy policy = RowsPolicy::kWide;
  std::int64_t batch = 0;
  int slices = 1;
  int cluster_ctas = 1;  // kCluster: CTAs per row
  int cluster_threads = kShortThreads;  // kCluster: threads per CTA
  int short_threads = kShortThreads;    // kShort: threads per CTA
  BufferPlan rows, merge;
  // slices > 1: the merge kernel launches as a programmatic dependent of the slice kernel
  // (merges_wait_for_slices), so that its launch overlaps the slices' work.
  bool dependent_merge = false;
  std::size_t cub_bytes = 0;  // radix path, sorted="value"
};

// ---------------------------------------------------------------------------------------------
// Launch
// ---------------------------------------------------------------------------------------------

/// The opt-ins each kernel has been given on each device: static plus dynamic shared memory
/// above 48 KB, and clusters of more than 8 CTAs, need a cudaFuncSetAttribute, which is a
/// driver call that also waits for the runtime's host<->device copies in flight (reported
/// against the CUDA runtime, intel/llvm#16928): set before every launch, it would stall a call
/// behind other streams' copies. So each kernel is opted in once a device, to the most shared
/// memory asked so far; launch_ex sets them again when a launch is refused (a cudaDeviceReset
/// clears them).
class OptIns {
 public:
  template <class Kernel>
  static void allow(Kernel kernel, std::size_t smem, bool clusters, const char* name) {
    int device = 0;
    cuda_check(cudaGetDevice(&device), "cudaGetDevice");
    const std::lock_guard<std::mutex> lock(mutex());
    Given& given = table()[{reinterpret_cast<std::uintptr_t>(kernel), device}];
    if (!given.any || smem > given.smem) {
      cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem)),
                 name);
      given.smem = smem;
      given.any = true;
    }
    if (clusters && !given.clusters) {
      cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1),
                 name);
      given.clusters = true;
    }
  }

  template <class Kernel>
  static void forget(Kernel kernel) {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return;
    const std::lock_guard<std::mutex> lock(mutex());
    table().erase({reinterpret_cast<std::uintptr_t>(kernel), device});
  }

 private:
  struct Given {
    bool any = false;       // the shared-memory opt-in has been set
    std::size_t smem = 0;   // to this many dynamic bytes
    bool clusters = false;  // non-portable cluster sizes allowed
  };
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::map<std::pair<std::uintptr_t, int>, Given>& table() {
    static std::map<std::pair<std::uintptr_t, int>, Given> t;
    return t;
  }
};

template <class Kernel>
void allow_dynamic_smem(Kernel kernel, std::size_t smem, const char* name) {
  OptIns::allow(kernel, smem, false, name);
}

/// Opts `kernel` into `smem` bytes of dynamic shared memory and clusters of up to 16 CTAs (more
/// than 8 is non-portable).
template <class Kernel>
void allow_clusters(Kernel kernel, std::size_t smem, const char* name) {
  OptIns::allow(kernel, smem, true, name);
}

/// Whether the current device runs `kernel` from code compiled for sm_90 or newer, which holds
/// the sm_90 primitives (clusters, griddepcontrol); compute_80 PTX compiled at load time on a
/// newer GPU holds stand-ins instead. A binary for sm_90 or newer runs only on such a device.
template <class Kernel>
bool runs_sm90_code(Kernel kernel) {
  cudaFuncAttributes attributes{};
  cuda_check(cudaFuncGetAttributes(&attributes, kernel), "cudaFuncGetAttributes");
  return attributes.ptxVersion >= 90 && attributes.binaryVersion >= 90;
}

/// cudaLaunchKernelEx's form of `blocks` CTAs of `threads` with at most one launch attribute.
struct LaunchExConfig {
  cudaLaunchAttribute attribute{};
  cudaLaunchConfig_t config{};

  LaunchExConfig(std::int64_t blocks, int threads, std::size_t smem, cudaStream_t stream) {
    config.gridDim = dim3(static_cast<unsigned>(blocks));
    config.blockDim = dim3(static_cast<unsigned>(threads));
    config.dynamicSmemBytes = smem;
    config.stream = stream;
  }
  LaunchExConfig(std::int64_t blocks, int threads, std::size_t smem, cudaStream_t stream,
                 const cudaLaunchAttribute& a)
      : LaunchExConfig(blocks, threads, smem, stream) {
    attribute = a;
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  LaunchExConfig(const LaunchExConfig&) = delete;  // config points into this object
  LaunchExConfig& operator=(const LaunchExConfig&) = delete;
};

/// Thread-block clusters of `ctas` CTAs.
inline cudaLaunchAttribute cluster_attribute(int ctas) {
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeClusterDimension;
  a.val.clusterDim.x = static_cast<unsigned>(ctas);
  a.val.clusterDim.y = 1;
  a.val.clusterDim.z = 1;
  return a;
}

/// Every launch: the kernel's opt-ins (OptIns), then cudaLaunchKernelEx, which reports this
/// launch's own error. A launch refused after the opt-ins were taken from the table is tried
/// once more with them set again (a cudaDeviceReset clears what the table remembers); a
/// refused launch ran nothing, so nothing runs twice.
template <class Kernel>
void launch_ex(Kernel kernel, const LaunchExConfig& ex, bool clusters, const TopkKernelParams& p,
               const char* name) {
  const std::size_t smem = ex.config.dynamicSmemBytes;
  OptIns::allow(kernel, smem, clusters, name);
  cudaError_t e = cudaLaunchKernelEx(&ex.config, kernel, p);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // a refused launch's error is not sticky: cleared, not left
    OptIns::forget(kernel);    // for the caller's next error check to report as its own
    OptIns::allow(kernel, smem, clusters, name);
    e = cudaLaunchKernelEx(&ex.config, kernel, p);
    if (e != cudaSuccess) (void)cudaGetLastError();
  }
  cuda_check(e, name);
}

template <class Kernel>
void launch(Kernel kernel, std::int64_t blocks, int threads, std::size_t smem,
            cudaStream_t stream, const TopkKernelParams& p, const char* name) {
  launch_ex(kernel, LaunchExConfig(blocks, threads, smem, stream), false, p, name);
}

/// launch(), as the programmatic dependent of the kernel before it in the stream when
/// `dependent` (cuda/common/dependent_launch.cuh): it may be scheduled while that one runs, and
/// waits for its results in the kernel. The slice kernels allow it from their start; overlapping
/// the merge's launch took sliced rows 1.01-1.05x faster (run 160: bf16 1 x 1M k=512 26.8 ->
/// 25.9 us, 2 x 512K k=1024 26.2 -> 24.9, fp32 1 x 129280 k=1 9.31 -> 8.96-9.18).
template <class Kernel>
void launch_after(Kernel kernel, std::int64_t blocks, int threads, std::size_t smem,
                  cudaStream_t stream, const TopkKernelParams& p, bool dependent,
                  const char* name) {
  if (!dependent) {
    launch(kernel, blocks, threads, smem, stream, p, name);
    return;
  }
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  launch_ex(kernel, LaunchExConfig(blocks, threads, smem, stream, attribute), false, p, name);
}

/// Launches `ctas` CTAs per row as one thread-block cluster each (sm_90).
template <class Kernel>
void launch_clustered(Kernel kernel, std::int64_t rows, int ctas, int threads, std::size_t smem,
                      cudaStream_t stream, const TopkKernelParams& p, const char* name) {
  launch_ex(kernel, LaunchExConfig(rows * ctas, threads, smem, stream, cluster_attribute(ctas)),
            true, p, name);
}

/// The clustered cluster kernel with CTAs of `threads` (kShortThreads or kWideClusterThreads),
/// for sorted="value" or not.
template <class Traits>
auto clustered_rows_kernel(int threads, bool sorted = false) {
  constexpr int kWide = kWideClusterThreads, kNarrow = kShortThreads, kPer = kShortPerThread;
  if (threads == kWide) {
    return sorted ? topk_cluster_rows_kernel<Traits, kWide, kPer, true, true>
                  : topk_cluster_rows_kernel<Traits, kWide, kPer, true, false>;
  }
  return sorted ? topk_cluster_rows_kernel<Traits, kNarrow, kPer, true, true>
                : topk_cluster_rows_kernel<Traits, kNarrow, kPer, true, false>;
}

/// The rows kernel of policy P.
template <class Traits, class P>
constexpr auto rows_kernel =
    topk_rows_kernel<Traits, P::kThreads, P::kPrefetch, P::kMinBlocks, P::kU>;

/// The merge kernel of sliced rows.
template <class Traits>
constexpr auto merge_kernel =
    topk_merge_kernel<Traits, kMergeThreads, WidePolicy::kPrefetch, WidePolicy::kU>;

/// Launches the rows kernel (the filter path) with policy P.
template <class Traits, class P>
void launch_rows_with(const TopkPlan& plan, const TopkKernelParams& p, cudaStream_t stream,
                      const char* name) {
  launch(rows_kernel<Traits, P>, plan.batch * plan.slices, P::kThreads, plan.rows.smem(), stream,
         p, name);
}

/// Launches the rows kernel (the filter path) with its policy.
template <class Traits>
void launch_rows(const TopkPlan& plan, TopkKernelParams p, cudaStream_t stream) {
  p.limit = plan.rows.limit;
  p.newcomer_limit = plan.rows.newcomer_limit;
  p.survivor_slots = plan.rows.survivor_slots;
  p.newcomer_slots = plan.rows.newcomer_slots;
  switch (plan.policy) {
    case RowsPolicy::kNarrow:
      launch_rows_with<Traits, NarrowPolicy>(plan, p, stream, "topk_rows_kernel<256>");
      break;
    case RowsPolicy::kNarrowHalfRound:
      launch_rows_with<Traits, NarrowHalfRoundPolicy>(plan, p, stream,
                                                      "topk_rows_kernel<256, half round>");
      break;
    case RowsPolicy::kTriple:
      launch_rows_with<Traits, TriplePolicy>(plan, p, stream, "topk_rows_kernel<256, triple>");
      break;
    case RowsPolicy::kWide:
      launch_rows_with<Traits, WidePolicy>(plan, p, stream, "topk_rows_kernel<512>");
      break;
  }
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
  if (plan.path == TopkPath::kNanScan) {
    launch(topk_nan_scan_kernel<Traits, kNanScanThreads>, plan.batch, kNanScanThreads, 0, stream,
           p, "topk_nan_scan_kernel");
    return;
  }
  if (plan.path == TopkPath::kShort) {
    // At least two slots, so that the candidate list (at 2 x slots words) is 16-byte aligned;
    // 16-bit rows at least kShortListMinSlots, so that a small k's list holds its pivot digit.
    const std::uint32_t slots = std::max<std::uint32_t>(
        plan.rows.survivor_slots, Traits::kBits == 16 ? kShortListMinSlots : 2);
    p.survivor_slots = slots;
    // 16-bit rows list their candidates where the sort's spare lists go, 2 x slots words; up
    // to kShortListSlots those keep four CTAs an SM (the registers' limit), beyond they would
    // cost one, so such rows resolve in the registers unless the sort takes the space anyway.
    const bool list = Traits::kBits == 16 && (p.sort_by_value || slots <= kShortListSlots);
    p.candidate_words = list ? 2 * slots : 0;
    const std::size_t smem = kept_list_bytes(slots, p.sort_by_value || list);
    // The plan gives the wide CTAs, which carry no sort, only to fp32 rows without
    // sorted="value" (make_launch).
    if constexpr (Traits::kBits == 32) {
      if (plan.short_threads == kShortWideThreads) {
        constexpr int kPer = kShortMaxLen / kShortWideThreads;
        launch(topk_short_rows_kernel<Traits, kShortWideThreads, kPer, 3>, plan.batch,
               kShortWideThreads, smem, stream, p, "topk_short_rows_kernel<512>");
        return;
      }
    }
    launch(topk_short_rows_kernel<Traits, kShortThreads, kShortPerThread, 4>, plan.batch,
           kShortThreads, smem, stream, p, "topk_short_rows_kernel");
    return;
  }
  if (plan.path == TopkPath::kCluster) {
    p.survivor_slots = plan.rows.survivor_slots;
    p.cluster_ctas = plan.cluster_ctas;
    const ClusterSample sample = cluster_sample(p.k_select, plan.cluster_ctas);
    p.cluster_sample_need = sample.need;
    p.cluster_span_past = sample.past;
    const std::size_t smem =
        cluster_smem_bytes<Traits>(plan.rows.survivor_slots, plan.cluster_threads, p.sort_by_value);
    if (plan.cluster_ctas == 1) {
      constexpr int kPer = kShortPerThread;
      const auto kernel = p.sort_by_value
                              ? topk_cluster_rows_kernel<Traits, kShortThreads, kPer, false, true>
                              : topk_cluster_rows_kernel<Traits, kShortThreads, kPer, false, false>;
      launch(kernel, plan.batch, kShortThreads, smem, stream, p, "topk_cluster_rows_kernel");
    } else {
      launch_clustered(clustered_rows_kernel<Traits>(plan.cluster_threads, p.sort_by_value),
                       plan.batch, plan.cluster_ctas, plan.cluster_threads, smem, stream, p,
                       "topk_cluster_rows_kernel<cluster>");
    }
    return;
  }
  if (plan.path == TopkPath::kArgmax) {
    launch(topk_argmax_kernel<Traits, kArgmaxThreads, kArgmaxUnroll>, plan.batch * plan.slices,
           kArgmaxThreads, 0, stream, p, "topk_argmax_kernel");
    if (plan.slices > 1) {
      launch_after(topk_argmax_merge_kernel<Traits>, plan.batch, kWarpSize, 0, stream, p,
                   plan.dependent_merge, "topk_argmax_merge_kernel");
    }
    return;
  }
  launch_rows<Traits>(plan, p, stream);
  if (plan.slices > 1) {
    p.limit = plan.merge.limit;
    p.newcomer_limit = plan.merge.newcomer_limit;
    p.survivor_slots = plan.merge.survivor_slots;
    p.newcomer_slots = plan.merge.newcomer_slots;
    launch_after(merge_kernel<Traits>, plan.batch, kMergeThreads, plan.merge.smem(), stream, p,
                 plan.dependent_merge, "topk_merge_kernel");
  }
}

/// Whether this device runs both merge kernels from code that waits for the slice kernel
/// (wait_for_prior_grid), so that they may launch as its programmatic dependents: 1 or 0.
template <class Traits>
int merges_wait_for_slices() {
  return runs_sm90_code(merge_kernel<Traits>) && runs_sm90_code(topk_argmax_merge_kernel<Traits>);
}

/// How many clusters of `ctas` CTAs of `threads` threads of the cluster kernel this device
/// keeps resident at once, with the largest k's kept lists (0 where it cannot run them). CTAs
/// of 512 threads take one SM each, so for them this is also how many clusters of `ctas`
/// narrow CTAs fit one CTA an SM: a cluster stays within one GPC, and an H200's GPCs hold
/// seven clusters of 16 such CTAs, or fifteen of 8. `sorted` asks of the sorted="value" kernel,
/// whose registers and shared memory can be more.
template <class Traits>
int resident_clusters(int ctas, int threads, bool sorted) {
  const auto kernel = clustered_rows_kernel<Traits>(threads, sorted);
  const std::size_t smem = cluster_smem_bytes<Traits>(kMaxFilterK, threads, sorted);
  allow_clusters(kernel, smem, "cudaFuncSetAttribute");
  const LaunchExConfig cluster(ctas, threads, smem, nullptr, cluster_attribute(ctas));
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cluster.config) != cudaSuccess) {
    (void)cudaGetLastError();  // an unsupported size is an answer, not an error
    return 0;
  }
  return clusters;
}

/// The largest cluster (CTAs per row) the cluster kernel with `threads`-thread CTAs
/// (kShortThreads or kWideClusterThreads) can run with on the current device: 1 before sm_90,
/// or when the kernel's code on this device was not compiled for sm_90 or newer (runs_sm90_code:
/// e.g. compute_80 PTX compiled at load time on a newer GPU, whose cluster primitives are
/// single-CTA stand-ins). `sorted` asks of the sorted="value" kernel.
template <class Traits>
int max_cluster_ctas(int threads, bool sorted) {
  int device = 0, cluster_launch = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&cluster_launch, cudaDevAttrClusterLaunch, device),
             "cudaDeviceGetAttribute(clusterLaunch)");
  if (!runs_sm90_code(clustered_rows_kernel<Traits>(threads, sorted)) || cluster_launch == 0) {
    return 1;
  }
  for (int ctas = kMaxClusterCtas; ctas > 1; --ctas) {
    if (resident_clusters<Traits>(ctas, threads, sorted) > 0) return ctas;
  }
  return 1;
}

/// How many CTAs of the ragged-row policy (TriplePolicy, kTripleSmem of buffers) this device
/// keeps resident on one SM; the policy pays only at three (an H200 has the shared memory for
/// three, an A100 for two).
template <class Traits>
int triple_ctas_per_sm() {
  const auto kernel = rows_kernel<Traits, TriplePolicy>;
  allow_dynamic_smem(kernel, kTripleSmem, "cudaFuncSetAttribute(topk_rows_kernel<256, triple>)");
  int ctas = 0;
  cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, TriplePolicy::kThreads,
                                                           kTripleSmem),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor(topk_rows_kernel<256, triple>)");
  return ctas;
}

template <class Traits>
void launch_ranked(const TopkPlan& plan, const TopkKernelParams& params,
                   const std::uint64_t* sorted, cudaStream_t stream) {
  topk_ranked_kernel<Traits, kRadixThreads>
      <<<static_cast<unsigned>(plan.batch), kRadixThreads, 0, stream>>>(params, sorted);
  cuda_check_launch("topk_ranked_kernel");
}

}  // namespace attnkit::detail::cuda
