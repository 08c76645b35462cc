#include "common/util/thread_pool.h"

#include <sched.h>

#include <algorithm>

namespace bitsplit {
namespace {
// Chunk `worker` of `workers` over n items, boundaries aligned to grain.
void ChunkBounds(int64_t n, int64_t grain, int workers, int worker, int64_t* begin, int64_t* end) {
  const int64_t blocks = (n + grain - 1) / grain;
  const int64_t per = blocks / workers;
  const int64_t extra = blocks % workers;
  const int64_t first = worker * per + std::min<int64_t>(worker, extra);
  const int64_t count = per + (worker < extra ? 1 : 0);
  *begin = std::min(n, first * grain);
  *end = std::min(n, (first + count) * grain);
}
}  // namespace

std::vector<int> AllowedCpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::thread::hardware_concurrency());
  num_threads_ = std::max(1, num_threads);
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn) {
  ParallelForGrained(n, 1, fn);
}

void ThreadPool::ParallelForGrained(int64_t n, int64_t grain,
                                    const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (num_threads_ == 1 || n <= grain) {
    fn(0, n, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    job_items_ = n;
    job_grain_ = grain;
    pending_ = num_threads_ - 1;
    ++generation_;
  }
  work_ready_.notify_all();
  int64_t begin, end;
  ChunkBounds(n, grain, num_threads_, 0, &begin, &end);
  if (begin < end) fn(begin, end, 0);
  std::unique_lock<std::mutex> lock(mutex_);
  work_done_.wait(lock, [this] { return pending_ == 0; });
  job_ = nullptr;
}

void ThreadPool::WorkerLoop(int worker) {
  uint64_t seen = 0;
  while (true) {
    const std::function<void(int64_t, int64_t, int)>* job;
    int64_t n, grain;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      job = job_;
      n = job_items_;
      grain = job_grain_;
    }
    int64_t begin, end;
    ChunkBounds(n, grain, num_threads_, worker, &begin, &end);
    if (begin < end) (*job)(begin, end, worker);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0) work_done_.notify_one();
    }
  }
}

}  // namespace bitsplit
