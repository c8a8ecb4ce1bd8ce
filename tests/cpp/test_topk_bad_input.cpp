// SPDX-License-Identifier: Apache-2.0
// One test per argument rule of topk (src/core/check_topk.cpp, SPEC "Bad input"): each asserts
// the ErrorCode, that the message names the argument, the value seen and the rule, and that no
// output (nor any input) was written. Sizes past 2^31 use views of a few real bytes with huge
// shapes or broadcast strides: the checks must refuse them before touching any element.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "topk_test_util.hpp"

namespace {

using namespace attnkit_test;
using attnkit::Device;
using attnkit::DeviceType;

constexpr std::int64_t kB = 3;
constexpr std::int64_t kN = 10;
constexpr std::int64_t kK = 4;
constexpr std::int64_t kTwo31 = std::int64_t{1} << 31;
constexpr std::int64_t kInt32Max = std::numeric_limits<std::int32_t>::max();
constexpr std::int64_t kInt32Min = std::numeric_limits<std::int32_t>::min();
constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();

const Device kCpu{};
const Device kCuda0{DeviceType::kCUDA, 0};

/// A valid call (x [3, 10] float32 from the normal generator, k = 4, int64 indices and float32
/// values) whose pieces each test breaks one at a time. Every buffer is snapshotted before the
/// call, so "nothing was written" covers inputs and outputs alike.
class TopkBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    x_ = Buffer(4, kB * kN + 64, 0);
    x16_ = Buffer(2, kB * kN + 64, 0);
    std::vector<std::uint32_t> row(static_cast<std::size_t>(kN));
    for (std::int64_t b = 0; b < kB; ++b) {
      generate_row(Dist::kNormal, DType::kFloat32, 7, static_cast<std::uint64_t>(b), kN,
                   row.data());
      for (std::int64_t j = 0; j < kN; ++j) x_.set(b * kN + j, row[static_cast<std::size_t>(j)]);
      generate_row(Dist::kNormal, DType::kBFloat16, 7, static_cast<std::uint64_t>(b), kN,
                   row.data());
      for (std::int64_t j = 0; j < kN; ++j) x16_.set(b * kN + j, row[static_cast<std::size_t>(j)]);
    }
    idx64_ = Buffer(8, kB * kK + 64, kPoison);
    idx32_ = Buffer(4, kB * kK + 64, kPoison);
    val32_ = Buffer(4, kB * kK + 64, kPoison);
    val16_ = Buffer(2, kB * kK + 64, kPoison);
    rows64_ = Buffer(8, 64, 0);
    rows32_ = Buffer(4, 64, 0);
    rowsf_ = Buffer(4, 64, 0);
  }

  TensorView x() { return TensorView::make(x_.at(0), DType::kFloat32, kCpu, {kB, kN}); }
  TensorView x_bf16() { return TensorView::make(x16_.at(0), DType::kBFloat16, kCpu, {kB, kN}); }
  TensorView out_indices() { return TensorView::make(idx64_.at(0), DType::kInt64, kCpu, {kB, kK}); }
  TensorView out_indices32() {
    return TensorView::make(idx32_.at(0), DType::kInt32, kCpu, {kB, kK});
  }
  TensorView out_values() {
    return TensorView::make(val32_.at(0), DType::kFloat32, kCpu, {kB, kK});
  }
  /// A [B] int64 row vector holding `values`, at slot `slot` of the row-vector buffer.
  TensorView row_vector(std::initializer_list<std::int64_t> values, int slot = 0) {
    const std::int64_t first = slot * 8;
    std::int64_t i = first;
    for (std::int64_t v : values) rows64_.set(i++, static_cast<std::uint64_t>(v));
    return TensorView::make(rows64_.at(first), DType::kInt64, kCpu,
                            {static_cast<std::int64_t>(values.size())});
  }
  TopkTensors valid() {
    TopkTensors t;
    t.x = x();
    t.out_indices = out_indices();
    t.out_values = out_values();
    return t;
  }
  TopkOptions options() {
    TopkOptions o;
    o.k = kK;
    return o;
  }

  std::vector<Buffer*> buffers() {
    return {&x_, &x16_, &idx64_, &idx32_, &val32_, &val16_, &rows64_, &rows32_, &rowsf_};
  }

  /// Every entry point refuses the call with `code` and a message holding each of `needles`,
  /// and no buffer changed. `static_rule`: the rule needs no per-row data, so the workspace
  /// query and topk_workspace_size refuse the call too.
  void expect_error(const TopkTensors& t, const TopkOptions& o, ErrorCode code,
                    std::initializer_list<std::string> needles, bool static_rule = true) {
    std::vector<Buffer> before;
    for (Buffer* b : buffers()) before.push_back(*b);
    auto check_error = [&](const char* entry, auto&& call) {
      SCOPED_TRACE(entry);
      try {
        call();
        ADD_FAILURE() << "no error; expected Error(" << attnkit::error_code_name(code) << ")";
      } catch (const attnkit::Error& e) {
        const std::string what = e.what();
        EXPECT_EQ(e.code(), code) << "code " << attnkit::error_code_name(e.code()) << ", expected "
                                  << attnkit::error_code_name(code) << "; message: " << what;
        EXPECT_EQ(what.rfind("topk: ", 0), 0u) << "message does not name the op: " << what;
        for (const std::string& needle : needles) {
          EXPECT_NE(what.find(needle), std::string::npos)
              << "message \"" << what << "\" does not contain \"" << needle << "\"";
        }
      }
    };
    check_error("topk(tensors, options)", [&] { attnkit::topk(t, o); });
    alignas(256) static unsigned char workspace[256];
    std::size_t bytes = sizeof workspace;
    check_error("topk(workspace, bytes, ...)", [&] { attnkit::topk(workspace, bytes, t, o); });
    EXPECT_EQ(bytes, sizeof workspace) << "workspace_bytes changed by a refused call";
    if (static_rule) {
      std::size_t query = 4321;
      check_error("topk(nullptr, bytes, ...)", [&] { attnkit::topk(nullptr, query, t, o); });
      EXPECT_EQ(query, 4321u) << "the workspace query wrote workspace_bytes on a refused call";
      check_error("topk_workspace_size", [&] { (void)attnkit::topk_workspace_size(t, o); });
    }
    const std::vector<Buffer*> now = buffers();
    for (std::size_t i = 0; i < now.size(); ++i) {
      const std::int64_t at = now[i]->first_difference(before[i]);
      EXPECT_EQ(at, -1) << "buffer " << i << " element " << at << " was written by a refused call";
    }
  }

  Buffer x_, x16_, idx64_, idx32_, val32_, val16_, rows64_, rows32_, rowsf_;
};

// ---------------------------------------------------------------------------------------------
// x
// ---------------------------------------------------------------------------------------------

