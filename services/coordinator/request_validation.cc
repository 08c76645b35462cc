#include "services/coordinator/request_validation.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/text/jinja_value.h"
#include "common/text/json_constraint.h"
#include "common/text/stop_matcher.h"
#include "common/util/status_macros.h"

namespace bitsplit::coordinator {
namespace {

absl::Status Prefixed(std::string_view prefix, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(std::string(prefix), status.message()));
}

// The messages as a chat template reads them, in the shape transformers and llama.cpp's server
// give: {role, content} (content None when unset), an assistant's calls as {id, type: "function",
// function: {name, arguments}} with the arguments as an object (the templates write them with
// tojson), an assistant's reasoning as reasoning_content and thinking, a tool result's
// tool_call_id (and name, where sent).
//
// `harmony` (gpt-oss's template, which tests `"..." in message.content` and refuses content beside
// a reasoned call): an assistant message with calls carries no content key when its content is
// unset or it has reasoning, as llama.cpp's server passes it to that template.
absl::StatusOr<text::jinja::Value> TemplateMessages(const v1::ChatMessages& chat, bool harmony) {
  text::jinja::Value::List messages;
  for (int i = 0; i < chat.messages_size(); ++i) {
    const v1::ChatMessage& message = chat.messages(i);
    const std::string& role = message.role();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      return absl::InvalidArgumentError(absl::StrFormat(
          "chat message %d has role \"%s\" (expected system, user, assistant or tool)", i, role));
    }
    if (!message.tool_calls().empty() && role != "assistant") {
      return absl::InvalidArgumentError(
          absl::StrFormat("chat message %d: only assistant messages carry tool calls", i));
    }
    if (!message.has_content() && message.tool_calls().empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("chat message %d has neither content nor tool calls", i));
    }
    text::jinja::Dict dict;
    dict.Set("role", role);
    const bool content_omitted = harmony && !message.tool_calls().empty() &&
                                 (!message.has_content() || message.has_reasoning_content());
    if (!content_omitted) {
      dict.Set("content", message.has_content() ? text::jinja::Value(message.content())
                                                : text::jinja::Value::None());
    }
    if (!message.tool_calls().empty()) {
      text::jinja::Value::List calls;
      for (int c = 0; c < message.tool_calls_size(); ++c) {
        const v1::ToolCall& call = message.tool_calls(c);
        absl::StatusOr<text::jinja::Value> arguments =
            text::jinja::ValueFromJson(call.arguments().empty() ? "{}" : call.arguments());
        if (!arguments.ok() || !arguments->is_dict()) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "chat message %d, tool call %d: arguments must be a JSON object", i, c));
        }
        text::jinja::Dict function;
        function.Set("name", call.name());
        function.Set("arguments", *std::move(arguments));
        text::jinja::Dict entry;
        entry.Set("id", call.id());
        entry.Set("type", "function");
        entry.Set("function", std::move(function));
        calls.emplace_back(std::move(entry));
      }
      dict.Set("tool_calls", text::jinja::Value(std::move(calls)));
    }
    if (message.has_reasoning_content()) {
      dict.Set("reasoning_content", message.reasoning_content());
      dict.Set("thinking", message.reasoning_content());
    }
    if (role == "tool") {
      dict.Set("tool_call_id", message.tool_call_id());
      if (!message.name().empty()) dict.Set("name", message.name());
    }
    messages.emplace_back(std::move(dict));
  }
  return text::jinja::Value(std::move(messages));
}

absl::StatusOr<model::SamplingParams> SamplingFromRequest(const v1::GenerateRequest& request) {
  model::SamplingParams sampling;
  if (request.has_temperature()) sampling.temperature = request.temperature();
  if (request.has_top_k()) sampling.top_k = request.top_k();
  if (request.has_top_p()) sampling.top_p = request.top_p();
  if (request.has_seed()) sampling.seed = request.seed();
  BITSPLIT_RETURN_IF_ERROR(model::ValidateSamplingParams(sampling));
  return sampling;
}

