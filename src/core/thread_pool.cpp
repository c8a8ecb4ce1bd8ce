// SPDX-License-Identifier: Apache-2.0
#include "core/thread_pool.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <new>
#include <string>
#include <system_error>

#include "attnkit/error.hpp"

namespace attnkit::detail {
namespace {

thread_local bool t_inside_task = false;

}  // namespace

int default_thread_count() {
  if (const char* env = std::getenv("ATTNKIT_NUM_THREADS")) {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && v >= 1 && v <= ThreadPool::kMaxThreads) {
      return static_cast<int>(v);
    }
  }
#if defined(__linux__)
  // The CPUs this process may run on (taskset, a container's cpuset): more threads than those
  // would only take turns on them. sched_getaffinity fails beyond 1024 CPUs (cpu_set_t's size),
  // where the hardware count stands.
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0 && CPU_COUNT(&allowed) > 0) {
    return std::min(CPU_COUNT(&allowed), ThreadPool::kMaxThreads);
  }
#endif
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

namespace {

// How long an idle worker polls for the next job before it sleeps on the condition variable.
// Back-to-back calls (a benchmark loop, a decode step per token) then skip the futex wake-up,
// which costs tens of microseconds: about the time of a whole small top-k.
constexpr auto kSpinBeforeSleep = std::chrono::microseconds(500);

// The process-wide pool. Never deleted: a forked child drops it without touching it (see
// forget_pool_in_child), and at exit its workers are left asleep rather than joined.
std::atomic<ThreadPool*> g_pool{nullptr};
std::atomic<int> g_forked_size{0};  // the pool size a forked child starts again with
std::atomic<bool> g_atfork_registered{false};

// In a child forked while the pool ran a job, only the forking thread exists: the workers are
// gone and the pool's locks may be held by threads that will never release them (the next
// call would wait forever). The child forgets that pool and the next call starts a new one of
// the same size, as torch's intra-op pool does.
void forget_pool_in_child() noexcept {
  if (ThreadPool* old = g_pool.load(std::memory_order_relaxed)) {
    g_forked_size.store(old->size(), std::memory_order_relaxed);
  }
  g_pool.store(nullptr, std::memory_order_relaxed);
}

}  // namespace

ThreadPool& ThreadPool::global() {
  if (ThreadPool* pool = g_pool.load(std::memory_order_acquire)) return *pool;
  if (!g_atfork_registered.exchange(true)) {
    pthread_atfork(nullptr, nullptr, forget_pool_in_child);
  }
  const int forked = g_forked_size.load(std::memory_order_relaxed);
  auto* fresh = new ThreadPool(forked > 0 ? forked : default_thread_count());
  ThreadPool* expected = nullptr;
  if (!g_pool.compare_exchange_strong(expected, fresh, std::memory_order_acq_rel)) {
    delete fresh;  // another thread's pool won
    return *expected;
  }
  return *fresh;
}

ThreadPool::ThreadPool(int num_threads) { start(num_threads); }  // as many as the system starts

ThreadPool::~ThreadPool() { stop(); }

int ThreadPool::start(int num_threads) {
  stopping_ = false;
  // The generation is read here, before any job can be published, so that a worker whose
  // thread starts late still joins the first job instead of taking its generation as seen.
  const std::uint64_t seen = generation_.load(std::memory_order_acquire);
  int started = 1;  // the caller's thread
  // A process or memory limit (RLIMIT_NPROC, a container's pids.max, thread stacks beyond
  // RLIMIT_AS) can refuse a thread: the pool then runs with those it has. Left to unwind, the
  // exception would destroy the condition variable under the running workers (a hang) or
  // joinable threads (std::terminate).
  try {
    workers_.reserve(static_cast<std::size_t>(num_threads - 1));
    for (; started < num_threads; ++started) {
      workers_.emplace_back([this, seen] { worker_loop(seen); });
    }
  } catch (const std::system_error&) {
  } catch (const std::bad_alloc&) {
  }
  size_.store(started, std::memory_order_relaxed);
  return started;
}

void ThreadPool::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
  workers_.clear();
}

void ThreadPool::resize(int num_threads) {
  if (num_threads < 1 || num_threads > kMaxThreads) {
    throw Error(ErrorCode::kValue, "set_num_threads: n = " + std::to_string(num_threads) +
                                       " must be in [1, " + std::to_string(kMaxThreads) + "]");
  }
  std::lock_guard<std::mutex> call_lock(call_mutex_);
  stop();
  const int started = start(num_threads);
  if (started < num_threads) {
    throw Error(ErrorCode::kValue, "set_num_threads: n = " + std::to_string(num_threads) +
                                       " is more threads than the system starts now (a process "
                                       "or memory limit); the pool runs " +
                                       std::to_string(started));
  }
}

void ThreadPool::run_tasks(Job& job) {
  const bool was_inside = t_inside_task;
  t_inside_task = true;
  while (!job.failed.load(std::memory_order_relaxed)) {
    const std::int64_t i = job.next.fetch_add(1, std::memory_order_relaxed);
    if (i >= job.n) break;
    try {
      job.fn(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(job.error_mutex);
      if (!job.error) job.error = std::current_exception();
      job.failed.store(true, std::memory_order_relaxed);
    }
  }
  t_inside_task = was_inside;
}

void ThreadPool::worker_loop(std::uint64_t seen) {
  for (;;) {
    const auto spin_until = std::chrono::steady_clock::now() + kSpinBeforeSleep;
    while (generation_.load(std::memory_order_acquire) == seen &&
           std::chrono::steady_clock::now() < spin_until) {
      std::this_thread::yield();
    }
    Job* job = nullptr;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ++sleepers_;
      // stopping_ too: a worker that starts after stop() must not wait for a later generation.
      wake_.wait(lock, [&] {
        return stopping_ || generation_.load(std::memory_order_relaxed) != seen;
      });
      --sleepers_;
      seen = generation_.load(std::memory_order_relaxed);
      if (stopping_) return;
      job = current_;  // null when the job already finished
      if (job != nullptr && job->helpers < job->max_helpers) {
        ++job->helpers;
        job->refs.fetch_add(1, std::memory_order_relaxed);
      } else {
        job = nullptr;  // finished, or as many threads as the caller asked for run it
      }
    }
    if (job) {
      run_tasks(*job);
      job->refs.fetch_sub(1, std::memory_order_release);
    }
  }
}

void ThreadPool::parallel_for(std::int64_t n, TaskRef fn, int max_threads) {
  if (n <= 0) return;
  if (t_inside_task || n == 1 || size() == 1 || max_threads <= 1) {
    for (std::int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mutex_);
  Job job(fn, n, max_threads - 1);
  bool any_asleep = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    current_ = &job;
    generation_.fetch_add(1, std::memory_order_release);
    any_asleep = sleepers_ > 0;
  }
  if (any_asleep) wake_.notify_all();
  run_tasks(job);
  {
    // No worker can join once current_ is cleared; wait for those that did.
    std::lock_guard<std::mutex> lock(mutex_);
    current_ = nullptr;
  }
  while (job.refs.load(std::memory_order_acquire) != 0) std::this_thread::yield();
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace attnkit::detail
