// SPDX-License-Identifier: Apache-2.0
// Turning CUDA runtime failures into attnkit::Error(kDeviceFault) at the host boundary.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "attnkit/error.hpp"

namespace attnkit::detail {

inline void cuda_check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  std::string message = std::string(what) + " failed: " + cudaGetErrorName(status) + " (" +
                        cudaGetErrorString(status) + ")";
  if (status == cudaErrorNoDevice || status == cudaErrorInsufficientDriver) {
    // A machine with no NVIDIA driver at all reports an insufficient driver.
    message = "no usable CUDA GPU (none is visible, or the NVIDIA driver is missing or older "
              "than this build's CUDA runtime): " + message;
  }
  throw Error(ErrorCode::kDeviceFault, message);
}

/// Checks the launch that just happened (configuration errors, missing kernel image).
inline void cuda_check_launch(const char* kernel) {
  cuda_check(cudaGetLastError(), kernel);
}

/// Makes `device` current for the scope and restores the caller's device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cuda_check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) cuda_check(cudaSetDevice(device), "cudaSetDevice");
    device_ = device;
  }
  ~DeviceGuard() {
    if (previous_ != device_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  int device_ = 0;
};

}  // namespace attnkit::detail
