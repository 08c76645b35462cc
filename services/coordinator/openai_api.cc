#include "services/coordinator/openai_api.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/text/json_constraint.h"
#include "common/text/streaming_detokenizer.h"
#include "common/util/status_macros.h"

namespace bitsplit::coordinator::openai {
namespace {

using nlohmann::json;

absl::Status Invalid(const std::string& field, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", message));
}

// A field that is absent or null counts as unset, as OpenAI's API reads it.
const json* Field(const json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<std::optional<int64_t>> IntField(const json& object, const char* key) {
  const json* value = Field(object, key);
  if (value == nullptr) return std::optional<int64_t>();
  if (value->is_number_unsigned()) {
    const uint64_t v = value->get<uint64_t>();
    return std::optional<int64_t>(v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
                                      ? std::numeric_limits<int64_t>::max()
                                      : static_cast<int64_t>(v));
  }
  if (value->is_number_integer()) return std::optional<int64_t>(value->get<int64_t>());
  return Invalid(key, "must be an integer");
}

// An int32 field of the gRPC request: larger values become INT32_MAX, which the request's
// validation refuses with its range.
absl::StatusOr<std::optional<int32_t>> Int32Field(const json& object, const char* key) {
  BITSPLIT_ASSIGN_OR_RETURN(const std::optional<int64_t> value, IntField(object, key));
  if (!value) return std::optional<int32_t>();
  if (*value > std::numeric_limits<int32_t>::max()) {
    return std::optional<int32_t>(std::numeric_limits<int32_t>::max());
  }
  if (*value < std::numeric_limits<int32_t>::min()) {
    return std::optional<int32_t>(std::numeric_limits<int32_t>::min());
  }
  return std::optional<int32_t>(static_cast<int32_t>(*value));
}

absl::StatusOr<std::optional<double>> NumberField(const json& object, const char* key) {
  const json* value = Field(object, key);
  if (value == nullptr) return std::optional<double>();
  if (!value->is_number()) return Invalid(key, "must be a number");
  return std::optional<double>(value->get<double>());
}

absl::StatusOr<std::optional<bool>> BoolField(const json& object, const char* key) {
  const json* value = Field(object, key);
  if (value == nullptr) return std::optional<bool>();
  if (!value->is_boolean()) return Invalid(key, "must be true or false");
  return std::optional<bool>(value->get<bool>());
}

absl::StatusOr<std::optional<std::string>> StringField(const json& object, const char* key) {
  const json* value = Field(object, key);
  if (value == nullptr) return std::optional<std::string>();
  if (!value->is_string()) return Invalid(key, "must be a string");
  return std::optional<std::string>(value->get<std::string>());
}

// Fields that would change the answer and that this server does not implement: refused, not
// ignored.
absl::Status RefuseUnsupported(const json& body, Endpoint endpoint) {
  BITSPLIT_ASSIGN_OR_RETURN(const std::optional<int64_t> n, IntField(body, "n"));
  if (n && *n != 1) return Invalid("n", "only 1 choice per request is supported");
  if (endpoint == Endpoint::kCompletions) {
    BITSPLIT_ASSIGN_OR_RETURN(const std::optional<int64_t> best_of, IntField(body, "best_of"));
    if (best_of && *best_of != 1) return Invalid("best_of", "only 1 is supported");
    BITSPLIT_ASSIGN_OR_RETURN(const std::optional<bool> echo, BoolField(body, "echo"));
    if (echo.value_or(false)) return Invalid("echo", "echoing the prompt is not supported");
    BITSPLIT_ASSIGN_OR_RETURN(const std::optional<std::string> suffix, StringField(body, "suffix"));
    if (suffix && !suffix->empty()) return Invalid("suffix", "suffixes are not supported");
  }
  if (endpoint == Endpoint::kCompletions) {
    for (const char* key : {"tools", "tool_choice"}) {
      if (Field(body, key) != nullptr) return Invalid(key, "tools are a chat completions field");
    }
  }
  // The legacy single-function API, replaced by tools.
  for (const char* key : {"functions", "function_call"}) {
    if (Field(body, key) != nullptr) return Invalid(key, "is not supported; use \"tools\"");
  }
  if (const json* format = Field(body, "response_format"); format != nullptr) {
    if (!format->is_object()) return Invalid("response_format", "must be an object");
    const std::string type = format->value("type", "");
    if (type != "text" && type != "json_object" && type != "json_schema") {
      return Invalid("response_format.type",
                     "must be \"text\", \"json_object\" or \"json_schema\"");
    }
  }
  for (const char* key : {"presence_penalty", "frequency_penalty"}) {
    BITSPLIT_ASSIGN_OR_RETURN(const std::optional<double> penalty, NumberField(body, key));
    if (penalty && *penalty != 0.0) return Invalid(key, "penalties are not supported (use 0)");
  }
  if (const json* bias = Field(body, "logit_bias"); bias != nullptr) {
    if (!bias->is_object()) return Invalid("logit_bias", "must be an object");
    if (!bias->empty()) return Invalid("logit_bias", "logit biases are not supported");
  }
  return absl::OkStatus();
}

// Text content: a string, or text parts joined.
absl::StatusOr<std::string> ContentText(const json& value, const std::string& where) {
  if (value.is_string()) return value.get<std::string>();
  if (!value.is_array()) return Invalid(where, "must be a string or an array of text parts");
  std::string content;
  for (size_t j = 0; j < value.size(); ++j) {
    const json& part = value[j];
    const std::string part_where = absl::StrCat(where, "[", j, "]");
    if (!part.is_object()) return Invalid(part_where, "must be an object");
    const std::string type = part.value("type", "");
    if (type != "text") {
      return Invalid(absl::StrCat(part_where, ".type"),
                     absl::StrCat("'", type, "': only text parts are supported"));
    }
    BITSPLIT_ASSIGN_OR_RETURN(const std::optional<std::string> text, StringField(part, "text"));
    if (!text) return Invalid(absl::StrCat(part_where, ".text"), "is required");
    content += *text;
  }
  return content;
}

// `calls` as parsed with its keys in the client's order (the arguments keep it).
absl::Status ReadToolCalls(const nlohmann::ordered_json& calls, const std::string& where,
                           v1::ChatMessage& out) {
  if (!calls.is_array()) return Invalid(where, "must be an array");
  for (size_t c = 0; c < calls.size(); ++c) {
    const nlohmann::ordered_json& call = calls[c];
    const std::string call_where = absl::StrCat(where, "[", c, "]");
    if (!call.is_object()) return Invalid(call_where, "must be an object");
    if (call.value("type", "function") != "function") {
      return Invalid(absl::StrCat(call_where, ".type"), "only \"function\" is supported");
    }
    if (!call.contains("function") || !call["function"].is_object()) {
      return Invalid(absl::StrCat(call_where, ".function"), "must be an object");
    }
    const nlohmann::ordered_json& function = call["function"];
    if (call.contains("id") && !call["id"].is_string()) {
      return Invalid(absl::StrCat(call_where, ".id"), "must be a string");
    }
    if (!function.contains("name") || !function["name"].is_string()) {
      return Invalid(absl::StrCat(call_where, ".function.name"), "must be a string");
    }
    v1::ToolCall* tool_call = out.add_tool_calls();
    tool_call->set_id(call.value("id", ""));
    tool_call->set_name(function["name"].get<std::string>());
    // OpenAI sends the arguments as JSON text; an object is taken too.
    const std::string arguments_where = absl::StrCat(call_where, ".function.arguments");
    nlohmann::ordered_json object = nlohmann::ordered_json::object();
    if (function.contains("arguments")) {
      const nlohmann::ordered_json& arguments = function["arguments"];
      object = arguments.is_string()
                   ? nlohmann::ordered_json::parse(arguments.get<std::string>(), nullptr, false)
                   : arguments;
    }
    if (!object.is_object()) return Invalid(arguments_where, "must be a JSON object");
    tool_call->set_arguments(object.dump());
  }
  return absl::OkStatus();
}

// `ordered` is the body parsed with its keys in the client's order.
absl::Status ReadChatMessages(const json& body, const nlohmann::ordered_json& ordered,
                              v1::GenerateRequest& request) {
  const json* messages = Field(body, "messages");
  if (messages == nullptr) return Invalid("messages", "is required");
  if (!messages->is_array() || messages->empty()) {
    return Invalid("messages", "must be a non-empty array of {role, content}");
  }
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& message = (*messages)[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!message.is_object()) return Invalid(where, "must be an object with role and content");
    BITSPLIT_ASSIGN_OR_RETURN(std::optional<std::string> role, StringField(message, "role"));
    if (!role) return Invalid(absl::StrCat(where, ".role"), "is required");
    if (*role == "developer") role = "system";  // OpenAI's newer name for the system role
    if (*role != "system" && *role != "user" && *role != "assistant" && *role != "tool") {
      return Invalid(absl::StrCat(where, ".role"),
                     absl::StrCat("'", *role,
                                  "' is not supported (system, developer, user, assistant, tool)"));
    }
    v1::ChatMessage* out = request.mutable_chat()->add_messages();
    out->set_role(*role);
    if (const json* calls = Field(message, "tool_calls"); calls != nullptr && !calls->is_null()) {
      if (*role != "assistant") {
        return Invalid(absl::StrCat(where, ".tool_calls"), "only assistant messages make calls");
      }
      BITSPLIT_RETURN_IF_ERROR(ReadToolCalls(ordered["messages"][i]["tool_calls"],
                                             absl::StrCat(where, ".tool_calls"), *out));
    }
    const json* value = Field(message, "content");
    if (value == nullptr || value->is_null()) {
      if (out->tool_calls().empty()) return Invalid(absl::StrCat(where, ".content"), "is required");
    } else {
      BITSPLIT_ASSIGN_OR_RETURN(std::string content,
                                ContentText(*value, absl::StrCat(where, ".content")));
      out->set_content(std::move(content));
    }
    BITSPLIT_ASSIGN_OR_RETURN(const std::optional<std::string> reasoning,
                              StringField(message, "reasoning_content"));
    if (reasoning) {
      if (*role != "assistant") {
        return Invalid(absl::StrCat(where, ".reasoning_content"),
                       "only assistant messages carry reasoning");
      }
      out->set_reasoning_content(*reasoning);
    }
    if (*role == "tool") {
      BITSPLIT_ASSIGN_OR_RETURN(const std::optional<std::string> id,
                                StringField(message, "tool_call_id"));
      if (!id) return Invalid(absl::StrCat(where, ".tool_call_id"), "is required");
      out->set_tool_call_id(*id);
      BITSPLIT_ASSIGN_OR_RETURN(const std::optional<std::string> name,
                                StringField(message, "name"));
      out->set_name(name.value_or(""));
    }
  }
  return absl::OkStatus();
}

// response_format json_object / json_schema: constrained decoding.
absl::Status ReadResponseFormat(const nlohmann::ordered_json& ordered, OpenAiRequest& parsed) {
  if (!ordered.contains("response_format")) return absl::OkStatus();
  const nlohmann::ordered_json& format = ordered["response_format"];
  const std::string type = format.value("type", "");
  if (type == "json_object") {
    parsed.request.set_json_object(true);
  } else if (type == "json_schema") {
    if (!format.contains("json_schema") || !format["json_schema"].is_object()) {
      return Invalid("response_format.json_schema", "must be an object with a schema");
    }
    const nlohmann::ordered_json& spec = format["json_schema"];
    if (!spec.contains("schema") || !spec["schema"].is_object()) {
      return Invalid("response_format.json_schema.schema", "must be a JSON Schema object");
    }
    if (absl::StatusOr<text::JsonConstraint> compiled =
            text::JsonConstraint::FromSchema(spec["schema"]);
        !compiled.ok()) {
      return Invalid("response_format.json_schema.schema",
                     std::string(compiled.status().message()));
    }
    // The schema's keys in the client's order: properties are generated in it.
    parsed.request.set_response_schema(spec["schema"].dump());
  }
  return absl::OkStatus();
}

// tools, tool_choice and parallel_tool_calls.
absl::Status ReadTools(const json& body, const nlohmann::ordered_json& ordered,
                       OpenAiRequest& parsed) {
  const json* tools = Field(body, "tools");
  const bool has_tools = tools != nullptr && !tools->is_null() && !tools->empty();
  if (tools != nullptr && !tools->is_null()) {
    if (!tools->is_array()) return Invalid("tools", "must be an array");
    for (size_t t = 0; t < tools->size(); ++t) {
      const json& tool = (*tools)[t];
      const std::string where = absl::StrCat("tools[", t, "]");
      if (!tool.is_object() || tool.value("type", "") != "function") {
        return Invalid(where, "must be {\"type\": \"function\", \"function\": {...}}");
      }
      const json* function = Field(tool, "function");
      if (function == nullptr || !function->is_object() || !function->contains("name") ||
          !(*function)["name"].is_string()) {
        return Invalid(absl::StrCat(where, ".function"), "must be an object with a string name");
      }
    }
  }
  std::string choice = has_tools ? "auto" : "none";
  if (const json* tool_choice = Field(body, "tool_choice");
      tool_choice != nullptr && !tool_choice->is_null()) {
    if (tool_choice->is_object()) {
      const json* function = Field(*tool_choice, "function");
      if (tool_choice->value("type", "") != "function" || function == nullptr ||
          !function->is_object() || !function->contains("name") ||
          !(*function)["name"].is_string()) {
        return Invalid("tool_choice",
                       "must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                       "\"function\": {\"name\": ...}}");
      }
      const std::string name = (*function)["name"].get<std::string>();
      const bool listed =
          has_tools && std::any_of(tools->begin(), tools->end(),
                                   [&](const json& t) { return t["function"]["name"] == name; });
      if (!listed) {
        return Invalid("tool_choice.function.name",
                       absl::StrCat("\"", name, "\" is not among the tools"));
      }
      parsed.forced_tool = name;
      choice = "function";
    } else if (!tool_choice->is_string()) {
      return Invalid("tool_choice", "must be a string or an object");
    } else {
      choice = tool_choice->get<std::string>();
      if (choice != "auto" && choice != "none" && choice != "required") {
        return Invalid("tool_choice", "must be \"auto\", \"none\" or \"required\"");
      }
      if (choice != "none" && !has_tools) {
        return Invalid("tool_choice", absl::StrCat("\"", choice, "\" needs tools"));
      }
      if (choice == "required") parsed.forced_tool = "";
    }
  }
  if (parsed.forced_tool &&
      (parsed.request.json_object() || !parsed.request.response_schema().empty())) {
    return Invalid("tool_choice",
                   "a forced tool call is its own structured output: it excludes a JSON "
                   "response_format");
  }
  BITSPLIT_ASSIGN_OR_RETURN(const std::optional<bool> parallel,
                            BoolField(body, "parallel_tool_calls"));
  parsed.parallel_tool_calls = parallel.value_or(true);
  // "none": the model is not told about the tools, so that it answers in text.
  parsed.parse_tool_calls = has_tools && choice != "none";
  if (parsed.parse_tool_calls) {
    parsed.request.mutable_chat()->set_tools_json(ordered["tools"].dump());
  }
  return absl::OkStatus();
}

absl::Status ReadPrompt(const json& body, v1::GenerateRequest& request) {
  const json* prompt = Field(body, "prompt");
  if (prompt == nullptr) return Invalid("prompt", "is required");
  const json* single = prompt;
  if (prompt->is_array() && !prompt->empty() && !(*prompt)[0].is_number()) {
    // A list of prompts: one is served, several are a batch this server does not take.
    if (prompt->size() != 1) return Invalid("prompt", "only one prompt per request is supported");
    single = &(*prompt)[0];
  }
  if (single->is_string()) {
    request.set_prompt(single->get<std::string>());
    return absl::OkStatus();
  }
  if (single->is_array()) {
    if (single->empty()) return Invalid("prompt", "must not be empty");
    v1::TokenIds* ids = request.mutable_token_ids();
    for (const json& id : *single) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return Invalid("prompt", "token ids must be non-negative integers");
      }
      ids->add_ids(static_cast<int32_t>(id.get<int64_t>()));
    }
    return absl::OkStatus();
  }
  return Invalid("prompt", "must be a string or an array of token ids");
}

