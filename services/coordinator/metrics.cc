#include "services/coordinator/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace bitsplit::coordinator {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration duration) { return std::chrono::duration<double>(duration).count(); }

// Prometheus' text format: a sample value (integers exactly, others as the shortest text that
// reads back as the same double).
std::string Value(double value) {
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (std::isnan(value)) return "NaN";
  char buffer[32];
  const std::to_chars_result written = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, written.ptr);
}
std::string Value(uint64_t value) { return absl::StrCat(value); }
std::string Value(int64_t value) { return absl::StrCat(value); }

std::string EscapeLabel(absl::string_view value) {
  return absl::StrReplaceAll(value, {{"\\", "\\\\"}, {"\"", "\\\""}, {"\n", "\\n"}});
}

void Header(std::string& out, absl::string_view name, absl::string_view type,
            absl::string_view help) {
  absl::StrAppend(&out, "# HELP ", name, " ",
                  absl::StrReplaceAll(help, {{"\\", "\\\\"}, {"\n", "\\n"}}), "\n# TYPE ", name,
                  " ", type, "\n");
}

template <typename T>
void Sample(std::string& out, absl::string_view name, T value, absl::string_view labels = "") {
  absl::StrAppend(&out, name, labels.empty() ? "" : "{", labels, labels.empty() ? "" : "}", " ",
                  Value(value), "\n");
}

template <typename T>
void Single(std::string& out, absl::string_view name, absl::string_view type,
            absl::string_view help, T value) {
  Header(out, name, type, help);
  Sample(out, name, value);
}

// Bucket bounds in seconds. Time to first token and request latency as vLLM's, inter-token
// latency from 1 ms: a speculation step spreads its interval over several tokens.
std::vector<double> TimeToFirstTokenBounds() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,  0.75,
          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160., 640., 2560.0};
}
std::vector<double> InterTokenBounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,
          0.4,   0.5,    0.75,  1.0,  2.5,   5.0,  7.5,   10., 20.0, 40.0, 80.0};
}
std::vector<double> RequestLatencyBounds() {
  return {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,  10.0, 15.0, 20.0,
          30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960., 1920, 7680};
}

}  // namespace

std::string ApiName(Api api) { return api == Api::kGrpc ? "grpc" : "http"; }

std::string OutcomeLabel(const absl::StatusOr<v1::GenerateComplete>& result) {
  if (!result.ok()) return absl::AsciiStrToLower(absl::StatusCodeToString(result.status().code()));
  switch (result->finish_reason()) {
    case v1::FINISH_REASON_EOS:
      return "eos";
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_CANCELLED:
      return "cancelled";
    default:
      return "unspecified";
  }
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)), counts_(upper_bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  const size_t bucket = static_cast<size_t>(
      std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) - upper_bounds_.begin());
  std::lock_guard lock(mutex_);
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

uint64_t Histogram::count() const {
  std::lock_guard lock(mutex_);
  return count_;
}

void Histogram::Render(std::string_view name, std::string_view help, std::string& out) const {
  const absl::string_view family(name.data(), name.size());
  std::vector<uint64_t> counts;
  double sum = 0.0;
  uint64_t count = 0;
  {
    std::lock_guard lock(mutex_);
    counts = counts_;
    sum = sum_;
    count = count_;
  }
  Header(out, family, "histogram", absl::string_view(help.data(), help.size()));
  const std::string bucket = absl::StrCat(family, "_bucket");
  uint64_t cumulative = 0;
  for (size_t i = 0; i < upper_bounds_.size(); ++i) {
    cumulative += counts[i];
    Sample(out, bucket, cumulative, absl::StrCat("le=\"", Value(upper_bounds_[i]), "\""));
  }
  cumulative += counts.back();
  Sample(out, bucket, cumulative, "le=\"+Inf\"");
  Sample(out, absl::StrCat(family, "_sum"), sum);
  Sample(out, absl::StrCat(family, "_count"), count);
}

CoordinatorMetrics::CoordinatorMetrics()
    : time_to_first_token_(TimeToFirstTokenBounds()),
      inter_token_latency_(InterTokenBounds()),
      request_latency_(RequestLatencyBounds()),
      queue_time_(TimeToFirstTokenBounds()) {}

void CoordinatorMetrics::RecordOutcome(Api api, const std::string& outcome) {
  std::lock_guard lock(mutex_);
  ++requests_[{ApiName(api), outcome}];
}

void CoordinatorMetrics::RecordRefused(Api api, const absl::Status& status) {
  RecordOutcome(api, OutcomeLabel(status));
}

std::unique_ptr<RequestRecorder> CoordinatorMetrics::StartRequest(Api api, int64_t prompt_tokens,
                                                                  Clock::time_point arrival) {
  {
    std::lock_guard lock(mutex_);
    prompt_tokens_ += static_cast<uint64_t>(prompt_tokens);
  }
  return std::make_unique<RequestRecorder>(*this, api, arrival);
}

