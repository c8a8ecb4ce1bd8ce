// SPDX-License-Identifier: Apache-2.0
// CUDA top-k against the CPU backend on the same inputs: every distribution, option, layout
// and size class of SPEC §Testing, plus determinism, CUDA graph capture and device-side checks.
// Tests named *Small* are the subset scripts/gpu-check.sh also runs under compute-sanitizer.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "attnkit/attnkit.hpp"
#include "common/float_bits.hpp"
#include "common/topk_sample.hpp"

namespace {

using attnkit::DType;
using attnkit::TensorView;

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

const attnkit::Device kCpu{attnkit::DeviceType::kCPU, 0};
const attnkit::Device kGpu{attnkit::DeviceType::kCUDA, 0};

enum class Dist {
  kNormal, kTiny, kHuge, kTies, kAllEqual, kAscending, kDescending, kSpecials, kRawBits, kDsa,
  kMostlyNan, kSampleBait, kMostlyNegInf, kSliceBait, kBands
};
// The distributions every-distribution tests cycle (not kSliceBait, kBands).
constexpr int kDists = 13;

const char* dist_name(Dist d) {
  switch (d) {
    case Dist::kNormal: return "normal";
    case Dist::kTiny: return "normal*1e-3";
    case Dist::kHuge: return "normal*1e3";
    case Dist::kTies: return "4-values";
    case Dist::kAllEqual: return "all-equal";
    case Dist::kAscending: return "ascending";
    case Dist::kDescending: return "descending";
    case Dist::kSpecials: return "nan-inf-denormal";
    case Dist::kRawBits: return "raw-bits";
    case Dist::kDsa: return "dsa-relu";
    case Dist::kMostlyNan: return "90%-nan";
    case Dist::kSampleBait: return "sample-bait";
    case Dist::kMostlyNegInf: return "99.7%-neg-inf";
    case Dist::kSliceBait: return "slice-bait";
    case Dist::kBands: return "bands";
  }
  return "?";
}

std::uint32_t to_bits(DType dtype, float v) {
  switch (dtype) {
    case DType::kFloat32: return attnkit::detail::float_to_bits(v);
    case DType::kBFloat16: return attnkit::detail::float_to_bf16_bits(v);
    default: return attnkit::detail::float_to_f16_bits(v);
  }
}

/// Bit patterns of B rows of `stride` elements (element size `elem`), generated per row; `k`
/// places kSliceBait.
std::vector<std::uint8_t> make_rows(DType dtype, std::int64_t batch, std::int64_t n,
                                    std::int64_t stride, Dist dist, std::uint64_t seed,
                                    std::int64_t k = 0) {
  const std::size_t elem = attnkit::dtype_size(dtype);
  std::vector<std::uint8_t> data(static_cast<std::size_t>(batch * stride) * elem + 64);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  const std::uint32_t nan =
      dtype == DType::kFloat32 ? 0x7FC00001u : (dtype == DType::kBFloat16 ? 0x7FC1u : 0x7E01u);
  const std::uint32_t neg_nan =
      dtype == DType::kFloat32 ? 0xFFC00002u : (dtype == DType::kBFloat16 ? 0xFFC2u : 0xFE02u);
  const std::uint32_t denorm = dtype == DType::kFloat32 ? 0x00000003u : 0x0003u;
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t i = 0; i < stride; ++i) {
      float v = 0;
      std::uint32_t bits = 0;
      switch (dist) {
        case Dist::kNormal: v = normal(rng); bits = to_bits(dtype, v); break;
        case Dist::kTiny: v = normal(rng) * 1e-3f; bits = to_bits(dtype, v); break;
        case Dist::kHuge: v = normal(rng) * 1e3f; bits = to_bits(dtype, v); break;
        case Dist::kTies: v = static_cast<float>(rng() % 4); bits = to_bits(dtype, v); break;
        case Dist::kAllEqual: bits = to_bits(dtype, 1.5f); break;
        case Dist::kAscending: bits = to_bits(dtype, static_cast<float>(i) * 0.25f); break;
        case Dist::kDescending: bits = to_bits(dtype, -static_cast<float>(i) * 0.25f); break;
        case Dist::kSpecials: {
          const std::uint64_t r = rng() % 16;
          bits = r == 0   ? nan
                 : r == 1 ? neg_nan
                 : r == 2 ? to_bits(dtype, INFINITY)
                 : r == 3 ? to_bits(dtype, -INFINITY)
                 : r == 4 ? denorm
                 : r == 5 ? (denorm | (dtype == DType::kFloat32 ? 0x80000000u : 0x8000u))
                 : r == 6 ? 0u
                 : r == 7 ? (dtype == DType::kFloat32 ? 0x80000000u : 0x8000u)
                          : to_bits(dtype, normal(rng));
          break;
        }
        case Dist::kRawBits: bits = static_cast<std::uint32_t>(rng()); break;
        case Dist::kMostlyNan:  // the k-th best becomes a NaN, and for largest=false every
                                // number beats it: the prefilter must let numbers through
          bits = rng() % 10 == 0 ? to_bits(dtype, normal(rng)) : (rng() % 2 ? nan : neg_nan);
          break;
        case Dist::kSampleBait: {  // the columns the register kernels and the filter kernel
                                   // (one CTA a row) sample, in rows without padding or
                                   // offsets, hold the largest values: the sample overestimates
                                   // the row, and the full select or scan must take over
          const std::int64_t vec = 16 / static_cast<std::int64_t>(elem);
          const bool sampled = attnkit::detail::short_sampled(i, n) ||
                               attnkit::detail::filter_sampled_vector(i / vec, n / vec);
          // Spread wide enough that bf16 and fp16 keep the planted values apart: the floor
          // then has only its own ties above it, not hundreds of rounded copies.
          v = sampled ? 1000.0f + 100.0f * normal(rng) : normal(rng);
          bits = to_bits(dtype, v);
          break;
        }
        case Dist::kSliceBait: {  // the vectors a filter slice samples from its whole row
                                  // for this k hold the largest values: every slice starts
                                  // from a floor fewer than k elements reach, and the merge
                                  // must stream the row again
          const std::int64_t vec = 16 / static_cast<std::int64_t>(elem);
          const int per_thread = attnkit::detail::filter_samples_per_thread(
              k, n, n / vec, static_cast<int>(vec), attnkit::detail::kFilterSampleMaxKeys);
          const bool sampled = attnkit::detail::filter_sampled_vector(i / vec, n / vec, per_thread);
          v = sampled ? 1000.0f + 100.0f * normal(rng) : normal(rng);
          bits = to_bits(dtype, v);
          break;
        }
        case Dist::kBands: {  // row b: the bit patterns of 1.0 and the next W - 1 numbers,
                              // W cycling through widths that give the scores' range every
                              // number of significant bits around the select's 8-bit digits
          constexpr std::uint32_t kWidths[] = {
              1, 2, 200, 256, 257, 3001, 65537, (1u << 20) + 3, 1u << 23};
          const std::uint32_t w = kWidths[b % 9];
          const std::uint32_t one = to_bits(dtype, 1.0f);
          bits = one + static_cast<std::uint32_t>(rng() % (elem == 4 ? w : std::min(w, 0x3000u)));
          break;
        }
        case Dist::kMostlyNegInf: {  // a sampled floor of -inf itself: the prefilter bound
                                     // below it must still let every number through
          const std::uint64_t r = rng() % 1000;
          bits = r < 997 ? to_bits(dtype, -INFINITY) : r < 998 ? nan : to_bits(dtype, normal(rng));
          break;
        }
        case Dist::kDsa: {
          // Indexer scores: a weighted sum of ReLUs, many exact zeros, bf16-quantised.
          float s = 0;
          for (int h = 0; h < 4; ++h) s += std::max(0.0f, normal(rng)) * 0.5f;
          bits = to_bits(dtype, s);
          break;
        }
      }
      std::uint8_t* dst = data.data() + static_cast<std::size_t>(b * stride + i) * elem;
      if (elem == 4) {
        std::memcpy(dst, &bits, 4);
      } else {
        const std::uint16_t h = static_cast<std::uint16_t>(bits);
        std::memcpy(dst, &h, 2);
      }
    }
  }
  return data;
}