absl::Status ParseSpeculation(const v1::SpeculationSettings& settings, const ServerLimits& limits,
                              GenerationPlan& plan) {
  switch (settings.mode()) {
    case v1::SpeculationSettings::MODE_UNSPECIFIED:
      plan.mode = limits.default_mode;
      break;
    case v1::SpeculationSettings::MODE_OFF:
      plan.mode = SpeculationMode::kOff;
      break;
    case v1::SpeculationSettings::MODE_TREE:
      plan.mode = SpeculationMode::kTree;
      break;
    case v1::SpeculationSettings::MODE_ADAPTIVE:
      plan.mode = SpeculationMode::kAdaptive;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("speculation: unknown mode ", static_cast<int>(settings.mode()),
                       " (expected MODE_OFF, MODE_TREE or MODE_ADAPTIVE)"));
  }
  plan.shape =
      plan.mode == SpeculationMode::kAdaptive ? limits.adaptive_shape : limits.default_shape;
  if (settings.has_nodes()) plan.shape.nodes = settings.nodes();
  if (settings.has_expansions_per_step()) plan.shape.expansions = settings.expansions_per_step();
  if (settings.has_max_depth()) plan.shape.max_depth = settings.max_depth();
  if (plan.mode == SpeculationMode::kOff) {
    plan.shape.nodes = 0;
    return absl::OkStatus();
  }
  absl::Status status = speculation::ValidateTreeShape(plan.shape, limits.max_tree_nodes);
  if (!status.ok()) return Prefixed("speculation: ", status);
  if (plan.shape.nodes == 0) {
    plan.mode = SpeculationMode::kOff;  // no tree fits: the baseline is the only choice
  } else if (plan.mode == SpeculationMode::kAdaptive) {
    if (auto policy = speculation::MakeAdaptivePolicy(plan.shape); !policy.ok()) {
      return Prefixed("speculation: adaptive: ", policy.status());
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view SpeculationModeName(SpeculationMode mode) {
  switch (mode) {
    case SpeculationMode::kOff:
      return "off";
    case SpeculationMode::kTree:
      return "tree";
    case SpeculationMode::kAdaptive:
      return "adaptive";
  }
  return "?";
}

absl::StatusOr<SpeculationMode> ParseSpeculationMode(std::string_view name) {
  if (name == "off") return SpeculationMode::kOff;
  if (name == "tree") return SpeculationMode::kTree;
  if (name == "adaptive") return SpeculationMode::kAdaptive;
  return absl::InvalidArgumentError(absl::StrCat("unknown speculation mode \"", std::string(name),
                                                 "\" (expected adaptive, tree or off)"));
}

int32_t MaxTokenBytes(const text::Tokenizer& tokenizer) {
  size_t longest = 1;
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    longest = std::max(longest, tokenizer.GetTokenText(id).value_or("").size());
  }
  return static_cast<int32_t>(longest);
}

absl::StatusOr<std::vector<int32_t>> PromptTokens(const v1::GenerateRequest& request,
                                                  const text::Tokenizer& tokenizer,
                                                  const text::ChatTemplate* chat_template,
                                                  int64_t max_prompt_tokens,
                                                  int32_t max_token_bytes) {
  std::string prompt_text;
  bool parse_special = false;
  switch (request.input_case()) {
    case v1::GenerateRequest::kPrompt:
      if (request.prompt().empty()) return absl::InvalidArgumentError("the prompt is empty");
      prompt_text = request.prompt();
      break;
    case v1::GenerateRequest::kChat: {
      if (request.chat().messages().empty()) {
        return absl::InvalidArgumentError("the chat has no messages");
      }
      if (chat_template == nullptr) {
        return absl::FailedPreconditionError(
            "the model has no chat template; send a prompt or token ids instead");
      }
      BITSPLIT_ASSIGN_OR_RETURN(const text::jinja::Value messages,
                                TemplateMessages(request.chat(), chat_template->harmony()));
      text::jinja::Value tools = text::jinja::Value::None();
      if (!request.chat().tools_json().empty()) {
        absl::StatusOr<text::jinja::Value> parsed =
            text::jinja::ValueFromJson(request.chat().tools_json());
        if (!parsed.ok() || !parsed->is_list()) {
          return absl::InvalidArgumentError("tools_json is not a JSON array");
        }
        tools = *std::move(parsed);
      }
      absl::StatusOr<std::string> rendered =
          chat_template->Render(messages, tools, /*add_generation_prompt=*/true);
      if (!rendered.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the model's chat template refuses the conversation: ", rendered.status().message()));
      }
      prompt_text = *std::move(rendered);
      // The template's control tokens must become tokens, as in `bitsplit generate --chat`.
      parse_special = true;
      break;
    }
    case v1::GenerateRequest::kTokenIds: {
      const auto& ids = request.token_ids().ids();
      if (ids.empty()) return absl::InvalidArgumentError("token_ids is empty");

      for (int i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= tokenizer.vocab_size()) {
          return absl::InvalidArgumentError(
              absl::StrFormat("token_ids[%d] = %d is outside the vocabulary [0, %d)", i, ids[i],
                              tokenizer.vocab_size()));
        }
      }
      return std::vector<int32_t>(ids.begin(), ids.end());
    }
    default:
      return absl::InvalidArgumentError(
          "the request has no input: set one of prompt, chat or token_ids");
  }
  // Refused by its length alone, so that a huge prompt costs no tokenization (seconds and GBs).
  const int64_t fewest_tokens =
      (static_cast<int64_t>(prompt_text.size()) + max_token_bytes - 1) / max_token_bytes;
  if (max_prompt_tokens > 0 && fewest_tokens > max_prompt_tokens) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the prompt (%d bytes, so at least %d tokens) cannot fit: at most %d prompt tokens fit the "
        "context with max_tokens",
        prompt_text.size(), fewest_tokens, max_prompt_tokens));
  }
  std::vector<int32_t> tokens = tokenizer.Encode(prompt_text, parse_special);
  if (tokenizer.add_bos() && tokenizer.bos_id() >= 0) {
    tokens.insert(tokens.begin(), tokenizer.bos_id());
  }
  if (tokens.empty()) return absl::InvalidArgumentError("the prompt encodes to no tokens");
  return tokens;
}

