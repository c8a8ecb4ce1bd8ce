#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# GPU check: build, test, sanitize and benchmark attnkit on a CUDA machine; every log and
# result goes under $OUT (default /tmp/attnkit-gpu-check), at most 8 files.
#
#   scripts/gpu-check.sh [quick|full|check|bench]
#     quick  build, C++ CUDA tests, Python CUDA tests, an ncu profile, a short benchmark
#     full   build, tests, compute-sanitizer memcheck + racecheck, the whole benchmark, demo
#     check  build, tests, compute-sanitizer; no benchmark
#     bench  build and benchmark only
#
# The C++ test binary is built here with CMake unless a prebuilt one is given in
# ATTNKIT_CUDA_TESTS (it is host code over the CUDA runtime, linked statically, so a binary
# built on another x86-64 Linux machine with an older glibc runs here). GoogleTest comes from
# the system or from ATTNKIT_GTEST_SOURCE_DIR. BENCH_REPEATS sets the benchmark's repeats
# per case (default 20). FUZZ_SECONDS and FUZZ_SEED set the fuzzing step of full and check
# (scripts/fuzz_topk.py; default 60 s, seed 1). SANITIZE=memcheck or racecheck runs only that
# tool's steps (the two together take longer than one 10-minute device call); racecheck also
# skips the tests and the fuzzer, for a second call after a first with memcheck.
set -uo pipefail
MODE=${1:-quick}
SANITIZE=${SANITIZE:-all}
OUT=${OUT:-/tmp/attnkit-gpu-check}
ARCHS=${ATTNKIT_CUDA_ARCHS:-90a}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
status=0

step() {  # step NAME LOGFILE COMMAND...: run, append the outcome to the summary
  local name=$1 log=$2
  shift 2
  local t0=$SECONDS
  echo "== $name" | tee -a "$log"
  "$@" >> "$log" 2>&1
  local rc=$?
  printf '%-34s rc=%-3s %4ss  (log: %s)\n' "$name" "$rc" $((SECONDS - t0)) "$(basename "$log")" |
    tee -a "$SUMMARY"
  [ "$rc" -eq 0 ] || status=1
  return "$rc"
}

