// SPDX-License-Identifier: Apache-2.0
// Public topk entry points: check the arguments (check_topk.cpp), then hand the problem to
// the backend of the tensors' device. No computation happens here.
#include "attnkit/topk.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/error.hpp"
#include "core/backends.hpp"
#include "core/check_topk.hpp"
#include "core/check_util.hpp"

namespace attnkit {
namespace {

using detail::RowVector;
using detail::TopkProblem;

bool on_cuda(const TopkProblem& p) { return p.device.type == DeviceType::kCUDA; }

std::size_t required_workspace(const TopkProblem& p) {
#if defined(ATTNKIT_WITH_CUDA)
  if (on_cuda(p)) return detail::cuda_topk_workspace_size(p);
#endif
  (void)p;
  return 0;
}

#if defined(ATTNKIT_WITH_CUDA)
/// Host copy of a device row vector, for check_topk_row_values (one sync per vector).
RowVector host_copy(const RowVector& v, std::int64_t batch, std::vector<std::int64_t>& storage,
                    cudaStream_t stream) {
  if (v.data == nullptr || batch == 0) return {};
  storage.resize(static_cast<std::size_t>(batch));
  detail::cuda_copy_to_host(storage.data(), v.data, v.is_int64 ? 8 : 4, batch, v.stride, stream);
  return RowVector{storage.data(), v.is_int64, 1};
}
#endif

void check_rows(const TopkProblem& p, cudaStream_t stream) {
  if (!p.check_rows) return;
  if (!on_cuda(p)) {
    detail::check_topk_row_values(p, p.begin, p.end, p.index_offset);
    return;
  }
#if defined(ATTNKIT_WITH_CUDA)
  std::vector<std::int64_t> b, e, o;
  detail::check_topk_row_values(p, host_copy(p.begin, p.batch, b, stream),
                                host_copy(p.end, p.batch, e, stream),
                                host_copy(p.index_offset, p.batch, o, stream));
#else
  (void)stream;
#endif
}

/// The error of nan = "raise", naming the first NaN in row-major order (both backends).
void throw_if_nan(const TopkProblem& p, const detail::NanPosition& at) {
  if (at.row < 0) return;
  const std::string where = p.one_row ? "x[" + std::to_string(at.col) + "] is NaN, inside x's"
                                      : "x[" + std::to_string(at.row) + ", " +
                                            std::to_string(at.col) + "] is NaN, inside row " +
                                            std::to_string(at.row) + "'s";
  throw Error(ErrorCode::kNanFound, "topk: " + where + " valid range, and nan = \"raise\"");
}

void run(const TopkProblem& p, void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  check_rows(p, stream);
  if (!on_cuda(p)) {
    if (p.nan == NanPolicy::kRaise) throw_if_nan(p, detail::cpu_topk_find_nan(p));
    if (p.backend == TopkBackend::kReference) {
      detail::cpu_topk_reference(p);
    } else {
      detail::cpu_topk(p);
    }
    return;
  }
#if defined(ATTNKIT_WITH_CUDA)
  throw_if_nan(p, detail::cuda_topk(p, workspace, workspace_bytes, stream));
#else
  (void)workspace;
  (void)workspace_bytes;
#endif
}

/// fn(), with the op named in a device fault from below (the CUDA layer names only the runtime
/// call that failed), as every other error of topk is.
template <class Fn>
decltype(auto) naming_the_op(Fn&& fn) {
  try {
    return fn();
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kDeviceFault || std::string_view(e.what()).starts_with("topk: ")) {
      throw;
    }
    throw Error(ErrorCode::kDeviceFault, std::string("topk: ") + e.what());
  }
}

void topk_with_workspace(void* workspace, std::size_t& workspace_bytes, const TopkTensors& tensors,
                         const TopkOptions& options, cudaStream_t stream) {
  const TopkProblem p = detail::check_topk(tensors, options);
  const std::size_t need = required_workspace(p);
  if (workspace == nullptr) {
    workspace_bytes = need;
    return;
  }
  if (workspace_bytes < need) {
    throw Error(ErrorCode::kValue, "topk: workspace_bytes = " + std::to_string(workspace_bytes) +
                                       " is smaller than the " + std::to_string(need) +
                                       " bytes this call needs");
  }
  const auto address = reinterpret_cast<std::uintptr_t>(workspace);
  if (address % 256 != 0) {
    throw Error(ErrorCode::kValue, "topk: workspace = " + detail::hex_address(address) +
                                       " is not aligned to 256 bytes");
  }
  run(p, workspace, workspace_bytes, stream);
}

void topk_with_pool(const TopkTensors& tensors, const TopkOptions& options, cudaStream_t stream) {
  const TopkProblem p = detail::check_topk(tensors, options);
  const std::size_t need = required_workspace(p);
  if (need == 0) {
    run(p, nullptr, 0, stream);
    return;
  }
#if defined(ATTNKIT_WITH_CUDA)
  void* ws = detail::cuda_pool_allocate(p.device, need, stream);
  try {
    run(p, ws, need, stream);
  } catch (...) {
    detail::cuda_pool_free(p.device, ws, stream);
    throw;
  }
  detail::cuda_pool_free(p.device, ws, stream);
#endif
}

}  // namespace

void topk_check_inputs(const TopkTensors& tensors, const TopkOptions& options) {
  TopkProblem p = detail::check_topk_inputs(tensors, options);
  // On the CPU the per-row values are host memory, read at no cost: checked here too, so that
  // a bad begin or end is named before the caller allocates outputs. The index dtype comes
  // with the outputs, so index_offset is held to int64's range here (int32's in topk).
  if (p.check_rows && !on_cuda(p)) {
    p.indices_int64 = true;
    detail::check_topk_row_values(p, p.begin, p.end, p.index_offset);
  }
}

std::size_t topk_workspace_size(const TopkTensors& tensors, const TopkOptions& options) {
  return naming_the_op([&] { return required_workspace(detail::check_topk(tensors, options)); });
}

void topk(void* workspace, std::size_t& workspace_bytes, const TopkTensors& tensors,
          const TopkOptions& options, cudaStream_t stream) {
  naming_the_op([&] { topk_with_workspace(workspace, workspace_bytes, tensors, options, stream); });
}

void topk(const TopkTensors& tensors, const TopkOptions& options, cudaStream_t stream) {
  naming_the_op([&] { topk_with_pool(tensors, options, stream); });
}

}  // namespace attnkit
