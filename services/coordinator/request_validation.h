#pragma once
// Turns a public GenerateRequest into a validated generation plan: prompt tokens (plain text, chat
// through the model's template, or token ids), sampling parameters, stop conditions and the
// speculation mode. Every rejection is INVALID_ARGUMENT with a message that names the field and
// the allowed range, so a client can fix its request without reading the server's source.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "bitsplit/v1/generation.pb.h"
#include "common/model/sampler.h"
#include "common/speculation/policy.h"
#include "common/speculation/tree.h"
#include "common/text/chat_template.h"
#include "common/text/tokenizer.h"

namespace bitsplit::coordinator {

enum class SpeculationMode {
  kOff = 0,       // the verifier alone: one token per verify step (the baseline)
  kTree = 1,      // a fixed draft tree shape
  kAdaptive = 2,  // the shape is picked per step from measured costs and acceptance
};
std::string_view SpeculationModeName(SpeculationMode mode);  // "off", "tree", "adaptive"
absl::StatusOr<SpeculationMode> ParseSpeculationMode(std::string_view name);

// What the server allows; fixed at start from its flags, the model and the drafter.
struct ServerLimits {
  int32_t context_length = 2048;  // min(model context, drafter max_context)
  int32_t vocab_size = 0;
  int32_t max_tokens_limit = 4096;
  int32_t default_max_tokens = 512;  // for a request that leaves max_tokens unset
  // The most input bytes one token can stand for (the longest vocabulary entry): a prompt of B
  // bytes is at least ceil(B / max_token_bytes) tokens, so one too long for the context is
  // refused before it is tokenized.
  int32_t max_token_bytes = 1;
  int32_t max_tree_nodes = 63;  // drafted nodes beyond the root (drafter max_tree_nodes - 1)
  int32_t max_logprobs = 20;
  SpeculationMode default_mode = SpeculationMode::kAdaptive;
  speculation::TreeShape default_shape;  // tree mode's shape when a request sets none
  // Adaptive mode's largest shape when a request sets none: the policy picks among the shapes
  // within it (up to 128 nodes and depth 16: where verify rows are cheap, deep trees pay).
  speculation::TreeShape adaptive_shape = {.nodes = 128, .expansions = 8, .max_depth = 16};
};

struct GenerationPlan {
  std::vector<int32_t> prompt_tokens;
  int32_t max_tokens = 0;
  model::SamplingParams sampling;
  std::vector<std::string> stop_strings;
  std::vector<int32_t> stop_token_ids;
  int32_t logprobs = 0;
  SpeculationMode mode = SpeculationMode::kOff;
  speculation::TreeShape shape;  // kTree: the shape of every step; kAdaptive: the largest allowed
  bool skip_prefix_cache = false;
  std::string response_schema;  // structured output: a JSON Schema, checked to compile
  bool json_object = false;
  // The frame around the constrained document (response_prefix/suffix, tokenized).
  std::vector<int32_t> response_prefix_tokens;
  std::vector<int32_t> response_suffix_tokens;
  std::vector<int32_t> render_token_ids;  // control tokens shown in the text
};

// The prompt as token ids, tokenized as `bitsplit generate` does: plain prompts as text (control
// token spellings stay text), chat messages rendered by `chat_template` with the assistant's
// generation prompt and encoded with special tokens; BOS first when the tokenizer asks for it.
// Token-id input is taken as is. `chat_template` may be null (the model has none): chat input is
// then FAILED_PRECONDITION.
// `max_prompt_tokens` > 0: a prompt text (not token ids, which cost nothing to count) too long to
// encode to at most that many tokens (by its byte length and `max_token_bytes`) is INVALID_ARGUMENT
// before it is tokenized.
absl::StatusOr<std::vector<int32_t>> PromptTokens(const v1::GenerateRequest& request,
                                                  const text::Tokenizer& tokenizer,
                                                  const text::ChatTemplate* chat_template,
                                                  int64_t max_prompt_tokens = 0,
                                                  int32_t max_token_bytes = 1);

// The longest vocabulary entry in bytes (ServerLimits::max_token_bytes).
int32_t MaxTokenBytes(const text::Tokenizer& tokenizer);

absl::StatusOr<GenerationPlan> ValidateRequest(const v1::GenerateRequest& request,
                                               const text::Tokenizer& tokenizer,
                                               const text::ChatTemplate* chat_template,
                                               const ServerLimits& limits);

}  // namespace bitsplit::coordinator