absl::Status ReadStops(const json& body, v1::GenerateRequest& request) {
  if (const json* stop = Field(body, "stop"); stop != nullptr) {
    if (stop->is_string()) {
      request.add_stop(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const json& s : *stop) {
        if (!s.is_string()) return Invalid("stop", "must be a string or an array of strings");
        request.add_stop(s.get<std::string>());
      }
    } else {
      return Invalid("stop", "must be a string or an array of strings");
    }
  }
  if (const json* ids = Field(body, "stop_token_ids"); ids != nullptr) {
    if (!ids->is_array()) return Invalid("stop_token_ids", "must be an array of token ids");
    for (const json& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return Invalid("stop_token_ids", "must be non-negative integers");
      }
      request.add_stop_token_ids(static_cast<int32_t>(id.get<int64_t>()));
    }
  }
  return absl::OkStatus();
}

absl::Status ReadSampling(const json& body, v1::GenerateRequest& request) {
  BITSPLIT_ASSIGN_OR_RETURN(const std::optional<int32_t> max_tokens,
                            Int32Field(body, "max_tokens"));
  BITSPLIT_ASSIGN_OR_RETURN(const std::optional<int32_t> max_completion_tokens,
                            Int32Field(body, "max_completion_tokens"));
  const char* max_field = max_completion_tokens ? "max_completion_tokens" : "max_tokens";
  const std::optional<int32_t> max = max_completion_tokens ? max_completion_tokens : max_tokens;
  if (max) {
    // 0 would mean "the server's default" to the gRPC API.
    if (*max < 1) return Invalid(max_field, "must be at least 1");
    request.set_max_tokens(*max);
  }
  BITSPLIT_ASSIGN_OR_RETURN(const std::optional<double> temperature,
                            NumberField(body, "temperature"));
  request.set_temperature(static_cast<float>(temperature.value_or(1.0)));
  BITSPLIT_ASSIGN_OR_RETURN(const std::optional<double> top_p, NumberField(body, "top_p"));
  request.set_top_p(static_cast<float>(top_p.value_or(1.0)));
  BITSPLIT_ASSIGN_OR_RETURN(const std::optional<int32_t> top_k, Int32Field(body, "top_k"));
  if (top_k) request.set_top_k(*top_k);
  BITSPLIT_ASSIGN_OR_RETURN(const std::optional<int64_t> seed, IntField(body, "seed"));
  if (seed) {
    if (*seed < 0) return Invalid("seed", "must be a non-negative integer");
    request.set_seed(static_cast<uint64_t>(*seed));
  }
  // llama.cpp server's name for the prefix cache's switch (default on).
  BITSPLIT_ASSIGN_OR_RETURN(const std::optional<bool> cache_prompt,
                            BoolField(body, "cache_prompt"));
  request.set_skip_prefix_cache(!cache_prompt.value_or(true));
  return ReadStops(body, request);
}

