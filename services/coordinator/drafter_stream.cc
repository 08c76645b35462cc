#include "services/coordinator/drafter_stream.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/speculation/policy.h"
#include "common/speculation/tree.h"
#include "common/text/stop_matcher.h"
#include "common/text/streaming_detokenizer.h"
#include "common/util/status_macros.h"
#include "spdlog/spdlog.h"

namespace bitsplit::coordinator {
namespace {

namespace internal_v1 = bitsplit::internal::v1;
using Clock = std::chrono::steady_clock;

int64_t NanosBetween(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(to - from).count();
}

// What a client is told when the drafter (or cpu-residual behind it) fails: what it can act on,
// not socket paths or flag names; the detail goes to the log for the operator.
absl::Status DrafterError(const absl::Status& status) {
  spdlog::warn("drafter: {}", status.ToString());
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) {
    return absl::UnavailableError("the model backend is unavailable; retry shortly");
  }
  if (absl::IsResourceExhausted(status)) {
    return absl::ResourceExhaustedError("the server is at capacity; retry shortly");
  }
  if (absl::IsCancelled(status)) return status;
  return absl::InternalError("the model backend failed (the server log has the detail)");
}

// Per-request speculation statistics (SpeculationStats).
class StepStats {
 public:
  void Record(int32_t tree_depth, int32_t accepted_depth, int32_t tokens) {
    ++verify_steps_;
    yielded_tokens_ += tokens;
    if (static_cast<int32_t>(offered_.size()) < tree_depth) {
      offered_.resize(tree_depth, 0);
      reached_.resize(tree_depth, 0);
    }
    for (int32_t d = 1; d <= tree_depth; ++d) {
      ++offered_[d - 1];
      if (d <= accepted_depth) ++reached_[d - 1];
    }
  }
  void Fill(v1::SpeculationStats& stats) const {
    stats.set_verify_steps(verify_steps_);
    stats.set_mean_accepted_per_verify(
        verify_steps_ > 0 ? static_cast<double>(yielded_tokens_) / verify_steps_ : 0.0);
    for (size_t d = 0; d < offered_.size(); ++d) {
      stats.add_acceptance_by_depth(static_cast<double>(reached_[d]) / offered_[d]);
    }
  }

 private:
  int32_t verify_steps_ = 0;
  int64_t yielded_tokens_ = 0;    // tokens each verify step produced (the bonus token included)
  std::vector<int64_t> offered_;  // index d-1: steps whose tree reached depth d
  std::vector<int64_t> reached_;  // index d-1: steps whose accepted path reached depth d
};

// Turns the tokens a step yields into the step's chunk and decides when generation ends.
//
// A token is emitted (its id, log-probabilities and count) once its text has been emitted: the
// stop matcher holds text back, and the token ids wait with it. When a stop string completes,
// the tokens whose text starts before the cut are emitted and the rest (the stop string's own
// tokens) are not, so token_ids and usage describe exactly the text the client received.
class TokenEmitter {
 public:
  TokenEmitter(const GenerationPlan& plan, const text::Tokenizer& tokenizer)
      : plan_(plan),
        tokenizer_(tokenizer),
        stop_ids_(plan.stop_token_ids.begin(), plan.stop_token_ids.end()),
        detokenizer_(tokenizer, /*render_special=*/false, plan.render_token_ids),
        stop_matcher_(plan.stop_strings) {}

  // Adds one token to `chunk` (or ends generation). `choice` carries its log-probabilities.
  absl::Status Add(int32_t token, const internal_v1::NodeChoice& choice, v1::GenerateChunk& chunk) {
    if (tokenizer_.IsEndOfGeneration(token)) return Finish(v1::FINISH_REASON_EOS, chunk);
    if (stop_ids_.contains(token)) return Finish(v1::FINISH_REASON_STOP, chunk);
    ++generated_tokens_;
    Pending pending;
    pending.token = token;
    pending.text_begin = decoded_bytes_;
    if (plan_.logprobs > 0) {
      pending.logprob.set_token_id(token);
      pending.logprob.set_logprob(choice.logprob());
      pending.logprob.mutable_top_ids()->CopyFrom(choice.top_ids());
      pending.logprob.mutable_top_logprobs()->CopyFrom(choice.top_logprobs());
    }
    BITSPLIT_ASSIGN_OR_RETURN(const std::string piece, detokenizer_.Push(token));
    decoded_bytes_ += piece.size();
    pending.text_end = decoded_bytes_;
    pending_.push_back(std::move(pending));
    EmitText(stop_matcher_.Push(piece), chunk);
    if (stop_matcher_.stopped()) {
      finish_reason_ = v1::FINISH_REASON_STOP;
      ReleaseAtStop(chunk);
      return absl::OkStatus();
    }
    ReleaseEmitted(chunk);
    if (generated_tokens_ >= plan_.max_tokens) return Finish(v1::FINISH_REASON_LENGTH, chunk);
    return absl::OkStatus();
  }

