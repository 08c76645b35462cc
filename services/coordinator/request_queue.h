#pragma once
// Admission and the worker pool of the coordinator, shared by its front ends (the gRPC Generate
// stream and the HTTP API): at most `max_active` generations run at once (one worker thread
// each; the drafter batches their steps), up to `max_queue` more wait in FIFO order, and a
// request beyond that is refused at once. Every generation's figures go to the metrics.
//
// Thread safety: every method may be called from any thread.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bitsplit/v1/generation.pb.h"
#include "services/coordinator/drafter_stream.h"
#include "services/coordinator/metrics.h"
#include "services/coordinator/request_validation.h"

namespace bitsplit::coordinator {

// One admitted request, as a front end represents it. The queue calls its methods from the
// worker that runs it (ChunkSink's Send and Cancelled, then Finish) and from the thread that
// shuts the server down (RequestStop).
class GenerationJob : public ChunkSink {
 public:
  virtual const GenerationPlan& plan() const = 0;
  virtual std::chrono::steady_clock::time_point arrival() const = 0;
  virtual Api api() const = 0;
  // Asks the generation to stop at its next step (server shutdown): Cancelled() turns true.
  virtual void RequestStop() = 0;
  virtual bool stop_requested() const = 0;
  // The generation's end: the complete message, or why it failed. Called exactly once, by the
  // worker that ran the job, and the queue's last touch of the job.
  virtual void Finish(absl::StatusOr<v1::GenerateComplete> result) = 0;
};

struct QueueCounts {
  int running = 0;
  int waiting = 0;
};

class RequestQueue {
 public:
  // `environment` (its drafter and tokenizer) and `metrics` must outlive the queue. Starts
  // max(1, max_active) worker threads.
  RequestQueue(int max_active, int max_queue, GenerationEnvironment environment,
               CoordinatorMetrics& metrics);
  // Shuts down and joins the workers.
  ~RequestQueue();
  RequestQueue(const RequestQueue&) = delete;
  RequestQueue& operator=(const RequestQueue&) = delete;

  // Queues `job` (a worker runs it and calls its Finish), or refuses it: RESOURCE_EXHAUSTED
  // when max_active + max_queue requests are in, UNAVAILABLE once shutting down. A refused job
  // is not taken (nothing of it is called; the caller answers its client).
  absl::Status Submit(GenerationJob* job);

  // The client of `job` went away. A queued job leaves the queue and true comes back: it will
  // not run, and the caller finishes it (with CANCELLED). False when it is running (its worker
  // sees Cancelled() at the next step and finishes it) or already done.
  bool Withdraw(GenerationJob* job);

  // Refuses new requests, asks running ones to stop at their next step, and takes the queued
  // ones out: they are returned, not run, for the caller to finish. Idempotent.
  std::vector<GenerationJob*> Shutdown();

  // OK when a request sent now would be taken: not shutting down, the queue has room, and the
  // drafter has a free session or this coordinator holds one that will come free.
  absl::Status CheckCapacity(int drafter_open_sessions, int drafter_max_sessions);

  QueueCounts counts() const;
  int max_active() const { return max_active_; }
  int max_queue() const { return max_queue_; }

 private:
  void WorkerLoop();
  void RunOne(GenerationJob* job);

  const int max_active_;
  const int max_queue_;
  const GenerationEnvironment environment_;
  CoordinatorMetrics& metrics_;

  mutable std::mutex mutex_;
  std::condition_variable work_available_;
  std::deque<GenerationJob*> queue_ ABSL_GUARDED_BY(mutex_);
  std::vector<GenerationJob*> running_ ABSL_GUARDED_BY(mutex_);
  bool shutting_down_ ABSL_GUARDED_BY(mutex_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace bitsplit::coordinator