struct Case {
  DType dtype = DType::kBFloat16;
  std::int64_t batch = 1, n = 1, k = 1;
  Dist dist = Dist::kNormal;
  bool largest = true;
  attnkit::TopkOrder order = attnkit::TopkOrder::kNone;
  attnkit::NanPolicy nan = attnkit::NanPolicy::kLargest;
  bool ragged = false;        // per-row begin/end (int32), including empty rows
  bool causal = false;        // end[b] = ceil(N (b + 1) / B), begin 0 (not with ragged)
  bool ends_past_n = false;   // some end[b] > N and some negative (clamped; check off)
  bool offset = false;        // index_offset (int64)
  bool int32_indices = false;
  bool values = true;
  std::int64_t misalign = 0;  // elements added to the base pointer
  std::int64_t pad = 0;       // row stride = n + pad
  std::int64_t out_pad = 0;   // output row stride = k + out_pad
  std::uint64_t seed = 1;

  std::string str() const {
    std::ostringstream s;
    s << attnkit::dtype_name(dtype) << " B=" << batch << " N=" << n << " k=" << k << " dist="
      << dist_name(dist) << " largest=" << largest << " order=" << static_cast<int>(order)
      << " nan=" << static_cast<int>(nan) << " ragged=" << ragged << " causal=" << causal
      << " past_n=" << ends_past_n
      << " offset=" << offset << " i32=" << int32_indices << " values=" << values
      << " misalign=" << misalign << " pad=" << pad << " out_pad=" << out_pad << " seed=" << seed;
    return s.str();
  }
};

struct Result {
  std::vector<std::uint8_t> values;
  std::vector<std::int64_t> indices;  // widened
};

template <class T>
T* device_copy(const std::vector<T>& host) {
  T* d = nullptr;
  if (cudaMalloc(&d, std::max<std::size_t>(1, host.size() * sizeof(T))) != cudaSuccess)
    return nullptr;
  cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}

/// Runs the case on `device`; `graph` captures the call into a CUDA graph and replays it.
Result run_case(const Case& c, const std::vector<std::uint8_t>& rows,
                const std::vector<std::int32_t>& begin, const std::vector<std::int32_t>& end,
                const std::vector<std::int64_t>& offset, attnkit::Device device,
                attnkit::TopkBackend backend, bool graph = false) {
  const std::size_t elem = attnkit::dtype_size(c.dtype);
  const std::int64_t stride = c.n + c.pad, out_stride = c.k + c.out_pad;
  const std::size_t out_elems =
      static_cast<std::size_t>(std::max<std::int64_t>(c.batch * out_stride, 1));
  const std::size_t idx_size = c.int32_indices ? 4 : 8;
  std::vector<std::uint8_t> values(out_elems * elem, 0xAB);  // poison: every slot must be written
  std::vector<std::uint8_t> indices(out_elems * idx_size, 0xCD);

  const bool gpu = device.type == attnkit::DeviceType::kCUDA;
  void* x_ptr = const_cast<std::uint8_t*>(rows.data());
  void *v_ptr = values.data(), *i_ptr = indices.data();
  void *b_ptr = const_cast<std::int32_t*>(begin.data()),
       *e_ptr = const_cast<std::int32_t*>(end.data());
  void* o_ptr = const_cast<std::int64_t*>(offset.data());
  if (gpu) {
    x_ptr = device_copy(rows);
    v_ptr = device_copy(values);
    i_ptr = device_copy(indices);
    b_ptr = begin.empty() ? nullptr : device_copy(begin);
    e_ptr = end.empty() ? nullptr : device_copy(end);
    o_ptr = offset.empty() ? nullptr : device_copy(offset);
  }
  attnkit::TopkTensors t;
  t.x = TensorView::make(static_cast<char*>(x_ptr) + c.misalign * elem, c.dtype, device,
                         {c.batch, c.n}, {stride, 1});
  if (!begin.empty()) t.begin = TensorView::make(b_ptr, DType::kInt32, device, {c.batch});
  if (!end.empty()) t.end = TensorView::make(e_ptr, DType::kInt32, device, {c.batch});
  if (!offset.empty()) t.index_offset = TensorView::make(o_ptr, DType::kInt64, device, {c.batch});
  if (c.values)
    t.out_values = TensorView::make(v_ptr, c.dtype, device, {c.batch, c.k}, {out_stride, 1});
  t.out_indices = TensorView::make(i_ptr, c.int32_indices ? DType::kInt32 : DType::kInt64, device,
                                   {c.batch, c.k}, {out_stride, 1});
  attnkit::TopkOptions o;
  o.k = c.k;
  o.largest = c.largest;
  o.sorted = c.order;
  o.nan = c.nan;
  o.backend = backend;
  o.check = attnkit::CheckMode::kOff;  // the clamping cases pass bad ends on purpose

  if (!gpu) {
    attnkit::topk(t, o);
  } else {
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    std::size_t bytes = 0;
    attnkit::topk(nullptr, bytes, t, o, stream);
    void* ws = nullptr;
    cudaMalloc(&ws, std::max<std::size_t>(bytes, 256));
    if (graph) {
      cudaGraph_t g;
      cudaGraphExec_t exec;
      cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);
      attnkit::topk(ws, bytes, t, o, stream);
      cudaStreamEndCapture(stream, &g);
      cudaGraphInstantiate(&exec, g, 0);
      cudaGraphLaunch(exec, stream);
      cudaGraphLaunch(exec, stream);  // replays must give the same result
      cudaStreamSynchronize(stream);
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(g);
    } else {
      attnkit::topk(ws, bytes, t, o, stream);
    }
    cudaStreamSynchronize(stream);
    cudaMemcpy(values.data(), v_ptr, values.size(), cudaMemcpyDeviceToHost);
    cudaMemcpy(indices.data(), i_ptr, indices.size(), cudaMemcpyDeviceToHost);
    cudaFree(ws);
    cudaStreamDestroy(stream);
    for (void* p : {x_ptr, v_ptr, i_ptr, b_ptr, e_ptr, o_ptr}) cudaFree(p);
  }

  Result r;
  for (std::int64_t b = 0; b < c.batch; ++b) {
    for (std::int64_t j = 0; j < c.k; ++j) {
      const std::size_t at = static_cast<std::size_t>(b * out_stride + j);
      if (c.int32_indices) {
        std::int32_t v;
        std::memcpy(&v, indices.data() + at * 4, 4);
        r.indices.push_back(v);
      } else {
        std::int64_t v;
        std::memcpy(&v, indices.data() + at * 8, 8);
        r.indices.push_back(v);
      }
      if (c.values)
        r.values.insert(r.values.end(), values.begin() + static_cast<std::ptrdiff_t>(at * elem),
                        values.begin() + static_cast<std::ptrdiff_t>((at + 1) * elem));
    }
  }
  return r;
}

