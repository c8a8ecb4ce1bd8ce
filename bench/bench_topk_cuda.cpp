// SPDX-License-Identifier: Apache-2.0
// C++ timing of attnkit::topk on CUDA with no Python in the loop, for quick kernel iterations
// and for profilers (ncu/nsys see only the top-k kernels and an L2-flushing memset).
//
// Usage: attnkit_bench_cuda [--reps R] [--values 0|1] [--flush clean|write] [--seed S]
//                           [--sorted none|index|value] [--warm-code 0|1]
//                           [--dist normal|uniform|lognormal] [CASE ...]
//   CASE = dtype:B:N:k[:causal|:last|:end]   dtype in {bf16, f16, f32}; causal makes end[b]
//          rise to N as ceil(N (b + 1) / B); last as N - B + 1 + b, the last B queries of an
//          N-key context (bench/bench_topk.py's dsa-causal rows); end passes end[b] = N
//          (uniform rows through the ragged-row dispatch)
// Without cases it runs the DSA and sampling shapes of bench/bench_topk.py.
// Method: after L2 flushes that bring the GPU's clocks up, one call captured in a CUDA graph,
// replayed R times, each replay timed with events after L2 is flushed; the median is printed with
// the effective bandwidth (valid input bytes read once + output bytes) / time. Inputs are N(0,1)
// rows (--dist: U[0,1), as torch.rand, or exp of N(0,1), a heavy upper tail like softmax
// probabilities) drawn from a generator seeded with S (default 42): the cluster kernel's pass
// count depends on the data, so a single row's time is worth comparing across several seeds and
// distributions. The flush writes a 256 MiB buffer and, by default ("clean"), reads it back (an
// argmax over it), so that L2 holds only clean lines of a buffer the call never touches. "write"
// skips the read, as triton's do_bench does: L2 is then full of dirty lines, which the timed call
// has to write back to memory as its reads evict them (up to the L2's size of extra traffic).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "attnkit/attnkit.hpp"
#include "common/float_bits.hpp"