absl::Status ReadSpeculation(const json& body, v1::GenerateRequest& request) {
  const json* extension = Field(body, "bitsplit");
  if (extension == nullptr) return absl::OkStatus();
  if (!extension->is_object()) return Invalid("bitsplit", "must be an object");
  const json* speculation = Field(*extension, "speculation");
  if (speculation == nullptr) return absl::OkStatus();
  if (!speculation->is_object()) {
    return Invalid("bitsplit.speculation",
                   "must be an object {mode, nodes, expansions, max_depth}");
  }
  v1::SpeculationSettings& settings = *request.mutable_speculation();
  BITSPLIT_ASSIGN_OR_RETURN(const std::optional<std::string> mode,
                            StringField(*speculation, "mode"));
  if (!mode || *mode == "adaptive") {
    settings.set_mode(mode ? v1::SpeculationSettings::MODE_ADAPTIVE
                           : v1::SpeculationSettings::MODE_UNSPECIFIED);
  } else if (*mode == "tree") {
    settings.set_mode(v1::SpeculationSettings::MODE_TREE);
  } else if (*mode == "off") {
    settings.set_mode(v1::SpeculationSettings::MODE_OFF);
  } else {
    return Invalid("bitsplit.speculation.mode",
                   absl::StrCat("'", *mode, "' is not one of adaptive, tree, off"));
  }
  BITSPLIT_ASSIGN_OR_RETURN(const std::optional<int32_t> nodes, Int32Field(*speculation, "nodes"));
  if (nodes) settings.set_nodes(*nodes);
  BITSPLIT_ASSIGN_OR_RETURN(const std::optional<int32_t> expansions,
                            Int32Field(*speculation, "expansions"));
  if (expansions) settings.set_expansions_per_step(*expansions);
  BITSPLIT_ASSIGN_OR_RETURN(const std::optional<int32_t> depth,
                            Int32Field(*speculation, "max_depth"));
  if (depth) settings.set_max_depth(*depth);
  return absl::OkStatus();
}

