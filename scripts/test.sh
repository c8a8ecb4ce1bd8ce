#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# attnkit's test command:
#   1. configure and build the C++ project into build/cpp with warnings as errors, with the
#      CUDA backend whenever nvcc is found (so every CUDA source compiles), and run ctest;
#   2. pip-install the Python package with its test extra and run pytest on tests/python.
#
# Environment (all optional):
#   PYTHON              interpreter to install into (default python3; an externally managed
#                       system Python gets a virtualenv in build/venv instead)
#   CUDACXX             nvcc to use (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc)
#   ATTNKIT_CUDA        OFF/ON/AUTO for the Python package build (default: OFF without a GPU)
#   ATTNKIT_CMAKE_ARGS  extra arguments for the C++ configure step
#   ATTNKIT_PIP_ARGS    extra arguments for pip install (e.g. --no-build-isolation)
#   ATTNKIT_JOBS        parallel build and test jobs, the package build's too (default: all
#                       cores; CMAKE_BUILD_PARALLEL_LEVEL, where set, still rules the latter)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
build_dir=build/cpp
jobs=${ATTNKIT_JOBS:-$(nproc)}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$jobs}  # pip's CMake build
python=${PYTHON:-python3}

section() { printf '\n=== %s\n' "$*"; }

# ---------------------------------------------------------------------------------------------
# C++: build and ctest
# ---------------------------------------------------------------------------------------------
nvcc=${CUDACXX:-}
if [[ -z $nvcc ]]; then
  if command -v nvcc >/dev/null 2>&1; then
    nvcc=$(command -v nvcc)
  elif [[ -x /usr/local/cuda/bin/nvcc ]]; then
    nvcc=/usr/local/cuda/bin/nvcc
  fi
fi

cmake_args=(-DCMAKE_BUILD_TYPE=Release -DATTNKIT_WERROR=ON -DATTNKIT_BUILD_TESTS=ON)
if [[ -n $nvcc ]]; then
  cmake_args+=(-DATTNKIT_CUDA=ON "-DCMAKE_CUDA_COMPILER=$nvcc")
else
  cmake_args+=(-DATTNKIT_CUDA=OFF)
fi
# A generator can only be chosen when the build folder is new.
if [[ ! -f $build_dir/CMakeCache.txt ]] && command -v ninja >/dev/null 2>&1; then
  cmake_args+=(-G Ninja)
fi
# shellcheck disable=SC2206  # word splitting of the user's extra arguments is intended
cmake_args+=(${ATTNKIT_CMAKE_ARGS:-})

section "C++: configure ($build_dir, CUDA ${nvcc:-not found})"
cmake -S . -B "$build_dir" "${cmake_args[@]}"
section "C++: build"
cmake --build "$build_dir" --parallel "$jobs"
section "C++: ctest"
# A failing C++ suite does not stop the Python suite: one run reports both.
ctest_status=0
ctest --test-dir "$build_dir" --output-on-failure --parallel "$jobs" || ctest_status=$?

# ---------------------------------------------------------------------------------------------
# Python: install with the test extra, then pytest
# ---------------------------------------------------------------------------------------------
# PEP 668: Debian's own python3 refuses pip installs outside a virtualenv.
in_venv=$("$python" -c 'import sys; print(int(sys.prefix != sys.base_prefix))')
stdlib=$("$python" -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')
if [[ $in_venv == 0 && -f $stdlib/EXTERNALLY-MANAGED ]]; then
  section "Python: $python is externally managed; using the virtualenv build/venv"
  [[ -x build/venv/bin/python ]] || "$python" -m venv build/venv
  python=$root/build/venv/bin/python
fi

has_gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  has_gpu=1
fi
if [[ $has_gpu == 0 ]]; then
  # Without a GPU the CUDA backend could not run in pytest, and its sources were already
  # compiled (warnings as errors) by the CMake build above: skip the second CUDA compile.
  export ATTNKIT_CUDA=${ATTNKIT_CUDA:-OFF}
fi

section "Python: pip install .[test] (ATTNKIT_CUDA=${ATTNKIT_CUDA:-AUTO})"
# shellcheck disable=SC2086
"$python" -m pip install --config-settings=build-dir=build/python ${ATTNKIT_PIP_ARGS:-} ".[test]"

section "Python: pytest tests/python"
pytest_status=0
if [[ -d tests/python ]]; then
  "$python" -m pytest tests/python -q || pytest_status=$?
else
  pytest_status=5
fi
if [[ $pytest_status == 5 ]]; then
  # Exit code 5 means no test was collected; the C++ suite above still ran.
  echo "warning: pytest collected no tests in tests/python" >&2
  pytest_status=0
fi

cuda_setting=${ATTNKIT_CUDA:-}
if [[ -n $nvcc && ${cuda_setting^^} =~ ^(OFF|0|NO|N|FALSE)$ ]]; then
  echo "note: attnkit is now installed without its CUDA backend; '$python -m pip install .'" \
       "restores it"
fi
if [[ $ctest_status != 0 || $pytest_status != 0 ]]; then
  echo "FAILED: ctest exit code $ctest_status, pytest exit code $pytest_status" >&2
  exit 1
fi
echo "scripts/test.sh: C++ and Python suites passed"