{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: ${ATTNKIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  nvcc --version | tail -1
  python3 -c 'import torch; print("torch", torch.__version__)'
} >> "$SUMMARY" 2>&1

# -- Build ---------------------------------------------------------------------------------------
BUILD_LOG="$OUT/build.log"
export CMAKE_BUILD_PARALLEL_LEVEL=$JOBS
if [ "$SANITIZE" != racecheck ]; then
  step "python package (ATTNKIT_CUDA_ARCHS=$ARCHS)" "$BUILD_LOG" \
    env ATTNKIT_CUDA=ON ATTNKIT_CUDA_ARCHS="$ARCHS" \
    python3 -m pip install --no-build-isolation --no-deps -Cbuild-dir=build/gpu-py . || exit 1
  python3 -c 'import torch, attnkit; print(attnkit.info())' >> "$SUMMARY" 2>&1
  for probe in 'import ml_dtypes' 'import attnkit._ext; import ml_dtypes' \
               'import numpy, attnkit'; do
    python3 -c "$probe" > /dev/null 2>&1
    echo "probe '$probe': rc=$?" >> "$SUMMARY"
  done
fi

TESTS=${ATTNKIT_CUDA_TESTS:-}
if [ "$MODE" != bench ] && [ -z "$TESTS" ]; then
  gtest=()
  [ -n "${ATTNKIT_GTEST_SOURCE_DIR:-}" ] &&
    gtest=(-DATTNKIT_GTEST_SOURCE_DIR="$ATTNKIT_GTEST_SOURCE_DIR")
  step "cmake configure" "$BUILD_LOG" cmake -S . -B build/gpu -G Ninja -DATTNKIT_CUDA=ON \
    -DATTNKIT_CUDA_ARCHS="$ARCHS" "${gtest[@]}" &&
  step "cmake build attnkit_cuda_tests" "$BUILD_LOG" \
    cmake --build build/gpu --target attnkit_cuda_tests &&
  TESTS=build/gpu/tests/cpp/attnkit_cuda_tests
fi

# -- Tests ---------------------------------------------------------------------------------------
if [ "$MODE" != bench ] && [ "$SANITIZE" != racecheck ]; then
  TEST_LOG="$OUT/tests.log"
  if [ -n "$TESTS" ]; then
    step "C++ CUDA tests" "$TEST_LOG" "$TESTS" --gtest_brief=1
    # Again with the cluster kernel wherever it can run (one CTA a row up to 8192 columns,
    # clusters at every batch size), so that each kernel meets every distribution and option.
    step "C++ CUDA tests (cluster path)" "$TEST_LOG" env ATTNKIT_CUDA_TOPK_PATH=cluster \
      "$TESTS" --gtest_brief=1
    # And with no clusters, so that small batches of rows up to 256K columns take the filter
    # kernel's slices and their merge kernel too, as on GPUs before sm_90.
    step "C++ CUDA tests (filter path)" "$TEST_LOG" env ATTNKIT_CUDA_TOPK_PATH=filter \
      "$TESTS" --gtest_brief=1
  fi
  step "Python CUDA tests" "$TEST_LOG" python3 -m pytest tests/python_cuda -q -p no:cacheprovider -x
  if [ "$MODE" != quick ]; then
    # Random shapes, options and data, each call against the CPU backend on the same bytes.
    step "fuzz, CUDA against CPU (${FUZZ_SECONDS:-60} s)" "$TEST_LOG" \
      python3 scripts/fuzz_topk.py --seconds "${FUZZ_SECONDS:-60}" --seed "${FUZZ_SEED:-1}"
    # The case count and outcomes, in the summary too, which always comes back.
    sed -n '/^summary: /,$p' "$TEST_LOG" | sed -n '1,3p' >> "$SUMMARY"
  fi
fi
if { [ "$MODE" = full ] || [ "$MODE" = check ]; } && [ -n "$TESTS" ]; then
  SAN_LOG="$OUT/sanitizer.log"
  if [ "$SANITIZE" != racecheck ]; then
    step "compute-sanitizer memcheck" "$SAN_LOG" \
      compute-sanitizer --tool memcheck --error-exitcode 3 \
      "$TESTS" --gtest_filter='*Small*' --gtest_brief=1
    step "compute-sanitizer memcheck (cluster path)" "$SAN_LOG" env ATTNKIT_CUDA_TOPK_PATH=cluster \
      compute-sanitizer --tool memcheck --error-exitcode 3 \
      "$TESTS" --gtest_filter='*Small*' --gtest_brief=1
  fi
  if [ "$SANITIZE" != memcheck ]; then
    race_filter='*SmallDistributions*:*SmallKBeyond*:*SmallGraph*:*SmallArgmax*'
    race_filter+=':*SmallClusterWide*:*SmallSorted*:*SmallShortRowsWide*'
    step "compute-sanitizer racecheck" "$SAN_LOG" \
      compute-sanitizer --tool racecheck --error-exitcode 3 \
      "$TESTS" --gtest_filter="$race_filter" --gtest_brief=1
    step "compute-sanitizer racecheck (cluster path)" "$SAN_LOG" \
      env ATTNKIT_CUDA_TOPK_PATH=cluster \
      compute-sanitizer --tool racecheck --error-exitcode 3 \
      "$TESTS" --gtest_filter='*SmallDistributions:*SmallGraph*' --gtest_brief=1
  fi
fi

if [ "$MODE" = quick ] && command -v ncu > /dev/null; then
  step "ncu profile" "$OUT/ncu.txt" ncu --clock-control none --section SpeedOfLight \
    --section WarpStateStats --section Occupancy --section MemoryWorkloadAnalysis \
    --section SchedulerStats --section SourceCounters --section InstructionStats \
    -k regex:topk -c 4 python3 bench/profile_topk.py
fi

# -- Benchmark -----------------------------------------------------------------------------------
if [ "$MODE" = check ]; then
  cat "$SUMMARY"
  exit $status
fi
quick=(--repeats "${BENCH_REPEATS:-20}")
[ "$MODE" = quick ] && quick=(--quick --repeats 10)
step "benchmark" "$OUT/bench.log" python3 bench/bench_topk.py "${quick[@]}" \
  --json "$OUT/bench_topk.json" --markdown "$OUT/bench_topk.md"
tail -3 "$OUT/bench.log" >> "$SUMMARY"
if [ "$MODE" = full ]; then
  step "attnkit demo (GPU)" "$OUT/bench.log" \
    attnkit demo --quick --no-progress --json "$OUT/demo.json"
fi

cat "$SUMMARY"
exit $status
