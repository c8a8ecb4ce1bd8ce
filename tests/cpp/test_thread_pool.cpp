// SPDX-License-Identifier: Apache-2.0
// The CPU backend's thread pool (src/core/thread_pool.hpp) and the public thread-count API.
// Tests that would hang on a lost wake-up or a worker that never exits run under a deadlock
// watchdog, so a hang is reported as a failure instead of stalling the suite.
#include <gtest/gtest.h>
#if defined(__linux__)
#include <sched.h>
#endif
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "attnkit/attnkit.hpp"
#include "core/thread_pool.hpp"

namespace {

using attnkit::detail::ThreadPool;

/// Runs `body` on a thread of its own and fails the test if it has not finished after a bound
/// far above its normal run time (a liveness bound against deadlock, not a speed check). A
/// deadlocked body is left behind, detached; the process exit reclaims it.
void expect_finishes(const std::function<void()>& body) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> finished = done->get_future();
  std::thread([body, done] {
    body();
    done->set_value();
  }).detach();
  if (finished.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ADD_FAILURE() << "did not finish within 20 s: deadlock";
  }
}

/// Calls pool.parallel_for(n) and checks every index ran exactly once.
void expect_each_index_once(ThreadPool& pool, std::int64_t n) {
  std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
  pool.parallel_for(n, [&](std::int64_t i) {
    hits[static_cast<std::size_t>(i)].fetch_add(1, std::memory_order_relaxed);
  });
  std::int64_t wrong = 0, first_wrong = -1;
  for (std::int64_t i = 0; i < n; ++i) {
    if (hits[static_cast<std::size_t>(i)].load() != 1) {
      if (first_wrong < 0) first_wrong = i;
      ++wrong;
    }
  }
  EXPECT_EQ(wrong, 0) << "n = " << n << ", pool size " << pool.size() << ": first index run "
                      << (first_wrong >= 0 ? hits[static_cast<std::size_t>(first_wrong)].load() : 1)
                      << " times is " << first_wrong;
}

