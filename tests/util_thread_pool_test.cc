// ThreadPool: every item runs exactly once, in the static chunks the header promises, whether
// the workers are polling (back-to-back jobs), polling between yields, or asleep (jobs further
// apart than the spin budget, or no spinning at all), and the pool shuts down from any of these
// states. Whether a worker polling between yields leaves its CPU to other threads is
// util_thread_pool_cpu_share_test, which CTest runs alone.
#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "common/util/thread_pool.h"

namespace bitsplit {
namespace {

// Runs one job over n items and checks: each item once, chunks contiguous and in worker order
// (worker w's items all precede worker w + 1's), chunk boundaries on the grain.
void RunAndCheck(ThreadPool& pool, int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> calls(n);
  std::vector<int> owner(n, -1);
  pool.ParallelForGrained(n, grain, [&](int64_t begin, int64_t end, int worker) {
    ASSERT_LE(0, begin);
    ASSERT_LT(begin, end);
    ASSERT_LE(end, n);
    ASSERT_TRUE(begin % grain == 0) << begin;
    for (int64_t i = begin; i < end; ++i) {
      calls[i].fetch_add(1);
      owner[i] = worker;
    }
  });
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(calls[i].load(), 1) << "item " << i << " of " << n;
    if (i > 0) {
      ASSERT_LE(owner[i - 1], owner[i]) << "item " << i;
    }
    ASSERT_GE(owner[i], 0);
    ASSERT_LT(owner[i], pool.num_threads());
  }
}

TEST(ThreadPoolTest, CoversEveryItemOnceInStaticChunks) {
  for (int threads : {1, 2, 3, 8}) {
    for (auto spin : {std::chrono::microseconds(0), ThreadPool::kDefaultSpin}) {
      ThreadPool pool(threads, spin);
      EXPECT_EQ(pool.num_threads(), threads);
      for (int64_t n : {1, 2, 3, 7, 64, 1000}) {
        for (int64_t grain : {1, 4, 64}) RunAndCheck(pool, n, grain);
      }
    }
  }
}

TEST(ThreadPoolTest, RunsOnEveryWorkerOnce) {
  for (int threads : {1, 2, 5}) {
    ThreadPool pool(threads);
    for (int job = 0; job < 100; ++job) {
      std::vector<std::atomic<int>> calls(threads);
      pool.RunOnEveryWorker([&](int worker) { calls[worker].fetch_add(1); });
      for (int w = 0; w < threads; ++w) ASSERT_EQ(calls[w].load(), 1) << "worker " << w;
    }
  }
}

// Workers run on the CPUs they are given (worker i on cpus[i % size]).
TEST(ThreadPoolTest, PinsWorkersToTheGivenCpus) {
  const std::vector<int> allowed = AllowedCpus();
  ASSERT_FALSE(allowed.empty());
  const std::vector<int> cpus = {allowed.back()};
  ThreadPool pool(3, ThreadPool::kDefaultSpin, cpus);
  std::vector<int> ran_on(3, -1);
  pool.RunOnEveryWorker([&](int worker) { ran_on[worker] = sched_getcpu(); });
  EXPECT_EQ(ran_on[1], allowed.back());
  EXPECT_EQ(ran_on[2], allowed.back());
}

TEST(ThreadPoolTest, PinningToACpuOutsideTheMaskFails) {
  EXPECT_EQ(PinCurrentThread(-1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(PinCurrentThread(CPU_SETSIZE).ok());
}

TEST(ThreadPoolTest, EmptyJobCallsNothing) {
  ThreadPool pool(2);
  bool called = false;
  pool.ParallelFor(0, [&](int64_t, int64_t, int) { called = true; });
  EXPECT_FALSE(called);
}

// Jobs back to back: the workers catch them while polling. A lost or doubled hand-off would
// show as a wrong sum (or a hang, which CTest's timeout reports).
TEST(ThreadPoolTest, ManyBackToBackJobs) {
  ThreadPool pool(3);
  int64_t total = 0;
  for (int job = 0; job < 20000; ++job) {
    std::atomic<int64_t> sum{0};
    const int64_t n = 1 + job % 17;
    pool.ParallelFor(n, [&](int64_t begin, int64_t end, int) {
      for (int64_t i = begin; i < end; ++i) sum.fetch_add(i + 1);
    });
    ASSERT_EQ(sum.load(), n * (n + 1) / 2) << "job " << job;
    total += sum.load();
  }
  EXPECT_GT(total, 0);
}

// Jobs further apart than the spin budget: the workers (and the caller, waiting on a slow
// worker) have gone to sleep and must be woken every time.
TEST(ThreadPoolTest, WakesSleepingWorkersAndCaller) {
  using std::chrono::microseconds;
  struct Wait {
    microseconds spin, yield_spin;
  };
  for (const Wait wait :
       {Wait{microseconds(0), microseconds(0)}, Wait{microseconds(20), microseconds(0)},
        Wait{microseconds(0), microseconds(50)}, Wait{microseconds(20), microseconds(50)}}) {
    ThreadPool pool(2, wait.spin);
    pool.SetYieldSpin(wait.yield_spin);
    const auto spin = wait.spin + wait.yield_spin;
    for (int job = 0; job < 50; ++job) {
      std::this_thread::sleep_for(std::chrono::microseconds(300));
      std::atomic<int> items{0};
      pool.ParallelFor(2, [&](int64_t begin, int64_t end, int worker) {
        // The other worker outlasts the caller's spin, so the caller sleeps too.
        if (worker == 1 && job % 2 == 0)
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        items.fetch_add(static_cast<int>(end - begin));
      });
      ASSERT_EQ(items.load(), 2) << "spin " << spin.count() << " us, job " << job;
    }
  }
}

// The poll times change while workers poll or sleep; jobs keep being handed off either way.
TEST(ThreadPoolTest, SpinChangesTakeEffectBetweenJobs) {
  ThreadPool pool(3, std::chrono::seconds(10));  // they would poll far longer than the test
  for (int job = 0; job < 200; ++job) {
    RunAndCheck(pool, 30, 1);
    pool.SetSpin(job % 2 == 0 ? std::chrono::nanoseconds(0) : ThreadPool::kDefaultSpin);
    pool.SetYieldSpin(job % 3 == 0 ? std::chrono::nanoseconds(0) : std::chrono::seconds(10));
    if (job % 20 == 0) std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
}

TEST(ThreadPoolTest, ShutsDownWhilePollingOrAsleep) {
  for (auto spin : {std::chrono::microseconds(0), ThreadPool::kDefaultSpin,
                    std::chrono::microseconds(1000000)}) {
    {
      ThreadPool idle(4, spin);  // never used: workers polling or asleep from the start
    }
    ThreadPool pool(4, spin);
    RunAndCheck(pool, 100, 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    RunAndCheck(pool, 100, 1);
  }  // destructors return (a hang would time the test out)
}

}  // namespace
}  // namespace bitsplit