/// For order "none" the row order is unspecified: compare rows sorted by index.
void canonicalise(const Case& c, Result& r) {
  if (c.order != attnkit::TopkOrder::kNone) return;
  const std::size_t elem = attnkit::dtype_size(c.dtype);
  for (std::int64_t b = 0; b < c.batch; ++b) {
    std::vector<std::pair<std::int64_t, std::vector<std::uint8_t>>> row;
    for (std::int64_t j = 0; j < c.k; ++j) {
      const std::size_t at = static_cast<std::size_t>(b * c.k + j);
      std::vector<std::uint8_t> v;
      if (c.values)
        v.assign(r.values.begin() + static_cast<std::ptrdiff_t>(at * elem),
                 r.values.begin() + static_cast<std::ptrdiff_t>((at + 1) * elem));
      row.emplace_back(r.indices[at], v);
    }
    std::stable_sort(row.begin(), row.end(),
                     [](const auto& a, const auto& d) { return a.first < d.first; });
    for (std::int64_t j = 0; j < c.k; ++j) {
      const std::size_t at = static_cast<std::size_t>(b * c.k + j);
      r.indices[at] = row[static_cast<std::size_t>(j)].first;
      if (c.values)
        std::copy(row[static_cast<std::size_t>(j)].second.begin(),
                  row[static_cast<std::size_t>(j)].second.end(),
                  r.values.begin() + static_cast<std::ptrdiff_t>(at * elem));
    }
  }
}

void check_case(const Case& c, bool graph = false) {
  SCOPED_TRACE(c.str() + (graph ? " graph" : ""));
  const std::int64_t stride = c.n + c.pad;
  const auto rows = make_rows(c.dtype, c.batch, c.n, stride + c.misalign, c.dist, c.seed, c.k);
  std::vector<std::int32_t> begin, end;
  std::vector<std::int64_t> offset;
  std::mt19937_64 rng(c.seed * 7 + 3);
  if (c.causal) {
    for (std::int64_t b = 0; b < c.batch; ++b) {
      begin.push_back(0);
      end.push_back(static_cast<std::int32_t>((c.n * (b + 1) + c.batch - 1) / c.batch));
    }
  }
  if (c.ragged) {
    for (std::int64_t b = 0; b < c.batch; ++b) {
      std::int64_t e = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(c.n + 1));
      std::int64_t s = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(e + 1));
      if (b % 5 == 1) s = e;  // empty row
      if (b % 7 == 2) { s = 0; e = c.n; }
      if (c.ends_past_n && b % 3 == 0) e = c.n + 1 + static_cast<std::int64_t>(rng() % 1000);
      if (c.ends_past_n && b % 3 == 1) s = -5;
      begin.push_back(static_cast<std::int32_t>(s));
      end.push_back(static_cast<std::int32_t>(e));
    }
  }
  if (c.offset) {
    for (std::int64_t b = 0; b < c.batch; ++b)
      offset.push_back(static_cast<std::int64_t>(rng() % 100000) - 50000);
  }
  // Expected: the CPU reference for small problems, the CPU fast path (itself held to the
  // reference by the CPU suite) for large ones.
  const bool small = c.batch * c.n <= (std::int64_t{1} << 21);
  Result want = run_case(c, rows, begin, end, offset, kCpu,
                         small ? attnkit::TopkBackend::kReference : attnkit::TopkBackend::kAuto);
  Result got = run_case(c, rows, begin, end, offset, kGpu, attnkit::TopkBackend::kAuto, graph);
  if (small && !graph) {
    // Every small case also runs captured in a CUDA graph and replayed: the same bits.
    const Result replayed =
        run_case(c, rows, begin, end, offset, kGpu, attnkit::TopkBackend::kAuto, true);
    EXPECT_EQ(replayed.indices, got.indices) << "graph replay differs from the direct call";
    EXPECT_TRUE(replayed.values == got.values) << "graph replay values differ";
  }
  canonicalise(c, want);
  canonicalise(c, got);
  std::int64_t bad = 0;
  for (std::size_t i = 0; i < want.indices.size() && bad < 5; ++i) {
    if (want.indices[i] != got.indices[i]) {
      ADD_FAILURE() << "row " << static_cast<std::int64_t>(i) / c.k << " slot "
                    << static_cast<std::int64_t>(i) % c.k << ": index " << got.indices[i]
                    << ", expected " << want.indices[i];
      ++bad;
    }
  }
  EXPECT_EQ(want.indices, got.indices);
  EXPECT_TRUE(want.values == got.values) << "values differ bitwise";
}

// ---------------------------------------------------------------------------------------------

class TopkCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
    ASSERT_GT(count, 0) << "these tests need a CUDA device";
  }
};

/// A batch a few rows larger than the device's SM count: the filter kernel then runs one CTA a
/// row with the narrow (or, with per-row ends, the ragged-row) policy.
std::int64_t rows_past_sms() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  return std::max(sms, 1) + 8;
}

/// The option axes of the every-option tests, cycled by `variant` at different periods so that
/// the combinations differ from case to case.
void set_variant_options(Case& c, int variant) {
  c.largest = variant % 2 == 0;
  c.nan = variant % 4 == 3 ? attnkit::NanPolicy::kIgnore : attnkit::NanPolicy::kLargest;
  c.offset = variant % 2 == 1;
  c.int32_indices = variant % 2 == 0;
  c.values = variant != 5;
  c.misalign = variant % 4;
  c.pad = variant * 5;
  c.out_pad = variant % 3;
}

TEST_F(TopkCuda, SmallEveryOption) {
  const DType dtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
  const attnkit::TopkOrder orders[] = {attnkit::TopkOrder::kNone, attnkit::TopkOrder::kIndex,
                                       attnkit::TopkOrder::kValue};
  std::uint64_t seed = 100;
  for (DType dtype : dtypes) {
    for (attnkit::TopkOrder order : orders) {
      for (int variant = 0; variant < 8; ++variant) {
        Case c;
        c.dtype = dtype;
        c.order = order;
        c.batch = 1 + variant * 3;
        c.n = std::int64_t{1} << (4 + variant);  // 16 .. 2048
        c.n -= variant % 2 ? 3 : 0;
        c.k = variant % 3 == 0 ? 1 : variant % 3 == 1 ? 7 : c.n / 3 + 1;
        c.dist = static_cast<Dist>(variant % 10);
        set_variant_options(c, variant);
        c.ragged = variant % 3 == 2;
        c.seed = seed++;
        check_case(c);
      }
    }
  }
}

// Rows of 8K..256K columns in small batches take one thread-block cluster per row on sm_90
// (up to 16 CTAs pooling histograms and counts, of 512 threads beyond 128K columns, e.g. the
// 151936- and 202048-entry vocabularies): every option there, with rows that end inside any CTA
// of the cluster.
TEST_F(TopkCuda, SmallClusterEveryOption) {
  const DType dtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
  const attnkit::TopkOrder orders[] = {attnkit::TopkOrder::kNone, attnkit::TopkOrder::kIndex,
                                       attnkit::TopkOrder::kValue};
  const std::int64_t lengths[] = {8193, 20000, 65543, 131072, 151936, 202048};
  const std::int64_t ks[] = {7, 512, 4096};
  std::uint64_t seed = 5000;
  for (int variant = 0; variant < 18; ++variant) {
    // Every length meets every k, dtype and order once.
    Case c;
    c.n = lengths[variant % 6];
    c.k = ks[variant / 6];
    c.dtype = dtypes[(variant + variant / 6) % 3];
    c.order = orders[(variant / 3) % 3];
    c.batch = 1 + variant % 3;
    c.dist = static_cast<Dist>(variant % kDists);
    set_variant_options(c, variant);
    c.ragged = variant % 3 != 0;
    c.seed = seed++;
    check_case(c);
  }
}

