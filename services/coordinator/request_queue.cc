#include "services/coordinator/request_queue.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace bitsplit::coordinator {

RequestQueue::RequestQueue(int max_active, int max_queue, GenerationEnvironment environment,
                           CoordinatorMetrics& metrics)
    : max_active_(std::max(1, max_active)),
      max_queue_(std::max(0, max_queue)),
      environment_(environment),
      metrics_(metrics) {
  for (int i = 0; i < max_active_; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

RequestQueue::~RequestQueue() {
  for (GenerationJob* job : Shutdown()) {
    job->Finish(absl::UnavailableError("the coordinator is shutting down"));
  }
  for (std::thread& worker : workers_) worker.join();
}

absl::Status RequestQueue::Submit(GenerationJob* job) {
  absl::Status refusal;
  {
    std::lock_guard lock(mutex_);
    const size_t capacity = static_cast<size_t>(max_active_ + max_queue_);
    if (shutting_down_) {
      refusal = absl::UnavailableError("the coordinator is shutting down");
    } else if (queue_.size() + running_.size() >= capacity) {
      spdlog::warn("refused a request: {} running and {} queued (--max-active {}, --max-queue {})",
                   running_.size(), queue_.size(), max_active_, max_queue_);
      refusal = absl::ResourceExhaustedError(
          absl::StrFormat("the server is busy: %d requests running and %d queued; retry later",
                          running_.size(), queue_.size()));
    } else {
      queue_.push_back(job);
    }
  }
  if (!refusal.ok()) {
    metrics_.RecordRefused(job->api(), refusal);
    return refusal;
  }
  work_available_.notify_one();
  return absl::OkStatus();
}

bool RequestQueue::Withdraw(GenerationJob* job) {
  {
    std::lock_guard lock(mutex_);
    auto it = std::find(queue_.begin(), queue_.end(), job);
    if (it == queue_.end()) return false;
    queue_.erase(it);
  }
  spdlog::debug("a queued request was cancelled by its client");
  metrics_.RecordRefused(job->api(), absl::CancelledError(""));
  return true;
}

std::vector<GenerationJob*> RequestQueue::Shutdown() {
  std::vector<GenerationJob*> queued;
  {
    std::lock_guard lock(mutex_);
    shutting_down_ = true;
    queued.assign(queue_.begin(), queue_.end());
    queue_.clear();
    // A running job stays alive while it is in running_ (its worker removes it before Finish,
    // under this lock).
    for (GenerationJob* job : running_) job->RequestStop();
  }
  work_available_.notify_all();
  for (GenerationJob* job : queued) {
    metrics_.RecordRefused(job->api(), absl::UnavailableError(""));
  }
  return queued;
}

absl::Status RequestQueue::CheckCapacity(int drafter_open_sessions, int drafter_max_sessions) {
  std::lock_guard lock(mutex_);
  if (shutting_down_) return absl::UnavailableError("shutting down");
  const size_t capacity = static_cast<size_t>(max_active_ + max_queue_);
  if (queue_.size() + running_.size() >= capacity) {
    return absl::ResourceExhaustedError(absl::StrFormat("the queue is full (%d running, %d queued)",
                                                        running_.size(), queue_.size()));
  }
  // Sessions this coordinator holds come back when its requests finish; sessions held by others
  // (another coordinator) may not.
  if (drafter_open_sessions >= drafter_max_sessions && running_.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("all %d drafter sessions are held by other clients", drafter_max_sessions));
  }
  return absl::OkStatus();
}

QueueCounts RequestQueue::counts() const {
  std::lock_guard lock(mutex_);
  return {.running = static_cast<int>(running_.size()), .waiting = static_cast<int>(queue_.size())};
}

void RequestQueue::WorkerLoop() {
  while (true) {
    GenerationJob* job = nullptr;
    {
      std::unique_lock lock(mutex_);
      work_available_.wait(lock, [this] { return shutting_down_ || !queue_.empty(); });
      if (queue_.empty()) return;  // shutting down
      job = queue_.front();
      queue_.pop_front();
      running_.push_back(job);
    }
    RunOne(job);
  }
}

void RequestQueue::RunOne(GenerationJob* job) {
  std::unique_ptr<RequestRecorder> recorder = metrics_.StartRequest(
      job->api(), static_cast<int64_t>(job->plan().prompt_tokens.size()), job->arrival());
  recorder->QueueLeft(std::chrono::steady_clock::now());
  absl::StatusOr<v1::GenerateComplete> result =
      RunGeneration(job->plan(), environment_, *job, job->arrival(), recorder.get());
  if (!result.ok() && absl::IsCancelled(result.status()) && job->stop_requested()) {
    result = absl::UnavailableError("the coordinator is shutting down");
  }
  if (!result.ok()) {
    if (absl::IsCancelled(result.status())) {
      spdlog::debug("generation cancelled: {}", result.status().ToString());
    } else {
      spdlog::warn("generation failed: {}", result.status().ToString());
    }
  }
  recorder->Finished(result, std::chrono::steady_clock::now());
  {
    std::lock_guard lock(mutex_);
    running_.erase(std::find(running_.begin(), running_.end(), job));
  }
  job->Finish(std::move(result));
}

}  // namespace bitsplit::coordinator
