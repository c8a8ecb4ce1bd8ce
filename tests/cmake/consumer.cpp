// SPDX-License-Identifier: Apache-2.0
// A consumer of attnkit (tests/cmake/subproject, tests/cmake/installed): the best two of one
// row, printed as value:index. With ATTNKIT_CONSUMER_DLPACK the row passes through DLPack
// first, so that attnkit/dlpack.hpp must compile in the consuming project.
#include <cstdint>
#include <cstdio>

#include "attnkit/attnkit.hpp"
#ifdef ATTNKIT_CONSUMER_DLPACK
#include "attnkit/dlpack.hpp"
#endif

int main() {
  float x[4] = {0.5f, 4.0f, -1.0f, 2.0f};
  float values[2] = {};
  std::int32_t indices[2] = {};
  attnkit::TopkTensors t;
  t.x = attnkit::TensorView::make(x, attnkit::DType::kFloat32, {}, {4});
#ifdef ATTNKIT_CONSUMER_DLPACK
  t.x = attnkit::from_dlpack(attnkit::to_dlpack(t.x));
#endif
  t.out_values = attnkit::TensorView::make(values, attnkit::DType::kFloat32, {}, {2});
  t.out_indices = attnkit::TensorView::make(indices, attnkit::DType::kInt32, {}, {2});
  attnkit::TopkOptions options;
  options.k = 2;
  options.sorted = attnkit::TopkOrder::kValue;
  attnkit::topk(t, options);
  std::printf("%g:%d %g:%d\n", values[0], indices[0], values[1], indices[1]);
  return 0;
}