RequestRecorder::RequestRecorder(CoordinatorMetrics& metrics, Api api, Clock::time_point arrival)
    : metrics_(metrics), api_(api), arrival_(arrival) {}

void RequestRecorder::QueueLeft(Clock::time_point now) {
  metrics_.queue_time_.Observe(Seconds(now - arrival_));
}

void RequestRecorder::Step(const internal::v1::StepReport& step) {
  std::lock_guard lock(metrics_.mutex_);
  ++metrics_.verify_steps_;
  const int32_t drafted = step.tree_nodes() - 1;
  if (drafted <= 0) return;  // a step without a draft (off)
  ++metrics_.drafts_;
  metrics_.draft_tokens_ += static_cast<uint64_t>(drafted);
  metrics_.accepted_tokens_ += static_cast<uint64_t>(step.accepted_depth());
  if (metrics_.accepted_per_position_.size() < static_cast<size_t>(step.accepted_depth())) {
    metrics_.accepted_per_position_.resize(step.accepted_depth(), 0);
  }
  for (int32_t d = 0; d < step.accepted_depth(); ++d) ++metrics_.accepted_per_position_[d];
}

void RequestRecorder::ChunkSent(int tokens, bool has_text, Clock::time_point now) {
  if (tokens <= 0 && !has_text) return;
  if (!first_chunk_) {
    first_chunk_ = now;
    metrics_.time_to_first_token_.Observe(Seconds(now - arrival_));
  }
  if (tokens <= 0) return;
  {
    std::lock_guard lock(metrics_.mutex_);
    metrics_.generation_tokens_ += static_cast<uint64_t>(tokens);
  }
  if (!last_token_chunk_) {
    for (int i = 1; i < tokens; ++i) metrics_.inter_token_latency_.Observe(0.0);
  } else {
    const double each = Seconds(now - *last_token_chunk_) / tokens;
    for (int i = 0; i < tokens; ++i) metrics_.inter_token_latency_.Observe(each);
  }
  last_token_chunk_ = now;
}

void RequestRecorder::Finished(const absl::StatusOr<v1::GenerateComplete>& result,
                               Clock::time_point now) {
  metrics_.request_latency_.Observe(Seconds(now - arrival_));
  metrics_.RecordOutcome(api_, OutcomeLabel(result));
}

