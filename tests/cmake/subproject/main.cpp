// SPDX-License-Identifier: Apache-2.0
// The README's C++ example as a program: prints value:index for each output slot.
#include <cstdint>
#include <cstdio>
#include <vector>

#include "attnkit/attnkit.hpp"

int main() {
  std::vector<float> x = {0.5f, 3.0f, -1.0f, 3.0f, 2.0f, 9.0f, 1.0f, 8.0f, 7.0f, 6.0f};
  std::vector<float> values(2 * 3);
  std::vector<std::int64_t> indices(2 * 3);
  const attnkit::Device cpu{};
  attnkit::TopkTensors t;
  t.x = attnkit::TensorView::make(x.data(), attnkit::DType::kFloat32, cpu, {2, 5});
  t.out_values = attnkit::TensorView::make(values.data(), attnkit::DType::kFloat32, cpu, {2, 3});
  t.out_indices = attnkit::TensorView::make(indices.data(), attnkit::DType::kInt64, cpu, {2, 3});
  attnkit::TopkOptions options;
  options.k = 3;
  options.sorted = attnkit::TopkOrder::kValue;
  attnkit::topk(t, options);
  for (int i = 0; i < 6; ++i) {
    std::printf("%g:%lld%s", values[i], static_cast<long long>(indices[i]), i < 5 ? " " : "\n");
  }
  return 0;
}