// fp32 rows of 128K-256K columns take clusters of 512-thread CTAs whose registers hold the
// words flipped for the direction (topk_cluster.cuh, kFlipOnce): each length meets both
// directions under both NaN policies that return, on rows of specials, NaN, -inf, ties and
// sample bait.
TEST_F(TopkCuda, SmallFloat32WideClusterDirections) {
  const std::int64_t lengths[] = {131073, 151936, 202048, 262144};
  const std::int64_t ks[] = {2, 50, 1024, 4096};
  const Dist dists[] = {Dist::kSpecials,   Dist::kMostlyNan, Dist::kMostlyNegInf,
                        Dist::kSampleBait, Dist::kTies,      Dist::kRawBits,
                        Dist::kNormal,     Dist::kDescending};
  std::uint64_t seed = 9100;
  for (int variant = 0; variant < 16; ++variant) {
    Case c;
    c.dtype = DType::kFloat32;
    c.n = lengths[variant % 4];
    c.k = ks[(variant / 4 + variant) % 4];
    c.largest = (variant + variant / 4) % 2 == 0;
    c.nan = variant < 8 ? attnkit::NanPolicy::kLargest : attnkit::NanPolicy::kIgnore;
    c.dist = dists[variant % 8];
    c.batch = 1 + variant % 3;
    c.order = variant % 5 == 0 ? attnkit::TopkOrder::kValue : attnkit::TopkOrder::kNone;
    c.ragged = variant % 4 == 3;
    c.misalign = variant % 3;
    c.seed = seed++;
    check_case(c);
  }
}

// Batches of 8-15 rows of 64K-128K columns take clusters of 8 512-thread CTAs on an H100 or
// H200 (dispatch.cu, wide_batch_clusters; elsewhere whatever fits): rows that end inside any
// CTA, and rows whose planted best values sit where either layout samples; fp32 rows in both
// directions under both NaN policies that return, as the flipped registers must order them.
TEST_F(TopkCuda, SmallClusterWideBatches) {
  const attnkit::TopkOrder orders[] = {attnkit::TopkOrder::kNone, attnkit::TopkOrder::kIndex,
                                       attnkit::TopkOrder::kValue};
  const Dist dists[] = {Dist::kSampleBait, Dist::kTies, Dist::kSpecials, Dist::kNormal};
  const std::int64_t ks[] = {7, 512, 4096};
  std::uint64_t seed = 7500;
  for (int variant = 0; variant < 6; ++variant) {
    Case c;
    c.dtype = variant % 2 == 0 ? DType::kBFloat16 : DType::kFloat16;
    c.batch = variant < 3 ? 10 : 8;
    c.n = variant % 3 == 0 ? 100000 : 131072;
    c.k = ks[variant % 3];
    c.order = orders[(variant + 1) % 3];
    c.dist = dists[variant % 4];
    c.ragged = variant % 2 == 1;
    c.seed = seed++;
    check_case(c);
  }
  const Dist f32_dists[] = {Dist::kSpecials, Dist::kMostlyNan, Dist::kSampleBait, Dist::kTies,
                            Dist::kRawBits,  Dist::kNormal};
  const std::int64_t f32_ks[] = {2, 50, 1024, 4096};
  for (int variant = 0; variant < 6; ++variant) {
    Case c;
    c.dtype = DType::kFloat32;
    c.batch = 8 + (variant * 3) % 8;  // 8, 11, 14, 9, 12, 15
    c.n = variant % 2 == 0 ? 129280 : 65537 + 13000 * variant;
    c.k = f32_ks[variant % 4];
    c.largest = variant % 3 != 1;
    c.nan = variant < 3 ? attnkit::NanPolicy::kLargest : attnkit::NanPolicy::kIgnore;
    c.order = orders[variant % 3];
    c.dist = f32_dists[variant];
    c.ragged = variant % 3 == 2;
    c.misalign = variant % 2;
    c.seed = seed++;
    check_case(c);
  }
}

// The cluster kernel's kept elements at the k-th score: ties that end inside a later CTA (the
// packed comparisons decide the masks, and one thread keeps only some of its ties), a k-th at
// a NaN's or at +inf's score (each candidate's score is tested instead), and smallest-first
// rows with NaNs that end before k (everything valid is kept).
TEST_F(TopkCuda, SmallClusterKthTies) {
  std::uint64_t seed = 7000;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    Case ties;  // 4 values over 20000 columns: the top value's 4096th copy lies in CTA 2
    ties.dtype = dtype;
    ties.batch = 2;
    ties.n = 20000;
    ties.k = 4096;
    ties.dist = Dist::kTies;
    ties.seed = seed++;
    check_case(ties);
    for (std::int64_t k : {1000, 3000}) {  // 1/8 NaN, 1/16 +inf: the k-th is a NaN, then +inf
      Case c;
      c.dtype = dtype;
      c.batch = 2;
      c.n = 20000;
      c.k = k;
      c.dist = Dist::kSpecials;
      c.order = k == 1000 ? attnkit::TopkOrder::kValue : attnkit::TopkOrder::kNone;
      c.seed = seed++;
      check_case(c);
    }
    Case smallest;
    smallest.dtype = dtype;
    smallest.batch = 8;
    smallest.n = 20000;
    smallest.k = 4096;
    smallest.dist = Dist::kSpecials;
    smallest.largest = false;
    smallest.ragged = true;
    smallest.seed = seed++;
    check_case(smallest);
  }
}

TEST_F(TopkCuda, SmallDistributions) {
  std::uint64_t seed = 500;
  for (int d = 0; d < kDists; ++d) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      for (std::int64_t k : {1, 5, 300}) {
        Case c;
        c.dtype = dtype;
        c.largest = seed % 2 == 0;
        c.dist = static_cast<Dist>(d);
        c.batch = 4;
        c.n = 5000;
        c.k = k;
        c.order = attnkit::TopkOrder::kValue;
        c.seed = seed++;
        check_case(c);
      }
    }
  }
}

// Short 16-bit rows list their candidates from the first digit's pivot up (topk_short.cuh)
// and resolve that digit in the list; rows whose pivot digit holds more candidates than the
// list (ties, all-equal, most NaN) and k beyond 2048 without sorted="value" resolve in the
// registers instead. Every distribution, both directions, ragged rows, unaligned starts, the
// orders that keep column order, k on both sides of the list's 2048.
TEST_F(TopkCuda, ShortRowsCandidateList) {
  std::uint64_t seed = 7000;
  for (int d = 0; d < kDists; ++d) {
    for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
      for (std::int64_t k : {7, 700, 2048, 3000}) {
        Case c;
        c.dtype = dtype;
        c.largest = seed % 2 == 0;
        c.nan = seed % 3 == 0 ? attnkit::NanPolicy::kIgnore : attnkit::NanPolicy::kLargest;
        c.dist = static_cast<Dist>(d);
        c.batch = 3;
        c.n = 8192 - static_cast<std::int64_t>(seed % 3);
        c.k = k;
        c.order = seed % 4 == 1 ? attnkit::TopkOrder::kIndex : attnkit::TopkOrder::kNone;
        c.ragged = seed % 5 == 2;
        c.misalign = c.dist == Dist::kSampleBait ? 0 : static_cast<std::int64_t>(seed % 2);
        c.seed = seed++;
        check_case(c);
      }
    }
  }
}

