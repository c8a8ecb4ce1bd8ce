// SPDX-License-Identifier: Apache-2.0
// Examples shown in the public headers; compiled and run so that the docs cannot rot.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attnkit/attnkit.hpp"
#include "topk_test_util.hpp"

using attnkit_test::expect_throws;

TEST(TopkApi, Example) {
  // [topk example]
  // Two rows of five scores; keep the best three of each, best first.
  std::vector<float> x = {0.5f, 3.0f, -1.0f, 3.0f, 2.0f,
                          9.0f, 1.0f, 8.0f, 7.0f, 6.0f};
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
  attnkit::topk(t, options);  // CPU: runs now; CUDA: enqueued on the stream argument
  // values  = {3, 3, 2,  9, 8, 7}   (the tie 3.0 at columns 1 and 3: lower column first)
  // indices = {1, 3, 4,  0, 2, 3}
  // [topk example]
  EXPECT_EQ(values, (std::vector<float>{3, 3, 2, 9, 8, 7}));
  EXPECT_EQ(indices, (std::vector<std::int64_t>{1, 3, 4, 0, 2, 3}));
}

TEST(TopkApi, TwoPhaseWorkspaceQueryWritesNothing) {
  std::vector<float> x = {1, 2, 3, 4};
  std::vector<std::int32_t> indices(2, -7);
  attnkit::TopkTensors t;
  t.x = attnkit::TensorView::make(x.data(), attnkit::DType::kFloat32, {}, {4});
  t.out_indices = attnkit::TensorView::make(indices.data(), attnkit::DType::kInt32, {}, {2});
  attnkit::TopkOptions options;
  options.k = 2;
  std::size_t bytes = 12345;
  attnkit::topk(nullptr, bytes, t, options);
  EXPECT_EQ(bytes, 0u);  // the CPU backend needs no workspace
  EXPECT_EQ(indices, (std::vector<std::int32_t>{-7, -7}));
  EXPECT_EQ(attnkit::topk_workspace_size(t, options), 0u);
}

// Inputs are checked without outputs, so that a caller allocates [B, k] only for a valid call.
TEST(TopkApi, InputsCheckedBeforeOutputsExist) {
  std::vector<float> x(3 * 10, 0.0f);
  std::vector<std::int64_t> begin(2, 0);
  attnkit::TopkTensors t;  // no outputs
  t.x = attnkit::TensorView::make(x.data(), attnkit::DType::kFloat32, {}, {3, 10});
  attnkit::TopkOptions options;
  options.k = std::int64_t{1} << 30;
  EXPECT_NO_THROW(attnkit::topk_check_inputs(t, options));
  t.begin = attnkit::TensorView::make(begin.data(), attnkit::DType::kInt64, {}, {2});
  expect_throws([&] { attnkit::topk_check_inputs(t, options); }, attnkit::ErrorCode::kShape,
                "begin");
  options.k = -1;
  t.begin.reset();
  EXPECT_THROW(attnkit::topk_check_inputs(t, options), attnkit::Error);
}

// On the CPU the per-row values are checked too, before any output exists: a bad end is named
// rather than hidden behind the allocation of a huge [B, k]. index_offset is held to int64's
// range only, since the index dtype comes with the outputs.
TEST(TopkApi, CpuRowValuesCheckedBeforeOutputsExist) {
  std::vector<float> x(3 * 10, 0.0f);
  std::vector<std::int64_t> end = {10, 11, 4};
  std::vector<std::int64_t> offset = {0, std::int64_t{1} << 40, 0};
  attnkit::TopkTensors t;  // no outputs
  t.x = attnkit::TensorView::make(x.data(), attnkit::DType::kFloat32, {}, {3, 10});
  t.end = attnkit::TensorView::make(end.data(), attnkit::DType::kInt64, {}, {3});
  attnkit::TopkOptions options;
  options.k = std::int64_t{1} << 30;
  expect_throws([&] { attnkit::topk_check_inputs(t, options); }, attnkit::ErrorCode::kValue,
                "end[1] = 11");
  options.check = attnkit::CheckMode::kOff;  // unchecked: the kernels clamp
  EXPECT_NO_THROW(attnkit::topk_check_inputs(t, options));
  options.check = attnkit::CheckMode::kDefault;
  end[1] = 10;
  t.index_offset = attnkit::TensorView::make(offset.data(), attnkit::DType::kInt64, {}, {3});
  EXPECT_NO_THROW(attnkit::topk_check_inputs(t, options));  // fits int64 indices
}

TEST(TopkApi, VersionIsTheProjectsAndLeadsTheBuildInfo) {
  EXPECT_STREQ(attnkit::version(), ATTNKIT_TEST_PROJECT_VERSION);
  EXPECT_EQ(attnkit::build_info().rfind(std::string("attnkit ") + attnkit::version() + "\n", 0),
            0u);
}
