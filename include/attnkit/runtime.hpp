// SPDX-License-Identifier: Apache-2.0
/// \file
/// Process-wide settings and build information.
#pragma once

#include <string>

namespace attnkit {

/// Threads the CPU backend uses (the caller's thread included). Initially the value of the
/// environment variable `ATTNKIT_NUM_THREADS` when it is an integer in [1, 4096], else the
/// number of hardware threads; fewer where the system starts fewer (a process or memory limit).
int num_threads() noexcept;

/// Resizes the CPU thread pool. `1 <= n <= 4096`.
/// \throws Error(kValue) for n outside [1, 4096], or when the system starts fewer threads
/// (a process or memory limit); the pool then runs with those it started, which
/// num_threads() reports.
void set_num_threads(int n);

/// attnkit's version, "MAJOR.MINOR.PATCH": the CMake project's (find_package's
/// `attnkit_VERSION`) and the Python package's (`attnkit.__version__`).
const char* version() noexcept;

/// True when this build contains the CUDA backend.
bool cuda_available_in_build() noexcept;

/// One line per fact: version, compiler, CPU threads, CUDA runtime and driver and the targets
/// compiled in, and each visible CUDA device (name, compute capability, SMs, memory).
std::string build_info();

}  // namespace attnkit
