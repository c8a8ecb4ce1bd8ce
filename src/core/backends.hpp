// SPDX-License-Identifier: Apache-2.0
// The backend entry points the dispatch layer calls. Each takes a checked problem and trusts it.
#pragma once

#include <cstddef>
#include <string>

#include "attnkit/error.hpp"
#include "attnkit/tensor.hpp"
#include "common/topk_keys.hpp"
#include "core/topk_problem.hpp"

namespace attnkit::detail {

/// Calls fn with the score traits of a checked problem's dtype (Float32Traits{}, ...) and
/// returns what it returns: the one dtype switch of both backends.
template <class Fn>
auto with_traits(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: return fn(Float32Traits{});
    case DType::kBFloat16: return fn(BFloat16Traits{});
    case DType::kFloat16: return fn(Float16Traits{});
    default: break;
  }
  throw Error(ErrorCode::kInternal, "topk: unexpected dtype after checks");
}

// CPU (src/cpu/).
void cpu_topk(const TopkProblem& p);
void cpu_topk_reference(const TopkProblem& p);
/// Row and column of the first NaN in a row's valid range, or row -1 when there is none
/// (for nan = "raise", checked before any write).
struct NanPosition {
  std::int64_t row = -1, col = -1;
};
NanPosition cpu_topk_find_nan(const TopkProblem& p);

#if defined(ATTNKIT_WITH_CUDA)
// CUDA (src/cuda/).
std::size_t cuda_topk_workspace_size(const TopkProblem& p);
/// Launches on `stream`. With nan = "raise" it synchronizes and returns the first NaN in a
/// valid range (row -1 when there is none), the outputs then being unspecified.
NanPosition cuda_topk(const TopkProblem& p, void* workspace, std::size_t workspace_bytes,
                      cudaStream_t stream);
/// Stream-ordered allocation from attnkit's cached pool for `device`.
void* cuda_pool_allocate(Device device, std::size_t bytes, cudaStream_t stream);
void cuda_pool_free(Device device, void* ptr, cudaStream_t stream);
/// Copies `count` elements of `elem_bytes` each, `stride` elements apart (any sign; 0 repeats
/// one element), from device memory to contiguous host memory on `stream`, and waits for it.
void cuda_copy_to_host(void* dst, const void* src, std::size_t elem_bytes, std::int64_t count,
                       std::int64_t stride, cudaStream_t stream);
/// Lines for attnkit::build_info(): targets compiled in, devices and the variant for each.
std::string cuda_build_info();
#endif

}  // namespace attnkit::detail
