// SPDX-License-Identifier: Apache-2.0
// CUDA top-k dispatch: choose the path and configuration for a checked problem, carve the
// workspace, launch, and check the NaN flag when asked. Kernels: kernels/*.cuh; policies and
// the plan: topk_launch.cuh; algorithm: docs/topk.md.
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cub/device/device_segmented_sort.cuh>
#include <limits>
#include <mutex>

#include "attnkit/error.hpp"
#include "common/topk_keys.hpp"
#include "core/backends.hpp"
#include "cuda/common/cuda_check.cuh"
#include "cuda/topk/topk_launch.cuh"

// Instantiated once per dtype in the generated topk_<dtype>.cu units, not here.
namespace attnkit::detail::cuda {
#define ATTNKIT_TOPK_EXTERN(Traits)                                                           \
  extern template void launch_topk<Traits>(const TopkPlan&, const TopkKernelParams&,         \
                                           cudaStream_t);                                    \
  extern template void launch_ranked<Traits>(const TopkPlan&, const TopkKernelParams&,       \
                                             const std::uint64_t*, cudaStream_t);            \
  extern template int max_cluster_ctas<Traits>(int, bool);                                  \
  extern template int resident_clusters<Traits>(int, int, bool);                           \
  extern template int triple_ctas_per_sm<Traits>();                                         \
  extern template int merges_wait_for_slices<Traits>();
ATTNKIT_TOPK_EXTERN(Float32Traits)
ATTNKIT_TOPK_EXTERN(BFloat16Traits)
ATTNKIT_TOPK_EXTERN(Float16Traits)
#undef ATTNKIT_TOPK_EXTERN
}  // namespace attnkit::detail::cuda

