// SPDX-License-Identifier: Apache-2.0
// The CPU backend's thread pool: persistent workers that share one parallel_for at a time.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace attnkit::detail {

/// A non-owning reference to a task, a callable taking the task's index: parallel_for holds its
/// caller's lambda through one, so that a call allocates nothing (a std::function copies a
/// large capture to the heap, which can fail after a caller reserved its memory).
class TaskRef {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, TaskRef>>>
  TaskRef(const F& f) noexcept  // NOLINT(google-explicit-constructor): called with lambdas
      : callable_(&f),
        call_([](const void* c, std::int64_t i) { (*static_cast<const F*>(c))(i); }) {}
  void operator()(std::int64_t i) const { call_(callable_, i); }

 private:
  const void* callable_;
  void (*call_)(const void*, std::int64_t);
};

/// The global pool's size: ATTNKIT_NUM_THREADS when it is an integer in [1, 4096], else the
/// CPUs the process may run on (its affinity mask, on Linux), else the hardware thread count.
int default_thread_count();

class ThreadPool {
 public:
  /// More threads than this is a mistake (a count of bytes, a typo), not a machine.
  static constexpr int kMaxThreads = 4096;

  /// The process-wide pool, of default_thread_count() threads.
  static ThreadPool& global();

  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /// Threads that run a parallel_for, the caller's included: those the system started, at
  /// most the count asked for.
  int size() const noexcept { return size_.load(std::memory_order_relaxed); }
  /// Restarts the pool with `num_threads` threads; throws Error(kValue) for a count outside
  /// [1, 4096], or when the system starts fewer (the pool then runs those).
  void resize(int num_threads);

  /// Calls fn(i) once for every i in [0, n), spread over the pool, and returns when all
  /// calls have returned. Tasks are handed out one at a time, so uneven tasks balance. At most
  /// `max_threads` threads (at least 1, the caller's included) run tasks at once, whatever
  /// size() is by then: a caller that sized per-thread state by size() before the call stays
  /// within it when resize() grows the pool in between. The first exception a task throws is
  /// rethrown here (tasks not yet started are skipped). A call from inside a task runs
  /// serially on that thread. `fn` must outlive the call (a lambda written in the call's
  /// arguments does).
  void parallel_for(std::int64_t n, TaskRef fn, int max_threads = kMaxThreads);

 private:
  /// One parallel_for. Lives on the caller's stack; workers hold it only while `refs` counts
  /// them, and the caller returns only when refs is back to zero.
  struct Job {
    Job(TaskRef f, std::int64_t count, int most) : fn(f), n(count), max_helpers(most) {}
    TaskRef fn;
    std::int64_t n;
    int max_helpers;  // workers that may join besides the caller
    int helpers = 0;  // workers that joined; under mutex_
    std::atomic<std::int64_t> next{0};
    std::atomic<int> refs{0};
    std::atomic<bool> failed{false};
    std::exception_ptr error;
    std::mutex error_mutex;
  };

  int start(int num_threads);  // returns the threads started, the caller's included
  void stop();
  void worker_loop(std::uint64_t seen);
  static void run_tasks(Job& job);

  std::atomic<int> size_{1};
  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // one parallel_for at a time

  std::mutex mutex_;  // guards current_, stopping_ and the generation counter
  std::condition_variable wake_;
  Job* current_ = nullptr;
  bool stopping_ = false;
  int sleepers_ = 0;  // workers blocked in wake_; a job skips the futex call when none are
  std::atomic<std::uint64_t> generation_{0};
};

}  // namespace attnkit::detail
