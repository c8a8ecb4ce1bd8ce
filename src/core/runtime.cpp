// SPDX-License-Identifier: Apache-2.0
#include "attnkit/runtime.hpp"

#include <string>

#include "core/backends.hpp"
#include "core/thread_pool.hpp"

#ifndef ATTNKIT_VERSION
#define ATTNKIT_VERSION "0.0.0"
#endif

namespace attnkit {

int num_threads() noexcept { return detail::ThreadPool::global().size(); }

void set_num_threads(int n) { detail::ThreadPool::global().resize(n); }

const char* version() noexcept { return ATTNKIT_VERSION; }

bool cuda_available_in_build() noexcept {
#if defined(ATTNKIT_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

std::string build_info() {
  std::string s = "attnkit " ATTNKIT_VERSION "\n";
#if defined(__clang__)
  s += "compiler: clang " __clang_version__ "\n";
#elif defined(__GNUC__)
  s += "compiler: gcc " __VERSION__ "\n";
#endif
  s += "cpu threads: " + std::to_string(num_threads()) + "\n";
#if defined(ATTNKIT_WITH_CUDA)
  s += detail::cuda_build_info();
#else
  s += "cuda: not built\n";
#endif
  return s;
}

}  // namespace attnkit
