#pragma once
// The OpenAI-compatible face of the coordinator, as data: request bodies of
// POST /v1/chat/completions and /v1/completions become the bitsplit.v1.GenerateRequest the gRPC
// API takes (so one validation, ValidateRequest, with the same messages, serves both), and the
// generation's chunks and end become OpenAI's response objects and stream chunks. No I/O here;
// http_api.cc serves them.
//
// What differs from the gRPC defaults: an unset temperature is 1.0 and an unset top_p is 1.0, as
// OpenAI's API documents (the gRPC API's unset temperature is greedy).
//
// Extension field "bitsplit" (both endpoints): {"speculation": {"mode": "adaptive"|"tree"|"off",
// "nodes": N, "expansions": k, "max_depth": D}} in a request; {"speculation": {...stats},
// "token_ids": [...]} in a response (streaming: in the chunk that carries finish_reason), and
// {"base_format", "residual_format", "fingerprint", ...} in /v1/models.
//
// Thread safety: free functions and a per-response accumulator (one thread).
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "bitsplit/v1/generation.pb.h"
#include "common/text/tokenizer.h"
#include "common/text/tool_calls.h"
#include "nlohmann/json.hpp"

namespace bitsplit::coordinator::openai {

enum class Endpoint { kChatCompletions, kCompletions };

struct OpenAiRequest {
  Endpoint endpoint = Endpoint::kChatCompletions;
  v1::GenerateRequest request;  // what the gRPC API would be sent
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // Chat: "logprobs": true, with "top_logprobs" alternatives; completions: "logprobs": N.
  bool logprobs = false;
  int32_t top_logprobs = 0;
  std::string model;  // as the request named it
  // Chat with tools and tool_choice other than "none": the answer is parsed for the model's
  // tool calls.
  bool parse_tool_calls = false;
  bool parallel_tool_calls = true;  // false: only the first call is returned
  // tool_choice "required" (empty: any of the tools) or a named function: the output is
  // constrained to one call (ApplyToolCallFormat).
  std::optional<std::string> forced_tool;
};

// Reads a request body. INVALID_ARGUMENT (HTTP 400) naming the field for a body that is not a JSON
// object, a field of the wrong type or out of range, or something this server does not do
// (n other than 1, tools on completions, a tool_choice function not among the tools, a
// response_format schema outside the supported subset, penalties, logit_bias, several prompts,
// echo, best_of, suffix), said plainly rather than ignored; NOT_FOUND (404) for a model other than
// `served_model`. Range checks of the generation itself (max_tokens, temperature, top_p, stop
// strings, the context) are ValidateRequest's, after this.
absl::StatusOr<OpenAiRequest> ParseRequest(Endpoint endpoint, std::string_view body,
                                           std::string_view served_model);

// The tool-call markers of `format` that are control tokens of `tokenizer` (hidden from text
// unless named in render_token_ids).
std::vector<int32_t> ControlMarkerIds(const text::Tokenizer& tokenizer,
                                      text::ToolCallFormat format);

// What a chat request with tools needs from the model's tool-call syntax `format` (none: the
// template has none, and the request is refused): the control markers rendered in the text so
// that the parser sees them, and, for a forced call (tool_choice "required" or a function), the
// output constrained to one call in the syntax (text::ForcedToolCallOutput: response_schema,
// response_prefix, response_suffix). INVALID_ARGUMENT naming "tools" or "tool_choice" otherwise.
// A request without tools is left as it is.
absl::Status ApplyToolCallFormat(std::optional<text::ToolCallFormat> format,
                                 std::span<const int32_t> control_marker_ids,
                                 OpenAiRequest& request);

// Who is answering: the fields every response and chunk repeats.
struct ResponseIdentity {
  std::string id;       // "chatcmpl-..." or "cmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
  std::string system_fingerprint;  // the split model's fingerprint, shortened
};

// Builds the answer from the generation's chunks (in order) and its end. For a chat request with
// tools (parse_tool_calls) and a model whose template has a tool-call syntax
// (`tool_call_format`), the text goes through text::ToolCallStreamParser: content deltas hold
// back what may still become a call, each call arrives as delta.tool_calls (id and name, then
// the arguments), the message gets `tool_calls`, and finish_reason is "tool_calls" when the model
// made any. With parallel_tool_calls false only the first call is returned.
class ResponseBuilder {
 public:
  // `tokenizer` must outlive the builder.
  ResponseBuilder(const OpenAiRequest& request, ResponseIdentity identity,
                  const text::Tokenizer& tokenizer,
                  std::optional<text::ToolCallFormat> tool_call_format = std::nullopt);

  // Streaming: the chunk objects (each becomes one "data: " event) for the first chunk: the
  // assistant role, for chat; nothing for completions.
  std::vector<nlohmann::json> StreamStart();
  // A generation chunk: its stream event (none when it carries neither text nor tokens); the
  // text, ids and log-probabilities are also kept for the whole response.
  std::optional<nlohmann::json> AddChunk(const v1::GenerateChunk& chunk);
  // The end: the stream events (the one with finish_reason and the bitsplit extension, then the
  // usage chunk when asked for).
  std::vector<nlohmann::json> StreamEnd(const v1::GenerateComplete& complete);
  // The non-streaming response object, from everything added.
  nlohmann::json Response(const v1::GenerateComplete& complete);

 private:
  // What the tool-call parser decided for `delta` (kept for the response), as a chat delta;
  // null when it is empty.
  nlohmann::json ToolDelta(const text::ToolCallStreamDelta& delta);
  // The parser's end, once.
  text::ToolCallStreamDelta FinishToolCalls();
  std::string_view FinishReason(const v1::GenerateComplete& complete) const;

  nlohmann::json ChunkObject(nlohmann::json choice) const;
  nlohmann::json LogprobsOf(const v1::GenerateChunk& chunk) const;
  nlohmann::json Extension(const v1::GenerateComplete& complete) const;

  const OpenAiRequest& request_;
  const ResponseIdentity identity_;
  const text::Tokenizer& tokenizer_;
  std::string text_;
  std::vector<int32_t> token_ids_;
  nlohmann::json logprobs_;  // chat: the "content" list; completions: the four lists
  int64_t text_offset_ = 0;  // completions' text_offset of the next token
  std::optional<text::ToolCallStreamParser> tool_parser_;
  bool tool_parser_finished_ = false;
  text::ParsedToolCalls parsed_;  // what the parser returned (only the first call without parallel)
};

// "stop" for EOS, a stop string or a stop token id; "length" for max_tokens or the context.
std::string_view FinishReasonName(v1::FinishReason reason);

// OpenAI's error object: {"error": {"message", "type", "param": null, "code"}}.
nlohmann::json ErrorBody(std::string_view message, std::string_view type, std::string_view code);

// GET /v1/models' list with the one model this server holds.
nlohmann::json ModelList(const v1::ModelInfo& info, std::string_view served_model, int64_t created);

// JSON text for the wire: invalid UTF-8 (none is expected) replaced rather than thrown on.
std::string Dump(const nlohmann::json& value);

}  // namespace bitsplit::coordinator::openai
