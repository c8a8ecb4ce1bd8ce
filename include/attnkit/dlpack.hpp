// SPDX-License-Identifier: Apache-2.0
/// \file
/// Conversion between `attnkit::TensorView` and DLPack's `DLTensor` (dmlc/dlpack).
///
/// DLPack strides and shapes are in elements, as ours are; a `DLTensor` with null `strides`
/// is C-contiguous. `byte_offset` is folded into the view's data pointer.
#pragma once

#include <dlpack/dlpack.h>

#include "attnkit/tensor.hpp"

namespace attnkit {

/// A view of `t`'s memory.
/// \throws Error(kDType) for element types attnkit has no DType for (complex, float8, vector
///         lanes, ...; the integer types and bool are known, though topk refuses them);
///         Error(kDevice) for devices other than CPU, CUDA and CUDA host memory;
///         Error(kShape) for more than kMaxDims dimensions; Error(kLayout), where `data` is
///         not null, for a `byte_offset` of 2^62 or more, or one that wraps the address.
TensorView from_dlpack(const DLTensor& t);

/// A `DLTensor` describing `view`. Its `shape` and `strides` point into `view`, which must
/// outlive the result.
/// \throws Error(kDType), Error(kShape), Error(kDevice) for a view whose dtype, ndim or device
///         is out of range.
DLTensor to_dlpack(TensorView& view);

}  // namespace attnkit
