#include "services/cpu-residual/worker_pool.h"

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace bitsplit::residual {
namespace {

int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

absl::Status PinCurrentThread(int cpu) {
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

WorkerPool::WorkerPool(int num_threads, std::chrono::nanoseconds spin, std::vector<int> cpus)
    : num_threads_(num_threads < 1 ? 1 : num_threads), spin_(spin), cpus_(std::move(cpus)) {
  for (int i = 1; i < num_threads_; ++i) threads_.emplace_back([this, i] { WorkerLoop(i); });
}

WorkerPool::~WorkerPool() {
  stopping_.store(true, std::memory_order_seq_cst);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  generation_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void WorkerPool::Run(const std::function<void(int)>& fn) {
  if (num_threads_ == 1) {
    fn(0);
    return;
  }
  job_ = &fn;
  remaining_.store(num_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  generation_.notify_all();
  fn(0);
  while (remaining_.load(std::memory_order_acquire) != 0) _mm_pause();
  job_ = nullptr;
}

void WorkerPool::WorkerLoop(int worker) {
  if (!cpus_.empty()) {
    // A failure leaves the thread unpinned; the store reports pinning problems at startup.
    (void)PinCurrentThread(cpus_[static_cast<size_t>(worker) % cpus_.size()]);
  }
  uint32_t seen = 0;  // the value at construction: a job posted before this thread ran counts
  while (true) {
    uint32_t current = generation_.load(std::memory_order_acquire);
    if (current == seen) {
      const int64_t start = NowNanos();
      while (current == seen && NowNanos() - start < spin_.count()) {
        _mm_pause();
        current = generation_.load(std::memory_order_acquire);
      }
      while (current == seen) {
        generation_.wait(seen, std::memory_order_acquire);
        current = generation_.load(std::memory_order_acquire);
      }
    }
    seen = current;
    if (stopping_.load(std::memory_order_acquire)) return;
    (*job_)(worker);
    remaining_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace bitsplit::residual