  // Ends generation for a reason other than a stop string: the held-back text is released.
  absl::Status Finish(v1::FinishReason reason, v1::GenerateChunk& chunk) {
    finish_reason_ = reason;
    const std::string tail = detokenizer_.Finish();
    decoded_bytes_ += tail.size();
    if (!pending_.empty()) pending_.back().text_end = decoded_bytes_;
    EmitText(stop_matcher_.Push(tail), chunk);
    if (!stop_matcher_.stopped()) {
      EmitText(stop_matcher_.Flush(), chunk);
      ReleaseEmitted(chunk);
    } else {
      finish_reason_ = v1::FINISH_REASON_STOP;
      ReleaseAtStop(chunk);
    }
    return absl::OkStatus();
  }

  bool finished() const { return finish_reason_ != v1::FINISH_REASON_UNSPECIFIED; }
  v1::FinishReason finish_reason() const { return finish_reason_; }
  int32_t completion_tokens() const { return completion_tokens_; }

 private:
  struct Pending {
    int32_t token = 0;
    size_t text_begin = 0;  // its piece's byte range in the decoded text
    size_t text_end = 0;
    v1::TokenLogprob logprob;
  };

  void EmitText(const std::string& text, v1::GenerateChunk& chunk) {
    emitted_bytes_ += text.size();
    chunk.mutable_text()->append(text);
  }
  void Release(Pending& pending, v1::GenerateChunk& chunk) {
    chunk.add_token_ids(pending.token);
    if (plan_.logprobs > 0) *chunk.add_logprobs() = std::move(pending.logprob);
    ++completion_tokens_;
  }
  // The tokens whose text is all out.
  void ReleaseEmitted(v1::GenerateChunk& chunk) {
    while (!pending_.empty() && pending_.front().text_end <= emitted_bytes_) {
      Release(pending_.front(), chunk);
      pending_.pop_front();
    }
  }
  // A stop string completed at emitted_bytes_: tokens that begin before it are out.
  void ReleaseAtStop(v1::GenerateChunk& chunk) {
    for (Pending& pending : pending_) {
      if (pending.text_begin < emitted_bytes_) Release(pending, chunk);
    }
    pending_.clear();
  }

  const GenerationPlan& plan_;
  const text::Tokenizer& tokenizer_;
  const std::unordered_set<int32_t> stop_ids_;
  text::StreamingDetokenizer detokenizer_;
  text::StopMatcher stop_matcher_;
  std::deque<Pending> pending_;  // generated, text not all emitted yet
  size_t decoded_bytes_ = 0;     // text the detokenizer produced so far
  size_t emitted_bytes_ = 0;     // text sent to the client so far
  int32_t generated_tokens_ = 0;
  int32_t completion_tokens_ = 0;
  v1::FinishReason finish_reason_ = v1::FINISH_REASON_UNSPECIFIED;
};

internal_v1::SamplingParams ToProto(const model::SamplingParams& sampling) {
  internal_v1::SamplingParams proto;
  proto.set_temperature(sampling.temperature);
  proto.set_top_k(sampling.top_k);
  proto.set_top_p(sampling.top_p);
  proto.set_seed(sampling.seed);
  return proto;
}

// The drafter's Generate request for `plan`.
internal_v1::GenerateRequest DrafterRequest(const GenerationPlan& plan,
                                            const text::Tokenizer& tokenizer, int64_t capacity) {
  internal_v1::GenerateRequest request;
  request.mutable_prompt()->Assign(plan.prompt_tokens.begin(), plan.prompt_tokens.end());
  request.set_context(static_cast<int32_t>(capacity));
  *request.mutable_sampling() = ToProto(plan.sampling);
  request.set_logprobs(plan.logprobs);
  request.set_max_tokens(plan.max_tokens);
  request.set_skip_prefix_cache(plan.skip_prefix_cache);
  request.set_response_schema(plan.response_schema);
  request.set_json_object(plan.json_object);
  request.mutable_response_prefix_tokens()->Assign(plan.response_prefix_tokens.begin(),
                                                   plan.response_prefix_tokens.end());
  request.mutable_response_suffix_tokens()->Assign(plan.response_suffix_tokens.begin(),
                                                   plan.response_suffix_tokens.end());
  for (int32_t id : tokenizer.end_of_generation_ids()) request.add_end_token_ids(id);
  for (int32_t id : plan.stop_token_ids) request.add_end_token_ids(id);
  if (plan.mode != SpeculationMode::kOff) {
    request.set_nodes(plan.shape.nodes);
    request.set_expansions(plan.shape.expansions);
    request.set_max_depth(plan.shape.max_depth);
    request.set_adaptive(plan.mode == SpeculationMode::kAdaptive);
  }
  return request;
}

// Ends the drafter's stream on every way out of RunGeneration (the drafter then closes the
// session), and reads it to its end.
class CallGuard {
 public:
  explicit CallGuard(rpc::DrafterClient::GenerateCall& call) : call_(call) {}
  ~CallGuard() {
    if (finished_) return;
    call_.Cancel();
    internal_v1::GenerateEvent ignored;
    while (call_.Read(&ignored)) {
    }
    (void)call_.Finish();
  }
  void Finished() { finished_ = true; }
  CallGuard(const CallGuard&) = delete;
  CallGuard& operator=(const CallGuard&) = delete;

