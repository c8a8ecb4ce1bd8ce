// SPDX-License-Identifier: Apache-2.0
#include "attnkit/error.hpp"

namespace attnkit {

const char* error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kValue: return "value";
    case ErrorCode::kShape: return "shape";
    case ErrorCode::kDType: return "dtype";
    case ErrorCode::kDevice: return "device";
    case ErrorCode::kLayout: return "layout";
    case ErrorCode::kNanFound: return "nan_found";
    case ErrorCode::kDeviceFault: return "device_fault";
    case ErrorCode::kInternal: return "internal";
  }
  return "unknown";
}

}  // namespace attnkit