absl::Status ReadLogprobs(const json& body, OpenAiRequest& parsed) {
  if (parsed.endpoint == Endpoint::kChatCompletions) {
    BITSPLIT_ASSIGN_OR_RETURN(const std::optional<bool> logprobs, BoolField(body, "logprobs"));
    BITSPLIT_ASSIGN_OR_RETURN(const std::optional<int32_t> top, Int32Field(body, "top_logprobs"));
    parsed.logprobs = logprobs.value_or(false);
    if (top && !parsed.logprobs) return Invalid("top_logprobs", "needs \"logprobs\": true");
    parsed.top_logprobs = top.value_or(0);
  } else {
    BITSPLIT_ASSIGN_OR_RETURN(const std::optional<int32_t> logprobs, Int32Field(body, "logprobs"));
    parsed.logprobs = logprobs.has_value();
    parsed.top_logprobs = logprobs.value_or(0);
  }
  if (parsed.top_logprobs < 0) {
    return Invalid(parsed.endpoint == Endpoint::kChatCompletions ? "top_logprobs" : "logprobs",
                   "must not be negative");
  }
  // The gRPC API returns the chosen token's log-probability with its alternatives: ask for at
  // least one, and send as many as the request asked for.
  if (parsed.logprobs) parsed.request.set_logprobs(std::max(1, parsed.top_logprobs));
  return absl::OkStatus();
}