 private:
  rpc::DrafterClient::GenerateCall& call_;
  bool finished_ = false;
};

}  // namespace

absl::StatusOr<v1::GenerateComplete> RunGeneration(const GenerationPlan& plan,
                                                   const GenerationEnvironment& environment,
                                                   ChunkSink& sink, Clock::time_point request_start,
                                                   RequestRecorder* recorder) {
  rpc::DrafterClient& drafter = *environment.drafter;
  const int64_t prompt_length = static_cast<int64_t>(plan.prompt_tokens.size());
  // Room for the prompt, the output and one more tree beyond the last committed token.
  const int64_t capacity = std::min<int64_t>(prompt_length + plan.max_tokens + plan.shape.nodes + 1,
                                             environment.context_length);
  std::unique_ptr<rpc::DrafterClient::GenerateCall> call =
      drafter.Generate(DrafterRequest(plan, *environment.tokenizer, capacity));
  CallGuard guard(*call);

  TokenEmitter emitter(plan, *environment.tokenizer);
  StepStats step_stats;
  int64_t draft_ns = 0, verify_ns = 0;
  std::string policy_shape;  // the adaptive policy's last description
  std::optional<Clock::time_point> first_token_time;
  int32_t cached_tokens = 0;
  Clock::time_point decode_start = Clock::now();  // once the prompt is in the cache
  internal_v1::GenerateEvent event;
  while (!emitter.finished()) {
    if (sink.Cancelled()) return absl::CancelledError("the client cancelled the request");
    if (!call->Read(&event)) {
      guard.Finished();
      const absl::Status ended = call->Finish();
      if (!ended.ok()) return DrafterError(ended);
      // The drafter ended first: its session's context holds no further token.
      v1::GenerateChunk chunk;
      BITSPLIT_RETURN_IF_ERROR(emitter.Finish(v1::FINISH_REASON_LENGTH, chunk));
      if (chunk.token_ids_size() > 0 || !chunk.text().empty()) {
        if (!sink.Send(chunk)) return absl::CancelledError("the client went away");
        if (recorder != nullptr) {
          recorder->ChunkSent(chunk.token_ids_size(), !chunk.text().empty(), Clock::now());
        }
      }
      break;
    }
    if (!event.has_step()) {  // a prefill chunk, or the prefix the cache held
      cached_tokens += event.cached();
      if (event.prefilled() >= prompt_length - 1) decode_start = Clock::now();
      continue;
    }
    const internal_v1::StepReport& step = event.step();
    if (event.tokens_size() != event.choices_size() || event.tokens_size() == 0) {
      return absl::InternalError(absl::StrFormat("drafter: a step emitted %d tokens and %d choices",
                                                 event.tokens_size(), event.choices_size()));
    }
    step_stats.Record(step.tree_depth(), step.accepted_depth(), step.accepted_depth() + 1);
    if (recorder != nullptr) recorder->Step(step);
    draft_ns += step.draft_ns();
    verify_ns += step.verify_ns();
    policy_shape = step.shape();
    v1::GenerateChunk chunk;
    for (int i = 0; i < event.tokens_size() && !emitter.finished(); ++i) {
      BITSPLIT_RETURN_IF_ERROR(emitter.Add(event.tokens(i), event.choices(i), chunk));
    }
    if (chunk.token_ids_size() > 0 || !chunk.text().empty()) {
      if (!first_token_time) first_token_time = Clock::now();
      if (!sink.Send(chunk)) return absl::CancelledError("the client went away");
      if (recorder != nullptr) {
        recorder->ChunkSent(chunk.token_ids_size(), !chunk.text().empty(), Clock::now());
      }
    }
  }
  const Clock::time_point end = Clock::now();
  v1::GenerateComplete complete;
  complete.set_finish_reason(emitter.finish_reason());
  complete.mutable_usage()->set_prompt_tokens(static_cast<int32_t>(prompt_length));
  complete.mutable_usage()->set_completion_tokens(emitter.completion_tokens());
  complete.mutable_usage()->set_cached_prompt_tokens(cached_tokens);
  v1::SpeculationStats& stats = *complete.mutable_speculation();
  switch (plan.mode) {
    case SpeculationMode::kOff:
      stats.set_shape("off");
      break;
    case SpeculationMode::kTree:
      stats.set_shape(speculation::DescribeShape(plan.shape));
      break;
    case SpeculationMode::kAdaptive:
      stats.set_shape(policy_shape.empty() ? "adaptive: measuring" : policy_shape);
      break;
  }
  step_stats.Fill(stats);
  stats.set_draft_ns(draft_ns);
  stats.set_verify_ns(verify_ns);
  if (first_token_time) {
    stats.set_time_to_first_token_ns(NanosBetween(request_start, *first_token_time));
  }
  const double decode_seconds = std::chrono::duration<double>(end - decode_start).count();
  stats.set_tokens_per_second(decode_seconds > 0 ? emitter.completion_tokens() / decode_seconds
                                                 : 0.0);
  return complete;
}

}  // namespace bitsplit::coordinator
