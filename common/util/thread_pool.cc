#include "common/util/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

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

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
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

absl::Status PinCurrentThread(int cpu) {
  if (cpu < 0 || cpu >= CPU_SETSIZE) {
    return absl::InvalidArgumentError(absl::StrCat("CPU ", cpu, " is out of range"));
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  const int error = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  if (error != 0) {
    return absl::InternalError(
        absl::StrCat("pinning a thread to CPU ", cpu, " failed: ", std::strerror(error)));
  }
  return absl::OkStatus();
}

ThreadPool::ThreadPool(int num_threads, std::chrono::nanoseconds spin, std::vector<int> cpus)
    : cpus_(std::move(cpus)) {
  SetSpin(spin);
  if (num_threads <= 0) num_threads = static_cast<int>(std::thread::hardware_concurrency());
  num_threads_ = std::max(1, num_threads);
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  stopping_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::SetSpin(std::chrono::nanoseconds spin) {
  spin_ns_.store(std::max<int64_t>(0, spin.count()), std::memory_order_relaxed);
}

void ThreadPool::SetYieldSpin(std::chrono::nanoseconds yield_spin) {
  yield_spin_ns_.store(std::max<int64_t>(0, yield_spin.count()), std::memory_order_relaxed);
}

template <typename Word>
Word ThreadPool::WaitWhileEqual(const std::atomic<Word>& word, Word old) const {
  Word now = word.load(std::memory_order_acquire);
  if (now != old) return now;
  const std::chrono::nanoseconds spin(spin_ns_.load(std::memory_order_relaxed));
  const std::chrono::nanoseconds yield_spin(yield_spin_ns_.load(std::memory_order_relaxed));
  if (spin.count() > 0 || yield_spin.count() > 0) {
    const auto start = std::chrono::steady_clock::now();
    for (int polls = 1; now == old && spin.count() > 0; ++polls) {
      CpuRelax();
      now = word.load(std::memory_order_acquire);
      if (polls % 64 == 0 && std::chrono::steady_clock::now() - start > spin) break;
    }
    while (now == old && std::chrono::steady_clock::now() - start < spin + yield_spin) {
      sched_yield();
      now = word.load(std::memory_order_acquire);
    }
  }
  while (now == old) {
    word.wait(old, std::memory_order_acquire);
    now = word.load(std::memory_order_acquire);
  }
  return now;
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
  job_ = &fn;
  job_items_ = n;
  job_grain_ = grain;
  pending_.store(num_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);  // publishes the job
  generation_.notify_all();                             // a syscall only when a worker sleeps
  int64_t begin, end;
  ChunkBounds(n, grain, num_threads_, 0, &begin, &end);
  if (begin < end) fn(begin, end, 0);
  for (int32_t left = pending_.load(std::memory_order_acquire); left != 0;) {
    left = WaitWhileEqual(pending_, left);
  }
}

void ThreadPool::RunOnEveryWorker(const std::function<void(int)>& fn) {
  // One item per worker: ChunkBounds gives worker w exactly item w.
  ParallelForGrained(num_threads_, 1, [&](int64_t, int64_t, int worker) { fn(worker); });
}

void ThreadPool::WorkerLoop(int worker) {
  // A failed pin leaves the thread unpinned; callers that pin check the CPUs up front.
  if (!cpus_.empty()) (void)PinCurrentThread(cpus_[static_cast<size_t>(worker) % cpus_.size()]);
  uint32_t seen = 0;  // the value at construction: a job posted before this thread ran counts
  while (true) {
    seen = WaitWhileEqual(generation_, seen);
    if (stopping_.load(std::memory_order_acquire)) return;
    int64_t begin, end;
    ChunkBounds(job_items_, job_grain_, num_threads_, worker, &begin, &end);
    if (begin < end) (*job_)(begin, end, worker);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

}  // namespace bitsplit