TEST_F(TopkBadInput, XRankNotOneOrTwo) {
  TopkTensors t = valid();
  t.x = TensorView::make(x_.at(0), DType::kFloat32, kCpu, {2, 3, 5});
  expect_error(t, options(), ErrorCode::kShape,
               {"x has 3 dimensions", "[2, 3, 5]", "expected [B, N] or [N]"});
  t.x = TensorView::make(x_.at(0), DType::kFloat32, kCpu, {});
  expect_error(t, options(), ErrorCode::kShape, {"x has 0 dimensions", "expected [B, N] or [N]"});
}

TEST_F(TopkBadInput, XNegativeSize) {
  TopkTensors t = valid();
  t.x = TensorView::make(x_.at(0), DType::kFloat32, kCpu, {kB, -1}, {kN, 1});
  expect_error(t, options(), ErrorCode::kShape, {"x has shape [3, -1]", "sizes must be >= 0"});
}

TEST_F(TopkBadInput, XNullData) {
  TopkTensors t = valid();
  t.x = TensorView::make(nullptr, DType::kFloat32, kCpu, {kB, kN});
  expect_error(t, options(), ErrorCode::kValue, {"x has 30 elements", "null data pointer"});
}

TEST_F(TopkBadInput, UnsetRequiredViews) {
  // A default TensorView (0-d, no data) where a tensor is required: named as unset, not as a
  // one-element view.
  TopkTensors t = valid();
  t.x = TensorView{};
  expect_error(t, options(), ErrorCode::kValue, {"x is not set", "required"});
  t = valid();
  t.out_indices = TensorView{};
  expect_error(t, options(), ErrorCode::kValue, {"out_indices is not set", "required"});
}

TEST_F(TopkBadInput, XUnsupportedDType) {
  for (DType d : {DType::kInt32, DType::kInt64, DType::kFloat64, DType::kInt8, DType::kUInt8,
                  DType::kInt16, DType::kUInt16, DType::kUInt32, DType::kUInt64, DType::kBool}) {
    SCOPED_TRACE(attnkit::dtype_name(d));
    TopkTensors t = valid();
    t.x = TensorView::make(x_.at(0), d, kCpu, {kB, 2});
    expect_error(t, options(), ErrorCode::kDType,
                 {std::string("x.dtype = ") + attnkit::dtype_name(d),
                  "expected float32, bfloat16 or float16"});
  }
}

TEST_F(TopkBadInput, XLastDimNotContiguous) {
  for (std::int64_t stride : {2, 0, -1}) {
    SCOPED_TRACE(stride);
    TopkTensors t = valid();
    t.x = TensorView::make(x_.at(kN), DType::kFloat32, kCpu, {kB, 3}, {kN, stride});
    expect_error(t, options(), ErrorCode::kLayout,
                 {"x.stride(-1) = " + std::to_string(stride) + " elements",
                  "must be contiguous (stride 1)"});
  }
  // The rule binds only when a row has more than one element: [B, 1] with stride 7 is fine.
  TopkTensors t = valid();
  t.x = TensorView::make(x_.at(0), DType::kFloat32, kCpu, {kB, 1}, {kN, 7});
  TopkOptions o = options();
  o.k = 1;
  t.out_indices = TensorView::make(idx64_.at(0), DType::kInt64, kCpu, {kB, 1});
  t.out_values = TensorView::make(val32_.at(0), DType::kFloat32, kCpu, {kB, 1});
  EXPECT_NO_THROW(attnkit::topk(t, o));
  for (std::int64_t b = 0; b < kB; ++b) EXPECT_EQ(idx64_.get_int(b), 0) << "row " << b;
}

TEST_F(TopkBadInput, XMoreThanInt32MaxColumns) {
  TopkTensors t = valid();
  // 2^31 columns of a fake row: the check must refuse it before reading anything.
  t.x = TensorView::make(x_.at(0), DType::kFloat32, kCpu, {1, kTwo31}, {kTwo31, 1});
  t.out_indices = TensorView::make(idx64_.at(0), DType::kInt64, kCpu, {1, kK});
  t.out_values = TensorView::make(val32_.at(0), DType::kFloat32, kCpu, {1, kK});
  expect_error(t, options(), ErrorCode::kShape, {"x has N = 2147483648", "N must be <= 2^31 - 1"});
  t.x = TensorView::make(x_.at(0), DType::kBFloat16, kCpu, {kTwo31 + 5});
  t.out_indices = TensorView::make(idx64_.at(0), DType::kInt64, kCpu, {kK});
  t.out_values = std::nullopt;
  expect_error(t, options(), ErrorCode::kShape, {"x has N = 2147483653", "N must be <= 2^31 - 1"});
}

TEST_F(TopkBadInput, XMoreThanInt32MaxRows) {
  TopkTensors t = valid();
  // 2^31 rows broadcast from one real row (row stride 0): no allocation.
  t.x = TensorView::make(x_.at(0), DType::kFloat32, kCpu, {kTwo31, kN}, {0, 1});
  t.out_indices = TensorView::make(idx64_.at(0), DType::kInt64, kCpu, {kTwo31, kK}, {0, 1});
  t.out_values = std::nullopt;
  expect_error(t, options(), ErrorCode::kShape, {"x has B = 2147483648", "B must be <= 2^31 - 1"});
}

/// The largest legal extents pass the checks. With k = 0 and check = off nothing is read or
/// written, so fake views of 2^31 - 1 rows or columns cost nothing.
TEST_F(TopkBadInput, LargestExtentsAccepted) {
  TopkOptions o = options();
  o.k = 0;
  o.check = CheckMode::kOff;
  TopkTensors t;
  t.x = TensorView::make(x_.at(0), DType::kFloat32, kCpu, {1, kInt32Max});
  t.out_indices = TensorView::make(idx64_.at(0), DType::kInt64, kCpu, {1, 0});
  EXPECT_NO_THROW(attnkit::topk(t, o));
  t.x = TensorView::make(x_.at(0), DType::kFloat32, kCpu, {kInt32Max, kN}, {0, 1});
  t.out_indices = TensorView::make(idx64_.at(0), DType::kInt64, kCpu, {kInt32Max, 0});
  EXPECT_NO_THROW(attnkit::topk(t, o));
  EXPECT_EQ(check_untouched(TopkOutputs{idx64_, val32_, kK}), "");
}

TEST_F(TopkBadInput, CudaTensorInThisBuild) {
  TopkTensors t = valid();
  t.x = TensorView::make(x_.at(0), DType::kFloat32, kCuda0, {kB, kN});
  if (attnkit::cuda_available_in_build()) {
    // A CUDA build accepts CUDA tensors, so the CPU outputs are what is wrong here.
    expect_error(t, options(), ErrorCode::kDevice,
                 {"out_indices is on cpu", "x is on cuda:0", "same device"});
  } else {
    expect_error(t, options(), ErrorCode::kDevice, {"x is on cuda:0", "no CUDA backend"});
  }
}

