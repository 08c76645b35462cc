#pragma once
// Continuous batching of the drafter's Generate streams (docs/design.md §3): one thread runs every
// active generation, an iteration at a time. Each iteration it
//   1. admits the generations that arrived (a session each) and drops the cancelled ones,
//   2. gives every generation its next piece of work under the iteration's limits (PlanIteration:
//      a speculation step with the shape its policy picks, or a chunk of its prompt),
//   3. runs them all through DrafterEngine::Step (one batched draft forward per draft round, one
//      verifier forward),
//   4. emits each generation's tokens on its stream and ends the finished ones (their sessions
//      are closed before their streams end).
// Generations join and leave between iterations. Only this thread calls the engine and the
// residual link, so their forwards need no lock.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "common/model/sampler.h"
#include "common/speculation/session.h"
#include "services/gpu-drafter/drafter_engine.h"
#include "services/gpu-drafter/generate_stream.h"
#include "services/gpu-drafter/residual_link.h"

namespace bitsplit::drafter {

// A validated Generate request (DrafterService checks it).
struct GenerationRequest {
  std::vector<int32_t> prompt;  // at least one token; the last is the first step's root
  int32_t context = 0;          // tokens its session holds, at least the prompt's
  model::SamplingParams sampling;
  int32_t logprobs = 0;    // top alternatives per emitted token
  int32_t max_tokens = 0;  // tokens outside end_tokens, at least 1
  std::unordered_set<int32_t> end_tokens;
  speculation::TreeShape shape;  // every step's, or the adaptive policy's bounds
  bool adaptive = false;
  bool skip_prefix_cache = false;  // prefill the whole prompt even if a cached prefix matches
  // Structured output: what every emitted token must keep possible (null: unconstrained).
  std::shared_ptr<const speculation::TokenConstraint> constraint;
};

struct SchedulerOptions {
  int max_sessions = 4;
  // Prompt rows an iteration prefills, all generations together (the rows of the decoding
  // generations' trees come on top).
  int32_t prefill_rows = 64;
  // Verifier rows of one iteration, all generations together: the rows one residual request
  // carries (cpu-residual's --max-rows must allow it).
  int32_t max_batch_rows = 256;
  // Generations one iteration takes at most (0: every active one). 1 serializes them: one
  // generation's step per forward, in turn.
  int32_t max_batch_generations = 0;
  // Keep finished sessions for the prefixes they hold: a request whose prompt starts with a kept
  // session's tokens takes that session and prefills only the rest. Kept sessions occupy only
  // the session slots (max_sessions) that no generation uses, least recently used evicted first.
  bool prefix_cache = true;
};

// What the scheduler did since it started (GetInfo).
struct SchedulerCounters {
  int64_t iterations = 0;
  int64_t steps = 0;  // prefill chunks and speculation steps; steps / iterations is the batch
  int64_t draft_ns = 0;
  int64_t verify_ns = 0;
  int64_t verify_forwards = 0;
  int64_t verify_rows = 0;
  int64_t prefix_lookups = 0;        // admissions that looked for a cached prefix
  int64_t prefix_hits = 0;           // ... and took one
  int64_t prefix_cached_tokens = 0;  // prompt tokens the hits did not prefill
  int64_t prefix_evictions = 0;      // kept sessions destroyed to make room
};

// Thread safety: every public method may be called from any thread.
class Scheduler {
 public:
  // `engine` and `residual_link` (null: the residual is in process) must outlive the scheduler.
  Scheduler(DrafterEngine& engine, ResidualLink* residual_link, const SchedulerOptions& options);
  ~Scheduler();

  // Queues a generation whose events and end go to `stream`; after Stop it ends the stream at
  // once (UNAVAILABLE).
  void Submit(std::shared_ptr<GenerateStream> stream, GenerationRequest request);
  // Ends every stream (UNAVAILABLE: the drafter is shutting down) and stops the thread.
  void Stop();

  int open_sessions() const { return open_sessions_.load(); }
  // Finished sessions kept for their prefixes.
  int cached_sessions() const { return cached_sessions_.load(); }
  int max_sessions() const { return options_.max_sessions; }
  SchedulerCounters counters() const;
  // The residual service's record and file size, from the link's last attach.
  std::string residual_format() const;
  uint64_t residual_bytes() const;

 private:
  struct Generation;
  struct AdaptivePolicies;

  void Loop();
  void RunIteration(std::vector<std::unique_ptr<Generation>>& active);
  // The iteration's steps, one per generation in `running`.
  std::vector<speculation::SessionStep> TakeWork(std::vector<std::unique_ptr<Generation>>& active,
                                                 std::vector<Generation*>& running);
  void Admit(Generation& generation);
  void Count(std::span<Generation* const> running, std::span<const speculation::SessionStep> steps);
  void Emit(Generation& generation, const speculation::SessionStep& step,
            int32_t batch_generations);
  // Ends the generation's use of its session: kept in the prefix cache, or destroyed.
  void Close(Generation& generation);
  // The kept session whose tokens share the longest prefix with `prompt` (at most all but its
  // last token), removed from the cache and reset to that prefix for a session of `context`
  // tokens; null when none shares a token. Sets `reused` to the prefix's length.
  std::unique_ptr<speculation::SpeculativeSession> TakeCachedPrefix(
      const std::vector<int32_t>& prompt, int64_t context, int64_t& reused);
  // Destroys the least recently used kept sessions until `free_slots` slots are free.
  void EvictFor(int free_slots);
  absl::Status EnsureResidual();
  // The status to report for a failed verifier forward.
  absl::Status ForwardError(const absl::Status& status);

  DrafterEngine& engine_;
  ResidualLink* const residual_link_;
  const SchedulerOptions options_;
  std::atomic<int> open_sessions_{0};
  std::atomic<int> cached_sessions_{0};
  // The prefix cache, most recently used first (scheduler thread only).
  std::list<std::unique_ptr<speculation::SpeculativeSession>> prefix_cache_;

  std::mutex arriving_mutex_;
  std::condition_variable wake_;
  std::vector<std::unique_ptr<Generation>> arriving_ ABSL_GUARDED_BY(arriving_mutex_);
  bool stopping_ ABSL_GUARDED_BY(arriving_mutex_) = false;

  mutable std::mutex counters_mutex_;
  SchedulerCounters counters_ ABSL_GUARDED_BY(counters_mutex_);
  std::string residual_format_ ABSL_GUARDED_BY(counters_mutex_);
  uint64_t residual_bytes_ ABSL_GUARDED_BY(counters_mutex_) = 0;

  std::unique_ptr<AdaptivePolicies> policies_;  // the scheduler thread's
  std::thread thread_;
};

}  // namespace bitsplit::drafter