namespace attnkit::detail {
namespace {

using cuda::TopkKernelParams;
using cuda::RowsPolicy;
using cuda::TopkPath;
using cuda::TopkPlan;

constexpr std::size_t kAlign = 256;

/// Rows of at least this many bytes may take the narrow or the ragged-row policy with a
/// newcomer list that has room for the slack and a round only (BufferPlan::small_room: 16-bit
/// k = 1025-2048 and fp32 k = 2049-4096 in rounds of four, with a slack of 1024; fp32 ragged
/// rows with k = 1153-2048). Its earlier selects cost the same on every row, while rounds of
/// four, or three CTAs an SM, save more the longer the row (runs 169-171, 256 rows of bf16 with
/// k=2048 against rounds of two: 65536 columns 0.97-0.98x, 131072 1.05x, 1M 1.14x; fp32
/// 256 x 129280 k=4096 1.07x against 512-thread CTAs, causal 2048 x 65536 k=2048 1.10x). Rounds
/// of two with the small room lost to 512-thread CTAs (bf16 256 x 65536 k=4096 0.94x, run 171)
/// and are not taken.
constexpr std::int64_t kSmallRoomMinBytes = 256 * 1024;

std::size_t align_up(std::size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

int sm_count(int device) {
  static std::mutex mutex;
  static std::array<int, 64> cache{};
  std::lock_guard<std::mutex> lock(mutex);
  const auto d = static_cast<std::size_t>(device);
  if (d >= cache.size()) return 132;
  if (cache[d] == 0) {
    cuda_check(cudaDeviceGetAttribute(&cache[d], cudaDevAttrMultiProcessorCount, device),
               "cudaDeviceGetAttribute(multiProcessorCount)");
  }
  return cache[d];
}

/// A value per (device, dtype) that `query(traits)` computes once (it launches nothing);
/// `fallback` for device indices beyond the cache.
class PerDeviceDtype {
 public:
  PerDeviceDtype() {
    for (auto& row : cache_) row.fill(kUnset);
  }
  template <class Query>
  int get(const TopkProblem& p, int fallback, Query query) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto d = static_cast<std::size_t>(p.device.index);
    const std::size_t t = p.dtype == DType::kFloat32 ? 0 : p.dtype == DType::kBFloat16 ? 1 : 2;
    if (d >= cache_.size()) return fallback;
    int& v = cache_[d][t];
    if (v == kUnset) with_traits(p.dtype, [&](auto traits) { v = query(traits); });
    return v;
  }

 private:
  static constexpr int kUnset = std::numeric_limits<int>::min();
  std::mutex mutex_;
  std::array<std::array<int, 3>, 64> cache_{};
};

/// The largest cluster the cluster kernel runs with for this dtype on this device, with CTAs
/// of `threads` (kShortThreads or kWideClusterThreads), asked of the kernel p's order takes.
int cluster_limit(const TopkProblem& p, int threads) {
  static PerDeviceDtype cache[2][2];  // [wide][sorted]
  const bool sorted = p.order == TopkOrder::kValue;
  const bool wide = threads == cuda::kWideClusterThreads;
  return cache[wide][sorted].get(p, 1, [threads, sorted](auto traits) {
    return cuda::max_cluster_ctas<decltype(traits)>(threads, sorted);
  });
}

/// Whether a batch of rows of kWideChoiceLen to 16 x 8192 columns takes clusters of 8 CTAs of
/// 512 threads instead of 16 of 256. Where the 16-CTA clusters do not all fit one CTA an SM (an
/// H200 holds seven, run 89: B=7 x 128K bf16 k=512 11.26 us, B=8 12.29, the eighth cluster
/// sharing SMs with another) but the 8-CTA ones do (fifteen), the wider CTAs measured 1.02-1.18x
/// faster (run 91: B=8 12.45 -> 11.84 us, B=15 14.72 -> 12.45). Where both fit, the narrow ones
/// win (run 90, B=1: 10.98 against 11.71 us; fp32 B=1-4 run 265, H100: the wide ones 0.79-0.95x,
/// 1 x 129280 k=50 12.51 against 13.65). fp32 rows gained once the 512-thread CTAs flipped
/// their registers once (run 262, H100: 8 x 129280 k=50 1.01x, k=1024 1.09x, k=4096 1.14x,
/// 12 x 129280 k=50 1.03x, 15 x 129280 k=1024 1.50x, 8 x 100000 k=512 1.05x).
bool wide_batch_clusters(const TopkProblem& p) {
  if (p.row_len <= kWideChoiceLen ||
      p.row_len > kShortMaxLen * kMaxClusterCtas ||
      cluster_limit(p, cuda::kWideClusterThreads) < kMaxClusterCtas) {
    return false;
  }
  // Rows of this range take 5-8 wide CTAs; the count for 8 holds for all (fewer fit no worse).
  static PerDeviceDtype narrow_fit, wide_fit;
  const int narrow = narrow_fit.get(p, 0, [](auto traits) {
    return cuda::resident_clusters<decltype(traits)>(kMaxClusterCtas, cuda::kWideClusterThreads,
                                                     false);
  });
  const int wide = wide_fit.get(p, 0, [](auto traits) {
    return cuda::resident_clusters<decltype(traits)>(kMaxClusterCtas / 2,
                                                     cuda::kWideClusterThreads, false);
  });
  return p.batch > narrow && p.batch <= wide;
}

/// Whether the ragged-row policy keeps three CTAs an SM for this dtype on this device.
bool triple_fits_three(const TopkProblem& p) {
  static PerDeviceDtype cache;
  const int ctas = cache.get(
      p, 0, [](auto traits) { return cuda::triple_ctas_per_sm<decltype(traits)>(); });
  return ctas >= 3;
}

/// Whether the merge kernels for this dtype may launch as programmatic dependents of the slice
/// kernel on this device (cuda::merges_wait_for_slices).
bool dependent_merges(const TopkProblem& p) {
  static PerDeviceDtype cache;
  return cache.get(p, 0, [](auto traits) {
    return cuda::merges_wait_for_slices<decltype(traits)>();
  }) != 0;
}

/// ATTNKIT_CUDA_TOPK_PATH, read once: "cluster" prefers the cluster kernel wherever it can
/// run (rows of up to 16 * 16384 columns, one CTA per row for rows of up to 8192), "filter"
/// never takes it, anything else (the default, "auto") takes it where it measured fastest.
enum class PathChoice { kAuto, kCluster, kFilter };

PathChoice path_choice() {
  static const PathChoice choice = [] {
    const char* v = std::getenv("ATTNKIT_CUDA_TOPK_PATH");
    if (v != nullptr && std::strcmp(v, "cluster") == 0) return PathChoice::kCluster;
    if (v != nullptr && std::strcmp(v, "filter") == 0) return PathChoice::kFilter;
    return PathChoice::kAuto;
  }();
  return choice;
}

/// Whether the rows go to the cluster kernel (k >= 2 and k <= kMaxFilterK, checked by the
/// caller). It wins where the grid is small: a whole row per cluster cuts the latency of one
/// call; with many rows, the short-row and filter kernels use the SMs better. The bounds come
/// from the sweep of run 39 (docs/gpu-runs.md): up to two CTAs an SM everywhere; up to four for
/// 16-bit rows of more than 32K columns (B=32 x 128K: 1.2-1.5x faster than the filter kernel,
/// B=64 x 64K: 1.1-1.3x). fp32 rows need more passes, and shorter rows keep the filter
/// kernel's slices busy, so there the cluster kernel lost beyond two CTAs an SM (0.86-0.90x).
/// Rows beyond 16 x 8192 columns (and the batches wide_batch_clusters picks) take 512-thread
/// CTAs, one an SM, while B x CTAs <= SMs. Not every such grid is resident at once (a cluster
/// stays within one GPC: an H200 holds seven clusters of ten or thirteen such CTAs), but two
/// waves still beat the filter kernel: 8 x 151936 fp32 k=50 31.7 us against 33.0-33.2, 8 x
/// 202048 k=1024 39.1 against 56.4 (runs 72, 75).
/// When it does, `ctas` and `threads` receive the CTAs per row and the threads per CTA.
bool use_cluster_kernel(const TopkProblem& p, int sms, int& ctas, int& threads) {
  const PathChoice choice = path_choice();
  if (choice == PathChoice::kFilter || p.row_len > cuda::kClusterMaxLen) return false;
  const bool wide = wide_batch_clusters(p);
  const int c = short_cluster_ctas(p.row_len, wide);
  const int t = short_cluster_threads(p.row_len, wide);
  if (c > 1 && cluster_limit(p, t) < c) return false;
  bool take = true;
  if (choice != PathChoice::kCluster) {
    if (t == cuda::kWideClusterThreads) {
      take = p.batch * c <= sms;
    } else {
      const bool four = p.dtype != DType::kFloat32 && c >= 8;  // 16-bit, > 32K columns
      const std::int64_t max_ctas = (four ? 4 : 2) * static_cast<std::int64_t>(sms);
      take = c > 1 && p.batch * c <= max_ctas;
    }
  }
  if (take) {
    ctas = c;
    threads = t;
  }
  return take;
}

/// Start offset of row i's segment in the flat [B, k] array of ranked keys.
struct RowStart {
  std::int64_t k;
  __host__ __device__ std::int64_t operator()(std::int64_t i) const { return i * k; }
};

using RowStartIt = thrust::transform_iterator<RowStart, thrust::counting_iterator<std::int64_t>>;

std::size_t segmented_sort_bytes(std::int64_t batch, std::int64_t k, cudaStream_t stream) {
  const RowStartIt starts(thrust::counting_iterator<std::int64_t>(0), RowStart{k});
  std::size_t bytes = 0;
  cuda_check(cub::DeviceSegmentedSort::SortKeysDescending(
                 nullptr, bytes, static_cast<const std::uint64_t*>(nullptr),
                 static_cast<std::uint64_t*>(nullptr), batch * k, batch, starts, starts + 1,
                 stream),
             "cub::DeviceSegmentedSort (size query)");
  return bytes;
}

/// Byte offsets of the workspace parts; 0-sized parts are absent.
struct Layout {
  std::size_t nan_flag = 0, nan_at = 0, slice_key = 0, slice_col = 0, slice_threshold = 0,
              slice_count = 0, ranked_in = 0, ranked_out = 0, cub = 0;
  std::size_t total = 0;
};

struct Launch {
  TopkPlan plan;
  Layout layout;
  std::uint32_t k_select = 1, slot_stride = 4;
};

Launch make_launch(const TopkProblem& p) {
  Launch l;
  TopkPlan& plan = l.plan;
  plan.batch = p.batch;
  const std::int64_t selectable = std::min(p.k, p.row_len);
  l.k_select = static_cast<std::uint32_t>(std::max<std::int64_t>(selectable, 1));
  std::size_t off = 0;
  auto take = [&](std::size_t bytes) {
    const std::size_t at = off;
    off += align_up(bytes);
    return at;
  };
  if (p.nan == NanPolicy::kRaise) {
    l.layout.nan_flag = take(sizeof(int));
    l.layout.nan_at = take(sizeof(unsigned long long));
  }
  if (p.k == 0) {  // with nan="raise" only (cuda_topk): the valid ranges are scanned for NaN
    plan.path = TopkPath::kNanScan;
    l.layout.total = off;
    return l;
  }

  if (l.k_select > cuda::kMaxFilterK) {
    plan.path = TopkPath::kRadix;
    if (p.order == TopkOrder::kValue) {
      const std::size_t bytes = static_cast<std::size_t>(p.batch * p.k) * sizeof(std::uint64_t);
      l.layout.ranked_in = take(bytes);
      l.layout.ranked_out = take(bytes);
      plan.cub_bytes = segmented_sort_bytes(p.batch, p.k, nullptr);
      l.layout.cub = take(plan.cub_bytes);
    }
    l.layout.total = off;
    return l;
  }

  const int sms = sm_count(p.device.index);
  const std::uint32_t k = l.k_select;
  const bool sorted = p.order == TopkOrder::kValue;
  l.slot_stride = (k + 3) / 4 * 4;
  if (p.k == 1) {
    // Argmax: no candidate lists. Rows are cut until the grid holds four CTAs per SM (short
    // CTAs even out the waves), each slice streaming at least kArgmaxMinSlice elements.
    plan.path = TopkPath::kArgmax;
    const std::int64_t want = 4 * static_cast<std::int64_t>(sms) / p.batch;
    const std::int64_t by_length = p.row_len / cuda::kArgmaxMinSlice;
    plan.slices = static_cast<int>(std::clamp<std::int64_t>(std::min(want, by_length), 1, 64));
  } else if (use_cluster_kernel(p, sms, plan.cluster_ctas, plan.cluster_threads)) {
    // Rows in the registers of one cluster: one sampled threshold, one select, no rounds.
    plan.path = TopkPath::kCluster;
    plan.rows.survivor_slots = cuda::next_pow2_host(k);  // kept keys and columns, [2][slots]
  } else if (p.row_len <= cuda::kShortMaxLen) {
    // Rows that fit the registers of one CTA: one select, no rounds.
    plan.path = TopkPath::kShort;
    plan.rows.survivor_slots = cuda::next_pow2_host(k);  // kept keys and columns, [2][slots]
    if (p.dtype == DType::kFloat32 && p.row_len > cuda::kShortWideMinLen && !sorted) {
      plan.short_threads = cuda::kShortWideThreads;
    }
  } else {
    // Narrow CTAs (two per SM) when there are rows for every SM and both fit in shared memory,
    // with the widest rounds that fit; three per SM for ragged rows.
    const std::size_t elem = dtype_size(p.dtype);
    const cuda::BufferPlan narrow = cuda::buffer_plan(k, cuda::NarrowPolicy::round(elem),
                                                      cuda::kNarrowSmem, p.row_len, sorted);
    const cuda::BufferPlan narrow_half = cuda::buffer_plan(
        k, cuda::NarrowHalfRoundPolicy::round(elem), cuda::kNarrowSmem, p.row_len, sorted);
    // Three CTAs an SM only where their buffers fit without a smaller slack (which would add
    // selects: fp32 k > 1152) and the device keeps three resident.
    const cuda::BufferPlan triple = cuda::buffer_plan(
        k, cuda::TriplePolicy::round(elem), cuda::kTripleSmem, p.row_len, sorted);
    const cuda::BufferPlan triple_full = cuda::buffer_plan(
        k, cuda::TriplePolicy::round(elem), cuda::kMaxDynamicSmem, p.row_len, sorted);
    const bool long_rows = p.row_len * static_cast<std::int64_t>(elem) >= kSmallRoomMinBytes;
    if (p.batch >= sms && p.end.data != nullptr && triple.smem() <= cuda::kTripleSmem &&
        triple.limit == triple_full.limit && (!triple.small_room || long_rows) &&
        triple_fits_three(p)) {
      plan.policy = RowsPolicy::kTriple;
      plan.rows = triple;
    } else if (p.batch >= sms && narrow.smem() <= cuda::kNarrowSmem &&
               (!narrow.small_room || long_rows)) {
      plan.policy = RowsPolicy::kNarrow;
      plan.rows = narrow;
    } else if (p.batch >= sms && narrow_half.smem() <= cuda::kNarrowSmem &&
               !narrow_half.small_room) {
      plan.policy = RowsPolicy::kNarrowHalfRound;
      plan.rows = narrow_half;
    } else {
      plan.policy = RowsPolicy::kWide;
      const std::uint32_t round = cuda::WidePolicy::round(elem);
      std::int64_t slice_len = p.row_len;
      if (p.batch < sms) {
        // Cut rows so that the grid covers the GPU and each slice streams at least a round.
        // The slices of a row share its sampled floor, so the merge reads a few k candidates a
        // row however many slices there are; rows that take no floor (k above about a fifth
        // of the row) pass k a slice, at most 32K a row.
        const std::int64_t want = sms / p.batch;
        const std::int64_t by_length = p.row_len / round;
        const std::int64_t by_merge =
            filter_row_floored(k, p.row_len, 16 / static_cast<std::int64_t>(elem))
                ? cuda::kMaxSlices
                : 32768 / l.slot_stride;
        plan.slices = static_cast<int>(std::clamp<std::int64_t>(
            std::min({want, by_length, by_merge}), 1, cuda::kMaxSlices));
        slice_len = (p.row_len + plan.slices - 1) / plan.slices;
        // A slice keeps its row's sample in its newcomer list while it finds the floor.
        if (plan.slices > 1) slice_len = std::max(slice_len, kFilterSampleMaxKeys);
      }
      plan.rows = cuda::buffer_plan(k, round, cuda::kMaxDynamicSmem, slice_len, sorted);
    }
  }
  if (plan.slices > 1) {
    plan.dependent_merge = dependent_merges(p);
    if (plan.path == TopkPath::kFilter) {
      // Room for the whole row: the merge streams it again when the row's sample misled it.
      plan.merge = cuda::buffer_plan(k, cuda::merge_round(dtype_size(p.dtype)),
                                     cuda::kMaxDynamicSmem, p.row_len, sorted);
      // Room for every slice's list where it fits, so that the merge selects once.
      const std::int64_t lists = static_cast<std::int64_t>(plan.slices) * l.slot_stride;
      cuda::BufferPlan all = plan.merge;
      all.newcomer_slots = static_cast<std::uint32_t>(
          std::min<std::int64_t>(std::max<std::int64_t>(lists, all.newcomer_slots),
                                 65535 - 2 * static_cast<std::int64_t>(all.survivor_slots)));
      all.newcomer_limit += all.newcomer_slots - plan.merge.newcomer_slots;
      if (all.newcomer_slots > plan.merge.newcomer_slots && all.smem() <= cuda::kMaxDynamicSmem) {
        plan.merge = all;
      }
    }
    const std::size_t bytes =
        static_cast<std::size_t>(p.batch) * plan.slices * l.slot_stride * sizeof(std::uint32_t);
    l.layout.slice_key = take(bytes);
    l.layout.slice_col = take(bytes);
    if (plan.path == TopkPath::kFilter) {
      const std::size_t words =
          static_cast<std::size_t>(p.batch) * plan.slices * sizeof(std::uint32_t);
      l.layout.slice_threshold = take(words);
      l.layout.slice_count = take(words);
    }
  }
  l.layout.total = off;
  return l;
}

TopkKernelParams make_params(const TopkProblem& p, const Launch& l, char* ws) {
  TopkKernelParams k{};
  k.x = p.x;
  k.row_len = p.row_len;
  k.row_stride = p.row_stride;
  k.begin = p.begin.data;
  k.begin_stride = p.begin.stride;
  k.begin_is_int64 = p.begin.is_int64;
  k.end = p.end.data;
  k.end_stride = p.end.stride;
  k.end_is_int64 = p.end.is_int64;
  k.index_offset = p.index_offset.data;
  k.index_offset_stride = p.index_offset.stride;
  k.index_offset_is_int64 = p.index_offset.is_int64;
  k.values = p.values;
  k.values_row_stride = p.values_row_stride;
  k.indices = p.indices;
  k.indices_row_stride = p.indices_row_stride;
  k.indices_int64 = p.indices_int64;
  k.k = p.k;
  k.index_fill = p.index_fill;
  k.value_fill_bits = p.value_fill_bits;
  const bool ignore = p.nan == NanPolicy::kIgnore;
  switch (p.dtype) {
    case DType::kFloat32: k.sp = make_score_params<Float32Traits>(p.largest, ignore); break;
    case DType::kBFloat16: k.sp = make_score_params<BFloat16Traits>(p.largest, ignore); break;
    default: k.sp = make_score_params<Float16Traits>(p.largest, ignore); break;
  }
  k.sort_by_value = p.order == TopkOrder::kValue;
  k.k_select = l.k_select;
  k.slices = l.plan.slices;
  k.slot_stride = l.slot_stride;
  if (l.plan.slices > 1) {
    k.slice_key = reinterpret_cast<std::uint32_t*>(ws + l.layout.slice_key);
    k.slice_col = reinterpret_cast<std::uint32_t*>(ws + l.layout.slice_col);
    if (l.plan.path == TopkPath::kFilter) {
      k.slice_threshold = reinterpret_cast<std::uint32_t*>(ws + l.layout.slice_threshold);
      k.slice_count = reinterpret_cast<std::uint32_t*>(ws + l.layout.slice_count);
    }
  }
  if (l.plan.path == TopkPath::kRadix && p.order == TopkOrder::kValue) {
    k.ranked = reinterpret_cast<std::uint64_t*>(ws + l.layout.ranked_in);
  }
  if (p.nan == NanPolicy::kRaise) k.nan_flag = reinterpret_cast<int*>(ws + l.layout.nan_flag);
  return k;
}

/// An NVTX range around one public call, so that profiles show attnkit's share.
struct NvtxRange {
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
};

/// Once a kernel has set the NaN flag: the row and column of the first NaN in row-major order,
/// from a scan of the valid ranges (the error path only; the selection kernels keep one flag).
NanPosition locate_nan(const TopkProblem& p, const Launch& l, const TopkKernelParams& params,
                       char* ws, cudaStream_t stream) {
  TopkPlan scan = l.plan;
  scan.path = TopkPath::kNanScan;
  TopkKernelParams q = params;
  q.nan_at = reinterpret_cast<unsigned long long*>(ws + l.layout.nan_at);
  cuda_check(cudaMemsetAsync(q.nan_at, 0xFF, sizeof *q.nan_at, stream), "cudaMemsetAsync");
  with_traits(p.dtype, [&](auto traits) { cuda::launch_topk<decltype(traits)>(scan, q, stream); });
  unsigned long long at = 0;
  cuda_copy_to_host(&at, q.nan_at, sizeof at, 1, 1, stream);
  if (at == ~0ull) {
    throw Error(ErrorCode::kInternal, "cuda topk: a kernel saw a NaN that the scan did not find");
  }
  return {static_cast<std::int64_t>(at >> 32), static_cast<std::int64_t>(at & 0xFFFFFFFFull)};
}

/// Whether a call launches nothing: no rows, or k = 0 without a NaN scan to run.
bool nothing_to_launch(const TopkProblem& p) {
  return p.batch == 0 || (p.k == 0 && p.nan != NanPolicy::kRaise);
}

}  // namespace

std::size_t cuda_topk_workspace_size(const TopkProblem& p) {
  if (nothing_to_launch(p)) return 0;
  DeviceGuard guard(p.device.index);
  return make_launch(p).layout.total;
}

NanPosition cuda_topk(const TopkProblem& p, void* workspace, std::size_t workspace_bytes,
                      cudaStream_t stream) {
  if (nothing_to_launch(p)) return {};
  DeviceGuard guard(p.device.index);
  NvtxRange range("attnkit::topk");
  const Launch l = make_launch(p);
  if (workspace_bytes < l.layout.total) {
    throw Error(ErrorCode::kInternal, "cuda topk: workspace smaller than its own size query");
  }
  char* ws = static_cast<char*>(workspace);
  const TopkKernelParams params = make_params(p, l, ws);
#if defined(ATTNKIT_LOG_LAUNCHES)
  std::fprintf(stderr,
               "attnkit topk: B=%lld N=%lld k=%lld path=%s policy=%s slices=%d "
               "dependent_merge=%d cluster=%dx%d short_threads=%d limit=%u smem=%zu\n",
               static_cast<long long>(p.batch), static_cast<long long>(p.row_len),
               static_cast<long long>(p.k), l.plan.path == TopkPath::kRadix    ? "radix"
               : l.plan.path == TopkPath::kArgmax ? "argmax"
               : l.plan.path == TopkPath::kShort  ? "short"
               : l.plan.path == TopkPath::kCluster ? "cluster"
               : l.plan.path == TopkPath::kNanScan ? "nan-scan"
                                                  : "filter",
               l.plan.policy == RowsPolicy::kNarrow            ? "narrow"
               : l.plan.policy == RowsPolicy::kNarrowHalfRound ? "narrow-half-round"
               : l.plan.policy == RowsPolicy::kTriple          ? "triple"
                                                               : "wide",
               l.plan.slices, static_cast<int>(l.plan.dependent_merge), l.plan.cluster_ctas,
               l.plan.cluster_threads, l.plan.short_threads, l.plan.rows.limit,
               l.plan.rows.smem());
#endif
  if (params.nan_flag != nullptr) {
    cuda_check(cudaMemsetAsync(params.nan_flag, 0, sizeof(int), stream), "cudaMemsetAsync");
  }
  with_traits(p.dtype, [&](auto traits) {
    using Traits = decltype(traits);
    cuda::launch_topk<Traits>(l.plan, params, stream);
    if (params.ranked != nullptr) {
      auto* sorted = reinterpret_cast<std::uint64_t*>(ws + l.layout.ranked_out);
      const RowStartIt starts(thrust::counting_iterator<std::int64_t>(0), RowStart{p.k});
      std::size_t bytes = l.plan.cub_bytes;
      cuda_check(cub::DeviceSegmentedSort::SortKeysDescending(
                     ws + l.layout.cub, bytes, params.ranked, sorted, p.batch * p.k, p.batch,
                     starts, starts + 1, stream),
                 "cub::DeviceSegmentedSort");
      cuda::launch_ranked<Traits>(l.plan, params, sorted, stream);
    }
  });
  if (params.nan_flag != nullptr) {
    int found = 0;
    cuda_copy_to_host(&found, params.nan_flag, sizeof found, 1, 1, stream);
    if (found) return locate_nan(p, l, params, ws, stream);
  }
  return {};
}

}  // namespace attnkit::detail
