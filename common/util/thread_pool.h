#pragma once
// A fixed pool of worker threads that runs one parallel-for at a time.
//
// Work is split statically: item range [0, n) is cut into `num_threads()` contiguous chunks
// and chunk i always goes to worker i. Callers that need bit-reproducible results must make
// each item's computation independent of which chunk it lands in (e.g. split matmuls over
// output columns, never over the reduction dimension).
//
// Thread safety: ParallelFor may be called from one thread at a time (it is not reentrant);
// the pool itself is owned by one engine.
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace bitsplit {

// The CPUs this process may run on (its affinity mask), ascending; empty if it cannot be read.
std::vector<int> AllowedCpus();

class ThreadPool {
 public:
  // num_threads <= 0 means "all hardware threads". The calling thread acts as worker 0.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end, worker) for disjoint chunks covering [0, n); returns when all are done.
  void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn);

  // Like ParallelFor but chunk boundaries are multiples of `grain` (except the last).
  void ParallelForGrained(int64_t n, int64_t grain,
                          const std::function<void(int64_t, int64_t, int)>& fn);

 private:
  void WorkerLoop(int worker);

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  const std::function<void(int64_t, int64_t, int)>* job_ = nullptr;  // guarded by mutex_
  int64_t job_items_ = 0;
  int64_t job_grain_ = 1;
  uint64_t generation_ = 0;  // bumped per job so sleeping workers notice new work
  int pending_ = 0;
  bool stopping_ = false;
};

}  // namespace bitsplit
