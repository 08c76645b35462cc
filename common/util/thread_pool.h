#pragma once
// A fixed pool of worker threads that runs one parallel-for at a time.
//
// Work is split statically: item range [0, n) is cut into `num_threads()` contiguous chunks
// and chunk i always goes to worker i. Callers that need bit-reproducible results must make
// each item's computation independent of which chunk it lands in (e.g. split matmuls over
// output columns, never over the reduction dimension).
//
// Hand-off: a job is published through an atomic generation counter that idle workers poll for
// `spin` after their last job before they sleep on it (futex); the caller waits for the workers
// the same way. A forward pass issues hundreds of parallel-fors microseconds apart, and a
// futex wake-up per call costs 20-60 us on a VM: more than a one-token matmul of a
// 576 x 576 matrix. The bound keeps an idle pool from taking CPU from other processes (the
// residual service on the same cores) for longer than that.
//
// Thread safety: ParallelFor may be called from one thread at a time (it is not reentrant);
// the pool itself is owned by one engine or service.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/status/status.h"

namespace bitsplit {

// The CPUs this process may run on (its affinity mask), ascending; empty if it cannot be read.
std::vector<int> AllowedCpus();

// Pins the calling thread to `cpu`.
absl::Status PinCurrentThread(int cpu);

class ThreadPool {
 public:
  static constexpr std::chrono::microseconds kDefaultSpin{50};

  // num_threads <= 0 means "all hardware threads". The calling thread acts as worker 0.
  // spin: how long idle threads poll before sleeping (0: sleep at once).
  // cpus: empty, or worker i (i >= 1) runs pinned to cpus[i % size]; worker 0 is the caller's
  // thread, which pins itself if it wants (PinCurrentThread). A failed pin leaves the worker
  // unpinned.
  explicit ThreadPool(int num_threads, std::chrono::nanoseconds spin = kDefaultSpin,
                      std::vector<int> cpus = {});
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end, worker) for disjoint chunks covering [0, n); returns when all are done.
  void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn);

  // Like ParallelFor but chunk boundaries are multiples of `grain` (except the last).
  void ParallelForGrained(int64_t n, int64_t grain,
                          const std::function<void(int64_t, int64_t, int)>& fn);

  // Calls fn(worker) once on every worker 0..num_threads-1; returns when all are done.
  void RunOnEveryWorker(const std::function<void(int)>& fn);

  // Changes how long idle threads poll (from their next wait on). Where another process's
  // threads share these CPUs (the residual service beside the drafter on a small machine),
  // polling takes the CPUs its threads need: 0 makes idle workers sleep at once.
  void SetSpin(std::chrono::nanoseconds spin);

  // After the busy poll, how long idle threads keep polling between sched_yield calls before
  // they sleep (default 0). A yielding thread stays runnable, so the next job reaches it without
  // a futex wake-up (20-60 us on a VM), while a thread of another process that wants its CPU
  // gets it at the next yield. For pools whose threads cover every CPU, where busy polling
  // would starve the other processes.
  void SetYieldSpin(std::chrono::nanoseconds yield_spin);

 private:
  void WorkerLoop(int worker);
  // Returns once `word` differs from `old`: polls for spin_, then between yields for
  // yield_spin_, then sleeps on it.
  template <typename Word>
  Word WaitWhileEqual(const std::atomic<Word>& word, Word old) const;

  int num_threads_;
  std::atomic<int64_t> spin_ns_;
  std::atomic<int64_t> yield_spin_ns_{0};
  std::vector<int> cpus_;
  std::vector<std::thread> workers_;
  // The job: written by the caller before generation_ is bumped (release), read by the workers
  // after they see the new generation (acquire). No job starts before the last one's pending_
  // reached 0, so no worker reads these while they change.
  const std::function<void(int64_t, int64_t, int)>* job_ = nullptr;
  int64_t job_items_ = 0;
  int64_t job_grain_ = 1;
  std::atomic<uint32_t> generation_{0};  // bumped per job (and once at shutdown)
  std::atomic<int32_t> pending_{0};      // workers still running the current job
  std::atomic<bool> stopping_{false};
};

}  // namespace bitsplit