std::string CoordinatorMetrics::Render(
    const QueueFigures& queue, const absl::StatusOr<internal::v1::DrafterInfo>& drafter) const {
  std::string out;
  {
    std::lock_guard lock(mutex_);
    Header(out, "bitsplit:requests_total", "counter",
           "Requests that ended, by API (grpc, http) and outcome (eos, stop, length: finished; a "
           "status code name: failed or refused).");
    for (const auto& [key, count] : requests_) {
      Sample(out, "bitsplit:requests_total", count,
             absl::StrCat("api=\"", EscapeLabel(key.first), "\",outcome=\"",
                          EscapeLabel(key.second), "\""));
    }
    Single(out, "bitsplit:prompt_tokens_total", "counter",
           "Prompt tokens of the requests that ran.", prompt_tokens_);
    Single(out, "bitsplit:generation_tokens_total", "counter",
           "Generated tokens sent to clients (what usage.completion_tokens counts).",
           generation_tokens_);
    Single(out, "bitsplit:verify_steps_total", "counter",
           "Verifier forwards of the requests (speculation steps; one per token when off).",
           verify_steps_);
    Single(out, "bitsplit:spec_decode_num_drafts_total", "counter",
           "Speculation steps that verified a draft tree.", drafts_);
    Single(out, "bitsplit:spec_decode_num_draft_tokens_total", "counter",
           "Draft tokens (tree nodes beyond the root) verified.", draft_tokens_);
    Single(out, "bitsplit:spec_decode_num_accepted_tokens_total", "counter",
           "Draft tokens accepted (the bonus token not counted).", accepted_tokens_);
    Header(out, "bitsplit:spec_decode_num_accepted_tokens_per_pos_total", "counter",
           "Draft tokens accepted at each tree depth (position 0: depth 1).");
    for (size_t d = 0; d < accepted_per_position_.size(); ++d) {
      Sample(out, "bitsplit:spec_decode_num_accepted_tokens_per_pos_total",
             accepted_per_position_[d], absl::StrCat("position=\"", d, "\""));
    }
  }
  time_to_first_token_.Render("bitsplit:time_to_first_token_seconds",
                              "Time from a request's arrival to its first text, queue included.",
                              out);
  inter_token_latency_.Render(
      "bitsplit:inter_token_latency_seconds",
      "Time between tokens sent to a client; a chunk's interval is shared evenly by its tokens.",
      out);
  request_latency_.Render("bitsplit:e2e_request_latency_seconds",
                          "Time from a request's arrival to its end.", out);
  queue_time_.Render("bitsplit:request_queue_time_seconds", "Time a request waited for a worker.",
                     out);
  Single(out, "bitsplit:num_requests_running", "gauge", "Requests generating now.",
         static_cast<int64_t>(queue.running));
  Single(out, "bitsplit:num_requests_waiting", "gauge", "Requests queued for a worker.",
         static_cast<int64_t>(queue.waiting));
  Single(out, "bitsplit:max_active_requests", "gauge", "Requests that may generate at once.",
         static_cast<int64_t>(queue.max_active));
  Single(out, "bitsplit:max_queued_requests", "gauge",
         "Requests that may wait beyond those (more are refused).",
         static_cast<int64_t>(queue.max_queue));

  Single(out, "bitsplit:drafter_up", "gauge", "1 when the drafter answered this scrape's GetInfo.",
         static_cast<int64_t>(drafter.ok() ? 1 : 0));
  if (!drafter.ok()) return out;
  const internal::v1::DrafterInfo& info = *drafter;
  Single(out, "bitsplit:drafter_open_sessions", "gauge", "Sessions open in the drafter.",
         static_cast<int64_t>(info.open_sessions()));
  Single(out, "bitsplit:drafter_max_sessions", "gauge", "Sessions the drafter can hold.",
         static_cast<int64_t>(info.max_sessions()));
  Single(out, "bitsplit:drafter_scheduler_iterations_total", "counter",
         "Batched iterations of the drafter's scheduler.", info.scheduler_iterations());
  Single(out, "bitsplit:drafter_scheduler_steps_total", "counter",
         "Generation steps (prefill chunks and speculation steps) in those iterations.",
         info.scheduler_steps());
  Single(out, "bitsplit:drafter_draft_seconds_total", "counter",
         "Time in the scheduler's batched draft forwards.", info.draft_ns_total() * 1e-9);
  Single(out, "bitsplit:drafter_verify_seconds_total", "counter",
         "Time in the scheduler's batched verifier forwards (base + residual).",
         info.verify_ns_total() * 1e-9);
  Single(out, "bitsplit:drafter_verify_forwards_total", "counter", "Batched verifier forwards.",
         info.verify_forwards());
  Single(out, "bitsplit:drafter_verify_rows_total", "counter",
         "Rows (tree nodes and prompt tokens, every session's) in those forwards.",
         info.verify_rows());
  Single(out, "bitsplit:drafter_prefix_cache_sessions", "gauge",
         "Finished sessions the drafter keeps for the prompt prefixes they hold.",
         static_cast<int64_t>(info.cached_sessions()));
  Single(out, "bitsplit:drafter_prefix_cache_lookups_total", "counter",
         "Requests that looked for a cached prompt prefix.", info.prefix_lookups());
  Single(out, "bitsplit:drafter_prefix_cache_hits_total", "counter",
         "Requests that reused a cached prompt prefix.", info.prefix_hits());
  Single(out, "bitsplit:drafter_prefix_cache_hit_ratio", "gauge",
         "Hits over lookups since the drafter started (0 before the first lookup).",
         info.prefix_lookups() > 0
             ? static_cast<double>(info.prefix_hits()) / static_cast<double>(info.prefix_lookups())
             : 0.0);
  Single(out, "bitsplit:drafter_prefix_cache_tokens_total", "counter",
         "Prompt tokens whose KV rows came from the prefix cache instead of a prefill.",
         info.prefix_cached_tokens());
  Single(out, "bitsplit:drafter_prefix_cache_evictions_total", "counter",
         "Kept sessions destroyed to make room for new ones.", info.prefix_evictions());
  Single(out, "bitsplit:residual_up", "gauge",
         "1 when cpu-residual answered the drafter for this scrape.",
         static_cast<int64_t>(info.has_residual_stats() ? 1 : 0));
  if (!info.has_residual_stats()) return out;
  const internal::v1::ResidualStats& residual = info.residual_stats();
  Single(out, "bitsplit:residual_requests_total", "counter",
         "Batched residual matmuls (one linear group of one layer) cpu-residual computed.",
         residual.requests_served());
  Single(out, "bitsplit:residual_rows_total", "counter", "Activation rows in those matmuls.",
         residual.rows_served());
  Single(out, "bitsplit:residual_read_bytes_total", "counter",
         "Residual weight bytes those matmuls read.", residual.weight_bytes_read());
  Single(out, "bitsplit:residual_compute_seconds_total", "counter", "cpu-residual's kernel time.",
         residual.compute_ns() * 1e-9);
  Single(out, "bitsplit:residual_weight_bytes", "gauge",
         "Bytes of all residual matrices (what one full verify pass reads).",
         residual.weight_bytes());
  Single(out, "bitsplit:residual_attached_clients", "gauge",
         "Shared-memory channels attached to cpu-residual.",
         static_cast<int64_t>(residual.attached_clients()));
  return out;
}

}  // namespace bitsplit::coordinator