TEST_F(TopkBadInput, CudaTensorsWithoutAUsableGpu) {
  TopkTensors t = valid();
  t.x = TensorView::make(x_.at(0), DType::kFloat32, kCuda0, {kB, kN});
  t.out_indices = TensorView::make(idx64_.at(0), DType::kInt64, kCuda0, {kB, kK});
  t.out_values = TensorView::make(val32_.at(0), DType::kFloat32, kCuda0, {kB, kK});
  const std::string info = attnkit::build_info();
  if (!attnkit::cuda_available_in_build()) {
    expect_error(t, options(), ErrorCode::kDevice, {"x is on cuda:0", "no CUDA backend"});
  } else if (info.find("cuda devices: none visible") != std::string::npos) {
    // A CUDA build on a machine without a GPU or its driver says so, not only which call failed.
    expect_error(t, options(), ErrorCode::kDeviceFault, {"no usable CUDA GPU", "failed: cuda"});
  } else {
    // A GPU is visible, so these host buffers must not be handed to it; the device is listed.
    EXPECT_NE(info.find("cuda:0: "), std::string::npos) << info;
  }
}

TEST_F(TopkBadInput, ReferenceBackendWithCudaTensor) {
  TopkTensors t = valid();
  t.x = TensorView::make(x_.at(0), DType::kFloat32, kCuda0, {kB, kN});
  t.out_indices = TensorView::make(idx64_.at(0), DType::kInt64, kCuda0, {kB, kK});
  t.out_values = TensorView::make(val32_.at(0), DType::kFloat32, kCuda0, {kB, kK});
  TopkOptions o = options();
  o.backend = TopkBackend::kReference;
  if (attnkit::cuda_available_in_build()) {
    expect_error(t, o, ErrorCode::kDevice, {"backend = reference", "CPU only", "x is on cuda:0"});
  } else {
    // A CPU-only build refuses any CUDA tensor first, whatever the backend.
    expect_error(t, o, ErrorCode::kDevice, {"x is on cuda:0", "no CUDA backend"});
  }
}

// ---------------------------------------------------------------------------------------------
// k and the option enumerators
// ---------------------------------------------------------------------------------------------

TEST_F(TopkBadInput, KNegative) {
  for (std::int64_t k : {std::int64_t{-1}, std::int64_t{-3}, -kTwo31}) {
    SCOPED_TRACE(k);
    TopkOptions o = options();
    o.k = k;
    expect_error(valid(), o, ErrorCode::kValue, {"k = " + std::to_string(k), "must be >= 0"});
  }
}

TEST_F(TopkBadInput, KAboveInt32Max) {
  TopkTensors t = valid();
  t.out_indices = TensorView::make(idx64_.at(0), DType::kInt64, kCpu, {kB, kTwo31}, {0, 1});
  t.out_values = std::nullopt;
  TopkOptions o = options();
  o.k = kTwo31;
  expect_error(t, o, ErrorCode::kValue, {"k = 2147483648", "must be <= 2^31 - 1"});
}

TEST_F(TopkBadInput, InvalidEnumerator) {
  struct Field {
    const char* name;
    void (*set)(TopkOptions&);
  };
  const Field fields[] = {
      {"sorted", [](TopkOptions& o) { o.sorted = static_cast<TopkOrder>(7); }},
      {"nan", [](TopkOptions& o) { o.nan = static_cast<NanPolicy>(7); }},
      {"ties", [](TopkOptions& o) { o.ties = static_cast<TiePolicy>(7); }},
      {"check", [](TopkOptions& o) { o.check = static_cast<CheckMode>(7); }},
      {"backend", [](TopkOptions& o) { o.backend = static_cast<TopkBackend>(7); }},
  };
  for (const Field& f : fields) {
    SCOPED_TRACE(f.name);
    TopkOptions o = options();
    f.set(o);
    expect_error(valid(), o, ErrorCode::kValue,
                 {std::string("options.") + f.name + " = 7", "not a valid enumerator"});
  }
}

// ---------------------------------------------------------------------------------------------
// begin, end, index_offset as tensors
// ---------------------------------------------------------------------------------------------

/// Sets the row vector `arg` ("begin", "end", "index_offset") of t.
void set_row_vector(TopkTensors& t, const std::string& arg, const TensorView& v) {
  if (arg == "begin") t.begin = v;
  if (arg == "end") t.end = v;
  if (arg == "index_offset") t.index_offset = v;
}

const char* const kRowVectors[] = {"begin", "end", "index_offset"};

TEST_F(TopkBadInput, RowVectorWrongRank) {
  for (const char* arg : kRowVectors) {
    SCOPED_TRACE(arg);
    TopkTensors t = valid();
    set_row_vector(t, arg, TensorView::make(rows64_.at(0), DType::kInt64, kCpu, {kB, 1}));
    expect_error(t, options(), ErrorCode::kShape,
                 {std::string(arg) + " has shape [3, 1]", "expected [B] = [3]"});
  }
}

TEST_F(TopkBadInput, RowVectorWrongLength) {
  for (const char* arg : kRowVectors) {
    for (std::int64_t len : {std::int64_t{2}, kB + 1}) {
      SCOPED_TRACE(std::string(arg) + " length " + std::to_string(len));
      TopkTensors t = valid();
      set_row_vector(t, arg, TensorView::make(rows64_.at(0), DType::kInt64, kCpu, {len}));
      expect_error(
          t, options(), ErrorCode::kShape,
          {std::string(arg) + " has shape [" + std::to_string(len) + "]", "expected [B] = [3]"});
    }
  }
}

TEST_F(TopkBadInput, RowVectorWrongDType) {
  for (const char* arg : kRowVectors) {
    for (DType d : {DType::kFloat32, DType::kInt16, DType::kUInt32, DType::kFloat64}) {
      SCOPED_TRACE(std::string(arg) + " " + attnkit::dtype_name(d));
      TopkTensors t = valid();
      set_row_vector(t, arg, TensorView::make(rowsf_.at(0), d, kCpu, {kB}));
      expect_error(
          t, options(), ErrorCode::kDType,
          {std::string(arg) + ".dtype = " + attnkit::dtype_name(d), "expected int32 or int64"});
    }
  }
}

TEST_F(TopkBadInput, RowVectorOnOtherDevice) {
  for (const char* arg : kRowVectors) {
    SCOPED_TRACE(arg);
    TopkTensors t = valid();
    set_row_vector(t, arg, TensorView::make(rows64_.at(0), DType::kInt64, kCuda0, {kB}));
    expect_error(t, options(), ErrorCode::kDevice,
                 {std::string(arg) + " is on cuda:0", "x is on cpu", "same device"});
  }
}

TEST_F(TopkBadInput, RowVectorNullData) {
  for (const char* arg : kRowVectors) {
    SCOPED_TRACE(arg);
    TopkTensors t = valid();
    set_row_vector(t, arg, TensorView::make(nullptr, DType::kInt64, kCpu, {kB}));
    expect_error(t, options(), ErrorCode::kValue,
                 {std::string(arg) + " has 3 elements", "null data pointer"});
  }
}