// Causal rows of the short-row kernel, ending anywhere from the first column to the last: the
// threads, and whole warps, past a row's end hold no column and skip the per-element loops, so
// each row's result rests on the threads before it. Both CTA shapes (fp32 rows of more than 4096
// columns take 512 threads), both 16-bit paths (k=7 and 700 resolve in the candidate list,
// k=3000 in the registers), the distributions in turn.
TEST_F(TopkCuda, SmallShortRowsCausal) {
  std::uint64_t seed = 7300;
  for (DType dtype : {DType::kBFloat16, DType::kFloat32, DType::kFloat16}) {
    for (std::int64_t k : {7, 700, 3000}) {
      Case c;
      c.dtype = dtype;
      c.batch = 67;
      c.n = 8192 - static_cast<std::int64_t>(seed % 2);
      c.k = k;
      c.causal = true;
      c.dist = static_cast<Dist>(seed % kDists);
      c.largest = seed % 3 != 1;
      c.order = seed % 4 == 1 ? attnkit::TopkOrder::kIndex : attnkit::TopkOrder::kNone;
      c.misalign = c.dist == Dist::kSampleBait ? 0 : static_cast<std::int64_t>(seed % 2);
      c.seed = seed++;
      check_case(c);
    }
  }
}

// fp32 rows of 4097-8192 columns take the short-row kernel's CTAs of 512 threads x 16 columns
// unless sorted="value" (topk_launch.cuh, kShortWideThreads): every distribution, both
// directions and NaN modes, ragged rows, unaligned starts, k from 7 to 4096, both unordered
// and column order, and sorted="value" on the same rows (the 256-thread CTAs).
TEST_F(TopkCuda, SmallShortRowsWideFp32) {
  std::uint64_t seed = 7500;
  const attnkit::TopkOrder orders[] = {attnkit::TopkOrder::kNone, attnkit::TopkOrder::kIndex,
                                       attnkit::TopkOrder::kNone, attnkit::TopkOrder::kValue};
  for (int d = 0; d < kDists; ++d) {
    for (std::int64_t k : {7, 700, 2048, 4096}) {
      Case c;
      c.dtype = DType::kFloat32;
      // Four cases a distribution, one per k: the other axes turn at other periods, so that
      // each k meets each order (and each direction) over the distributions.
      c.largest = (seed / 3) % 2 == 0;
      c.nan = seed % 3 == 0 ? attnkit::NanPolicy::kIgnore : attnkit::NanPolicy::kLargest;
      c.dist = static_cast<Dist>(d);
      c.batch = 3;
      c.n = seed % 3 == 0 ? 4097 : 8192 - static_cast<std::int64_t>(seed % 5);
      c.k = k;
      c.order = orders[(seed + seed / 4) % 4];
      c.ragged = seed % 5 == 2;
      c.values = seed % 7 != 3;
      c.int32_indices = (seed / 5) % 2 == 1;
      c.misalign = c.dist == Dist::kSampleBait ? 0 : static_cast<std::int64_t>((seed / 7) % 2);
      c.seed = seed++;
      check_case(c);
    }
  }
}

// Rows longer than one CTA's registers (8192): clusters of 4 CTAs (20000 columns) on sm_90,
// and the filter kernel's rounds, appends and repeated selects (270000 columns, beyond every
// cluster), on every distribution.
TEST_F(TopkCuda, SmallDistributionsLongRows) {
  std::uint64_t seed = 4000;
  for (int d = 0; d < kDists; ++d) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      for (std::int64_t k : {5, 300, 2048}) {
        Case c;
        c.dtype = dtype;
        c.largest = seed % 2 == 0;
        c.nan = seed % 3 == 0 ? attnkit::NanPolicy::kIgnore : attnkit::NanPolicy::kLargest;
        c.dist = static_cast<Dist>(d);
        c.batch = 3;
        // A third of the cases.
        const bool filter = (seed + static_cast<std::uint64_t>(d)) % 3 == 0;
        c.n = filter ? 270000 : 20000 + static_cast<std::int64_t>(seed % 5);
        c.k = k;
        c.order = k == 300 ? attnkit::TopkOrder::kValue : attnkit::TopkOrder::kNone;
        c.misalign = c.dist == Dist::kSampleBait ? 0 : static_cast<std::int64_t>(seed % 3);
        c.seed = seed++;
        check_case(c);
      }
    }
  }
}

// Few long rows (beyond every cluster) are cut into slices that each start from a floor
// sampled from the whole row for the row's k, so that the merge reads a few k candidates. The
// bait puts the row's best values at exactly those sampled vectors: the slices then hold fewer
// than k candidates together, and the merge must stream the whole row again from the bottom
// (each row's best k are far below the planted values). Ragged rows give each slice a share
// of a different length, and some rows none.
TEST_F(TopkCuda, FilterSlicesShareTheRowsFloor) {
  std::uint64_t seed = 5200;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (std::int64_t k : {600, 3000}) {
      Case c;
      c.dtype = dtype;
      c.dist = Dist::kSliceBait;
      c.batch = 2;
      c.n = 300000;
      c.k = k;
      c.order = k == 600 ? attnkit::TopkOrder::kValue : attnkit::TopkOrder::kIndex;
      c.seed = seed++;
      check_case(c);
      for (Dist dist : {Dist::kNormal, Dist::kDsa, Dist::kAscending}) {
        c.dist = dist;
        c.batch = 5;
        c.ragged = dist != Dist::kAscending;
        c.largest = dist != Dist::kDsa;
        c.nan = dist == Dist::kDsa ? attnkit::NanPolicy::kIgnore : attnkit::NanPolicy::kLargest;
        c.order = attnkit::TopkOrder::kNone;
        c.misalign = static_cast<std::int64_t>(seed % 3);
        c.seed = seed++;
        check_case(c);
      }
    }
  }
}

// Rows of 36000 columns, more rows than SMs: one filter CTA a row (rounds of four vectors, or
// of two for 16-bit k = 2048), each starting from a floor sampled from its row (at least 2048
// aligned vectors), on every distribution. The bait puts the row's best values at the sampled
// vectors, so that fewer than k elements reach the floor and every row is scanned again from
// the bottom (k = 600, 700 or 2048, above the floor's rank of 42-175 samples); descending rows
// put the best at the start. Each case but the bait runs again with ragged rows in the other
// direction; those take the ragged-row policy (three CTAs an SM) where its buffers fit with the
// full slack (every k here but 16-bit 2048).
TEST_F(TopkCuda, FilterSampledFloorDistributions) {
  std::uint64_t seed = 4600;
  int index = 0;
  const DType dtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
  for (int d = 0; d < kDists; ++d) {
    for (std::int64_t k0 : {7, 700, 2048}) {
      const bool bait = d == static_cast<int>(Dist::kSampleBait);
      // A rescan needs k above the floor's rank, and 16 of the best k expected in a sample of
      // one vector a thread (so that the sample is the one the bait was planted at).
      const std::int64_t k = bait && k0 == 7 ? 600 : k0;
      Case c;
      c.dtype = dtypes[(seed + static_cast<std::uint64_t>(d)) % 3];
      c.largest = index++ % 2 == 0 || bait;
      c.nan = seed % 3 == 0 ? attnkit::NanPolicy::kIgnore : attnkit::NanPolicy::kLargest;
      c.dist = static_cast<Dist>(d);
      c.batch = rows_past_sms();
      c.n = 36000;
      c.k = k;
      c.order = k0 == 700 ? attnkit::TopkOrder::kValue : attnkit::TopkOrder::kNone;
      c.seed = seed++;
      check_case(c);
      if (bait) continue;  // the bait is planted at full rows' sampled vectors
      c.ragged = true;
      c.largest = !c.largest;
      c.seed = seed++;
      check_case(c);
    }
  }
}

