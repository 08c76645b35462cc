#pragma once
// One request's generation against the drafter (docs/design.md §3): open a session, prefill the
// prompt, then per step draft a tree (unless speculation is off), verify it, walk it, commit the
// accepted path and stream the emitted tokens, until EOS, a stop token or string, max_tokens,
// cancellation or an error. The session is closed on every path.
//
// Text is streamed as complete UTF-8 only (StreamingDetokenizer) and held back while it could
// still become a stop string (StopMatcher), so a client never sees text that a later token
// would have cut off.
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "bitsplit/v1/generation.pb.h"
#include "common/model/speculation_policy.h"
#include "common/rpc/drafter_client.h"
#include "common/text/tokenizer.h"
#include "services/coordinator/request_validation.h"

namespace bitsplit::coordinator {

// Where a generation's chunks go (the gRPC stream, or a test).
class ChunkSink {
 public:
  virtual ~ChunkSink() = default;
  // Sends one chunk; blocks while an earlier one is still being written. False when the client
  // is gone: the loop then stops.
  virtual bool Send(const v1::GenerateChunk& chunk) = 0;
  // True once the client cancelled or the server is shutting down; checked between steps.
  virtual bool Cancelled() const = 0;
};

// An AdaptivePolicy behind a lock, shared by the requests whose bounds are the server's: costs
// are the machine's and acceptance the model's, so what one request measured serves the next.
class SharedAdaptivePolicy {
 public:
  SharedAdaptivePolicy(model::AdaptivePolicy policy, const model::TreeShape& bounds)
      : policy_(std::move(policy)), bounds_(bounds) {}
  model::TreeShape Next() const;
  absl::Status Record(const model::StepMeasurement& step);
  std::string Describe() const;
  const model::TreeShape& bounds() const { return bounds_; }

 private:
  mutable std::mutex mutex_;
  model::AdaptivePolicy policy_;
  const model::TreeShape bounds_;
};

struct GenerationEnvironment {
  rpc::DrafterClient* drafter = nullptr;
  const text::Tokenizer* tokenizer = nullptr;
  int32_t context_length = 2048;  // a session's largest context
  // Used by adaptive requests with these bounds; others get a policy of their own.
  SharedAdaptivePolicy* shared_policy = nullptr;
};

// Runs `plan` to completion. Errors: CANCELLED when the sink reports cancellation or a closed
// stream; the drafter's status otherwise (UNAVAILABLE with "cpu-residual/drafter unavailable: "
// when the drafter or its residual service cannot be reached or died).
// `request_start` is when the request arrived (time to first token counts the queue wait).
absl::StatusOr<v1::GenerateComplete> RunGeneration(
    const GenerationPlan& plan, const GenerationEnvironment& environment, ChunkSink& sink,
    std::chrono::steady_clock::time_point request_start);

}  // namespace bitsplit::coordinator