// ---------------------------------------------------------------------------------------------
// Outputs
// ---------------------------------------------------------------------------------------------

const char* const kOutputs[] = {"out_indices", "out_values"};

/// Sets output `arg` of t to a view over `buf` (the dtype each output needs unless given).
void set_output(TopkTensors& t, const std::string& arg, const TensorView& v) {
  if (arg == "out_indices") t.out_indices = v;
  if (arg == "out_values") t.out_values = v;
}

TEST_F(TopkBadInput, OutputWrongShape) {
  struct Shape {
    std::vector<std::int64_t> dims;
    std::string seen;
  };
  for (const char* arg : kOutputs) {
    const DType d = std::string(arg) == "out_indices" ? DType::kInt64 : DType::kFloat32;
    void* p = std::string(arg) == "out_indices" ? idx64_.at(0) : val32_.at(0);
    const TensorView shapes[] = {
        TensorView::make(p, d, kCpu, {kB, kK + 1}), TensorView::make(p, d, kCpu, {kB - 1, kK}),
        TensorView::make(p, d, kCpu, {kB * kK}), TensorView::make(p, d, kCpu, {1, kB, kK})};
    for (const TensorView& v : shapes) {
      SCOPED_TRACE(std::string(arg) + " " + v.shape_str());
      TopkTensors t = valid();
      set_output(t, arg, v);
      expect_error(t, options(), ErrorCode::kShape,
                   {std::string(arg) + " has shape " + v.shape_str(), "expected [B, k] = [3, 4]"});
    }
    // For x [N] the outputs are [k].
    TopkTensors t = valid();
    t.x = TensorView::make(x_.at(0), DType::kFloat32, kCpu, {kN});
    t.out_indices = TensorView::make(idx64_.at(0), DType::kInt64, kCpu, {kK});
    t.out_values = TensorView::make(val32_.at(0), DType::kFloat32, kCpu, {kK});
    set_output(t, arg, TensorView::make(p, d, kCpu, {1, kK}));
    expect_error(t, options(), ErrorCode::kShape,
                 {std::string(arg) + " has shape [1, 4]", "expected [k] = [4]"});
  }
}

TEST_F(TopkBadInput, OutputIndicesWrongDType) {
  for (DType d : {DType::kFloat32, DType::kInt16, DType::kUInt32, DType::kUInt64}) {
    SCOPED_TRACE(attnkit::dtype_name(d));
    TopkTensors t = valid();
    t.out_indices = TensorView::make(idx64_.at(0), d, kCpu, {kB, kK});
    expect_error(
        t, options(), ErrorCode::kDType,
        {std::string("out_indices.dtype = ") + attnkit::dtype_name(d), "expected int32 or int64"});
  }
}

TEST_F(TopkBadInput, OutputValuesNotXDType) {
  TopkTensors t = valid();
  t.out_values = TensorView::make(val16_.at(0), DType::kBFloat16, kCpu, {kB, kK});
  expect_error(t, options(), ErrorCode::kDType,
               {"out_values.dtype = bfloat16", "expected x.dtype = float32"});
  t = valid();
  t.x = x_bf16();
  t.out_values = TensorView::make(val16_.at(0), DType::kFloat16, kCpu, {kB, kK});
  expect_error(t, options(), ErrorCode::kDType,
               {"out_values.dtype = float16", "expected x.dtype = bfloat16"});
}

TEST_F(TopkBadInput, OutputOnOtherDevice) {
  for (const char* arg : kOutputs) {
    SCOPED_TRACE(arg);
    TopkTensors t = valid();
    const bool idx = std::string(arg) == "out_indices";
    set_output(t, arg,
               TensorView::make(idx ? idx64_.at(0) : val32_.at(0),
                                idx ? DType::kInt64 : DType::kFloat32, kCuda0, {kB, kK}));
    expect_error(t, options(), ErrorCode::kDevice,
                 {std::string(arg) + " is on cuda:0", "x is on cpu", "same device"});
  }
}

TEST_F(TopkBadInput, OutputLastDimNotContiguous) {
  for (const char* arg : kOutputs) {
    SCOPED_TRACE(arg);
    TopkTensors t = valid();
    const bool idx = std::string(arg) == "out_indices";
    set_output(
        t, arg,
        TensorView::make(idx ? idx64_.at(0) : val32_.at(0), idx ? DType::kInt64 : DType::kFloat32,
                         kCpu, {kB, kK}, {2 * kK, 2}));
    expect_error(t, options(), ErrorCode::kLayout,
                 {std::string(arg) + ".stride(-1) = 2", "must be contiguous (stride 1)"});
  }
}

TEST_F(TopkBadInput, OutputRowsOverlap) {
  for (const char* arg : kOutputs) {
    for (std::int64_t stride : {kK - 1, std::int64_t{0}, -(kK - 1)}) {
      SCOPED_TRACE(std::string(arg) + " row stride " + std::to_string(stride));
      TopkTensors t = valid();
      const bool idx = std::string(arg) == "out_indices";
      void* base = idx ? idx64_.at(2 * kK) : val32_.at(2 * kK);
      set_output(t, arg,
                 TensorView::make(base, idx ? DType::kInt64 : DType::kFloat32, kCpu, {kB, kK},
                                  {stride, 1}));
      expect_error(t, options(), ErrorCode::kLayout,
                   {std::string(arg) + ".stride(0) = " + std::to_string(stride),
                    "rows of length 4 overlap", "|stride(0)| must be >= the row length"});
    }
  }
}

TEST_F(TopkBadInput, OutputNullData) {
  for (const char* arg : kOutputs) {
    SCOPED_TRACE(arg);
    TopkTensors t = valid();
    const bool idx = std::string(arg) == "out_indices";
    set_output(t, arg,
               TensorView::make(nullptr, idx ? DType::kInt64 : DType::kFloat32, kCpu, {kB, kK}));
    expect_error(t, options(), ErrorCode::kValue,
                 {std::string(arg) + " has 12 elements", "null data pointer"});
  }
}