// More rows than SMs whose narrow-policy lists fit only with room for the slack and one round
// (16-bit k > 1024 on rows of at least 256 KB, fp32 k = 4096; buffer_plan): before the first
// select the newcomers join the survivors, or are selected with them once there are more than
// k, each time they fill that room. Ascending rows admit every element, ties cross the joins,
// and the bait (the best values at the sampled vectors) sends rows to the rescan. Split by
// width so that the sanitizers can take the shorter fp32 rows alone.
void check_small_room_rows(DType dtype, std::int64_t n, std::int64_t k, std::uint64_t seed) {
  for (Dist d :
       {Dist::kNormal, Dist::kAscending, Dist::kDescending, Dist::kTies, Dist::kSampleBait}) {
    Case c;
    c.dtype = dtype;
    c.batch = rows_past_sms();
    c.n = n;
    c.k = k;
    c.dist = d;
    c.order = d == Dist::kTies ? attnkit::TopkOrder::kValue : attnkit::TopkOrder::kNone;
    c.values = seed % 2 == 0;
    c.seed = seed++;
    check_case(c);
  }
}

TEST_F(TopkCuda, FilterSmallRoom16Bit) {
  check_small_room_rows(DType::kBFloat16, 131072, 2048, 4700);
  check_small_room_rows(DType::kFloat16, 131072, 1500, 4710);
}

TEST_F(TopkCuda, FilterSmallRoomFp32) { check_small_room_rows(DType::kFloat32, 65536, 4096, 4720); }

// More ragged rows than SMs, each longer than the short-row kernel's limit: the ragged-row
// policy (three filter CTAs an SM), small enough for racecheck. Every distribution, the three
// dtypes, k = 7, 300 and 1024 (near the largest the policy takes: 1024 for 16-bit types, 1152
// for fp32), both directions and NaN policies; the fp32 rows are long enough to start from a
// sampled floor.
TEST_F(TopkCuda, SmallDistributionsRaggedBatch) {
  std::uint64_t seed = 4800;
  const DType dtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
  const std::int64_t ks[] = {7, 300, 1024};
  for (int d = 0; d < kDists; ++d) {
    Case c;
    c.dtype = dtypes[d % 3];
    c.largest = d % 2 == 0;
    c.nan = d % 4 == 1 ? attnkit::NanPolicy::kIgnore : attnkit::NanPolicy::kLargest;
    c.dist = static_cast<Dist>(d);
    c.batch = rows_past_sms();
    c.n = 10000;
    c.k = ks[(d / 3) % 3];
    c.order = d % 2 == 1 ? attnkit::TopkOrder::kValue : attnkit::TopkOrder::kNone;
    c.ragged = true;
    c.misalign = d % 3;
    c.seed = seed++;
    check_case(c);
  }
}

// k = 1 takes the argmax kernel; rows this long are cut into slices whose bests a second
// kernel reduces, so ties across slices, all-NaN rows and empty slices all cross that merge.
TEST_F(TopkCuda, SmallArgmaxSlices) {
  const DType dtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
  for (int d = 0; d < kDists; ++d) {
    for (int variant = 0; variant < 2; ++variant) {
      Case c;
      c.dtype = dtypes[(d + variant) % 3];
      c.dist = static_cast<Dist>(d);
      c.batch = 2 + variant;
      c.n = 40000 + 7 * d;
      c.k = 1;
      c.largest = (d + variant) % 2 == 0;
      c.nan = variant == 1 ? attnkit::NanPolicy::kIgnore : attnkit::NanPolicy::kLargest;
      c.ragged = variant == 1;
      c.offset = d % 2 == 1;
      c.int32_indices = d % 3 == 0;
      c.misalign = d % 4;
      c.pad = d;
      c.seed = 3000 + static_cast<std::uint64_t>(2 * d + variant);
      check_case(c);
    }
  }
}

TEST_F(TopkCuda, SmallKBeyondRowsAndEmpty) {
  for (std::int64_t n : {0, 1, 3, 17}) {
    for (std::int64_t k : {1, 5, 20, 5000}) {
      Case c;
      c.n = n;
      c.k = k;
      c.batch = 3;
      c.ragged = n > 0;
      c.ends_past_n = n > 0;
      c.seed = static_cast<std::uint64_t>(n * 1000 + k);
      check_case(c);
    }
  }
}

TEST_F(TopkCuda, SmallGraphCaptureReplays) {
  Case c;
  c.batch = 3;
  c.n = 70000;
  c.k = 512;
  c.dtype = DType::kBFloat16;
  check_case(c, /*graph=*/true);
  c.batch = 2000;
  c.n = 3000;
  c.k = 100;
  c.order = attnkit::TopkOrder::kValue;
  check_case(c, /*graph=*/true);
  // Sliced rows: the merge kernels launch as programmatic dependents of the slice kernels on
  // sm_90, which capture turns into a programmatic edge of the graph.
  c.order = attnkit::TopkOrder::kNone;
  c.batch = 1;
  c.n = 300000;
  c.k = 512;
  check_case(c, /*graph=*/true);
  c.dtype = DType::kFloat32;
  c.n = 129280;
  c.k = 1;
  check_case(c, /*graph=*/true);
}

TEST_F(TopkCuda, DsaShapes) {
  // DSA indexer: bf16, k in {512, 1024, 2048}, decode and prefill batches, causal ends.
  std::uint64_t seed = 900;
  for (std::int64_t k : {512, 1024, 2048}) {
    for (auto [b, n] : {std::pair<std::int64_t, std::int64_t>{1, 131072}, {8, 262144}, {300, 65536},
                        {1024, 8192}}) {
      Case c;
      c.dtype = DType::kBFloat16;
      c.dist = Dist::kDsa;
      c.batch = b;
      c.n = n;
      c.k = k;
      c.int32_indices = true;
      c.values = seed % 2 == 0;
      c.seed = seed++;
      check_case(c);
      c.ragged = true;  // causal prefill / ragged decode
      c.seed = seed++;
      check_case(c);
    }
  }
}

// LLM sampling over a vocabulary of 129280 fp32 logits, including k = 2 and 20, whose k-th
// best lies above the sampled best on many rows (the cluster kernel's widest first pass).
TEST_F(TopkCuda, SamplingShapes) {
  std::uint64_t seed = 1300;
  for (std::int64_t k : {1, 2, 20, 50, 1024, 4096}) {
    for (std::int64_t b : {1, 7, 256}) {
      Case c;
      c.dtype = DType::kFloat32;
      c.batch = b;
      c.n = 129280;
      c.k = k;
      c.order = attnkit::TopkOrder::kValue;
      c.seed = seed++;
      check_case(c);
    }
  }
}

TEST_F(TopkCuda, AdversarialOrderAndTies) {
  std::uint64_t seed = 1700;
  for (Dist d :
       {Dist::kAscending, Dist::kDescending, Dist::kTies, Dist::kAllEqual, Dist::kRawBits}) {
    for (std::int64_t k : {7, 2048, 4096}) {
      Case c;
      c.dtype = DType::kBFloat16;
      c.dist = d;
      c.batch = 3;
      c.n = 300000;
      c.k = k;
      c.seed = seed++;
      check_case(c);
    }
  }
}

// sorted="value" orders each row's kept elements in the kernel that selected them (a radix sort
// of the keys' range in one CTA): kept counts that fill no whole warp or tile, keys spanning
// every bit of an fp32 score (four passes), a few distinct keys (ties ordered by column) and one
// key (no pass at all), on every in-block path. Short rows and one cluster here, which the GPU
// check also runs under racecheck; the filter's rows, slower there, below.
struct SortedShape {
  std::int64_t batch, n, k;
};

void check_sorted_value(const SortedShape& shape, std::uint64_t& seed) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (Dist d : {Dist::kRawBits, Dist::kTies, Dist::kAllEqual, Dist::kNormal}) {
      Case c;
      c.dtype = dtype;
      c.dist = d;
      c.batch = shape.batch;
      c.n = shape.n;
      c.k = shape.k;
      c.largest = seed % 2 == 0;
      c.order = attnkit::TopkOrder::kValue;
      c.seed = seed++;
      check_case(c);
    }
  }
}