absl::Status ReadStreaming(const json& body, OpenAiRequest& parsed) {
  BITSPLIT_ASSIGN_OR_RETURN(const std::optional<bool> stream, BoolField(body, "stream"));
  parsed.stream = stream.value_or(false);
  if (const json* options = Field(body, "stream_options"); options != nullptr) {
    if (!parsed.stream) return Invalid("stream_options", "is only allowed with \"stream\": true");
    if (!options->is_object()) return Invalid("stream_options", "must be an object");
    BITSPLIT_ASSIGN_OR_RETURN(const std::optional<bool> include_usage,
                              BoolField(*options, "include_usage"));
    parsed.include_usage = include_usage.value_or(false);
  }
  return absl::OkStatus();
}

json StatsJson(const v1::SpeculationStats& stats) {
  json depth = json::array();
  for (double p : stats.acceptance_by_depth()) depth.push_back(p);
  return {{"shape", stats.shape()},
          {"verify_steps", stats.verify_steps()},
          {"mean_accepted_per_verify", stats.mean_accepted_per_verify()},
          {"acceptance_by_depth", std::move(depth)},
          {"draft_ns", stats.draft_ns()},
          {"verify_ns", stats.verify_ns()},
          {"time_to_first_token_ns", stats.time_to_first_token_ns()},
          {"tokens_per_second", stats.tokens_per_second()}};
}

json UsageJson(const v1::Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens()},
          {"completion_tokens", usage.completion_tokens()},
          {"total_tokens", usage.prompt_tokens() + usage.completion_tokens()},
          {"prompt_tokens_details", {{"cached_tokens", usage.cached_prompt_tokens()}}}};
}

}  // namespace

absl::StatusOr<OpenAiRequest> ParseRequest(Endpoint endpoint, std::string_view body,
                                           std::string_view served_model) {
  json parsed_body;
  try {
    parsed_body = json::parse(body);
  } catch (const json::parse_error& error) {
    return absl::InvalidArgumentError(absl::StrCat("the body is not valid JSON: ", error.what()));
  }
  if (!parsed_body.is_object()) return absl::InvalidArgumentError("the body must be a JSON object");
  OpenAiRequest parsed;
  parsed.endpoint = endpoint;
  BITSPLIT_ASSIGN_OR_RETURN(const std::optional<std::string> model,
                            StringField(parsed_body, "model"));
  parsed.model = model.value_or(std::string(served_model));
  if (parsed.model != served_model) {
    return absl::NotFoundError(absl::StrCat("the model '", parsed.model,
                                            "' does not exist; this server serves '",
                                            std::string(served_model), "'"));
  }
  BITSPLIT_RETURN_IF_ERROR(RefuseUnsupported(parsed_body, endpoint));
  // Tools, tool-call arguments and schemas keep the client's key order.
  const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(body);
  BITSPLIT_RETURN_IF_ERROR(ReadResponseFormat(ordered, parsed));
  if (endpoint == Endpoint::kChatCompletions) {
    BITSPLIT_RETURN_IF_ERROR(ReadChatMessages(parsed_body, ordered, parsed.request));
    BITSPLIT_RETURN_IF_ERROR(ReadTools(parsed_body, ordered, parsed));
  } else {
    BITSPLIT_RETURN_IF_ERROR(ReadPrompt(parsed_body, parsed.request));
  }
  BITSPLIT_RETURN_IF_ERROR(ReadSampling(parsed_body, parsed.request));
  BITSPLIT_RETURN_IF_ERROR(ReadSpeculation(parsed_body, parsed.request));
  BITSPLIT_RETURN_IF_ERROR(ReadLogprobs(parsed_body, parsed));
  BITSPLIT_RETURN_IF_ERROR(ReadStreaming(parsed_body, parsed));
  return parsed;
}