// Views filled in by hand (not through TensorView::make) with fields out of range: refused by
// name before any of their sizes or strides is used.
TEST_F(TopkBadInput, MalformedViews) {
  for (std::int32_t ndim : {7, 1 << 30, -1}) {
    SCOPED_TRACE(ndim);
    TopkTensors t = valid();
    t.x.ndim = ndim;
    expect_error(t, options(), ErrorCode::kShape,
                 {"x.ndim = " + std::to_string(ndim), "0 to 6 dimensions"});
  }
  {
    TopkTensors t = valid();
    t.out_indices.device.type = static_cast<attnkit::DeviceType>(7);
    expect_error(t, options(), ErrorCode::kDevice, {"out_indices is on device type 7"});
  }
  {
    TopkTensors t = valid();
    t.x.dtype = static_cast<DType>(200);
    expect_error(t, options(), ErrorCode::kDType, {"x.dtype = unknown (200)"});
  }
  {
    TopkTensors t = valid();
    ASSERT_TRUE(t.out_values.has_value());
    t.out_values->dtype = static_cast<DType>(200);
    expect_error(t, options(), ErrorCode::kDType,
                 {"out_values.dtype = unknown (200)", "expected x.dtype = float32"});
  }
  // Row strides whose byte offsets wrap around 2^64 would put row 1 over row 0.
  for (std::int64_t stride : {(std::int64_t{1} << 61) + 1, (std::int64_t{1} << 62) + 1,
                              std::numeric_limits<std::int64_t>::min()}) {
    SCOPED_TRACE(stride);
    TopkTensors t = valid();
    t.out_indices = TensorView::make(idx64_.at(0), DType::kInt64, kCpu, {kB, kK}, {stride, 1});
    expect_error(t, options(), ErrorCode::kLayout, {"out_indices has shape [3, 4] and strides",
                                                    "byte span is 2^62 or more"});
  }
}

TEST_F(TopkBadInput, OutputsOverlapEachOther) {
  // out_values over the last bytes of out_indices.
  TopkTensors t = valid();
  t.out_values = TensorView::make(idx64_.at(kB * kK - 1), DType::kFloat32, kCpu, {kB, kK});
  expect_error(t, options(), ErrorCode::kLayout,
               {"out_values (bytes [0x", ") overlaps out_indices (bytes [0x"});
}

TEST_F(TopkBadInput, OutputOverlapsInput) {
  struct Alias {
    const char* out;
    const char* in;
  };
  for (const Alias a : {Alias{"out_indices", "x"}, Alias{"out_values", "x"},
                        Alias{"out_indices", "begin"}, Alias{"out_indices", "end"},
                        Alias{"out_indices", "index_offset"}, Alias{"out_values", "begin"},
                        Alias{"out_values", "end"}, Alias{"out_values", "index_offset"}}) {
    SCOPED_TRACE(std::string(a.out) + " over " + a.in);
    TopkTensors t = valid();
    t.begin = row_vector({0, 0, 0}, 0);
    t.end = row_vector({kN, kN, kN}, 1);
    t.index_offset = row_vector({0, 0, 0}, 2);
    const std::string in = a.in;
    // The output starts inside the input's last 8 bytes, at an address its element size
    // divides (so the alignment rule does not fire first).
    void* p = in == "x"       ? x_.at(kB * kN - 2)
              : in == "begin" ? rows64_.at(2)
              : in == "end"   ? rows64_.at(8 + 2)
                              : rows64_.at(16 + 2);
    const bool idx = std::string(a.out) == "out_indices";
    set_output(t, a.out,
               TensorView::make(p, idx ? DType::kInt64 : DType::kFloat32, kCpu, {kB, kK}));
    expect_error(t, options(), ErrorCode::kLayout,
                 {std::string(a.out) + " (bytes", ") overlaps " + std::string(a.in) + " (bytes",
                  "may not share memory"});
  }
}

// Outputs may share a buffer with x as long as no byte is shared: [B, N] inputs and [B, k]
// outputs interleaved in the columns of one [B, W] buffer are accepted (and computed right);
// one column of overlap is refused.
TEST(TopkOverlap, OutputsInTheSpareColumnsOfX) {
  constexpr std::int64_t kRows = 3, kCols = 10, kTake = 4, kWidth = 16;
  std::vector<float> buffer(static_cast<std::size_t>(kRows * kWidth), -7.0f);
  for (std::int64_t b = 0; b < kRows; ++b) {
    for (std::int64_t j = 0; j < kCols; ++j) {
      buffer[static_cast<std::size_t>(b * kWidth + j)] = static_cast<float>((j * 7 + b * 3) % 11);
    }
  }
  const std::vector<float> before = buffer;
  std::vector<std::int64_t> indices(static_cast<std::size_t>(kRows * kTake), -5);
  attnkit::TopkTensors t;
  t.x = TensorView::make(buffer.data(), DType::kFloat32, kCpu, {kRows, kCols}, {kWidth, 1});
  t.out_values = TensorView::make(buffer.data() + kCols, DType::kFloat32, kCpu, {kRows, kTake},
                                  {kWidth, 1});
  t.out_indices = TensorView::make(indices.data(), DType::kInt64, kCpu, {kRows, kTake});
  attnkit::TopkOptions o;
  o.k = kTake;
  o.sorted = attnkit::TopkOrder::kValue;
  attnkit::topk(t, o);
  for (std::int64_t b = 0; b < kRows; ++b) {
    std::vector<std::int64_t> cols(static_cast<std::size_t>(kCols));
    for (std::int64_t j = 0; j < kCols; ++j) cols[static_cast<std::size_t>(j)] = j;
    const float* row = before.data() + b * kWidth;
    std::stable_sort(cols.begin(), cols.end(), [&](std::int64_t a, std::int64_t c) {
      return row[a] > row[c];
    });
    for (std::int64_t i = 0; i < kTake; ++i) {
      const std::int64_t want = cols[static_cast<std::size_t>(i)];
      EXPECT_EQ(indices[static_cast<std::size_t>(b * kTake + i)], want)
          << "row " << b << " slot " << i;
      EXPECT_EQ(buffer[static_cast<std::size_t>(b * kWidth + kCols + i)], row[want]);
    }
    for (std::int64_t j = 0; j < kWidth; ++j) {  // x's columns and the unused ones untouched
      if (j >= kCols && j < kCols + kTake) continue;
      EXPECT_EQ(buffer[static_cast<std::size_t>(b * kWidth + j)],
                before[static_cast<std::size_t>(b * kWidth + j)]) << b << ", " << j;
    }
  }

  const std::vector<float> after = buffer;
  t.out_values = TensorView::make(buffer.data() + kCols - 1, DType::kFloat32, kCpu,
                                  {kRows, kTake}, {kWidth, 1});
  expect_throws([&] { attnkit::topk(t, o); }, ErrorCode::kLayout, ") overlaps x (bytes");
  EXPECT_EQ(buffer, after);
}