// Rows whose scores span 0 to 23 bits (kBands), so that the filter's selects, which count
// 8-bit digits of (score - least score) from the range's top bit down and stop at a digit kept
// whole, run every number of passes and digits narrower than 8 bits: one CTA a row (each row
// from a sampled floor) and sliced rows with their merge, both directions.
TEST_F(TopkCuda, FilterSelectDigitWidths) {
  std::uint64_t seed = 9300;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (std::int64_t k : {7, 700, 2048}) {
      Case c;
      c.dtype = dtype;
      c.dist = Dist::kBands;
      c.largest = k != 700;
      c.batch = rows_past_sms();
      c.n = 36000;
      c.k = k;
      c.seed = seed++;
      check_case(c);
      c.batch = 9;  // every width once
      c.n = 270000;
      c.largest = !c.largest;
      c.order = attnkit::TopkOrder::kValue;
      c.seed = seed++;
      check_case(c);
    }
  }
}

TEST_F(TopkCuda, SmallSortedValueEveryPath) {
  std::uint64_t seed = 9100;
  for (const SortedShape& shape : {SortedShape{3, 8192, 4096},     // short rows, the most keys
                                   SortedShape{2, 301, 299},       // short rows, no whole tile
                                   SortedShape{1, 131072, 4096}}) {  // one cluster
    check_sorted_value(shape, seed);
  }
}

// The filter kernels sort from one survivor list into the other and count in the newcomer list:
// one CTA a row, and a sliced row's merge.
TEST_F(TopkCuda, SortedValueFilterRows) {
  std::uint64_t seed = 9200;
  for (const SortedShape& shape : {SortedShape{rows_past_sms(), 20000, 1000},
                                   SortedShape{1, std::int64_t{1} << 21, 2048}}) {
    check_sorted_value(shape, seed);
  }
}

TEST_F(TopkCuda, LargeKMultiPass) {
  std::uint64_t seed = 2100;
  for (attnkit::TopkOrder order : {attnkit::TopkOrder::kNone, attnkit::TopkOrder::kValue}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      Case c;
      c.dtype = dtype;
      c.batch = 3;
      c.n = 50000;
      c.k = 5000;
      c.order = order;
      c.ragged = true;
      c.seed = seed++;
      check_case(c);
      c.k = c.n;  // k = N
      c.seed = seed++;
      check_case(c);
    }
  }
}

/// Each kernel is opted into shared memory once a device, to the most asked so far: calls
/// on the same kernels whose buffers grow, then shrink, then grow again, each against the CPU.
TEST_F(TopkCuda, SharedMemoryGrowsAcrossCalls) {
  std::uint64_t seed = 2400;
  for (std::int64_t k : {8, 4096, 64, 2048, 4096}) {
    for (std::int64_t batch : {256, 2}) {  // one CTA a row, and sliced rows with their merge
      Case c;
      c.dtype = DType::kFloat32;
      c.batch = batch;
      c.n = 65536;
      c.k = k;
      c.seed = seed++;
      check_case(c);
    }
  }
}

TEST_F(TopkCuda, LongRow) {
  Case c;
  c.dtype = DType::kBFloat16;
  c.batch = 1;
  c.n = std::int64_t{1} << 24;
  c.k = 2048;
  c.seed = 2500;
  check_case(c);
}

TEST_F(TopkCuda, ManyShortRows) {
  Case c;
  c.dtype = DType::kFloat32;
  c.batch = 8192;
  c.n = 1000;
  c.k = 7;
  c.ragged = true;
  c.seed = 2600;
  check_case(c);
}

TEST_F(TopkCuda, SmallDeterministic) {
  Case c;
  c.dtype = DType::kBFloat16;
  c.dist = Dist::kTies;
  c.batch = 5;
  c.n = 200000;
  c.k = 1000;
  const auto rows = make_rows(c.dtype, c.batch, c.n, c.n, c.dist, 77);
  const Result a = run_case(c, rows, {}, {}, {}, kGpu, attnkit::TopkBackend::kAuto);
  const Result b = run_case(c, rows, {}, {}, {}, kGpu, attnkit::TopkBackend::kAuto);
  EXPECT_EQ(a.indices, b.indices);
  EXPECT_TRUE(a.values == b.values);
}

/// Runs topk, which must raise kNanFound naming `where` (e.g. "x[1, 500]") as the first NaN.
void expect_nan_error(const attnkit::TopkTensors& t, const attnkit::TopkOptions& o,
                      const std::string& where) {
  try {
    attnkit::topk(t, o);
    ADD_FAILURE() << "expected a NaN error at " << where;
  } catch (const attnkit::Error& e) {
    EXPECT_EQ(e.code(), attnkit::ErrorCode::kNanFound);
    EXPECT_NE(std::string(e.what()).find(where + " is NaN"), std::string::npos) << e.what();
  }
}

TEST_F(TopkCuda, SmallNanRaise) {
  std::vector<float> x(2 * 1000, 1.0f);
  x[1500] = NAN;
  x[1900] = NAN;  // later in the same row: the error names the first
  float* dx = device_copy(x);
  std::int64_t* di = nullptr;
  cudaMalloc(&di, 2 * 5 * sizeof(std::int64_t));
  attnkit::TopkTensors t;
  t.x = TensorView::make(dx, DType::kFloat32, kGpu, {2, 1000});
  t.out_indices = TensorView::make(di, DType::kInt64, kGpu, {2, 5});
  attnkit::TopkOptions o;
  o.k = 5;
  o.nan = attnkit::NanPolicy::kRaise;
  expect_nan_error(t, o, "x[1, 500]");
  // The NaNs lie outside row 1's range [0, 400): no error.
  std::vector<std::int32_t> end = {1000, 400};
  std::int32_t* de = device_copy(end);
  t.end = TensorView::make(de, DType::kInt32, kGpu, {2});
  x[1500] = 1.0f;
  x[1401] = NAN;  // row 1, column 401
  cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
  EXPECT_NO_THROW(attnkit::topk(t, o));
  // k = 0 selects nothing but still scans the valid ranges, as the CPU backend does.
  o.k = 0;
  t.out_indices = TensorView::make(di, DType::kInt64, kGpu, {2, 0});
  EXPECT_NO_THROW(attnkit::topk(t, o));  // the NaN lies outside row 1's range
  t.end.reset();
  expect_nan_error(t, o, "x[1, 401]");
  x[17] = NAN;  // row 0 comes first, whatever the columns
  cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
  expect_nan_error(t, o, "x[0, 17]");
  o.k = 5;
  t.out_indices = TensorView::make(di, DType::kInt64, kGpu, {2, 5});
  expect_nan_error(t, o, "x[0, 17]");
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the context is healthy
  cudaFree(dx);
  cudaFree(di);
  cudaFree(de);
}

TEST_F(TopkCuda, SmallNanRaiseLargeK) {
  // k > 4096 (the multi-pass radix kernel): a NaN inside the range raises, one outside not.
  constexpr std::int64_t kCols = 6000, kTake = 5000;
  std::vector<float> x(2 * kCols);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 997);
  x[kCols + 5999] = NAN;  // row 1, last column
  float* dx = device_copy(x);
  std::int32_t* di = nullptr;
  cudaMalloc(&di, 2 * kTake * sizeof(std::int32_t));
  attnkit::TopkTensors t;
  t.x = TensorView::make(dx, DType::kFloat32, kGpu, {2, kCols});
  t.out_indices = TensorView::make(di, DType::kInt32, kGpu, {2, kTake});
  attnkit::TopkOptions o;
  o.k = kTake;
  o.nan = attnkit::NanPolicy::kRaise;
  for (auto order : {attnkit::TopkOrder::kNone, attnkit::TopkOrder::kValue}) {
    o.sorted = order;
    expect_nan_error(t, o, "x[1, 5999]");
  }
  std::vector<std::int32_t> end = {kCols, kCols - 1};  // row 1 ends before its NaN
  std::int32_t* de = device_copy(end);
  t.end = TensorView::make(de, DType::kInt32, kGpu, {2});
  EXPECT_NO_THROW(attnkit::topk(t, o));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(dx);
  cudaFree(di);
  cudaFree(de);
}

