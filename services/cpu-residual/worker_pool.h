#pragma once
// A low-latency fork-join pool for the residual kernels: workers spin for a while after each job
// (a verify step issues its requests microseconds apart) and then sleep on the job counter.
// The calling thread is worker 0. Workers may be pinned to CPUs.
//
// Thread safety: Run is called by one thread at a time (the store serializes it).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/status/status.h"

namespace bitsplit::residual {

// Pins the calling thread to `cpu`.
absl::Status PinCurrentThread(int cpu);

class WorkerPool {
 public:
  // `cpus` empty: no pinning; else worker i runs on cpus[i % size] (worker 0, the caller, pins
  // itself through PinCurrentThread).
  WorkerPool(int num_threads, std::chrono::nanoseconds spin, std::vector<int> cpus);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int num_threads() const { return num_threads_; }
  // Calls fn(worker) once for every worker 0..num_threads-1 and returns when all are done.
  void Run(const std::function<void(int)>& fn);

 private:
  void WorkerLoop(int worker);

  const int num_threads_;
  const std::chrono::nanoseconds spin_;
  std::vector<int> cpus_;
  std::vector<std::thread> threads_;
  const std::function<void(int)>* job_ = nullptr;  // published by generation_ (release)
  std::atomic<uint32_t> generation_{0};
  std::atomic<int> remaining_{0};
  std::atomic<bool> stopping_{false};
};

}  // namespace bitsplit::residual