/// Views whose data pointer is not a multiple of the element size (a byte offset into a
/// buffer) cannot be read with typed loads.
TEST_F(TopkBadInput, DataNotElementAligned) {
  auto shifted = [](void* p, std::ptrdiff_t bytes) { return static_cast<char*>(p) + bytes; };
  struct Misaligned {
    const char* arg;
    std::size_t elem;
  };
  for (const Misaligned m :
       {Misaligned{"x", 4}, Misaligned{"begin", 8}, Misaligned{"end", 8},
        Misaligned{"index_offset", 8}, Misaligned{"out_indices", 8}, Misaligned{"out_values", 4}}) {
    for (std::ptrdiff_t by : {1, 2, 3}) {
      SCOPED_TRACE(std::string(m.arg) + " shifted by " + std::to_string(by) + " bytes");
      TopkTensors t = valid();
      const std::string arg = m.arg;
      void* p = nullptr;
      if (arg == "x") {
        p = shifted(x_.at(0), by);
        t.x = TensorView::make(p, DType::kFloat32, kCpu, {kB, kN});
      } else if (arg == "out_indices" || arg == "out_values") {
        const bool idx = arg == "out_indices";
        p = shifted(idx ? idx64_.at(0) : val32_.at(0), by);
        set_output(t, arg,
                   TensorView::make(p, idx ? DType::kInt64 : DType::kFloat32, kCpu, {kB, kK}));
      } else {
        p = shifted(rows64_.at(0), by);
        set_row_vector(t, arg, TensorView::make(p, DType::kInt64, kCpu, {kB}));
      }
      char address[32];
      std::snprintf(address, sizeof address, "%#llx",
                    static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(p)));
      expect_error(t, options(), ErrorCode::kLayout,
                   {arg + ".data = " + address + " ",
                    "is not a multiple of its " + std::to_string(m.elem) + "-byte element size"});
    }
  }
  // 16-bit x and int32 vectors need only 2- and 4-byte alignment.
  TopkTensors t = valid();
  t.x = TensorView::make(shifted(x16_.at(0), 2), DType::kBFloat16, kCpu, {kB, kN});
  t.out_values = TensorView::make(shifted(val16_.at(0), 2), DType::kBFloat16, kCpu, {kB, kK});
  t.end = TensorView::make(shifted(rows32_.at(0), 4), DType::kInt32, kCpu, {kB});
  for (std::int64_t i = 1; i <= kB; ++i) rows32_.set(i, static_cast<std::uint64_t>(kN));
  EXPECT_NO_THROW(attnkit::topk(t, options()));
}

TEST_F(TopkBadInput, IndexFillDoesNotFitInt32) {
  for (std::int64_t fill : {kInt32Max + 1, kInt32Min - 1, kInt64Max}) {
    SCOPED_TRACE(fill);
    TopkTensors t = valid();
    t.out_indices = out_indices32();
    TopkOptions o = options();
    o.index_fill = fill;
    expect_error(t, o, ErrorCode::kValue,
                 {"index_fill = " + std::to_string(fill), "does not fit the int32 indices"});
  }
  // int64 indices hold it.
  TopkOptions o = options();
  o.index_fill = kInt32Max + 1;
  o.k = kN + 2;
  TopkTensors t;
  t.x = x();
  t.out_indices = TensorView::make(idx64_.at(0), DType::kInt64, kCpu, {kB, kN + 2});
  ASSERT_NO_THROW(attnkit::topk(t, o));
  EXPECT_EQ(idx64_.get_int(kN), kInt32Max + 1);
}

// ---------------------------------------------------------------------------------------------
// Per-row values (checked on the CPU by default)
// ---------------------------------------------------------------------------------------------

TEST_F(TopkBadInput, BeginNegative) {
  TopkTensors t = valid();
  t.begin = row_vector({0, -1, 0});
  expect_error(t, options(), ErrorCode::kValue, {"begin[1] = -1", "is outside [0, N] = [0, 10]"},
               /*static_rule=*/false);
}

TEST_F(TopkBadInput, BeginPastN) {
  TopkTensors t = valid();
  t.begin = row_vector({0, 0, kN + 1});
  expect_error(t, options(), ErrorCode::kValue, {"begin[2] = 11", "is outside [0, N] = [0, 10]"},
               false);
}

TEST_F(TopkBadInput, EndBeforeBegin) {
  TopkTensors t = valid();
  t.begin = row_vector({0, 5, 0}, 0);
  t.end = row_vector({kN, 4, kN}, 1);
  expect_error(t, options(), ErrorCode::kValue,
               {"end[1] = 4", "is outside [begin[1], N] = [5, 10]"}, false);
  // Without begin, a negative end is below the default begin 0.
  t = valid();
  t.end = row_vector({-2, kN, kN}, 1);
  expect_error(t, options(), ErrorCode::kValue,
               {"end[0] = -2", "is outside [begin[0], N] = [0, 10]"}, false);
}

TEST_F(TopkBadInput, EndPastN) {
  TopkTensors t = valid();
  t.end = row_vector({kN + 1, kN, kN}, 1);
  expect_error(t, options(), ErrorCode::kValue,
               {"end[0] = 11", "is outside [begin[0], N] = [0, 10]"}, false);
  // int32 begin/end are read as int32: an int32 end of N + 1 is just as wrong.
  for (std::int64_t i = 0; i < kB; ++i) rows32_.set(i, static_cast<std::uint64_t>(kN));
  rows32_.set(2, static_cast<std::uint64_t>(kN + 5));
  t = valid();
  t.end = TensorView::make(rows32_.at(0), DType::kInt32, kCpu, {kB});
  expect_error(t, options(), ErrorCode::kValue,
               {"end[2] = 15", "is outside [begin[2], N] = [0, 10]"}, false);
}

TEST_F(TopkBadInput, IndexOffsetOverflowsIndexDType) {
  struct Bad {
    std::int64_t offset;
    DType indices;
    const char* range;
    const char* columns;  // those whose index overflows
  };
  // Columns [0, 10): the last index is 9 + offset, the first 0 + offset.
  for (const Bad bad :
       {Bad{kInt32Max - 8, DType::kInt32, "int32", "[9, 10)"},
        Bad{kInt32Max - 2, DType::kInt32, "int32", "[3, 10)"},
        Bad{kInt32Min - 1, DType::kInt32, "int32", "[0, 1)"},
        Bad{kInt32Min - 4, DType::kInt32, "int32", "[0, 4)"},
        Bad{kInt64Max - 8, DType::kInt64, "int64", "[9, 10)"},
        Bad{std::numeric_limits<std::int64_t>::min(), DType::kInt32, "int32", "[0, 10)"}}) {
    SCOPED_TRACE(bad.offset);
    TopkTensors t = valid();
    t.out_indices = bad.indices == DType::kInt32 ? out_indices32() : out_indices();
    t.index_offset = row_vector({0, bad.offset, 0}, 2);
    expect_error(
        t, options(), ErrorCode::kValue,
        {"index_offset[1] = " + std::to_string(bad.offset),
         std::string("moves indices of columns ") + bad.columns,
         std::string("outside the range of ") + bad.range},
        false);
  }
  // One less is exactly at the edge and passes: the last index is INT32_MAX.
  TopkTensors t = valid();
  t.out_indices = out_indices32();
  t.out_values = std::nullopt;
  t.index_offset = row_vector({0, kInt32Max - 9, 0}, 2);
  TopkOptions o = options();
  o.k = kN;
  t.out_indices = TensorView::make(idx32_.at(0), DType::kInt32, kCpu, {kB, kN});
  ASSERT_NO_THROW(attnkit::topk(t, o));
  std::int64_t largest_index = 0;
  for (std::int64_t j = 0; j < kN; ++j)
    largest_index = std::max(largest_index, idx32_.get_int(kN + j));
  EXPECT_EQ(largest_index, kInt32Max);
}