absl::StatusOr<GenerationPlan> ValidateRequest(const v1::GenerateRequest& request,
                                               const text::Tokenizer& tokenizer,
                                               const text::ChatTemplate* chat_template,
                                               const ServerLimits& limits) {
  GenerationPlan plan;
  if (request.max_tokens() < 0 || request.max_tokens() > limits.max_tokens_limit) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_tokens must be in [1, %d] (or 0 for the default, %d), got %d",
                        limits.max_tokens_limit, limits.default_max_tokens, request.max_tokens()));
  }
  const bool default_max_tokens = request.max_tokens() == 0;
  plan.max_tokens = default_max_tokens ? limits.default_max_tokens : request.max_tokens();
  BITSPLIT_ASSIGN_OR_RETURN(plan.sampling, SamplingFromRequest(request));
  if (request.logprobs() < 0 || request.logprobs() > limits.max_logprobs) {
    return absl::InvalidArgumentError(absl::StrFormat("logprobs must be in [0, %d], got %d",
                                                      limits.max_logprobs, request.logprobs()));
  }
  plan.logprobs = request.logprobs();
  plan.skip_prefix_cache = request.skip_prefix_cache();
  if (request.json_object() && !request.response_schema().empty()) {
    return absl::InvalidArgumentError("json_object and response_schema exclude each other");
  }
  if (!request.response_schema().empty()) {
    // The drafter compiles it too; here a bad schema is refused before a session is taken.
    const nlohmann::ordered_json schema =
        nlohmann::ordered_json::parse(request.response_schema(), nullptr, false);
    if (schema.is_discarded()) return absl::InvalidArgumentError("response_schema: not JSON");
    if (absl::StatusOr<text::JsonConstraint> compiled = text::JsonConstraint::FromSchema(schema);
        !compiled.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("response_schema: ", compiled.status().message()));
    }
  }
  plan.response_schema = request.response_schema();
  plan.json_object = request.json_object();
  if (!request.response_prefix().empty() || !request.response_suffix().empty()) {
    if (plan.response_schema.empty() && !plan.json_object) {
      return absl::InvalidArgumentError(
          "response_prefix and response_suffix frame a constrained document: they need "
          "response_schema or json_object");
    }
    plan.response_prefix_tokens = tokenizer.Encode(request.response_prefix(), true);
    plan.response_suffix_tokens = tokenizer.Encode(request.response_suffix(), true);
  }
  for (int i = 0; i < request.render_token_ids_size(); ++i) {
    const int32_t id = request.render_token_ids(i);
    if (id < 0 || id >= limits.vocab_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "render_token_ids[%d] = %d is outside the vocabulary [0, %d)", i, id, limits.vocab_size));
    }
    plan.render_token_ids.push_back(id);
  }
  plan.stop_strings.assign(request.stop().begin(), request.stop().end());
  if (absl::Status status = text::ValidateStopStrings(plan.stop_strings); !status.ok()) {
    return Prefixed("stop: ", status);
  }
  for (int i = 0; i < request.stop_token_ids_size(); ++i) {
    const int32_t id = request.stop_token_ids(i);
    if (id < 0 || id >= limits.vocab_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "stop_token_ids[%d] = %d is outside the vocabulary [0, %d)", i, id, limits.vocab_size));
    }
    plan.stop_token_ids.push_back(id);
  }
  BITSPLIT_RETURN_IF_ERROR(ParseSpeculation(request.speculation(), limits, plan));
  // A default max_tokens gives way to the prompt; an explicit one is the client's to keep.
  const int64_t max_prompt_tokens =
      limits.context_length - (default_max_tokens ? 1 : plan.max_tokens);
  if (max_prompt_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_tokens %d leaves no room for a prompt in the context of %d tokens",
                        plan.max_tokens, limits.context_length));
  }
  BITSPLIT_ASSIGN_OR_RETURN(
      plan.prompt_tokens,
      PromptTokens(request, tokenizer, chat_template, max_prompt_tokens, limits.max_token_bytes));
  const int64_t prompt_length = static_cast<int64_t>(plan.prompt_tokens.size());
  if (default_max_tokens && prompt_length < limits.context_length) {
    plan.max_tokens = static_cast<int32_t>(
        std::min<int64_t>(plan.max_tokens, limits.context_length - prompt_length));
  }
  if (prompt_length >= limits.context_length) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the prompt (%d tokens) does not fit the context of %d tokens",
                        prompt_length, limits.context_length));
  }
  if (prompt_length + plan.max_tokens > limits.context_length) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the prompt (%d tokens) + max_tokens %d exceeds the context of %d tokens (at most %d "
        "new tokens fit)",
        prompt_length, plan.max_tokens, limits.context_length,
        limits.context_length - prompt_length));
  }
  return plan;
}

}  // namespace bitsplit::coordinator