TEST_F(TopkCuda, SmallNanRaiseArgmax) {
  // k = 1 (the argmax kernel), one row long enough to be cut into slices.
  std::vector<float> x(100000, 1.0f);
  x[77777] = NAN;
  float* dx = device_copy(x);
  std::int32_t* di = nullptr;
  cudaMalloc(&di, sizeof(std::int32_t));
  attnkit::TopkTensors t;
  t.x = TensorView::make(dx, DType::kFloat32, kGpu, {1, 100000});
  t.out_indices = TensorView::make(di, DType::kInt32, kGpu, {1, 1});
  attnkit::TopkOptions o;
  o.k = 1;
  o.nan = attnkit::NanPolicy::kRaise;
  expect_nan_error(t, o, "x[0, 77777]");
  x[77777] = 2.0f;
  cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
  EXPECT_NO_THROW(attnkit::topk(t, o));
  std::int32_t got = -1;
  cudaMemcpy(&got, di, sizeof got, cudaMemcpyDeviceToHost);
  EXPECT_EQ(got, 77777);
  cudaFree(dx);
  cudaFree(di);
}

TEST_F(TopkCuda, SmallCheckOnRejectsBadEnd) {
  std::vector<float> x(2 * 100, 1.0f);
  float* dx = device_copy(x);
  std::vector<std::int64_t> sentinel(2 * 5, -77);
  std::int64_t* di = device_copy(sentinel);
  std::vector<std::int32_t> end = {100, 101};
  std::int32_t* de = device_copy(end);
  attnkit::TopkTensors t;
  t.x = TensorView::make(dx, DType::kFloat32, kGpu, {2, 100});
  t.out_indices = TensorView::make(di, DType::kInt64, kGpu, {2, 5});
  t.end = TensorView::make(de, DType::kInt32, kGpu, {2});
  attnkit::TopkOptions o;
  o.k = 5;
  o.check = attnkit::CheckMode::kOn;
  try {
    attnkit::topk(t, o);
    ADD_FAILURE() << "expected an error for end[1] = 101 > N";
  } catch (const attnkit::Error& e) {
    EXPECT_EQ(e.code(), attnkit::ErrorCode::kValue);
    EXPECT_NE(std::string(e.what()).find("end[1] = 101"), std::string::npos) << e.what();
  }
  std::vector<std::int64_t> after(2 * 5);
  cudaMemcpy(after.data(), di, after.size() * 8, cudaMemcpyDeviceToHost);
  EXPECT_EQ(after, sentinel);  // nothing written
  cudaFree(dx);
  cudaFree(di);
  cudaFree(de);
}

// Row vectors broadcast with stride 0 (a torch expand of one element) hold one element: the
// host check must read that element for every row, not B elements of a one-element buffer.
TEST_F(TopkCuda, SmallCheckOnBroadcastRowVectors) {
  constexpr std::int64_t kB = 3, kN = 100, kK = 8;
  std::vector<float> x(kB * kN);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 101) - 50.0f;
  float* dx = device_copy(x);
  const std::vector<std::int32_t> bad_end = {kN + 1}, end = {40};
  const std::vector<std::int64_t> begin = {5}, offset = {1000};
  std::int32_t* d_bad_end = device_copy(bad_end);
  std::int32_t* d_end = device_copy(end);
  std::int64_t* d_begin = device_copy(begin);
  std::int64_t* d_offset = device_copy(offset);
  std::vector<std::int64_t> sentinel(kB * kK, -77);
  std::int64_t* di = device_copy(sentinel);
  attnkit::TopkOptions o;
  o.k = kK;
  o.check = attnkit::CheckMode::kOn;

  attnkit::TopkTensors t;
  t.x = TensorView::make(dx, DType::kFloat32, kGpu, {kB, kN});
  t.out_indices = TensorView::make(di, DType::kInt64, kGpu, {kB, kK});
  t.end = TensorView::make(d_bad_end, DType::kInt32, kGpu, {kB}, {0});
  try {
    attnkit::topk(t, o);
    ADD_FAILURE() << "expected an error for end[0] = " << kN + 1 << " > N";
  } catch (const attnkit::Error& e) {
    EXPECT_EQ(e.code(), attnkit::ErrorCode::kValue);
    EXPECT_NE(std::string(e.what()).find("end[0] = 101"), std::string::npos) << e.what();
  }
  std::vector<std::int64_t> got(kB * kK);
  cudaMemcpy(got.data(), di, got.size() * 8, cudaMemcpyDeviceToHost);
  EXPECT_EQ(got, sentinel);  // nothing written

  // Valid broadcast vectors: the same indices as the CPU's, whose views read the same strides.
  t.end = TensorView::make(d_end, DType::kInt32, kGpu, {kB}, {0});
  t.begin = TensorView::make(d_begin, DType::kInt64, kGpu, {kB}, {0});
  t.index_offset = TensorView::make(d_offset, DType::kInt64, kGpu, {kB}, {0});
  attnkit::topk(t, o);
  cudaMemcpy(got.data(), di, got.size() * 8, cudaMemcpyDeviceToHost);
  std::vector<std::int64_t> want(kB * kK, -77);
  std::vector<std::int32_t> host_end = end;
  std::vector<std::int64_t> host_begin = begin, host_offset = offset;
  attnkit::TopkTensors c;
  c.x = TensorView::make(x.data(), DType::kFloat32, kCpu, {kB, kN});
  c.out_indices = TensorView::make(want.data(), DType::kInt64, kCpu, {kB, kK});
  c.end = TensorView::make(host_end.data(), DType::kInt32, kCpu, {kB}, {0});
  c.begin = TensorView::make(host_begin.data(), DType::kInt64, kCpu, {kB}, {0});
  c.index_offset = TensorView::make(host_offset.data(), DType::kInt64, kCpu, {kB}, {0});
  attnkit::topk(c, o);
  EXPECT_EQ(got, want);
  for (std::int64_t v : want) {  // every row's best of columns [5, 40), offset by 1000
    EXPECT_GE(v, 1005);
    EXPECT_LT(v, 1040);
  }
  for (void* ptr : {static_cast<void*>(dx), static_cast<void*>(d_bad_end),
                    static_cast<void*>(d_end), static_cast<void*>(d_begin),
                    static_cast<void*>(d_offset), static_cast<void*>(di)}) {
    cudaFree(ptr);
  }
}

TEST_F(TopkCuda, SmallMixedDevicesRejected) {
  std::vector<float> x(100, 1.0f);
  float* dx = device_copy(x);
  std::vector<std::int64_t> host_idx(5);
  attnkit::TopkTensors t;
  t.x = TensorView::make(dx, DType::kFloat32, kGpu, {100});
  t.out_indices = TensorView::make(host_idx.data(), DType::kInt64, kCpu, {5});
  attnkit::TopkOptions o;
  o.k = 5;
  try {
    attnkit::topk(t, o);
    ADD_FAILURE() << "expected a device error";
  } catch (const attnkit::Error& e) {
    EXPECT_EQ(e.code(), attnkit::ErrorCode::kDevice);
  }
  cudaFree(dx);
}

}  // namespace