/// An offset is applied only to selected columns: an empty row, or k = 0, never overflows.
TEST_F(TopkBadInput, IndexOffsetUncheckedWhereNothingIsSelected) {
  TopkTensors t = valid();
  t.out_indices = out_indices32();
  t.begin = row_vector({0, 4, 0}, 0);
  t.end = row_vector({kN, 4, kN}, 1);
  t.index_offset = row_vector({0, kInt64Max, 0}, 2);
  EXPECT_NO_THROW(attnkit::topk(t, options()));
  TopkOptions o = options();
  o.k = 0;
  t = valid();
  t.out_indices = TensorView::make(idx32_.at(0), DType::kInt32, kCpu, {kB, 0});
  t.out_values = std::nullopt;
  t.index_offset = row_vector({kInt64Max, kInt64Max, kInt64Max}, 2);
  EXPECT_NO_THROW(attnkit::topk(t, o));
}

TEST_F(TopkBadInput, CheckOnRefusesLikeTheDefault) {
  TopkTensors t = valid();
  t.end = row_vector({kN, kN + 3, kN}, 1);
  TopkOptions o = options();
  o.check = CheckMode::kOn;
  expect_error(t, o, ErrorCode::kValue, {"end[1] = 13", "is outside [begin[1], N] = [0, 10]"},
               false);
}

// ---------------------------------------------------------------------------------------------
// Workspace of the two-phase call
// ---------------------------------------------------------------------------------------------

TEST_F(TopkBadInput, WorkspaceMisaligned) {
  alignas(256) static unsigned char workspace[512];
  for (std::size_t misalign : {1u, 8u, 128u}) {
    SCOPED_TRACE(misalign);
    std::vector<Buffer> before;
    for (Buffer* b : buffers()) before.push_back(*b);
    void* p = workspace + misalign;
    std::size_t bytes = 256;
    try {
      attnkit::topk(p, bytes, valid(), options());
      ADD_FAILURE() << "a workspace at " << p << " was accepted";
    } catch (const attnkit::Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.code(), ErrorCode::kValue) << what;
      EXPECT_NE(what.find("workspace"), std::string::npos) << what;
      EXPECT_NE(what.find("aligned to 256 bytes"), std::string::npos) << what;
      // The value seen is the address; accept it in decimal or hexadecimal.
      const auto address = reinterpret_cast<std::uintptr_t>(p);
      std::ostringstream hex_address;
      hex_address << std::hex << address;
      EXPECT_TRUE(what.find(std::to_string(address)) != std::string::npos ||
                  what.find(hex_address.str()) != std::string::npos)
          << "message \"" << what << "\" does not name the address seen (" << p << ")";
    }
    const std::vector<Buffer*> now = buffers();
    for (std::size_t i = 0; i < now.size(); ++i) {
      EXPECT_EQ(now[i]->first_difference(before[i]), -1) << "buffer " << i << " was written";
    }
  }
}

/// The CPU needs no workspace: the size is 0 and any 256-aligned workspace (even of 0 bytes) is
/// enough, so the "workspace too small" rule cannot fire here; the query leaves outputs alone.
TEST_F(TopkBadInput, WorkspaceSizeOnCpu) {
  EXPECT_EQ(attnkit::topk_workspace_size(valid(), options()), 0u);
  std::size_t bytes = 99;
  attnkit::topk(nullptr, bytes, valid(), options());
  EXPECT_EQ(bytes, 0u);
  EXPECT_EQ(check_untouched(TopkOutputs{idx64_, val32_, kK}), "");
  alignas(256) static unsigned char workspace[256];
  bytes = 0;
  ASSERT_NO_THROW(attnkit::topk(workspace, bytes, valid(), options()));
  // The call ran: every row's four indices are columns.
  for (std::int64_t i = 0; i < kB * kK; ++i) {
    EXPECT_GE(idx64_.get_int(i), 0) << "slot " << i;
    EXPECT_LT(idx64_.get_int(i), kN) << "slot " << i;
  }
}

// ---------------------------------------------------------------------------------------------
// nan = raise
// ---------------------------------------------------------------------------------------------

TEST_F(TopkBadInput, NanInValidRangeRaises) {
  for (DType dtype : kFloatDTypes) {
    for (std::uint32_t payload : nan_payloads(dtype)) {
      SCOPED_TRACE(std::string(attnkit::dtype_name(dtype)) + " NaN " + hex(payload));
      TopkCase c;
      c.dtype = dtype;
      c.dist = Dist::kNormal;
      c.seed = payload;
      c.batch = kB;
      c.n = kN;
      c.k = kK;
      c.nan = NanPolicy::kRaise;
      TopkInputs in = make_inputs(c);
      in.x.set(in.x_first + 2 * in.row_stride + static_cast<std::int64_t>(payload % kN), payload);
      TopkOutputs out = make_outputs(c);
      for (TopkBackend backend : {TopkBackend::kAuto, TopkBackend::kReference}) {
        const CallResult r = call_topk(c, in, out, backend);
        ASSERT_TRUE(r.threw) << "no error for a NaN in row 2";
        EXPECT_EQ(r.code, ErrorCode::kNanFound) << r.message;
        EXPECT_NE(r.message.find("NaN"), std::string::npos) << r.message;
        EXPECT_NE(r.message.find("raise"), std::string::npos) << r.message;
        // The message names the element: x[row, column].
        const std::string where = "x[2, " + std::to_string(payload % kN) + "]";
        EXPECT_NE(r.message.find(where), std::string::npos) << r.message;
        EXPECT_EQ(check_untouched(out), "");
      }
    }
  }
}

/// With NaNs in many rows, the error names the first row's, whichever thread scans it and
/// whatever the others find meanwhile (each row ends in a NaN, so that several threads are
/// inside rows with NaNs at once), and not one outside its row's valid range before it.
TEST_F(TopkBadInput, NanInManyRowsNamesTheFirst) {
  ThreadCountGuard restore;
  attnkit::set_num_threads(4);
  TopkCase c;
  c.dtype = DType::kFloat32;
  c.dist = Dist::kNormal;
  c.seed = 31;
  c.batch = 256;
  c.n = 4096;
  c.k = 3;
  c.nan = NanPolicy::kRaise;
  c.ranges = Ranges::kBoth;
  c.begin_values.assign(256, 0);
  c.end_values.assign(256, 4096);
  c.end_values[3] = 2000;
  TopkInputs in = make_inputs(c);
  const std::uint32_t nan = nan_payloads(c.dtype)[0];
  in.x.set(in.x_first + 3 * in.row_stride + 3000, nan);
  for (std::int64_t row = 5; row < c.batch; ++row) {
    in.x.set(in.x_first + row * in.row_stride + c.n - 1, nan);
  }
  for (int repeat = 0; repeat < 50; ++repeat) {
    TopkOutputs out = make_outputs(c);
    const CallResult r = call_topk(c, in, out, TopkBackend::kAuto);
    ASSERT_TRUE(r.threw);
    EXPECT_EQ(r.code, ErrorCode::kNanFound) << r.message;
    ASSERT_NE(r.message.find("x[5, 4095]"), std::string::npos) << r.message;
  }
}