#if defined(__linux__)
TEST(ThreadPool, DefaultCountFollowsTheAffinityMask) {
  // A process pinned to one CPU (taskset -c N, a cpuset) gets one thread, not one a core;
  // ATTNKIT_NUM_THREADS still wins.
  cpu_set_t before;
  ASSERT_EQ(sched_getaffinity(0, sizeof before, &before), 0);
  int first = 0;
  while (!CPU_ISSET(first, &before)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  const char* env = std::getenv("ATTNKIT_NUM_THREADS");
  const std::string saved = env != nullptr ? env : "";
  unsetenv("ATTNKIT_NUM_THREADS");
  const int all = attnkit::detail::default_thread_count();
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  const int pinned = attnkit::detail::default_thread_count();
  setenv("ATTNKIT_NUM_THREADS", "3", 1);
  const int asked = attnkit::detail::default_thread_count();
  ASSERT_EQ(sched_setaffinity(0, sizeof before, &before), 0);
  if (env != nullptr) {
    setenv("ATTNKIT_NUM_THREADS", saved.c_str(), 1);
  } else {
    unsetenv("ATTNKIT_NUM_THREADS");
  }
  EXPECT_EQ(all, CPU_COUNT(&before));
  EXPECT_EQ(pinned, 1);
  EXPECT_EQ(asked, 3);
}
#endif

TEST(ThreadPool, EveryIndexRunsOnce) {
  for (int threads : {1, 2, 3, 4, 8}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (std::int64_t n : {0, 1, 2, 3, 7, 64, 1000, 100003}) expect_each_index_once(pool, n);
  }
}

TEST(ThreadPool, NonPositiveCountRunsNothing) {
  ThreadPool pool(3);
  std::atomic<int> calls{0};
  pool.parallel_for(0, [&](std::int64_t) { calls.fetch_add(1); });
  pool.parallel_for(-5, [&](std::int64_t) { calls.fetch_add(1); });
  EXPECT_EQ(calls.load(), 0);
}

TEST(ThreadPool, SpreadsTasksOverItsThreads) {
  // Calls until some task ran on a worker: a pool whose workers never take part would loop
  // until the watchdog fires.
  auto distinct = std::make_shared<std::size_t>(0);
  expect_finishes([distinct] {
    ThreadPool pool(2);
    std::set<std::thread::id> ids;
    std::mutex ids_mutex;
    while (ids.size() < 2) {
      pool.parallel_for(64, [&](std::int64_t) {
        std::lock_guard<std::mutex> lock(ids_mutex);
        ids.insert(std::this_thread::get_id());
      });
    }
    *distinct = ids.size();
  });
  EXPECT_EQ(*distinct, 2u);
}

/// Runs parallel_for(n, ..., cap) on `pool` with tasks that overlap (each sleeps briefly) and
/// returns the most tasks that ran at once; fails if any index did not run exactly once.
int most_at_once(ThreadPool& pool, std::int64_t n, int cap) {
  std::atomic<int> running{0}, most{0};
  std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
  pool.parallel_for(n, [&](std::int64_t i) {
    const int now = running.fetch_add(1) + 1;
    int seen = most.load();
    while (now > seen && !most.compare_exchange_weak(seen, now)) {
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    hits[static_cast<std::size_t>(i)].fetch_add(1);
    running.fetch_sub(1);
  }, cap);
  for (std::int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(hits[static_cast<std::size_t>(i)].load(), 1) << "index " << i << ", cap " << cap;
  }
  return most.load();
}

TEST(ThreadPool, ParallelForRunsAtMostTheThreadsAskedFor) {
  // The CPU top-k reserves one working buffer per thread before its parallel_for: a pool that
  // grows in between (set_num_threads from another thread) must not run more tasks at once.
  ThreadPool pool(6);
  for (int cap : {1, 2, 3}) EXPECT_LE(most_at_once(pool, 200, cap), cap) << "cap " << cap;
  // Without a cap the pool's threads do overlap: the bound above is a real limit. (Retried: a
  // loaded machine may run one round's short tasks on fewer threads.)
  int uncapped = 0;
  for (int round = 0; round < 20 && uncapped <= 3; ++round) {
    uncapped = std::max(uncapped, most_at_once(pool, 200, ThreadPool::kMaxThreads));
  }
  EXPECT_GT(uncapped, 3);
}

/// Tasks that wait for each other finish only if every thread of the pool runs one at once.
/// The first call right after construction, and right after resize(), must already reach
/// every worker, including those whose threads had not started when the call was made.
TEST(ThreadPool, FirstCallAfterStartReachesEveryWorker) {
  auto ids = std::make_shared<std::vector<std::size_t>>();
  expect_finishes([ids] {
    auto interlocked = [](ThreadPool& pool) {
      const int n = pool.size();
      std::atomic<int> arrived{0};
      std::set<std::thread::id> seen;
      std::mutex seen_mutex;
      pool.parallel_for(n, [&](std::int64_t) {
        arrived.fetch_add(1);
        while (arrived.load() < n) std::this_thread::yield();
        std::lock_guard<std::mutex> lock(seen_mutex);
        seen.insert(std::this_thread::get_id());
      });
      return seen.size();
    };
    ThreadPool pool(2);
    ids->push_back(interlocked(pool));  // right after construction
    pool.resize(3);
    ids->push_back(interlocked(pool));  // right after resize
  });
  EXPECT_EQ(*ids, (std::vector<std::size_t>{2, 3}))
      << "a worker that starts after a call posted its job must still take part in it";
}

TEST(ThreadPool, ExceptionPropagatesAndPoolStaysUsable) {
  for (int threads : {1, 2, 4}) {
    SCOPED_TRACE(threads);
    ThreadPool pool(threads);
    std::atomic<int> calls{0};
    try {
      pool.parallel_for(1000, [&](std::int64_t i) {
        calls.fetch_add(1);
        if (i == 17) throw std::runtime_error("task 17 failed");
      });
      ADD_FAILURE() << "the task's exception was not rethrown";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "task 17 failed");
    }
    EXPECT_GE(calls.load(), 1);
    EXPECT_LE(calls.load(), 1000);
    // attnkit::Error keeps its type and code through the pool.
    try {
      pool.parallel_for(8, [&](std::int64_t) {
        throw attnkit::Error(attnkit::ErrorCode::kValue, "from a task");
      });
      ADD_FAILURE() << "no exception";
    } catch (const attnkit::Error& e) {
      EXPECT_EQ(e.code(), attnkit::ErrorCode::kValue);
    }
    expect_each_index_once(pool, 5000);
  }
}

TEST(ThreadPool, NestedParallelForRunsSeriallyOnTheTaskThread) {
  ThreadPool pool(4);
  const std::int64_t outer = 16, inner = 50;
  std::vector<std::atomic<int>> hits(static_cast<std::size_t>(outer * inner));
  std::atomic<int> off_thread{0};
  pool.parallel_for(outer, [&](std::int64_t i) {
    const std::thread::id me = std::this_thread::get_id();
    pool.parallel_for(inner, [&](std::int64_t j) {
      if (std::this_thread::get_id() != me) off_thread.fetch_add(1);
      hits[static_cast<std::size_t>(i * inner + j)].fetch_add(1);
    });
  });
  EXPECT_EQ(off_thread.load(), 0) << "inner tasks ran on other threads";
  for (std::size_t i = 0; i < hits.size(); ++i) EXPECT_EQ(hits[i].load(), 1) << "index " << i;
}

TEST(ThreadPool, Resize) {
  ThreadPool pool(2);
  for (int threads : {4, 1, 3, 3, 8, 2}) {
    pool.resize(threads);
    EXPECT_EQ(pool.size(), threads);
    expect_each_index_once(pool, 777);
  }
  try {
    pool.resize(0);
    ADD_FAILURE() << "resize(0) was accepted";
  } catch (const attnkit::Error& e) {
    EXPECT_EQ(e.code(), attnkit::ErrorCode::kValue);
    EXPECT_NE(std::string(e.what()).find("n = 0 must be in [1, 4096]"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(pool.size(), 2) << "a refused resize changed the pool";
  expect_each_index_once(pool, 777);
}

TEST(ThreadPool, ManyBackToBackCalls) {
  auto sums = std::make_shared<std::pair<std::int64_t, std::int64_t>>(0, 0);
  expect_finishes([sums] {
    ThreadPool pool(3);
    std::atomic<std::int64_t> sum{0};
    std::int64_t expected = 0;
    for (int call = 0; call < 20000; ++call) {
      const std::int64_t n = 1 + call % 5;
      pool.parallel_for(n,
                        [&](std::int64_t i) { sum.fetch_add(i + 1, std::memory_order_relaxed); });
      expected += n * (n + 1) / 2;
    }
    *sums = {sum.load(), expected};
  });
  EXPECT_EQ(sums->first, sums->second);
  EXPECT_GT(sums->second, 0);
}

TEST(ThreadPool, CallsFromSeveralThreadsAreSerialized) {
  ThreadPool pool(3);
  constexpr int kCallers = 4, kCalls = 300;
  std::vector<std::int64_t> sums(kCallers, 0);
  std::vector<std::thread> callers;
  for (int t = 0; t < kCallers; ++t) {
    callers.emplace_back([&, t] {
      for (int call = 0; call < kCalls; ++call) {
        std::vector<std::atomic<int>> hits(97);
        pool.parallel_for(97,
                          [&](std::int64_t i) { hits[static_cast<std::size_t>(i)].fetch_add(1); });
        for (auto& h : hits) sums[static_cast<std::size_t>(t)] += h.load();
      }
    });
  }
  for (auto& c : callers) c.join();
  for (int t = 0; t < kCallers; ++t)
    EXPECT_EQ(sums[static_cast<std::size_t>(t)], 97 * kCalls) << "caller " << t;
}

TEST(ThreadPool, DestructionRightAfterConstruction) {
  // Workers may not even have started when the destructor runs; none may be left waiting.
  auto rounds = std::make_shared<std::atomic<int>>(0);
  expect_finishes([rounds] {
    for (int round = 0; round < 300; ++round) {
      ThreadPool pool(1 + round % 6);
      rounds->fetch_add(1);
    }
    // And right after a resize, and right after a call.
    for (int round = 0; round < 100; ++round) {
      auto pool = std::make_unique<ThreadPool>(3);
      pool->resize(1 + round % 4);
      if (round % 2) pool->parallel_for(3, [](std::int64_t) {});
      pool.reset();
      rounds->fetch_add(1);
    }
  });
  EXPECT_EQ(rounds->load(), 400);
}

TEST(ThreadPool, PublicThreadCount) {
  const int saved = attnkit::num_threads();
  EXPECT_GE(saved, 1);
  attnkit::set_num_threads(3);
  EXPECT_EQ(attnkit::num_threads(), 3);
  EXPECT_EQ(ThreadPool::global().size(), 3);
  for (int n : {0, -2}) {
    try {
      attnkit::set_num_threads(n);
      ADD_FAILURE() << "set_num_threads(" << n << ") was accepted";
    } catch (const attnkit::Error& e) {
      EXPECT_EQ(e.code(), attnkit::ErrorCode::kValue);
      EXPECT_NE(std::string(e.what()).find("n = " + std::to_string(n)), std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(attnkit::num_threads(), 3);
  attnkit::set_num_threads(saved);
  EXPECT_EQ(attnkit::num_threads(), saved);
}

// Bytes of address space the process maps now (/proc/self/statm's first field).
std::size_t mapped_bytes() {
  unsigned long pages = 0;
  if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%lu", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  return static_cast<std::size_t>(pages) * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

// Under an address-space limit with room for a few thread stacks only (a limit that binds root
// too), a pool asked for 4096 threads runs with those the system started: the constructor
// neither hangs nor aborts, parallel_for runs every task, and resize reports the shortfall as
// Error(kValue) and keeps a usable pool. In a forked child, whose alarm turns a hang into a
// failed exit.
TEST(ThreadPool, RunsWithTheThreadsTheSystemStarts) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    alarm(60);
    rlimit limit{};
    getrlimit(RLIMIT_AS, &limit);
    limit.rlim_cur = mapped_bytes() + (std::size_t{256} << 20);
    if (setrlimit(RLIMIT_AS, &limit) != 0) _exit(2);
    int code = 0;
    {
      ThreadPool pool(4096);
      const int started = pool.size();
      if (started < 1 || started >= 4096) code |= 4;
      std::atomic<std::int64_t> sum{0};
      pool.parallel_for(1000, [&](std::int64_t i) { sum += i; });
      if (sum != 999 * 1000 / 2) code |= 8;
      bool reported = false;
      try {
        pool.resize(4096);
      } catch (const attnkit::Error& e) {
        reported = e.code() == attnkit::ErrorCode::kValue &&
                   std::string(e.what()).find("n = 4096") != std::string::npos;
      }
      if (!reported || pool.size() >= 4096) code |= 16;
      sum = 0;
      pool.parallel_for(100, [&](std::int64_t i) { sum += i; });
      if (sum != 99 * 100 / 2) code |= 32;
    }
    _exit(code);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child hung (alarm) or crashed: status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "failed checks (bits): 2 setrlimit, 4 pool size, "
                                       "8 parallel_for, 16 resize's error, 32 after resize";
}

}  // namespace
