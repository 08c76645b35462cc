#pragma once
// One request's generation through the drafter (docs/design.md §3): one Generate stream, in which
// the drafter's scheduler prefills the prompt and runs every speculation step (draft, verify,
// walk, commit; the adaptive policy included) batched with the other requests', and sends the
// emitted tokens; here they become text, until EOS, a stop token or string, max_tokens,
// cancellation or an error. The stream is ended on every path, which closes the session.
//
// Text is streamed as complete UTF-8 only (StreamingDetokenizer) and held back while it could
// still become a stop string (StopMatcher), so a client never sees text that a later token
// would have cut off.
#include <chrono>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "bitsplit/v1/generation.pb.h"
#include "common/rpc/drafter_client.h"
#include "common/text/tokenizer.h"
#include "services/coordinator/metrics.h"
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

struct GenerationEnvironment {
  rpc::DrafterClient* drafter = nullptr;
  const text::Tokenizer* tokenizer = nullptr;
  int32_t context_length = 2048;  // a session's largest context
};

// Runs `plan` to completion. Errors: CANCELLED when the sink reports cancellation or a closed
// stream; the drafter's status otherwise (UNAVAILABLE with "cpu-residual/drafter unavailable: "
// when the drafter or its residual service cannot be reached or died).
// `request_start` is when the request arrived (time to first token counts the queue wait).
// `recorder` (may be null) is told of every speculation step and every chunk sent.
absl::StatusOr<v1::GenerateComplete> RunGeneration(
    const GenerationPlan& plan, const GenerationEnvironment& environment, ChunkSink& sink,
    std::chrono::steady_clock::time_point request_start, RequestRecorder* recorder = nullptr);

}  // namespace bitsplit::coordinator
