// ThreadPool: an idle worker polling between sched_yield calls leaves its CPU to a thread that
// wants it, where a busy-polling worker takes half of it. The test measures CPU shares, so
// CTest runs it alone (RUN_SERIAL in tests/CMakeLists.txt): beside another CPU-heavy test its
// shares measure that test's load.
#include <gtest/gtest.h>
#include <sched.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/util/thread_pool.h"

namespace bitsplit {
namespace {

// Pins a fresh thread to `cpu` and returns how that went: the calling thread is left alone.
absl::Status PinAThread(int cpu) {
  absl::Status status;
  std::thread probe([&] { status = PinCurrentThread(cpu); });
  probe.join();
  return status;
}

// CPU time a thread pinned to `cpu` gets while it busy-loops for `wall`, as a fraction of it.
// An unpinned thread would measure some other CPU, so a failed pin fails the test.
double CpuShareOfABusyThread(int cpu, std::chrono::milliseconds wall) {
  double share = 0;
  std::thread busy([&] {
    const absl::Status pinned = PinCurrentThread(cpu);
    if (!pinned.ok()) {
      ADD_FAILURE() << pinned;
      return;
    }
    auto cpu_seconds = [] {
      timespec t;
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
      return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
    };
    const double cpu_start = cpu_seconds();
    const auto start = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - start < wall) {
    }
    share = (cpu_seconds() - cpu_start) /
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
  busy.join();
  return share;
}

struct Shares {
  double baseline;       // beside no worker
  double beside_worker;  // beside an idle worker pinned to the same CPU
};

// The busy thread's CPU share beside no worker, then beside an idle worker of a pool whose
// workers poll for `spin` and then between yields for `yield_spin`.
Shares MeasureShares(int cpu, std::chrono::nanoseconds spin, std::chrono::nanoseconds yield_spin) {
  constexpr std::chrono::milliseconds kWall(200);
  Shares shares{};
  shares.baseline = CpuShareOfABusyThread(cpu, kWall);
  ThreadPool pool(2, spin, {cpu});
  pool.SetYieldSpin(yield_spin);
  std::atomic<int> items{0};
  std::atomic<int> worker_cpu{-1};
  pool.ParallelFor(2, [&](int64_t begin, int64_t end, int worker) {  // worker 1 now waits idle
    items.fetch_add(static_cast<int>(end - begin));
    if (worker == 1) worker_cpu.store(sched_getcpu());
  });
  EXPECT_EQ(items.load(), 2);
  // The pool ignores a failed pin; a worker elsewhere would leave `cpu` to the busy thread
  // whatever it polls, and the busy-polling case would fail for the wrong reason.
  EXPECT_EQ(worker_cpu.load(), cpu) << "the pool's worker is not pinned to CPU " << cpu;
  shares.beside_worker = CpuShareOfABusyThread(cpu, kWall);
  return shares;
}

// A fair scheduler shares a CPU between two runnable threads, so beside a busy-polling worker
// the thread gets about half of what it gets alone; beside a worker polling between yields it
// gets about all of it. Each is compared with a baseline taken just before, up to 3 times,
// since other processes may load the same CPU for a while.
TEST(ThreadPoolCpuShareTest, YieldPollingWorkersLeaveTheirCpuBusyPollingOnesDoNot) {
  const std::vector<int> allowed = AllowedCpus();
  ASSERT_FALSE(allowed.empty());
  const int cpu = allowed.back();
  // The CPU is in this process's affinity mask, so only a sandbox that forbids changing thread
  // affinity (seccomp, some container runtimes) refuses the pin; there the shares cannot be
  // measured at all.
  if (const absl::Status pinned = PinAThread(cpu); !pinned.ok()) {
    GTEST_SKIP() << "this environment cannot pin a thread to an allowed CPU: " << pinned;
  }
  constexpr std::chrono::seconds kLongerThanTheTest(10);

  Shares polling{};
  for (int attempt = 0; attempt < 3; ++attempt) {
    polling = MeasureShares(cpu, kLongerThanTheTest, std::chrono::nanoseconds(0));
    if (HasFailure() || polling.beside_worker <= 0.7 * polling.baseline) break;
  }
  // A busy thread always gets some CPU in 200 ms; a zero baseline would make both comparisons
  // below hold trivially.
  EXPECT_GT(polling.baseline, 0.0);
  EXPECT_LE(polling.beside_worker, 0.7 * polling.baseline)
      << "a busy-polling worker should take about half the CPU; baseline share "
      << polling.baseline;

  Shares yielding{};
  for (int attempt = 0; attempt < 3; ++attempt) {
    yielding = MeasureShares(cpu, std::chrono::nanoseconds(0), kLongerThanTheTest);
    if (HasFailure() || yielding.beside_worker >= 0.8 * yielding.baseline) break;
  }
  EXPECT_GT(yielding.baseline, 0.0);
  EXPECT_GE(yielding.beside_worker, 0.8 * yielding.baseline)
      << "baseline share " << yielding.baseline;
}

}  // namespace
}  // namespace bitsplit
