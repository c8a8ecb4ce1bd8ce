// SPDX-License-Identifier: Apache-2.0
/// \file
/// The one exception type attnkit throws.
///
/// Every message names the argument, the value seen and the rule it broke, for example
/// `topk: k = -3 must be >= 0`. The Python package maps the codes to built-in exceptions:
/// `kDType` -> `TypeError`; `kDeviceFault` and `kInternal` -> `RuntimeError`; all others ->
/// `ValueError`.
#pragma once

#include <exception>
#include <string>
#include <utility>

namespace attnkit {

enum class ErrorCode {
  kValue,        ///< a scalar argument or a per-row value breaks a rule
  kShape,        ///< wrong rank, mismatched sizes, wrong output shape
  kDType,        ///< unsupported or mismatched element type
  kDevice,       ///< tensors on different devices, or a device attnkit was built without
  kLayout,       ///< a stride rule (contiguous last dimension) or overlapping buffers
  kNanFound,     ///< `nan="raise"` found a NaN in a valid range
  kDeviceFault,  ///< a CUDA runtime call failed
  kInternal,     ///< a broken invariant inside attnkit; please report it
};

/// "value", "shape", "dtype", ...
const char* error_code_name(ErrorCode code) noexcept;

class Error : public std::exception {
 public:
  Error(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  ErrorCode code() const noexcept { return code_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  ErrorCode code_;
  std::string message_;
};

}  // namespace attnkit
