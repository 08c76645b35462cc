#pragma once
// The coordinator's Prometheus metrics (GET /metrics on the HTTP listener): requests by API and
// outcome, prompt and generated tokens, time to first token, inter-token latency and request
// latency histograms, the queue, the speculation counters under the names vLLM and llama-server
// users know (spec_decode_num_drafts, spec_decode_num_draft_tokens,
// spec_decode_num_accepted_tokens, spec_decode_num_accepted_tokens_per_pos), and the drafter's
// and cpu-residual's own figures from the drafter's GetInfo. Names carry the "bitsplit:" prefix
// as vLLM's carry "vllm:"; counters end in _total. Text exposition format 0.0.4.
//
// Both front ends feed the same figures: they share the RequestQueue that records them.
//
// Thread safety: every method may be called from any thread.
#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bitsplit/internal/v1/drafter.pb.h"
#include "bitsplit/v1/generation.pb.h"

namespace bitsplit::coordinator {

// The front end a request came through: the requests_total{api} label.
enum class Api { kGrpc, kHttp };
std::string ApiName(Api api);  // "grpc", "http"

// A cumulative histogram with fixed upper bounds (seconds), as Prometheus reads it.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double value);
  // "# HELP", "# TYPE" and the _bucket{le=...}, _sum and _count lines.
  void Render(std::string_view name, std::string_view help, std::string& out) const;
  uint64_t count() const;

 private:
  const std::vector<double> upper_bounds_;
  mutable std::mutex mutex_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mutex_);  // one per bound, then +Inf
  double sum_ ABSL_GUARDED_BY(mutex_) = 0.0;
  uint64_t count_ ABSL_GUARDED_BY(mutex_) = 0;
};

// What one running request reports to the metrics, as it happens.
class RequestRecorder;

// The queue's figures at the moment of a scrape.
struct QueueFigures {
  int running = 0;
  int waiting = 0;
  int max_active = 0;
  int max_queue = 0;
};

class CoordinatorMetrics {
 public:
  CoordinatorMetrics();

  // A request refused before it ran (invalid, queue full, shutting down).
  void RecordRefused(Api api, const absl::Status& status);
  // A request a worker starts running; the recorder reports its steps and chunks.
  std::unique_ptr<RequestRecorder> StartRequest(Api api, int64_t prompt_tokens,
                                                std::chrono::steady_clock::time_point arrival);

  // The exposition text. `drafter`: the drafter's GetInfo answer, or why it could not be had
  // (then bitsplit:drafter_up is 0 and the drafter's figures are left out).
  std::string Render(const QueueFigures& queue,
                     const absl::StatusOr<internal::v1::DrafterInfo>& drafter) const;

 private:
  friend class RequestRecorder;
  void RecordOutcome(Api api, const std::string& outcome);

  mutable std::mutex mutex_;
  std::map<std::pair<std::string, std::string>, uint64_t> requests_ ABSL_GUARDED_BY(mutex_);
  uint64_t prompt_tokens_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t generation_tokens_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t verify_steps_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t drafts_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t draft_tokens_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t accepted_tokens_ ABSL_GUARDED_BY(mutex_) = 0;
  std::vector<uint64_t> accepted_per_position_ ABSL_GUARDED_BY(mutex_);  // index: depth - 1
  Histogram time_to_first_token_;
  Histogram inter_token_latency_;
  Histogram request_latency_;
  Histogram queue_time_;
};

// Reports one request: its speculation steps, the chunks sent to its client (time to first
// token, inter-token latency, generated tokens) and its end. Used by the request's worker only.
//
// Inter-token latency is observed once per token after the request's first: the time since the
// previous chunk divided evenly among a chunk's tokens (a speculation step sends several at
// once), 0 for the further tokens of the first chunk. So its count is the tokens sent minus one
// per request, and its mean is (last chunk - first chunk) / (tokens - 1), the usual definition.
class RequestRecorder {
 public:
  RequestRecorder(CoordinatorMetrics& metrics, Api api,
                  std::chrono::steady_clock::time_point arrival);
  void QueueLeft(std::chrono::steady_clock::time_point now);
  void Step(const internal::v1::StepReport& step);
  void ChunkSent(int tokens, bool has_text, std::chrono::steady_clock::time_point now);
  void Finished(const absl::StatusOr<v1::GenerateComplete>& result,
                std::chrono::steady_clock::time_point now);

 private:
  CoordinatorMetrics& metrics_;
  const Api api_;
  const std::chrono::steady_clock::time_point arrival_;
  std::optional<std::chrono::steady_clock::time_point> first_chunk_;
  std::optional<std::chrono::steady_clock::time_point> last_token_chunk_;
  bool first_token_seen_ = false;
};

// The outcome label of a request's end: the finish reason ("eos", "stop", "length") or the
// status code's name in lower case ("cancelled", "invalid_argument", "unavailable", ...).
std::string OutcomeLabel(const absl::StatusOr<v1::GenerateComplete>& result);

}  // namespace bitsplit::coordinator
