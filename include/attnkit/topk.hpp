// SPDX-License-Identifier: Apache-2.0
/// \file
/// Row-wise top-k selection: the DeepSeek Sparse Attention Lightning Indexer's top-k (bf16
/// scores, k of 512..2048 over up to a million keys) and the sampler's top-k (fp32 logits over
/// a ~128K vocabulary).
///
/// \par Semantics
/// For each row `b` of `x [B, N]` (a 1-D `x [N]` is one row), consider the valid range
/// `[begin[b], end[b])` (defaults `0` and `N`). The op returns the `k` best elements of that
/// range, best meaning largest (`largest = true`) or smallest.
/// - **Order of elements.** Values compare as real numbers; `-0.0 == +0.0`; `-inf` and `+inf`
///   are ordinary values. NaN depends on `TopkOptions::nan`: `kLargest` ranks every NaN above
///   `+inf` (as `torch.topk` does, also when `largest = false`, where a NaN is then the last
///   choice), `kIgnore` never selects a NaN, `kRaise` throws if a valid range holds one.
/// - **Ties.** `TiePolicy::kLowestIndex` (default) keeps, among elements equal to the k-th, those
///   with the lowest column index: the selected set equals the first k of a stable sort by
///   preference. `kAny` may keep any of them; attnkit's backends currently return the same set
///   as `kLowestIndex`. Either way the output is deterministic: the same inputs give the same
///   bits on every run.
/// - **k larger than a row.** `k >= 0` may exceed the row's valid length (and `N`). The valid
///   elements fill the first slots and the remaining slots are padding: indices
///   `index_fill` (default -1, `index_offset` not added), values `value_fill` (default `-inf`
///   when `largest`, `+inf` otherwise). Padding is always last.
/// - **Order of the output.** `TopkOrder::kNone`: unspecified but deterministic (attnkit's
///   backends return ascending column order); `kIndex`: ascending column index; `kValue`:
///   best first (descending values when `largest`), ties by ascending index.
/// - Values are copied bit for bit from `x` (a selected `-0.0` stays `-0.0`, NaN payloads are
///   kept). Indices are column indices in `[0, N)`, plus `index_offset[b]` when given,
///   computed in 64 bits and stored in the dtype of `out_indices`.
///
/// \par Determinism
/// Bitwise deterministic on every backend; no atomics decide what or where anything is written.
///
/// \par Complexity and bytes moved
/// Each valid element is read once (k <= 4096 on CUDA), plus a small sample of long rows and,
/// rarely, a second read of a row whose sample overestimated it (docs/topk.md). Writes are
/// `B * k` indices, plus `B * k` values when `out_values` is given. Work is
/// `O(N + k log(N / k))` per row in expectation on random data (see docs/topk.md for the bound
/// and its worst case, rows sorted ascending).
///
/// \par Requirements
/// - `x`: float32, bfloat16 or float16; rank 1 or 2; last dimension contiguous (stride 1) when
///   it has more than one element; any row stride (zero and negative included) and any
///   element offset (the data pointer a multiple of the element size). `N <= 2^31 - 1`,
///   `B <= 2^31 - 1`.
/// - `begin`, `end`, `index_offset`: rank 1, `[B]` (`[1]` for 1-D `x`), int32 or int64, any
///   stride, same device.
/// - `out_indices`: `[B, k]` (`[k]` for 1-D `x`), int32 or int64, last dimension contiguous,
///   any row stride whose rows do not overlap. `out_values`: the same shape, `x`'s dtype.
///   Outputs may not share a byte with each other or any input (they may lie between x's
///   rows, e.g. in spare columns of x's buffer, or between the elements of a strided
///   `begin`/`end`/`index_offset`); the error gives both byte ranges.
///
/// \par Errors (attnkit::Error)
/// `kShape`: wrong rank or mismatched sizes, `N` or `B` above 2^31 - 1; `kDType`: unsupported
/// dtype; `kDevice`: tensors on different devices, or CUDA tensors in a build without CUDA;
/// `kLayout`: a non-contiguous last dimension, overlapping buffers or output rows, a data
/// pointer that is not a multiple of the element size, a byte span of 2^62 or more; `kValue`:
/// k outside [0, 2^31 - 1], `x` or `out_indices` not set (a default `TensorView`), a null data
/// pointer with elements, `begin`/`end`/`index_offset`
/// values outside their rules when checked, an index that does not fit int32, a workspace too
/// small or not 256-byte aligned; `kNanFound`: a NaN in a valid range with `nan = kRaise`;
/// `kDeviceFault`: a CUDA runtime call failed; `kInternal`: a broken invariant (please report).
/// No output is written when an error is raised before the kernel runs. On CUDA,
/// `nan = kRaise` is detected after the kernel ran (one stream sync) and then leaves the
/// outputs unspecified. The CPU backend's scratch comes from the heap, reserved before any row
/// is written: running out of host memory there throws `std::bad_alloc` (Python: MemoryError;
/// its `what()` names the buffers, k and the shape) and leaves the outputs as they were.
///
/// \par Per-row values
/// `begin`, `end` and `index_offset` live on the tensors' device. With checking on (the CPU
/// default; `CheckMode::kOn` on CUDA, which waits on the stream for a host copy of each vector)
/// they must satisfy `0 <= begin[b] <= end[b] <= N` and `index + index_offset[b]` must fit the
/// index dtype. With checking off the kernels clamp `end` into `[0, N]` and `begin` into
/// `[0, end]`, so no access is ever out of bounds.
///
/// \par Threads
/// Calls are thread-safe. On the CPU, concurrent calls share one thread pool whose parallel
/// loops run one at a time (calls take turns loop by loop); `set_num_threads` (runtime.hpp) may
/// run during a call, which then uses at most the threads it counted when it started. On CUDA,
/// a call is enqueued on the `stream` it is given (the default stream unless one is passed).
///
/// \par Sources
/// `torch.topk` (NaN above +inf, `largest`, `sorted`); DeepSelect (`end`, `output_idx_offset`,
/// fills, `return_value`, `sorted_index`, the one-read threshold filter); CUB `DeviceTopK`
/// (explicit tie and order requirements, two-phase workspace).
///
/// \par Example
/// README.md "C++ example"; in the source tree, the test `tests/cpp/test_topk_api.cpp` holds
/// \snippet tests/cpp/test_topk_api.cpp topk example
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "attnkit/error.hpp"
#include "attnkit/tensor.hpp"