std::string_view FinishReasonName(v1::FinishReason reason) {
  return reason == v1::FINISH_REASON_LENGTH ? "length" : "stop";
}

std::vector<int32_t> ControlMarkerIds(const text::Tokenizer& tokenizer,
                                      text::ToolCallFormat format) {
  std::vector<int32_t> ids;
  for (std::string_view marker : text::ToolCallMarkers(format)) {
    const std::vector<int32_t> tokens = tokenizer.Encode(marker, /*parse_special=*/true);
    if (tokens.size() == 1 && tokenizer.IsControl(tokens[0])) ids.push_back(tokens[0]);
  }
  return ids;
}

absl::Status ApplyToolCallFormat(std::optional<text::ToolCallFormat> format,
                                 std::span<const int32_t> control_marker_ids,
                                 OpenAiRequest& request) {
  if (format == text::ToolCallFormat::kHarmony && request.endpoint == Endpoint::kChatCompletions) {
    // Every harmony answer is read for its channels, so the markers always show.
    request.request.mutable_render_token_ids()->Assign(control_marker_ids.begin(),
                                                       control_marker_ids.end());
    // A constrained answer goes to the final channel, as llama.cpp's harmony grammar writes it.
    if ((!request.request.response_schema().empty() || request.request.json_object()) &&
        !request.forced_tool) {
      request.request.set_response_prefix(std::string(text::ConstrainedAnswerPrefix(*format)));
    }
  }
  if (!request.parse_tool_calls) return absl::OkStatus();
  if (!format) {
    return Invalid("tools",
                   "the model's chat template writes no tool-call syntax this server parses "
                   "(Llama 3 JSON, Hermes/Qwen <tool_call>, Qwen3-Coder XML, Mistral "
                   "[TOOL_CALLS], Gemma 4)");
  }
  request.request.mutable_render_token_ids()->Assign(control_marker_ids.begin(),
                                                     control_marker_ids.end());
  if (!request.forced_tool) return absl::OkStatus();
  const nlohmann::ordered_json tools =
      nlohmann::ordered_json::parse(request.request.chat().tools_json());
  absl::StatusOr<text::ForcedToolCall> forced =
      text::ForcedToolCallOutput(*format, tools, *request.forced_tool, request.parallel_tool_calls);
  if (!forced.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("tool_choice: ", forced.status().message()));
  }
  request.request.set_response_schema(forced->schema.dump());
  request.request.set_response_prefix(forced->prefix);
  request.request.set_response_suffix(forced->suffix);
  return absl::OkStatus();
}

ResponseBuilder::ResponseBuilder(const OpenAiRequest& request, ResponseIdentity identity,
                                 const text::Tokenizer& tokenizer,
                                 std::optional<text::ToolCallFormat> tool_call_format)
    : request_(request), identity_(std::move(identity)), tokenizer_(tokenizer) {
  const bool harmony = tool_call_format == text::ToolCallFormat::kHarmony &&
                       request_.endpoint == Endpoint::kChatCompletions;
  if ((request_.parse_tool_calls && tool_call_format) || harmony) {
    text::ToolCallParserOptions options;
    options.calls = request_.parse_tool_calls;
    if (request_.parse_tool_calls) {
      options.tools = json::parse(request_.request.chat().tools_json(), nullptr, false);
    }
    // Ids differ between requests (and the turns of a conversation) as the response ids do.
    options.id_seed = std::hash<std::string>()(identity_.id);
    absl::StatusOr<text::ToolCallStreamParser> parser =
        text::ToolCallStreamParser::Create(*tool_call_format, std::move(options));
    // ParseRequest checked the tools' shape, which is all Create checks.
    BITSPLIT_CHECK(parser.ok());
    tool_parser_.emplace(*std::move(parser));
  }
  if (request_.endpoint == Endpoint::kChatCompletions) {
    logprobs_ = json::array();
  } else {
    logprobs_ = {{"tokens", json::array()},
                 {"token_logprobs", json::array()},
                 {"top_logprobs", json::array()},
                 {"text_offset", json::array()}};
  }
}