/// NaNs before begin, at end and beyond, and in the gaps between padded rows lie outside every
/// valid range: nan = raise must not see them, and the result is the NaN-free one.
TEST_F(TopkBadInput, NanOutsideValidRangeDoesNotRaise) {
  std::uint64_t seed = 900;
  for (DType dtype : kFloatDTypes) {
    for (XLayout layout : {XLayout::kPadded, XLayout::kNegative, XLayout::kContiguous}) {
      TopkCase c;
      c.dtype = dtype;
      c.dist = Dist::kNormal;
      c.seed = seed++;
      c.batch = 4;
      c.n = 40;
      c.k = 8;
      c.layout = layout;
      c.nan = NanPolicy::kRaise;
      c.ranges = Ranges::kBoth;
      c.begin_values = {5, 0, 10, 39};
      c.end_values = {30, 20, 40, 39};
      c.sorted = TopkOrder::kValue;
      SCOPED_TRACE(c.describe());
      TopkInputs in = make_inputs(c);
      const std::uint32_t nan = nan_payloads(dtype)[seed % 7];
      for (std::int64_t b = 0; b < c.batch; ++b) {
        const auto i = static_cast<std::size_t>(b);
        for (std::int64_t col = 0; col < c.n; ++col) {
          if (col < c.begin_values[i] || col >= c.end_values[i]) {
            in.x.set(in.x_first + b * in.row_stride + col, nan);
          }
        }
      }
      const Expected e = reference_topk(c, in);
      ASSERT_FALSE(e.error.has_value());
      for (TopkBackend backend : {TopkBackend::kAuto, TopkBackend::kReference}) {
        TopkOutputs out = make_outputs(c);
        const CallResult r = call_topk(c, in, out, backend);
        EXPECT_EQ(check_call(c, in, out, r, e), "")
            << "backend " << (backend == TopkBackend::kAuto ? "auto" : "reference");
      }
    }
  }
}

}  // namespace

// begin as column 0 of a [B, 2] int64 buffer and out_indices as its column 1 share no byte:
// strided vectors are compared element by element, as x's rows are.
TEST(TopkOverlap, OutputsInTheGapsOfAStridedEnd) {
  constexpr std::int64_t kRows = 3, kCols = 8;
  std::vector<float> x(static_cast<std::size_t>(kRows * kCols));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 5) % 7);
  std::vector<std::int64_t> shared(static_cast<std::size_t>(kRows * 2), -5);
  for (std::int64_t b = 0; b < kRows; ++b) shared[static_cast<std::size_t>(2 * b)] = 2 + 2 * b;
  attnkit::TopkTensors t;
  t.x = TensorView::make(x.data(), DType::kFloat32, kCpu, {kRows, kCols});
  t.end = TensorView::make(shared.data(), DType::kInt64, kCpu, {kRows}, {2});
  t.out_indices = TensorView::make(shared.data() + 1, DType::kInt64, kCpu, {kRows, 1}, {2, 1});
  attnkit::TopkOptions o;
  o.k = 1;
  attnkit::topk(t, o);
  for (std::int64_t b = 0; b < kRows; ++b) {
    const std::int64_t end = 2 + 2 * b;
    const float* row = x.data() + b * kCols;
    const std::int64_t want = std::max_element(row, row + end) - row;  // the first maximum
    EXPECT_EQ(shared[static_cast<std::size_t>(2 * b + 1)], want) << "row " << b;
    EXPECT_EQ(shared[static_cast<std::size_t>(2 * b)], end) << "end overwritten, row " << b;
  }
}

// Rows without columns only pad: their stride is never stepped, so a null x or a row stride
// no span check saw (empty views skip it) is harmless.
TEST(TopkEmptyRows, NullDataAndExtremeRowStridesOnlyPad) {
  for (const std::int64_t stride : {std::int64_t{-5}, std::numeric_limits<std::int64_t>::max()}) {
    for (const bool null_data : {true, false}) {
      float dummy = 0.0f;
      std::vector<std::int64_t> idx(6, 7);
      std::vector<float> val(6, 7.0f);
      attnkit::TopkTensors t;
      t.x = TensorView::make(null_data ? nullptr : &dummy, DType::kFloat32, kCpu, {3, 0},
                             {stride, 1});
      t.out_indices = TensorView::make(idx.data(), DType::kInt64, kCpu, {3, 2});
      t.out_values = TensorView::make(val.data(), DType::kFloat32, kCpu, {3, 2});
      attnkit::TopkOptions o;
      o.k = 2;
      o.nan = attnkit::NanPolicy::kRaise;  // the NaN scan visits the rows too
      attnkit::topk(t, o);
      EXPECT_EQ(idx, std::vector<std::int64_t>(6, -1)) << stride << " " << null_data;
      EXPECT_EQ(val, std::vector<float>(6, -std::numeric_limits<float>::infinity()));
    }
  }
}

// A dimension of size 1 never steps by its stride, whatever it is (INT64_MIN included).
// A single row's stride is never stepped and may take any value; the overlap check must still
// find an output inside that row, without stepping (or overflowing) the stride in bytes.
TEST(TopkOverlap, AnOutputInsideASingleRowWithAnExtremeStride) {
  for (std::int64_t stride : {std::numeric_limits<std::int64_t>::max(),
                              std::numeric_limits<std::int64_t>::min()}) {
    SCOPED_TRACE(stride);
    std::vector<float> buf(16, 1.0f);
    attnkit::TopkTensors t;
    t.x = TensorView::make(buf.data(), DType::kFloat32, kCpu, {1, 4}, {stride, 1});
    t.out_indices = TensorView::make(buf.data() + 2, DType::kInt32, kCpu, {1, 2});
    attnkit::TopkOptions o;
    o.k = 2;
    const std::vector<float> before = buf;
    expect_throws([&] { attnkit::topk(t, o); }, ErrorCode::kLayout,
                  {"out_indices (bytes", "overlaps x"});
    EXPECT_EQ(buf, before);
  }
}

TEST(TopkLayout, AnyStrideOnADimensionOfOne) {
  std::vector<float> x = {3.0f, 9.0f, 1.0f, 9.0f};
  std::vector<std::int64_t> idx(2, -5);
  attnkit::TopkTensors t;
  t.x = TensorView::make(x.data(), DType::kFloat32, kCpu, {1, 4},
                         {std::numeric_limits<std::int64_t>::min(), 1});
  t.out_indices = TensorView::make(idx.data(), DType::kInt64, kCpu, {1, 2});
  attnkit::TopkOptions o;
  o.k = 2;
  attnkit::topk(t, o);
  EXPECT_EQ(idx, (std::vector<std::int64_t>{1, 3}));
}