namespace {

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

/// A case's row ends, and its name in the CASE syntax and the output's causal column.
enum class Rows {
  kFull,    // no `end`
  kEnd,     // end[b] = N, passed (uniform rows through the ragged-row dispatch)
  kCausal,  // end[b] = ceil(N (b + 1) / B)
  kLast,    // end[b] = N - B + 1 + b: the last B queries of an N-key context
};

struct Case {
  attnkit::DType dtype;
  std::int64_t batch, n, k;
  Rows rows = Rows::kFull;
};

bool parse_case(const std::string& s, Case& c) {
  char dt[8] = {};
  long long b = 0, n = 0, k = 0;
  char tail[16] = {};
  const int got = std::sscanf(s.c_str(), "%7[^:]:%lld:%lld:%lld:%15s", dt, &b, &n, &k, tail);
  if (got < 4) return false;
  const std::string d = dt;
  if (d == "bf16") c.dtype = attnkit::DType::kBFloat16;
  else if (d == "f16") c.dtype = attnkit::DType::kFloat16;
  else if (d == "f32") c.dtype = attnkit::DType::kFloat32;
  else return false;
  c.batch = b, c.n = n, c.k = k;
  c.rows = Rows::kFull;
  if (got == 5) {
    const std::string t = tail;
    if (t == "causal") c.rows = Rows::kCausal;
    else if (t == "last") c.rows = Rows::kLast;
    else if (t == "end") c.rows = Rows::kEnd;
    else return false;
  }
  return b > 0 && n > 0 && k >= 0;
}

std::vector<Case> default_cases() {
  using attnkit::DType;
  std::vector<Case> out;
  for (std::int64_t k : {512, 2048}) {
    for (auto [b, n] : {std::pair<std::int64_t, std::int64_t>{1, 131072}, {8, 131072}, {1, 1048576},
                        {256, 65536}, {256, 131072}, {256, 1048576}, {4096, 8192}}) {
      out.push_back({DType::kBFloat16, b, n, k});
    }
    // bench_topk.py's dsa-causal rows: the last 4096 queries of an 8192-key context.
    out.push_back({DType::kBFloat16, 4096, 8192, k, Rows::kLast});
  }
  for (std::int64_t k : {1, 50, 1024, 4096}) {
    for (std::int64_t b : {1, 256}) {
      out.push_back({DType::kFloat32, b, 129280, k});
    }
  }
  return out;
}

const char* short_name(attnkit::DType d) {
  return d == attnkit::DType::kBFloat16 ? "bf16" : d == attnkit::DType::kFloat16 ? "f16" : "f32";
}

/// The rows' values (--dist).
enum class RowDist { kNormal, kUniform, kLognormal };

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  bool values = true;
  bool clean_flush = true;
  bool warm_code = false;
  attnkit::TopkOrder order = attnkit::TopkOrder::kNone;
  std::uint64_t seed = 42;
  RowDist dist = RowDist::kNormal;
  std::vector<Case> list;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: attnkit_bench_cuda [--reps R] [--values 0|1] [--flush clean|write] [--seed S] "
          "[--sorted none|index|value] [--warm-code 0|1] [--dist normal|uniform|lognormal] "
          "[CASE ...]\n  CASE = dtype:B:N:k[:causal|:last|:end], dtype in {bf16, f16, f32}\n"
          "  Times attnkit::topk on GPU 0 (a CUDA-graph replay per repeat, L2 flushed); without\n"
          "  cases it runs the shapes of bench/bench_topk.py.\n");
      return 0;
    }
    if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--values" && i + 1 < argc) {
      values = std::atoi(argv[++i]) != 0;
    } else if (a == "--flush" && i + 1 < argc) {
      const std::string mode = argv[++i];
      if (mode != "clean" && mode != "write") {
        std::fprintf(stderr, "bad --flush '%s' (want clean or write)\n", mode.c_str());
        return 2;
      }
      clean_flush = mode == "clean";
    } else if (a == "--sorted" && i + 1 < argc) {
      const std::string mode = argv[++i];
      if (mode == "none") order = attnkit::TopkOrder::kNone;
      else if (mode == "index") order = attnkit::TopkOrder::kIndex;
      else if (mode == "value") order = attnkit::TopkOrder::kValue;
      else {
        std::fprintf(stderr, "bad --sorted '%s' (want none, index or value)\n", mode.c_str());
        return 2;
      }
    } else if (a == "--warm-code" && i + 1 < argc) {
      warm_code = std::atoi(argv[++i]) != 0;
    } else if (a == "--dist" && i + 1 < argc) {
      const std::string name = argv[++i];
      if (name == "normal") dist = RowDist::kNormal;
      else if (name == "uniform") dist = RowDist::kUniform;
      else if (name == "lognormal") dist = RowDist::kLognormal;
      else {
        std::fprintf(stderr, "bad --dist '%s' (want normal, uniform or lognormal)\n", name.c_str());
        return 2;
      }
    } else if (a == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else {
      Case c{};
      if (!parse_case(a, c)) {
        std::fprintf(stderr, "bad case '%s' (want dtype:B:N:k[:causal|:last|:end])\n", a.c_str());
        return 2;
      }
      list.push_back(c);
    }
  }
  if (list.empty()) list = default_cases();
  int devices = 0;
  const cudaError_t found = cudaGetDeviceCount(&devices);
  if (found != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "attnkit_bench_cuda: no CUDA device is visible (%s); it times the GPU "
                         "backend only\n",
                 found != cudaSuccess ? cudaGetErrorString(found) : "0 devices");
    return 1;
  }

  const std::size_t flush_bytes = std::size_t{256} << 20;
  void* flush = nullptr;
  cuda_ok(cudaMalloc(&flush, flush_bytes), "cudaMalloc(flush)");
  cudaStream_t stream;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  const attnkit::Device gpu{attnkit::DeviceType::kCUDA, 0};

  // The clean flush's read: an argmax over the buffer seen as fp32 [64, flush_bytes / 256].
  attnkit::TopkTensors flush_read;
  constexpr std::int64_t kFlushRows = 64;
  flush_read.x = attnkit::TensorView::make(
      flush, attnkit::DType::kFloat32, gpu,
      {kFlushRows, static_cast<std::int64_t>(flush_bytes / 4) / kFlushRows});
  void* flush_idx = nullptr;
  cuda_ok(cudaMalloc(&flush_idx, kFlushRows * 4), "cudaMalloc(flush indices)");
  flush_read.out_indices =
      attnkit::TensorView::make(flush_idx, attnkit::DType::kInt32, gpu, {kFlushRows, 1});
  attnkit::TopkOptions flush_opt;
  flush_opt.k = 1;
  std::size_t flush_ws_bytes = attnkit::topk_workspace_size(flush_read, flush_opt);
  void* flush_ws = nullptr;
  cuda_ok(cudaMalloc(&flush_ws, std::max<std::size_t>(flush_ws_bytes, 1)), "cudaMalloc(flush ws)");
  auto flush_l2 = [&](int r) {
    cuda_ok(cudaMemsetAsync(flush, r & 0xFF, flush_bytes, stream), "flush");
    if (clean_flush) attnkit::topk(flush_ws, flush_ws_bytes, flush_read, flush_opt, stream);
  };
  cudaEvent_t t0, t1;
  cuda_ok(cudaEventCreate(&t0), "cudaEventCreate");
  cuda_ok(cudaEventCreate(&t1), "cudaEventCreate");

  // An idle GPU clocks its SMs down; cases timed while the clocks ramp up measured up to 3x
  // their later time (run 232). Flushes bring the clocks up: for a second before the first
  // case, and again after each case's inputs are made on the host, which can take seconds.
  auto warm_up = [&](std::chrono::milliseconds span) {
    const auto start = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - start < span) {
      for (int r = 0; r < 16; ++r) flush_l2(r);
      cuda_ok(cudaStreamSynchronize(stream), "warm-up");
    }
  };
  warm_up(std::chrono::milliseconds(1000));

  std::printf("%-5s %6s %8s %5s %-6s %-6s %10s %8s\n", "dtype", "B", "N", "k", "causal", "values",
              "us", "TB/s");
  for (const Case& c : list) {
    const std::size_t elem = attnkit::dtype_size(c.dtype);
    std::vector<std::uint8_t> host(static_cast<std::size_t>(c.batch * c.n) * elem);
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal;
    std::uniform_real_distribution<float> uniform;
    for (std::size_t i = 0; i < host.size() / elem; ++i) {
      const float v = dist == RowDist::kUniform     ? uniform(rng)
                      : dist == RowDist::kLognormal ? std::exp(normal(rng))
                                                    : normal(rng);
      if (elem == 4) {
        const std::uint32_t bits = attnkit::detail::float_to_bits(v);
        std::copy_n(reinterpret_cast<const std::uint8_t*>(&bits), 4, &host[i * 4]);
      } else {
        const std::uint16_t bits = static_cast<std::uint16_t>(
            c.dtype == attnkit::DType::kBFloat16 ? attnkit::detail::float_to_bf16_bits(v)
                                                 : attnkit::detail::float_to_f16_bits(v));
        std::copy_n(reinterpret_cast<const std::uint8_t*>(&bits), 2, &host[i * 2]);
      }
    }
    std::vector<std::int32_t> ends(static_cast<std::size_t>(c.batch));
    std::int64_t valid = 0;
    for (std::int64_t b = 0; b < c.batch; ++b) {
      ends[b] = static_cast<std::int32_t>(
          c.rows == Rows::kCausal ? (c.n * (b + 1) + c.batch - 1) / c.batch
          : c.rows == Rows::kLast ? std::max<std::int64_t>(1, c.n - c.batch + 1 + b)
                                  : c.n);
      valid += ends[b];
    }
    // One call's buffers and its captured graph; the decoy of --warm-code gets a set of its own.
    struct Call {
      void *x = nullptr, *vals = nullptr, *idx = nullptr, *end = nullptr, *ws = nullptr;
      std::size_t ws_bytes = 0;
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
    };
    const std::int64_t kk = std::max<std::int64_t>(c.k, 1);
    auto prepare = [&](Call& call) {
      cuda_ok(cudaMalloc(&call.x, host.size()), "cudaMalloc(x)");
      cuda_ok(cudaMalloc(&call.vals, static_cast<std::size_t>(c.batch * kk) * elem),
              "cudaMalloc(values)");
      cuda_ok(cudaMalloc(&call.idx, static_cast<std::size_t>(c.batch * kk) * 4),
              "cudaMalloc(indices)");
      cuda_ok(cudaMalloc(&call.end, ends.size() * 4), "cudaMalloc(end)");
      cuda_ok(cudaMemcpy(call.x, host.data(), host.size(), cudaMemcpyHostToDevice), "copy x");
      cuda_ok(cudaMemcpy(call.end, ends.data(), ends.size() * 4, cudaMemcpyHostToDevice),
              "copy end");
      attnkit::TopkTensors t;
      t.x = attnkit::TensorView::make(call.x, c.dtype, gpu, {c.batch, c.n});
      if (c.rows != Rows::kFull)
        t.end = attnkit::TensorView::make(call.end, attnkit::DType::kInt32, gpu, {c.batch});
      if (values) t.out_values = attnkit::TensorView::make(call.vals, c.dtype, gpu, {c.batch, c.k});
      t.out_indices =
          attnkit::TensorView::make(call.idx, attnkit::DType::kInt32, gpu, {c.batch, c.k});
      attnkit::TopkOptions o;
      o.k = c.k;
      o.sorted = order;
      call.ws_bytes = attnkit::topk_workspace_size(t, o);
      cuda_ok(cudaMalloc(&call.ws, std::max<std::size_t>(call.ws_bytes, 1)),
              "cudaMalloc(workspace)");
      attnkit::topk(call.ws, call.ws_bytes, t, o, stream);  // warm-up, outside the graph
      cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
      attnkit::topk(call.ws, call.ws_bytes, t, o, stream);
      cuda_ok(cudaStreamEndCapture(stream, &call.graph), "end capture");
      cuda_ok(cudaGraphInstantiate(&call.exec, call.graph, 0), "instantiate");
    };
    Call timed, decoy;
    prepare(timed);
    if (warm_code) prepare(decoy);
    warm_up(std::chrono::milliseconds(200));
    std::vector<float> us;
    for (int r = 0; r < reps; ++r) {
      flush_l2(r);
      if (warm_code) cuda_ok(cudaGraphLaunch(decoy.exec, stream), "replay (decoy)");
      cuda_ok(cudaEventRecord(t0, stream), "record");
      cuda_ok(cudaGraphLaunch(timed.exec, stream), "replay");
      cuda_ok(cudaEventRecord(t1, stream), "record");
      cuda_ok(cudaEventSynchronize(t1), "sync");
      float ms = 0;
      cuda_ok(cudaEventElapsedTime(&ms, t0, t1), "elapsed");
      us.push_back(ms * 1000.0f);
    }
    std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
    const double med = us[us.size() / 2];
    const double bytes =
        static_cast<double>(valid * static_cast<std::int64_t>(elem)) +
        static_cast<double>(c.batch * c.k * (4 + (values ? static_cast<std::int64_t>(elem) : 0)));
    const char* rows = c.rows == Rows::kCausal ? "yes"
                       : c.rows == Rows::kLast ? "last"
                       : c.rows == Rows::kEnd  ? "end"
                                               : "no";
    std::printf("%-5s %6lld %8lld %5lld %-6s %-6s %10.2f %8.3f\n", short_name(c.dtype),
                static_cast<long long>(c.batch), static_cast<long long>(c.n),
                static_cast<long long>(c.k), rows, values ? "yes" : "no", med, bytes / med / 1e6);
    std::fflush(stdout);
    for (Call* call : {&timed, &decoy}) {
      if (call->exec != nullptr) cudaGraphExecDestroy(call->exec);
      if (call->graph != nullptr) cudaGraphDestroy(call->graph);
      for (void* p : {call->x, call->vals, call->idx, call->end, call->ws}) cudaFree(p);
    }
  }
  return 0;
}