namespace attnkit {

/// Order of each output row.
enum class TopkOrder : std::uint8_t {
  kNone,   ///< unspecified, deterministic (currently ascending column index)
  kIndex,  ///< ascending column index (DeepSelect `sorted_index`)
  kValue,  ///< best first, ties by ascending index (`torch.topk(sorted=True)`)
};

/// What a NaN in a valid range means.
enum class NanPolicy : std::uint8_t {
  kLargest,  ///< NaN ranks above +inf (torch.topk)
  kIgnore,   ///< NaN is never selected; the row may pad
  kRaise,    ///< throw Error(kNanFound); on CUDA checked after the kernel (one sync)
};

/// Which of the elements equal to the k-th are kept.
enum class TiePolicy : std::uint8_t {
  kLowestIndex,  ///< the lowest column indices (a stable sort's first k)
  kAny,          ///< any of them; still deterministic
};

/// Whether device-resident per-row values (`begin`, `end`, `index_offset`) are validated.
enum class CheckMode : std::uint8_t {
  kDefault,  ///< on for CPU tensors, off for CUDA tensors
  kOn,       ///< validate and throw; on CUDA a host copy of each vector, and a wait for it
  kOff,      ///< clamp silently
};

/// Which implementation runs.
enum class TopkBackend : std::uint8_t {
  kAuto,       ///< the fast path for the tensors' device
  kReference,  ///< CPU only: a plain stable sort per row; slow, for tests and debugging
};

/// Options of `topk`; every field has the default of the Python API (`attnkit.topk`).
struct TopkOptions {
  std::int64_t k = 0;           ///< number of elements per row; >= 0, may exceed N
  bool largest = true;          ///< select the largest (true) or smallest (false) values
  TopkOrder sorted = TopkOrder::kNone;
  NanPolicy nan = NanPolicy::kLargest;
  TiePolicy ties = TiePolicy::kLowestIndex;
  std::int64_t index_fill = -1;       ///< index written to padding slots
  std::optional<double> value_fill;   ///< value written to padding slots (rounded once to x's
                                      ///< dtype, to nearest even, whatever the thread's
                                      ///< rounding and flush-to-zero modes); default -inf/+inf
  CheckMode check = CheckMode::kDefault;
  TopkBackend backend = TopkBackend::kAuto;
};

/// The tensors of one `topk` call. Optional inputs are absent when not given.
struct TopkTensors {
  TensorView x;                              ///< [in] [B, N] or [N]
  std::optional<TensorView> begin;           ///< [in] [B] int32/int64, default 0
  std::optional<TensorView> end;             ///< [in] [B] int32/int64, default N
  std::optional<TensorView> index_offset;    ///< [in] [B] int32/int64, added to indices
  std::optional<TensorView> out_values;      ///< [out] [B, k] x.dtype; absent: no values
  TensorView out_indices;                    ///< [out] [B, k] int32/int64
};

/// Validates x, k, the options, begin, end and index_offset as `topk` does, ignoring the
/// outputs: lets a caller that allocates the [B, k] outputs report bad input before it does.
/// The per-row values of begin, end and index_offset are checked here on the CPU only (with
/// checking on; index_offset against int64's range, since the index dtype comes with the
/// outputs); on CUDA, where reading them costs a sync, `topk` checks them before it writes.
/// \throws Error as listed in the file comment.
void topk_check_inputs(const TopkTensors& tensors, const TopkOptions& options);

/// Validates the call (all rules above except the per-row values) and returns the bytes of
/// device workspace it needs; 0 on the CPU.
/// \throws Error as listed in the file comment.
std::size_t topk_workspace_size(const TopkTensors& tensors, const TopkOptions& options);

/// Two-phase form (CUB style). With `workspace == nullptr` only `workspace_bytes` is set and
/// nothing else happens. Otherwise `workspace` must hold `workspace_bytes` bytes on the
/// tensors' device, at least `topk_workspace_size(...)`, aligned to 256 bytes (on the CPU too,
/// where the size is 0, so that code moved to a GPU keeps working). Runs on
/// `stream` (ignored on the CPU) and returns without synchronizing unless `nan = kRaise` or
/// `check = kOn` asked for a check that needs it.
/// \throws Error as listed in the file comment; `kValue` if the workspace is too small or not
/// aligned to 256 bytes.
void topk(void* workspace, std::size_t& workspace_bytes, const TopkTensors& tensors,
          const TopkOptions& options, cudaStream_t stream = nullptr);

/// One-call form: workspace comes from attnkit's stream-ordered pool for the device (cached;
/// the first call on a device may allocate, later calls of equal or smaller size do not).
void topk(const TopkTensors& tensors, const TopkOptions& options, cudaStream_t stream = nullptr);

}  // namespace attnkit