json ResponseBuilder::ChunkObject(json choice) const {
  const bool chat = request_.endpoint == Endpoint::kChatCompletions;
  json chunk = {{"id", identity_.id},
                {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", identity_.created},
                {"model", identity_.model},
                {"system_fingerprint", identity_.system_fingerprint},
                {"choices", json::array({std::move(choice)})}};
  if (request_.include_usage) chunk["usage"] = nullptr;
  return chunk;
}

std::vector<json> ResponseBuilder::StreamStart() {
  if (request_.endpoint != Endpoint::kChatCompletions) return {};
  return {ChunkObject({{"index", 0},
                       {"delta", {{"role", "assistant"}, {"content", ""}}},
                       {"logprobs", nullptr},
                       {"finish_reason", nullptr}})};
}

// The log-probabilities of a chunk's tokens in the endpoint's shape, and kept for the response.
json ResponseBuilder::LogprobsOf(const v1::GenerateChunk& chunk) const {
  auto piece = [this](int32_t id) {
    absl::StatusOr<std::string_view> text = tokenizer_.TokenToPiece(id, /*render_special=*/true);
    return text.ok() ? std::string(*text) : std::string();
  };
  auto bytes_of = [](const std::string& s) {
    json bytes = json::array();
    for (unsigned char c : s) bytes.push_back(static_cast<int>(c));
    return bytes;
  };
  const size_t top = static_cast<size_t>(request_.top_logprobs);
  if (request_.endpoint == Endpoint::kChatCompletions) {
    json content = json::array();
    for (const v1::TokenLogprob& lp : chunk.logprobs()) {
      const std::string text = piece(lp.token_id());
      json alternatives = json::array();
      for (int i = 0; i < lp.top_ids_size() && static_cast<size_t>(i) < top; ++i) {
        const std::string alternative = piece(lp.top_ids(i));
        alternatives.push_back({{"token", text::ReplaceInvalidUtf8(alternative)},
                                {"logprob", lp.top_logprobs(i)},
                                {"bytes", bytes_of(alternative)}});
      }
      content.push_back({{"token", text::ReplaceInvalidUtf8(text)},
                         {"logprob", lp.logprob()},
                         {"bytes", bytes_of(text)},
                         {"top_logprobs", std::move(alternatives)}});
    }
    return content;
  }
  json out = {{"tokens", json::array()},
              {"token_logprobs", json::array()},
              {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
  int64_t offset = text_offset_;
  for (const v1::TokenLogprob& lp : chunk.logprobs()) {
    const std::string text = piece(lp.token_id());
    json alternatives = json::object();
    for (int i = 0; i < lp.top_ids_size() && static_cast<size_t>(i) < top; ++i) {
      alternatives[text::ReplaceInvalidUtf8(piece(lp.top_ids(i)))] = lp.top_logprobs(i);
    }
    out["tokens"].push_back(text::ReplaceInvalidUtf8(text));
    out["token_logprobs"].push_back(lp.logprob());
    out["top_logprobs"].push_back(std::move(alternatives));
    out["text_offset"].push_back(offset);
    offset += static_cast<int64_t>(text.size());
  }
  return out;
}

std::optional<json> ResponseBuilder::AddChunk(const v1::GenerateChunk& chunk) {
  if (chunk.text().empty() && chunk.token_ids_size() == 0) return std::nullopt;
  text_ += chunk.text();
  token_ids_.insert(token_ids_.end(), chunk.token_ids().begin(), chunk.token_ids().end());
  json logprobs = nullptr;
  if (request_.logprobs) {
    json these = LogprobsOf(chunk);
    if (request_.endpoint == Endpoint::kChatCompletions) {
      for (json& entry : these) logprobs_.push_back(entry);
      logprobs = {{"content", these}};
    } else {
      for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
        for (json& entry : these[key]) logprobs_[key].push_back(entry);
      }
      for (const v1::TokenLogprob& lp : chunk.logprobs()) {
        absl::StatusOr<std::string_view> text = tokenizer_.TokenToPiece(lp.token_id(), true);
        if (text.ok()) text_offset_ += static_cast<int64_t>(text->size());
      }
      logprobs = std::move(these);
    }
  }
  json token_ids = json::array();
  for (int32_t id : chunk.token_ids()) token_ids.push_back(id);
  json choice;
  if (request_.endpoint == Endpoint::kChatCompletions) {
    json delta = {{"content", chunk.text()}};
    if (tool_parser_) {
      delta = ToolDelta(tool_parser_->Feed(chunk.text()));
      if (delta.is_null()) delta = {{"content", ""}};
    }
    choice = {{"index", 0},
              {"delta", std::move(delta)},
              {"logprobs", std::move(logprobs)},
              {"finish_reason", nullptr}};
  } else {
    choice = {{"index", 0},
              {"text", chunk.text()},
              {"logprobs", std::move(logprobs)},
              {"finish_reason", nullptr}};
  }
  json event = ChunkObject(std::move(choice));
  event["bitsplit"] = {{"token_ids", std::move(token_ids)}};
  return event;
}

json ResponseBuilder::Extension(const v1::GenerateComplete& complete) const {
  return {{"speculation", StatsJson(complete.speculation())},
          {"finish_reason", v1::FinishReason_Name(complete.finish_reason())}};
}

json ResponseBuilder::ToolDelta(const text::ToolCallStreamDelta& delta) {
  if (delta.empty()) return nullptr;
  text::ToolCallStreamDelta kept = delta;
  std::erase_if(kept.tool_calls, [&](const text::ToolCallDelta& call) {
    return !request_.parallel_tool_calls && call.index > 0;
  });
  // The parser's deltas are in streaming order by construction.
  BITSPLIT_CHECK(text::AppendToolCallStreamDelta(kept, parsed_).ok());
  json out = json::object();
  if (!kept.reasoning.empty()) out["reasoning_content"] = kept.reasoning;
  if (!kept.content.empty()) out["content"] = kept.content;
  json calls = json::array();
  for (const text::ToolCallDelta& call : kept.tool_calls) {
    json entry = {{"index", call.index}};
    if (!call.name.empty()) {
      entry["id"] = call.id;
      entry["type"] = "function";
      entry["function"] = {{"name", call.name}, {"arguments", call.arguments}};
    } else {
      entry["function"] = {{"arguments", call.arguments}};
    }
    calls.push_back(std::move(entry));
  }
  if (!calls.empty()) out["tool_calls"] = std::move(calls);
  return out.empty() ? json(nullptr) : out;
}

text::ToolCallStreamDelta ResponseBuilder::FinishToolCalls() {
  if (!tool_parser_ || tool_parser_finished_) return {};
  tool_parser_finished_ = true;
  return tool_parser_->Finish();
}

std::string_view ResponseBuilder::FinishReason(const v1::GenerateComplete& complete) const {
  if (!parsed_.tool_calls.empty()) return "tool_calls";
  return FinishReasonName(complete.finish_reason());
}

std::vector<json> ResponseBuilder::StreamEnd(const v1::GenerateComplete& complete) {
  std::vector<json> events;
  if (json rest = ToolDelta(FinishToolCalls()); !rest.is_null()) {
    events.push_back(ChunkObject({{"index", 0},
                                  {"delta", std::move(rest)},
                                  {"logprobs", nullptr},
                                  {"finish_reason", nullptr}}));
  }
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", FinishReason(complete)}};
  if (request_.endpoint == Endpoint::kChatCompletions) {
    choice["delta"] = json::object();
  } else {
    choice["text"] = "";
  }
  json last = ChunkObject(std::move(choice));
  last["bitsplit"] = Extension(complete);
  events.push_back(std::move(last));
  if (request_.include_usage) {
    json usage = ChunkObject(json::object());
    usage["choices"] = json::array();
    usage["usage"] = UsageJson(complete.usage());
    events.push_back(std::move(usage));
  }
  return events;
}

json ResponseBuilder::Response(const v1::GenerateComplete& complete) {
  const bool chat = request_.endpoint == Endpoint::kChatCompletions;
  json logprobs = nullptr;
  if (request_.logprobs) logprobs = chat ? json{{"content", logprobs_}} : logprobs_;
  ToolDelta(FinishToolCalls());
  json choice = {
      {"index", 0}, {"logprobs", std::move(logprobs)}, {"finish_reason", FinishReason(complete)}};
  if (chat && tool_parser_) {
    json message = {{"role", "assistant"}, {"content", parsed_.content}, {"refusal", nullptr}};
    if (!parsed_.reasoning.empty()) message["reasoning_content"] = parsed_.reasoning;
    if (!parsed_.tool_calls.empty()) {
      if (parsed_.content.empty()) message["content"] = nullptr;
      json calls = json::array();
      for (const text::ToolCall& call : parsed_.tool_calls) {
        calls.push_back({{"id", call.id},
                         {"type", "function"},
                         {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
      }
      message["tool_calls"] = std::move(calls);
    }
    choice["message"] = std::move(message);
  } else if (chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text_}, {"refusal", nullptr}};
  } else {
    choice["text"] = text_;
  }
  json extension = Extension(complete);
  extension["token_ids"] = token_ids_;
  return {{"id", identity_.id},
          {"object", chat ? "chat.completion" : "text_completion"},
          {"created", identity_.created},
          {"model", identity_.model},
          {"system_fingerprint", identity_.system_fingerprint},
          {"choices", json::array({std::move(choice)})},
          {"usage", UsageJson(complete.usage())},
          {"bitsplit", std::move(extension)}};
}

json ErrorBody(std::string_view message, std::string_view type, std::string_view code) {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", nullptr},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

json ModelList(const v1::ModelInfo& info, std::string_view served_model, int64_t created) {
  json model = {{"id", served_model},
                {"object", "model"},
                {"created", created},
                {"owned_by", "bitsplit"},
                {"bitsplit",
                 {{"name", info.name()},
                  {"architecture", info.architecture()},
                  {"layers", info.layers()},
                  {"d_model", info.d_model()},
                  {"vocab_size", info.vocab_size()},
                  {"context_length", info.context_length()},
                  {"base_format", info.base_format()},
                  {"residual_format", info.residual_format()},
                  {"fingerprint", info.fingerprint()}}}};
  return {{"object", "list"}, {"data", json::array({std::move(model)})}};
}

std::string Dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace bitsplit::coordinator::openai
