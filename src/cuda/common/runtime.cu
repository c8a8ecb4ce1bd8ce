// SPDX-License-Identifier: Apache-2.0
// CUDA runtime services of the backend: the cached workspace pool, host copies for checks,
// and build information.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "core/backends.hpp"
#include "cuda/common/cuda_check.cuh"

namespace attnkit::detail {
namespace {

/// One stream-ordered memory pool per device, created on first use. Its release threshold is
/// unlimited, so freed blocks stay cached and a call of the same size or smaller never reaches
/// cudaMalloc again; allocations and frees are ordered on the caller's stream, so concurrent
/// streams never share a live block, and both are legal inside CUDA graph capture.
cudaMemPool_t pool_for(int device) {
  static std::mutex mutex;
  static std::vector<cudaMemPool_t> pools;
  std::lock_guard<std::mutex> lock(mutex);
  if (static_cast<int>(pools.size()) <= device)
    pools.resize(static_cast<std::size_t>(device) + 1, nullptr);
  if (pools[static_cast<std::size_t>(device)] == nullptr) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t pool = nullptr;
    cuda_check(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate");
    unsigned long long threshold = ~0ull;
    cuda_check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold),
               "cudaMemPoolSetAttribute");
    pools[static_cast<std::size_t>(device)] = pool;
  }
  return pools[static_cast<std::size_t>(device)];
}

}  // namespace

void* cuda_pool_allocate(Device device, std::size_t bytes, cudaStream_t stream) {
  DeviceGuard guard(device.index);
  void* ptr = nullptr;
  cuda_check(cudaMallocFromPoolAsync(&ptr, bytes, pool_for(device.index), stream),
             "cudaMallocFromPoolAsync (workspace)");
  return ptr;
}

void cuda_pool_free(Device device, void* ptr, cudaStream_t stream) {
  DeviceGuard guard(device.index);
  cuda_check(cudaFreeAsync(ptr, stream), "cudaFreeAsync (workspace)");
}

void cuda_copy_to_host(void* dst, const void* src, std::size_t elem_bytes, std::int64_t count,
                       std::int64_t stride, cudaStream_t stream) {
  if (count <= 0) return;
  if (stride == 0) {
    // A broadcast vector holds one element: copy it, then repeat it on the host (a pitch of
    // one element would read count elements of a one-element buffer).
    cuda_copy_to_host(dst, src, elem_bytes, 1, 1, stream);
    char* d = static_cast<char*>(dst);
    for (std::int64_t i = 1; i < count; ++i) {
      std::memcpy(d + i * static_cast<std::int64_t>(elem_bytes), d, elem_bytes);
    }
    return;
  }
  // cudaMemcpy2D takes unsigned pitches: a negative stride is copied from its last element
  // upwards and reversed on the host.
  const char* first = static_cast<const char*>(src);
  if (stride < 0) first += (count - 1) * stride * static_cast<std::int64_t>(elem_bytes);
  const std::size_t pitch = static_cast<std::size_t>(stride < 0 ? -stride : stride) * elem_bytes;
  cuda_check(cudaMemcpy2DAsync(dst, elem_bytes, first, pitch, elem_bytes,
                               static_cast<std::size_t>(count), cudaMemcpyDeviceToHost, stream),
             "cudaMemcpy2DAsync");
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  if (stride < 0) {
    char* d = static_cast<char*>(dst);
    for (std::int64_t i = 0, j = count - 1; i < j; ++i, --j) {
      std::swap_ranges(d + i * static_cast<std::int64_t>(elem_bytes),
                       d + (i + 1) * static_cast<std::int64_t>(elem_bytes),
                       d + j * static_cast<std::int64_t>(elem_bytes));
    }
  }
}

std::string cuda_build_info() {
  int runtime = 0, driver = 0, count = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  const std::string driver_str =
      driver == 0 ? std::string("none")
                  : std::to_string(driver / 1000) + "." + std::to_string(driver % 1000 / 10);
  std::string s = "cuda: runtime " + std::to_string(runtime / 1000) + "." +
                  std::to_string(runtime % 1000 / 10) + ", driver " + driver_str +
                  ", compiled for " ATTNKIT_CUDA_TARGETS "\n";
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return s + "cuda devices: none visible\n";
  }
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) continue;
    s += "cuda:" + std::to_string(d) + ": " + prop.name + ", sm_" + std::to_string(prop.major) +
         std::to_string(prop.minor) + ", " + std::to_string(prop.multiProcessorCount) + " SMs, " +
         std::to_string(prop.totalGlobalMem >> 30) + " GiB\n";
  }
  return s;
}

}  // namespace attnkit::detail
