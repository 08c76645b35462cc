// The coordinator's HTTP pieces as units: the OpenAI request translation (openai_api.h) against
// the fields OpenAI documents, the response objects built from generation chunks against the
// tokenizer's own pieces, and the Prometheus exposition (metrics.h) against the text format's
// rules and the arithmetic of what was observed.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/io/gguf.h"
#include "common/text/chat_template.h"
#include "common/text/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/coordinator/metrics.h"
#include "services/coordinator/openai_api.h"
#include "services/coordinator/request_validation.h"
#include "tests/testing/paths.h"

namespace bitsplit::coordinator {
namespace {

using nlohmann::json;
using openai::Endpoint;
using openai::ParseRequest;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

absl::StatusOr<openai::OpenAiRequest> Chat(const json& body) {
  return ParseRequest(Endpoint::kChatCompletions, body.dump(), "m");
}
absl::StatusOr<openai::OpenAiRequest> Completion(const json& body) {
  return ParseRequest(Endpoint::kCompletions, body.dump(), "m");
}

const json kUser = json::array({{{"role", "user"}, {"content", "hi"}}});
// OpenAI's tool shape; the properties out of alphabetical order, as clients write them.
const json kTools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
    "description": "Weather of a city.", "parameters": {"type": "object", "properties":
    {"city": {"type": "string"}, "unit": {"type": "string"}}, "required": ["city"]}}}])");

TEST(OpenAiRequestTest, ToolsAndToolHistoryBecomeTheGrpcChat) {
  // Keys in the client's order all the way to the template: the body is text, not a json
  // object (which sorts its keys).
  const std::string body = R"({"messages": [
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
          "function": {"name": "get_weather", "arguments": "{\"unit\": \"C\", \"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18 C"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters":
        {"type": "object", "properties": {"unit": {"type": "string"}, "city": {"type": "string"}}}}}],
    "parallel_tool_calls": false})";
  const auto parsed = ParseRequest(Endpoint::kChatCompletions, body, "m");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->parse_tool_calls);
  EXPECT_FALSE(parsed->parallel_tool_calls);
  const v1::ChatMessages& chat = parsed->request.chat();
  EXPECT_EQ(chat.tools_json(),
            R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",)"
            R"("properties":{"unit":{"type":"string"},"city":{"type":"string"}}}}}])");
  ASSERT_EQ(chat.messages_size(), 3);
  EXPECT_FALSE(chat.messages(1).has_content());
  ASSERT_EQ(chat.messages(1).tool_calls_size(), 1);
  EXPECT_EQ(chat.messages(1).tool_calls(0).id(), "call_1");
  EXPECT_EQ(chat.messages(1).tool_calls(0).name(), "get_weather");
  EXPECT_EQ(chat.messages(1).tool_calls(0).arguments(), R"({"unit":"C","city":"Paris"})");
  EXPECT_EQ(chat.messages(2).role(), "tool");
  EXPECT_EQ(chat.messages(2).tool_call_id(), "call_1");
  EXPECT_EQ(chat.messages(2).name(), "get_weather");
  EXPECT_EQ(chat.messages(2).content(), "18 C");
  // tool_choice "none": the model is not told about the tools and its text is not parsed.
  const auto none = Chat({{"messages", kUser}, {"tools", kTools}, {"tool_choice", "none"}});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->parse_tool_calls);
  EXPECT_TRUE(none->request.chat().tools_json().empty());
}

// tool_choice "required" or a named function: the output is one call in the template's syntax,
// constrained like a response_format schema (its shape is text::ForcedToolCallOutput's, tested
// in text_tool_calls_test); the control markers are rendered for the parser.
TEST(OpenAiRequestTest, ForcedToolCallsBecomeAFramedSchema) {
  const json two_tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
      "required": ["city"]}}}, {"type": "function", "function": {"name": "get_time"}}])");
  auto named =
      Chat({{"messages", kUser},
            {"tools", two_tools},
            {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_time"}}}}}});
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_TRUE(named->parse_tool_calls);
  ASSERT_EQ(named->forced_tool, "get_time");
  const std::vector<int32_t> markers = {7, 9};
  ASSERT_TRUE(openai::ApplyToolCallFormat(text::ToolCallFormat::kHermes, markers, *named).ok());
  EXPECT_EQ(named->request.response_prefix(), "<tool_call>\n");
  EXPECT_EQ(named->request.response_suffix(), "\n</tool_call>");
  EXPECT_EQ(json::parse(named->request.response_schema()),
            json::parse(R"({"type": "object", "properties": {"name": {"const": "get_time"},
                "arguments": {"type": "object"}}, "required": ["name", "arguments"]})"));
  EXPECT_EQ(std::vector<int32_t>(named->request.render_token_ids().begin(),
                                 named->request.render_token_ids().end()),
            markers);
  EXPECT_FALSE(named->request.json_object());

  auto required = Chat({{"messages", kUser}, {"tools", two_tools}, {"tool_choice", "required"}});
  ASSERT_TRUE(required.ok()) << required.status();
  ASSERT_EQ(required->forced_tool, "");
  ASSERT_TRUE(openai::ApplyToolCallFormat(text::ToolCallFormat::kLlama3Json, {}, *required).ok());
  const json schema = json::parse(required->request.response_schema());
  ASSERT_EQ(schema["anyOf"].size(), 2u);
  EXPECT_EQ(schema["anyOf"][0]["properties"]["name"]["const"], "get_weather");
  EXPECT_EQ(schema["anyOf"][1]["properties"]["name"]["const"], "get_time");
  EXPECT_TRUE(schema["anyOf"][0]["properties"].contains("parameters"));
  EXPECT_EQ(required->request.response_prefix(), "");

  // A syntax whose arguments are not JSON cannot be forced; "auto" still works with it.
  auto gemma = Chat({{"messages", kUser}, {"tools", two_tools}, {"tool_choice", "required"}});
  ASSERT_TRUE(gemma.ok());
  const absl::Status refused =
      openai::ApplyToolCallFormat(text::ToolCallFormat::kGemma4, {}, *gemma);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("tool_choice: forcing a tool call"));
  auto automatic = Chat({{"messages", kUser}, {"tools", two_tools}});
  ASSERT_TRUE(automatic.ok());
  EXPECT_TRUE(openai::ApplyToolCallFormat(text::ToolCallFormat::kGemma4, {}, *automatic).ok());
  EXPECT_TRUE(automatic->request.response_schema().empty());
  // A template without a tool syntax refuses tools; a request without tools is untouched.
  const absl::Status no_syntax = openai::ApplyToolCallFormat(std::nullopt, {}, *automatic);
  EXPECT_THAT(std::string(no_syntax.message()), HasSubstr("tools: the model's chat template"));
  auto plain = Chat({{"messages", kUser}});
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(openai::ApplyToolCallFormat(std::nullopt, markers, *plain).ok());
  EXPECT_EQ(plain->request.render_token_ids_size(), 0);
}

// Harmony (gpt-oss): every chat answer shows its markers, since the channels are read from
// the text; a constrained answer is framed as a final-channel message and a forced call as a
// message to the function.
TEST(OpenAiRequestTest, HarmonyAnswersShowTheirMarkersAndFrameConstrainedOutput) {
  const std::vector<int32_t> markers = {3, 4, 5};
  const auto ids = [](const openai::OpenAiRequest& request) {
    return std::vector<int32_t>(request.request.render_token_ids().begin(),
                                request.request.render_token_ids().end());
  };
  auto plain = Chat({{"messages", kUser}});
  ASSERT_TRUE(plain.ok());
  ASSERT_TRUE(openai::ApplyToolCallFormat(text::ToolCallFormat::kHarmony, markers, *plain).ok());
  EXPECT_EQ(ids(*plain), markers);
  EXPECT_EQ(plain->request.response_prefix(), "");

  auto schema = Chat({{"messages", kUser},
                      {"response_format",
                       {{"type", "json_schema"},
                        {"json_schema", {{"name", "x"}, {"schema", {{"type", "object"}}}}}}}});
  ASSERT_TRUE(schema.ok()) << schema.status();
  ASSERT_TRUE(openai::ApplyToolCallFormat(text::ToolCallFormat::kHarmony, markers, *schema).ok());
  EXPECT_EQ(schema->request.response_prefix(), "<|channel|>final<|message|>");

  auto named =
      Chat({{"messages", kUser},
            {"tools", kTools},
            {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}});
  ASSERT_TRUE(named.ok());
  ASSERT_TRUE(openai::ApplyToolCallFormat(text::ToolCallFormat::kHarmony, markers, *named).ok());
  EXPECT_EQ(named->request.response_prefix(),
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>");
  EXPECT_EQ(json::parse(named->request.response_schema()), kTools[0]["function"]["parameters"]);
  EXPECT_EQ(ids(*named), markers);

  json two_tools = kTools;
  two_tools.push_back({{"type", "function"}, {"function", {{"name", "get_time"}}}});
  auto required = Chat({{"messages", kUser}, {"tools", two_tools}, {"tool_choice", "required"}});
  ASSERT_TRUE(required.ok());
  const absl::Status refused =
      openai::ApplyToolCallFormat(text::ToolCallFormat::kHarmony, markers, *required);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("name one function"));

  auto completion = Completion({{"prompt", "x"}});
  ASSERT_TRUE(completion.ok());
  ASSERT_TRUE(
      openai::ApplyToolCallFormat(text::ToolCallFormat::kHarmony, markers, *completion).ok());
  EXPECT_TRUE(ids(*completion).empty());
}

// An assistant's reasoning_content reaches the template as `thinking`: gpt-oss's template (from
// the corpus) writes it into the analysis channel of a turn that called a tool.
TEST(OpenAiRequestTest, ReasoningContentReachesTheTemplate) {
  auto file = gguf::File::Open(testing::ModelPath(testing::kSmolLm2File));
  ASSERT_TRUE(file.ok()) << file.status();
  auto tokenizer = text::Tokenizer::FromGguf(**file);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  std::ifstream in(testing::SourcePath("tests/fixtures/chat_templates/corpus.json"));
  const nlohmann::ordered_json corpus = nlohmann::ordered_json::parse(in);
  std::string source;
  for (const auto& entry : corpus["templates"]) {
    if (entry["file"] == "openai-gpt-oss-120b.jinja") source = entry["source"];
  }
  ASSERT_FALSE(source.empty());
  auto chat_template = text::ChatTemplate::FromSource(source, {});
  ASSERT_TRUE(chat_template.ok()) << chat_template.status();
  const std::string body = R"({"messages": [
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": null, "reasoning_content": "Use the weather tool.",
       "tool_calls": [{"id": "call_1", "type": "function",
          "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]})";
  const auto parsed = ParseRequest(Endpoint::kChatCompletions, body, "m");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->request.chat().messages(1).reasoning_content(), "Use the weather tool.");
  const auto tokens = PromptTokens(parsed->request, **tokenizer, &*chat_template);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  const auto prompt = (*tokenizer)->Decode(*tokens);
  ASSERT_TRUE(prompt.ok());
  EXPECT_THAT(*prompt, HasSubstr("<|start|>assistant<|channel|>analysis<|message|>Use the weather "
                                 "tool.<|end|><|start|>assistant to=functions.get_weather"));
  // Only an assistant reasons.
  const auto refused =
      Chat({{"messages", {{{"role", "user"}, {"content", "x"}, {"reasoning_content", "y"}}}}});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(OpenAiRequestTest, ChatFieldsBecomeTheGrpcRequest) {
  const auto parsed = Chat(
      {{"model", "m"},
       {"messages", json::array({{{"role", "developer"}, {"content", "be brief"}},
                                 {{"role", "user"},
                                  {"content", json::array({{{"type", "text"}, {"text", "a"}},
                                                           {{"type", "text"}, {"text", "b"}}})}},
                                 {{"role", "assistant"}, {"content", "c"}}})},
       {"max_tokens", 7},
       {"max_completion_tokens", 9},
       {"temperature", 0.5},
       {"top_p", 0.9},
       {"top_k", 40},
       {"seed", 12345678901234ull},
       {"stop", "END"},
       {"logprobs", true},
       {"top_logprobs", 3},
       {"stream", true},
       {"stream_options", {{"include_usage", true}}},
       {"user", "ignored"},
       {"bitsplit",
        {{"speculation",
          {{"mode", "tree"}, {"nodes", 12}, {"expansions", 3}, {"max_depth", 5}}}}}});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const v1::GenerateRequest& request = parsed->request;
  ASSERT_EQ(request.chat().messages_size(), 3);
  EXPECT_EQ(request.chat().messages(0).role(), "system");  // developer is OpenAI's new name
  EXPECT_EQ(request.chat().messages(1).content(), "ab");
  EXPECT_EQ(request.chat().messages(2).role(), "assistant");
  EXPECT_EQ(request.max_tokens(), 9);  // max_completion_tokens wins
  EXPECT_FLOAT_EQ(request.temperature(), 0.5f);
  EXPECT_FLOAT_EQ(request.top_p(), 0.9f);
  EXPECT_EQ(request.top_k(), 40);
  EXPECT_EQ(request.seed(), 12345678901234ull);
  ASSERT_EQ(request.stop_size(), 1);
  EXPECT_EQ(request.stop(0), "END");
  EXPECT_EQ(request.logprobs(), 3);
  EXPECT_TRUE(parsed->stream);
  EXPECT_TRUE(parsed->include_usage);
  EXPECT_EQ(request.speculation().mode(), v1::SpeculationSettings::MODE_TREE);
  EXPECT_EQ(request.speculation().nodes(), 12);
  EXPECT_EQ(request.speculation().expansions_per_step(), 3);
  EXPECT_EQ(request.speculation().max_depth(), 5);
}

TEST(OpenAiRequestTest, UnsetSamplingIsOpenAisDefault) {
  const auto parsed = Chat({{"messages", kUser}});  // no model: the served one
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->model, "m");
  EXPECT_TRUE(parsed->request.has_temperature());
  EXPECT_FLOAT_EQ(parsed->request.temperature(), 1.0f);
  EXPECT_FLOAT_EQ(parsed->request.top_p(), 1.0f);
  EXPECT_FALSE(parsed->request.has_seed());
  EXPECT_EQ(parsed->request.max_tokens(), 0);  // the server's default
  EXPECT_EQ(parsed->request.logprobs(), 0);
  EXPECT_FALSE(parsed->stream);
  // logprobs without alternatives still asks the gRPC API for the chosen token's.
  const auto chosen_only = Chat({{"messages", kUser}, {"logprobs", true}});
  ASSERT_TRUE(chosen_only.ok());
  EXPECT_EQ(chosen_only->request.logprobs(), 1);
  EXPECT_EQ(chosen_only->top_logprobs, 0);
  // null is unset.
  const auto nulls = Chat({{"messages", kUser}, {"temperature", nullptr}, {"stop", nullptr}});
  ASSERT_TRUE(nulls.ok());
  EXPECT_FLOAT_EQ(nulls->request.temperature(), 1.0f);
}

TEST(OpenAiRequestTest, CompletionPromptsAsTextOrTokenIds) {
  auto parsed =
      Completion({{"prompt", "once"}, {"logprobs", 2}, {"stop", json::array({"a", "b"})}});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->request.prompt(), "once");
  EXPECT_EQ(parsed->request.logprobs(), 2);
  EXPECT_EQ(parsed->request.stop_size(), 2);
  parsed = Completion({{"prompt", json::array({1, 2, 3})}});
  ASSERT_TRUE(parsed.ok());
  EXPECT_THAT(parsed->request.token_ids().ids(), ::testing::ElementsAre(1, 2, 3));
  parsed = Completion({{"prompt", json::array({"only one"})}});
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->request.prompt(), "only one");
  parsed = Completion({{"prompt", json::array({json::array({5, 6})})}});
  ASSERT_TRUE(parsed.ok());
  EXPECT_THAT(parsed->request.token_ids().ids(), ::testing::ElementsAre(5, 6));
  parsed = Completion({{"prompt", "x"}, {"logprobs", 0}});
  ASSERT_TRUE(parsed.ok());
  EXPECT_TRUE(parsed->logprobs);  // 0: the chosen token's log-probability only
  EXPECT_EQ(parsed->request.logprobs(), 1);
}

TEST(OpenAiRequestTest, RefusalsNameTheField) {
  struct Case {
    json body;
    std::string needle;
    bool chat = true;
    absl::StatusCode code = absl::StatusCode::kInvalidArgument;
  };
  const std::vector<Case> cases = {
      {{{"messages", kUser}, {"n", 2}}, "n: only 1"},
      {{{"messages", kUser}, {"tools", json::array({{{"type", "function"}}})}},
       "tools[0].function:"},
      {{{"messages", kUser}, {"tools", "get_weather"}}, "tools: must be an array"},
      {{{"messages", kUser}, {"tool_choice", "auto"}}, "tool_choice: \"auto\" needs tools"},
      {{{"messages", kUser}, {"tool_choice", "required"}}, "tool_choice: \"required\" needs tools"},
      {{{"messages", kUser},
        {"tools", kTools},
        {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_time"}}}}}},
       "tool_choice.function.name: \"get_time\" is not among the tools"},
      {{{"messages", kUser}, {"tools", kTools}, {"tool_choice", {{"type", "function"}}}},
       "tool_choice: must be"},
      {{{"messages", kUser},
        {"tools", kTools},
        {"tool_choice", "required"},
        {"response_format", {{"type", "json_object"}}}},
       "tool_choice: a forced tool call is its own structured output"},
      {{{"messages", kUser}, {"tools", kTools}, {"tool_choice", "sometimes"}}, "tool_choice: must"},
      {{{"messages", kUser}, {"functions", json::array()}}, "functions: is not supported"},
      {{{"prompt", "x"}, {"tools", kTools}}, "tools: tools are a chat completions field", false},
      {{{"messages",
         json::array({{{"role", "assistant"},
                       {"content", nullptr},
                       {"tool_calls",
                        json::array({{{"id", "c"},
                                      {"type", "function"},
                                      {"function", {{"name", "f"}, {"arguments", "[1]"}}}}})}}})}},
       "messages[0].tool_calls[0].function.arguments: must be a JSON object"},
      {{{"messages",
         json::array({{{"role", "user"},
                       {"content", "x"},
                       {"tool_calls", json::array({{{"function", {{"name", "f"}}}}})}}})}},
       "messages[0].tool_calls: only assistant messages make calls"},
      {{{"messages", json::array({{{"role", "tool"}, {"content", "x"}}})}},
       "messages[0].tool_call_id: is required"},
      {{{"messages", json::array({{{"role", "assistant"}, {"content", nullptr}}})}},
       "messages[0].content: is required"},
      {{{"messages", kUser}, {"response_format", {{"type", "json_schema"}}}},
       "response_format.json_schema: must be an object"},
      {{{"messages", kUser}, {"response_format", {{"type", "yaml"}}}}, "response_format.type:"},
      {{{"messages", kUser}, {"presence_penalty", 0.5}}, "presence_penalty:"},
      {{{"messages", kUser}, {"frequency_penalty", -1}}, "frequency_penalty:"},
      {{{"messages", kUser}, {"logit_bias", {{"50256", -100}}}}, "logit_bias:"},
      {{{"messages", kUser}, {"top_logprobs", 2}}, "top_logprobs: needs"},
      {{{"messages", kUser}, {"stream_options", {{"include_usage", true}}}}, "stream_options:"},
      {{{"messages", kUser}, {"temperature", "hot"}}, "temperature: must be a number"},
      {{{"messages", kUser}, {"max_tokens", 0}}, "max_tokens: must be at least 1"},
      {{{"messages", kUser}, {"max_tokens", 2.5}}, "max_tokens: must be an integer"},
      {{{"messages", kUser}, {"seed", -1}}, "seed:"},
      {{{"messages", kUser}, {"stream", "yes"}}, "stream: must be true or false"},
      {{{"messages", kUser}, {"stop", json::array({1})}}, "stop:"},
      {{{"messages", kUser}, {"bitsplit", {{"speculation", {{"mode", "fast"}}}}}}, "'fast'"},
      {{{"messages", json::array()}}, "messages:"},
      {{{"messages", "hi"}}, "messages:"},
      {json::object(), "messages: is required"},
      {{{"messages", json::array({{{"role", "function"}, {"content", "x"}}})}}, "'function'"},
      {{{"messages", json::array({{{"role", "user"}}})}}, "messages[0].content: is required"},
      {{{"messages",
         json::array({{{"role", "user"}, {"content", json::array({{{"type", "image_url"}}})}}})}},
       "only text parts"},
      {{{"messages", kUser}, {"model", "other"}},
       "'other' does not exist",
       true,
       absl::StatusCode::kNotFound},
      {{{"prompt", json::array({"a", "b"})}}, "only one prompt", false},
      {{{"prompt", json::array({-1})}}, "non-negative", false},
      {{{"prompt", 5}}, "prompt: must be", false},
      {{{"prompt", "x"}, {"echo", true}}, "echo:", false},
      {{{"prompt", "x"}, {"best_of", 3}}, "best_of:", false},
      {{{"prompt", "x"}, {"suffix", "y"}}, "suffix:", false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body.dump());
    const auto parsed = c.chat ? Chat(c.body) : Completion(c.body);
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(parsed.status().code(), c.code);
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.needle));
  }
  for (const std::string body : {"", "{", "[1]", "\"text\"", "{\"messages\": [}"}) {
    const auto parsed = ParseRequest(Endpoint::kChatCompletions, body, "m");
    ASSERT_FALSE(parsed.ok()) << body;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  }
  // Deep nesting (a body of the 4 MiB limit) is an error, not a stack overflow.
  for (const std::string& body :
       {std::string(4 << 20, '['), std::string(1 << 20, '[') + std::string(1 << 20, ']'),
        "{\"messages\": " + std::string(1 << 20, '[') + std::string(1 << 20, ']') + "}"}) {
    const auto parsed = ParseRequest(Endpoint::kChatCompletions, body, "m");
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  }
  // What OpenAI's own clients send by default is taken.
  EXPECT_TRUE(Chat({{"messages", kUser},
                    {"n", 1},
                    {"tools", json::array()},
                    {"tool_choice", "none"},
                    {"response_format", {{"type", "text"}}},
                    {"presence_penalty", 0},
                    {"logit_bias", json::object()}})
                  .ok());
}

// A conversation with tools, an assistant's call and the tool's result, sent in OpenAI's shape
// (arguments as JSON text), reaches each real template as jinja2 rendered it with the arguments
// as an object (tests/fixtures/chat_templates/corpus.json, "tool_calls"): the prompt tokens are
// those of jinja2's text. Templates that print today's date (strftime_now) are left out.
TEST(OpenAiRequestTest, ToolConversationsRenderAsJinja2DoesThroughEveryTemplate) {
  auto file = gguf::File::Open(testing::ModelPath(testing::kSmolLm2File));
  ASSERT_TRUE(file.ok()) << file.status();
  auto tokenizer = text::Tokenizer::FromGguf(**file);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  std::ifstream in(testing::SourcePath("tests/fixtures/chat_templates/corpus.json"));
  const nlohmann::ordered_json corpus = nlohmann::ordered_json::parse(in);
  const nlohmann::ordered_json& conversation = corpus["conversations"]["tool_calls"];
  nlohmann::ordered_json body = {{"messages", nlohmann::ordered_json::array()},
                                 {"tools", conversation["tools"]}};
  for (nlohmann::ordered_json message : conversation["messages"]) {
    if (message.contains("tool_calls")) {
      for (auto& call : message["tool_calls"]) {
        call["function"]["arguments"] = call["function"]["arguments"].dump();
      }
    }
    body["messages"].push_back(std::move(message));
  }
  const auto parsed = ParseRequest(Endpoint::kChatCompletions, body.dump(), "m");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  int compared = 0;
  for (const auto& entry : corpus["templates"]) {
    const std::string source = entry["source"];
    if (source.find("strftime_now") != std::string::npos) continue;
    for (const auto& c : entry["cases"]) {
      if (c["conversation"] != "tool_calls" || !c["add_generation_prompt"].get<bool>() ||
          !c.contains("output")) {
        continue;
      }
      SCOPED_TRACE(entry["file"].get<std::string>());
      auto chat_template = text::ChatTemplate::FromSource(
          source, {.bos_token = corpus["bos_token"], .eos_token = corpus["eos_token"]});
      ASSERT_TRUE(chat_template.ok()) << chat_template.status();
      const auto tokens = PromptTokens(parsed->request, **tokenizer, &*chat_template);
      ASSERT_TRUE(tokens.ok()) << tokens.status();
      std::vector<int32_t> expected = (*tokenizer)->Encode(c["output"].get<std::string>(), true);
      if ((*tokenizer)->add_bos()) expected.insert(expected.begin(), (*tokenizer)->bos_id());
      EXPECT_EQ(*tokens, expected);
      ++compared;
    }
  }
  EXPECT_GE(compared, 50);
  std::printf("tool conversation: %d templates render as jinja2 does\n", compared);
}

class ResponseBuilderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto file = gguf::File::Open(testing::ModelPath(testing::kSmolLm2File));
    ASSERT_TRUE(file.ok()) << file.status();
    file_ = std::move(*file);
    auto tokenizer = text::Tokenizer::FromGguf(*file_);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = std::move(*tokenizer);
  }

  // A chunk of `text`'s tokens, with made-up log-probabilities (alternatives: the next ids).
  v1::GenerateChunk ChunkOf(const std::string& text, float logprob) const {
    v1::GenerateChunk chunk;
    chunk.set_text(text);
    for (int32_t id : tokenizer_->Encode(text, false)) {
      chunk.add_token_ids(id);
      v1::TokenLogprob* lp = chunk.add_logprobs();
      lp->set_token_id(id);
      lp->set_logprob(logprob);
      for (int i = 0; i < 4; ++i) {
        lp->add_top_ids(id + i);
        lp->add_top_logprobs(logprob - i);
      }
    }
    return chunk;
  }
  std::string Piece(int32_t id) const { return std::string(*tokenizer_->TokenToPiece(id, true)); }

  std::unique_ptr<gguf::File> file_;
  std::unique_ptr<text::Tokenizer> tokenizer_;
};

v1::GenerateComplete Complete(v1::FinishReason reason, int prompt, int completion) {
  v1::GenerateComplete complete;
  complete.set_finish_reason(reason);
  complete.mutable_usage()->set_prompt_tokens(prompt);
  complete.mutable_usage()->set_completion_tokens(completion);
  complete.mutable_speculation()->set_shape("off");
  complete.mutable_speculation()->set_verify_steps(completion);
  return complete;
}

TEST_F(ResponseBuilderTest, ChatResponseAndStreamDescribeTheSameAnswer) {
  auto request = Chat({{"messages", kUser},
                       {"logprobs", true},
                       {"top_logprobs", 2},
                       {"stream", true},
                       {"stream_options", {{"include_usage", true}}}});
  ASSERT_TRUE(request.ok());
  openai::ResponseBuilder builder(*request, {"chatcmpl-1", 1700000000, "m", "bitsplit-abc"},
                                  *tokenizer_);
  const std::vector<json> start = builder.StreamStart();
  ASSERT_EQ(start.size(), 1u);
  EXPECT_EQ(start[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(start[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(start[0]["usage"].is_null());
  const v1::GenerateChunk first = ChunkOf("Paris is", -0.25f);
  const v1::GenerateChunk second = ChunkOf(" the capital", -0.5f);
  const auto event1 = builder.AddChunk(first);
  const auto event2 = builder.AddChunk(second);
  EXPECT_FALSE(builder.AddChunk(v1::GenerateChunk()).has_value());
  ASSERT_TRUE(event1 && event2);
  EXPECT_EQ((*event1)["choices"][0]["delta"]["content"], "Paris is");
  EXPECT_EQ((*event1)["bitsplit"]["token_ids"].size(), static_cast<size_t>(first.token_ids_size()));
  const json& lp = (*event1)["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), static_cast<size_t>(first.token_ids_size()));
  std::string spelled;
  for (size_t i = 0; i < lp.size(); ++i) {
    EXPECT_EQ(lp[i]["token"], Piece(first.token_ids(i)));
    EXPECT_FLOAT_EQ(lp[i]["logprob"].get<float>(), -0.25f);
    ASSERT_EQ(lp[i]["top_logprobs"].size(), 2u);  // trimmed to top_logprobs
    EXPECT_EQ(lp[i]["top_logprobs"][1]["token"], Piece(first.token_ids(i) + 1));
    std::string bytes;
    for (int b : lp[i]["bytes"]) bytes.push_back(static_cast<char>(b));
    EXPECT_EQ(bytes, Piece(first.token_ids(i)));
    spelled += lp[i]["token"].get<std::string>();
  }
  EXPECT_EQ(spelled, "Paris is");
  const int completion = first.token_ids_size() + second.token_ids_size();
  const v1::GenerateComplete complete = Complete(v1::FINISH_REASON_EOS, 11, completion);
  const std::vector<json> end = builder.StreamEnd(complete);
  ASSERT_EQ(end.size(), 2u);
  EXPECT_EQ(end[0]["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(end[0]["choices"][0]["delta"].empty());
  EXPECT_EQ(end[0]["bitsplit"]["speculation"]["shape"], "off");
  EXPECT_TRUE(end[1]["choices"].empty());
  EXPECT_EQ(end[1]["usage"]["total_tokens"], 11 + completion);

  const json response = builder.Response(complete);
  EXPECT_EQ(response["object"], "chat.completion");
  EXPECT_EQ(response["id"], "chatcmpl-1");
  EXPECT_EQ(response["system_fingerprint"], "bitsplit-abc");
  EXPECT_EQ(response["choices"][0]["message"]["content"], "Paris is the capital");
  EXPECT_EQ(response["choices"][0]["logprobs"]["content"].size(), static_cast<size_t>(completion));
  EXPECT_EQ(response["bitsplit"]["token_ids"].size(), static_cast<size_t>(completion));
  EXPECT_EQ(response["usage"]["completion_tokens"], completion);
  EXPECT_EQ(
      builder.Response(Complete(v1::FINISH_REASON_LENGTH, 1, 1))["choices"][0]["finish_reason"],
      "length");
  EXPECT_EQ(builder.Response(Complete(v1::FINISH_REASON_STOP, 1, 1))["choices"][0]["finish_reason"],
            "stop");
}

// A Hermes/Qwen answer with text and two calls, split mid-marker: the stream's content deltas
// and tool-call deltas put together equal the whole response's message, in OpenAI's shapes.
TEST_F(ResponseBuilderTest, ToolCallsComeBackInOpenAisShapes) {
  const std::vector<std::string> pieces = {
      "Let me check.\n<tool_", "call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": ",
      "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", ",
      "\"arguments\": {\"city\": \"Rome\"}}\n</tool_call>"};
  for (const bool parallel : {true, false}) {
    SCOPED_TRACE(parallel ? "parallel" : "one call");
    auto request = Chat({{"messages", kUser},
                         {"tools", kTools},
                         {"parallel_tool_calls", parallel},
                         {"stream", true}});
    ASSERT_TRUE(request.ok()) << request.status();
    openai::ResponseBuilder streamed(*request, {"chatcmpl-7", 1700000000, "m", "bitsplit-abc"},
                                     *tokenizer_, text::ToolCallFormat::kHermes);
    openai::ResponseBuilder whole(*request, {"chatcmpl-7", 1700000000, "m", "bitsplit-abc"},
                                  *tokenizer_, text::ToolCallFormat::kHermes);
    std::string content;
    std::vector<json> calls;  // by index: {id, name, arguments}
    auto take = [&](const json& event) {
      const json& delta = event["choices"][0]["delta"];
      if (delta.contains("content")) content += delta["content"].get<std::string>();
      if (!delta.contains("tool_calls")) return;
      for (const json& call : delta["tool_calls"]) {
        const size_t index = call["index"];
        if (call.contains("id")) {
          ASSERT_EQ(index, calls.size());  // each call opens with its id and name, in order
          EXPECT_EQ(call["type"], "function");
          calls.push_back({{"id", call["id"]},
                           {"name", call["function"]["name"]},
                           {"arguments", call["function"]["arguments"]}});
        } else {
          ASSERT_LT(index, calls.size());
          calls[index]["arguments"] = calls[index]["arguments"].get<std::string>() +
                                      call["function"]["arguments"].get<std::string>();
        }
      }
    };
    for (const std::string& piece : pieces) {
      const auto event = streamed.AddChunk(ChunkOf(piece, -0.1f));
      ASSERT_TRUE(event.has_value());
      take(*event);
      whole.AddChunk(ChunkOf(piece, -0.1f));
    }
    const v1::GenerateComplete complete = Complete(v1::FINISH_REASON_EOS, 30, 40);
    const std::vector<json> end = streamed.StreamEnd(complete);
    for (const json& event : end) take(event);
    EXPECT_EQ(end.back()["choices"][0]["finish_reason"], "tool_calls");
    EXPECT_EQ(content, "Let me check.");
    ASSERT_EQ(calls.size(), parallel ? 2u : 1u);
    EXPECT_EQ(calls[0]["name"], "get_weather");
    EXPECT_EQ(calls[0]["arguments"], R"({"city":"Paris"})");
    EXPECT_TRUE(calls[0]["id"].get<std::string>().starts_with("call_"));
    if (parallel) {
      EXPECT_EQ(calls[1]["arguments"], R"({"city":"Rome"})");
      EXPECT_NE(calls[1]["id"], calls[0]["id"]);
    }

    const json response = whole.Response(complete);
    const json& message = response["choices"][0]["message"];
    EXPECT_EQ(response["choices"][0]["finish_reason"], "tool_calls");
    EXPECT_EQ(message["content"], "Let me check.");
    ASSERT_EQ(message["tool_calls"].size(), calls.size());
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(message["tool_calls"][i]["id"], calls[i]["id"]);  // same request id, same ids
      EXPECT_EQ(message["tool_calls"][i]["type"], "function");
      EXPECT_EQ(message["tool_calls"][i]["function"]["name"], calls[i]["name"]);
      EXPECT_EQ(message["tool_calls"][i]["function"]["arguments"], calls[i]["arguments"]);
    }
  }
}

// Harmony: the analysis channel streams as reasoning_content, the final channel as content, a
// message to a function as a call (only when the request has tools; otherwise it is content).
TEST_F(ResponseBuilderTest, HarmonyChannelsBecomeReasoningContentAndCalls) {
  const std::vector<std::string> answer = {"<|channel|>analysis<|message|>Mild",
                                           " today.<|end|><|start|>assistant<|chan",
                                           "nel|>final<|message|>It is", " 18 C."};
  const std::vector<std::string> call = {
      "<|channel|>analysis<|message|>Need the", " weather.<|end|><|start|>assistant",
      "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":",
      " \"Paris\"}"};
  struct Case {
    std::vector<std::string> pieces;
    bool tools;
    std::string reasoning, content, arguments, finish;
  };
  const std::vector<Case> cases = {
      {answer, false, "Mild today.", "It is 18 C.", "", "stop"},
      {call, true, "Need the weather.", "", R"({"city":"Paris"})", "tool_calls"},
      {call, false, "Need the weather.",
       "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": "
       "\"Paris\"}",
       "", "stop"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.content + c.arguments);
    json body = {{"messages", kUser}, {"stream", true}};
    if (c.tools) body["tools"] = kTools;
    auto request = Chat(body);
    ASSERT_TRUE(request.ok());
    openai::ResponseBuilder streamed(*request, {"chatcmpl-9", 1, "m", "f"}, *tokenizer_,
                                     text::ToolCallFormat::kHarmony);
    openai::ResponseBuilder whole(*request, {"chatcmpl-9", 1, "m", "f"}, *tokenizer_,
                                  text::ToolCallFormat::kHarmony);
    std::string reasoning, content, arguments;
    auto take = [&](const json& event) {
      const json& delta = event["choices"][0]["delta"];
      if (delta.contains("reasoning_content")) {
        reasoning += delta["reasoning_content"].get<std::string>();
      }
      if (delta.contains("content")) content += delta["content"].get<std::string>();
      if (delta.contains("tool_calls")) {
        for (const json& piece : delta["tool_calls"]) {
          arguments += piece["function"]["arguments"].get<std::string>();
        }
      }
    };
    for (const std::string& piece : c.pieces) {
      const auto event = streamed.AddChunk(ChunkOf(piece, -0.1f));
      ASSERT_TRUE(event.has_value());
      take(*event);
      whole.AddChunk(ChunkOf(piece, -0.1f));
    }
    const v1::GenerateComplete complete = Complete(v1::FINISH_REASON_EOS, 3, 9);
    const std::vector<json> end = streamed.StreamEnd(complete);
    for (const json& event : end) take(event);
    EXPECT_EQ(reasoning, c.reasoning);
    EXPECT_EQ(content, c.content);
    EXPECT_EQ(arguments, c.arguments);
    EXPECT_EQ(end.back()["choices"][0]["finish_reason"], c.finish);

    const json response = whole.Response(complete);
    const json& message = response["choices"][0]["message"];
    EXPECT_EQ(message["reasoning_content"], c.reasoning);
    if (c.arguments.empty()) {
      EXPECT_EQ(message["content"], c.content);
      EXPECT_FALSE(message.contains("tool_calls"));
    } else {
      EXPECT_TRUE(message["content"].is_null());
      ASSERT_EQ(message["tool_calls"].size(), 1u);
      EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "get_weather");
      EXPECT_EQ(message["tool_calls"][0]["function"]["arguments"], c.arguments);
    }
  }
}

// Text without a call stays the answer; with tool_choice "none" nothing is parsed at all.
TEST_F(ResponseBuilderTest, TextWithoutToolCallsIsPlainContent) {
  auto with_tools = Chat({{"messages", kUser}, {"tools", kTools}});
  auto none = Chat({{"messages", kUser}, {"tools", kTools}, {"tool_choice", "none"}});
  ASSERT_TRUE(with_tools.ok() && none.ok());
  const std::string text = "No tool needed: <tool_call> is just text here";
  for (const auto* request : {&*with_tools, &*none}) {
    openai::ResponseBuilder builder(*request, {"chatcmpl-8", 1, "m", "f"}, *tokenizer_,
                                    text::ToolCallFormat::kHermes);
    builder.AddChunk(ChunkOf(text, -0.1f));
    const json response = builder.Response(Complete(v1::FINISH_REASON_EOS, 3, 9));
    EXPECT_EQ(response["choices"][0]["message"]["content"], text);
    EXPECT_FALSE(response["choices"][0]["message"].contains("tool_calls"));
    EXPECT_EQ(response["choices"][0]["finish_reason"], "stop");
  }
}

TEST_F(ResponseBuilderTest, CompletionLogprobsAreFourAlignedLists) {
  auto request = Completion({{"prompt", "x"}, {"logprobs", 3}});
  ASSERT_TRUE(request.ok());
  openai::ResponseBuilder builder(*request, {"cmpl-1", 1, "m", "f"}, *tokenizer_);
  EXPECT_TRUE(builder.StreamStart().empty());
  const v1::GenerateChunk a = ChunkOf("Hello world", -1.0f);
  const v1::GenerateChunk b = ChunkOf(", again", -2.0f);
  builder.AddChunk(a);
  builder.AddChunk(b);
  const json response = builder.Response(Complete(v1::FINISH_REASON_LENGTH, 1, 4));
  EXPECT_EQ(response["object"], "text_completion");
  EXPECT_EQ(response["choices"][0]["text"], "Hello world, again");
  const json& logprobs = response["choices"][0]["logprobs"];
  const size_t n = static_cast<size_t>(a.token_ids_size() + b.token_ids_size());
  ASSERT_EQ(logprobs["tokens"].size(), n);
  ASSERT_EQ(logprobs["token_logprobs"].size(), n);
  ASSERT_EQ(logprobs["top_logprobs"].size(), n);
  ASSERT_EQ(logprobs["text_offset"].size(), n);
  // Each token's offset is the bytes of the pieces before it.
  int64_t offset = 0;
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(logprobs["text_offset"][i].get<int64_t>(), offset);
    offset += static_cast<int64_t>(logprobs["tokens"][i].get<std::string>().size());
    EXPECT_LE(logprobs["top_logprobs"][i].size(), 3u);
  }
  EXPECT_EQ(offset, static_cast<int64_t>(std::string("Hello world, again").size()));
}

TEST(OpenAiResponseTest, ErrorAndModelObjects) {
  const json error = openai::ErrorBody("bad", "invalid_request_error", "");
  EXPECT_EQ(error["error"]["message"], "bad");
  EXPECT_TRUE(error["error"]["param"].is_null());
  EXPECT_TRUE(error["error"]["code"].is_null());
  EXPECT_EQ(openai::ErrorBody("x", "t", "c")["error"]["code"], "c");
  v1::ModelInfo info;
  info.set_architecture("llama");
  info.set_base_format("b2");
  const json list = openai::ModelList(info, "m", 5);
  EXPECT_EQ(list["object"], "list");
  EXPECT_EQ(list["data"][0]["id"], "m");
  EXPECT_EQ(list["data"][0]["object"], "model");
  EXPECT_EQ(list["data"][0]["created"], 5);
  EXPECT_EQ(list["data"][0]["bitsplit"]["base_format"], "b2");
  // Invalid UTF-8 is replaced, not thrown on.
  EXPECT_EQ(openai::Dump(json("a\xff")), "\"a\xEF\xBF\xBD\"");
}

// ---- Prometheus exposition ---------------------------------------------------------------------

// The samples of an exposition as name{labels} -> value, checking the format's rules: every
// sample's family has # HELP and # TYPE lines before it, names match [a-zA-Z_:][a-zA-Z0-9_:]*.
std::map<std::string, double> Samples(const std::string& text) {
  std::map<std::string, double> samples;
  std::map<std::string, std::string> types;
  const std::regex name(R"([a-zA-Z_:][a-zA-Z0-9_:]*)");
  for (absl::string_view piece : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const std::string line(piece);
    if (line.starts_with("# TYPE ")) {
      std::vector<std::string> parts = absl::StrSplit(line, ' ');
      EXPECT_EQ(parts.size(), 4u) << line;
      types[parts[2]] = parts[3];
      continue;
    }
    if (line.starts_with("# HELP ")) continue;
    const size_t space = line.rfind(' ');
    const std::string key = line.substr(0, space);
    const std::string family = key.substr(0, key.find('{'));
    EXPECT_TRUE(std::regex_match(family, name)) << family;
    std::string base = family;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      if (!types.contains(base) && base.ends_with(suffix))
        base.resize(base.size() - strlen(suffix));
    }
    EXPECT_TRUE(types.contains(base)) << "no # TYPE before " << line;
    samples[key] = std::stod(line.substr(space + 1));
  }
  return samples;
}

TEST(MetricsTest, HistogramBucketsAreCumulative) {
  Histogram histogram({0.1, 1.0, 10.0});
  for (double v : {0.05, 0.1, 0.5, 2.0, 2.0, 100.0}) histogram.Observe(v);
  std::string out;
  histogram.Render("x_seconds", "help", out);
  const auto samples = Samples(out);
  EXPECT_EQ(samples.at("x_seconds_bucket{le=\"0.1\"}"), 2);  // le: 0.1 itself counts
  EXPECT_EQ(samples.at("x_seconds_bucket{le=\"1\"}"), 3);
  EXPECT_EQ(samples.at("x_seconds_bucket{le=\"10\"}"), 5);
  EXPECT_EQ(samples.at("x_seconds_bucket{le=\"+Inf\"}"), 6);
  EXPECT_EQ(samples.at("x_seconds_count"), 6);
  EXPECT_DOUBLE_EQ(samples.at("x_seconds_sum"), 0.05 + 0.1 + 0.5 + 2.0 + 2.0 + 100.0);
}

TEST(MetricsTest, ARequestMovesEveryFigureByWhatItDid) {
  CoordinatorMetrics metrics;
  const Clock::time_point arrival = Clock::now();
  auto recorder = metrics.StartRequest(Api::kHttp, 17, arrival);
  recorder->QueueLeft(arrival + std::chrono::milliseconds(5));
  internal::v1::StepReport step;
  step.set_tree_nodes(9);  // 8 drafted
  step.set_tree_depth(4);
  step.set_accepted_depth(3);
  recorder->Step(step);
  step.set_accepted_depth(1);
  recorder->Step(step);
  step.set_tree_nodes(1);  // a step without a draft
  step.set_accepted_depth(0);
  recorder->Step(step);
  recorder->ChunkSent(0, true, arrival + std::chrono::milliseconds(100));  // text before its ids
  recorder->ChunkSent(3, true, arrival + std::chrono::milliseconds(120));
  recorder->ChunkSent(2, true, arrival + std::chrono::milliseconds(220));
  recorder->ChunkSent(1, false, arrival + std::chrono::milliseconds(250));
  v1::GenerateComplete complete;
  complete.set_finish_reason(v1::FINISH_REASON_LENGTH);
  recorder->Finished(complete, arrival + std::chrono::milliseconds(300));
  metrics.RecordRefused(Api::kGrpc, absl::InvalidArgumentError("x"));
  metrics.RecordRefused(Api::kHttp, absl::ResourceExhaustedError("x"));

  internal::v1::DrafterInfo drafter;
  drafter.set_open_sessions(2);
  drafter.set_verify_ns_total(1500000000);
  drafter.mutable_residual_stats()->set_weight_bytes_read(12345);
  const auto samples = Samples(
      metrics.Render({.running = 1, .waiting = 2, .max_active = 4, .max_queue = 16}, drafter));
  EXPECT_EQ(samples.at("bitsplit:requests_total{api=\"http\",outcome=\"length\"}"), 1);
  EXPECT_EQ(samples.at("bitsplit:requests_total{api=\"grpc\",outcome=\"invalid_argument\"}"), 1);
  EXPECT_EQ(samples.at("bitsplit:requests_total{api=\"http\",outcome=\"resource_exhausted\"}"), 1);
  EXPECT_EQ(samples.at("bitsplit:prompt_tokens_total"), 17);
  EXPECT_EQ(samples.at("bitsplit:generation_tokens_total"), 6);
  EXPECT_EQ(samples.at("bitsplit:verify_steps_total"), 3);
  EXPECT_EQ(samples.at("bitsplit:spec_decode_num_drafts_total"), 2);
  EXPECT_EQ(samples.at("bitsplit:spec_decode_num_draft_tokens_total"), 16);
  EXPECT_EQ(samples.at("bitsplit:spec_decode_num_accepted_tokens_total"), 4);
  EXPECT_EQ(samples.at("bitsplit:spec_decode_num_accepted_tokens_per_pos_total{position=\"0\"}"),
            2);
  EXPECT_EQ(samples.at("bitsplit:spec_decode_num_accepted_tokens_per_pos_total{position=\"2\"}"),
            1);
  // Time to first token: the first text, at 100 ms.
  EXPECT_EQ(samples.at("bitsplit:time_to_first_token_seconds_count"), 1);
  EXPECT_NEAR(samples.at("bitsplit:time_to_first_token_seconds_sum"), 0.1, 1e-9);
  // Inter-token latency: tokens - 1 observations summing to last - first token chunk.
  EXPECT_EQ(samples.at("bitsplit:inter_token_latency_seconds_count"), 5);
  EXPECT_NEAR(samples.at("bitsplit:inter_token_latency_seconds_sum"), 0.250 - 0.120, 1e-9);
  EXPECT_NEAR(samples.at("bitsplit:e2e_request_latency_seconds_sum"), 0.3, 1e-9);
  EXPECT_NEAR(samples.at("bitsplit:request_queue_time_seconds_sum"), 0.005, 1e-9);
  EXPECT_EQ(samples.at("bitsplit:num_requests_running"), 1);
  EXPECT_EQ(samples.at("bitsplit:num_requests_waiting"), 2);
  EXPECT_EQ(samples.at("bitsplit:drafter_up"), 1);
  EXPECT_EQ(samples.at("bitsplit:drafter_open_sessions"), 2);
  EXPECT_DOUBLE_EQ(samples.at("bitsplit:drafter_verify_seconds_total"), 1.5);
  EXPECT_EQ(samples.at("bitsplit:residual_up"), 1);
  EXPECT_EQ(samples.at("bitsplit:residual_read_bytes_total"), 12345);

  const auto down = Samples(metrics.Render({}, absl::UnavailableError("down")));
  EXPECT_EQ(down.at("bitsplit:drafter_up"), 0);
  EXPECT_FALSE(down.contains("bitsplit:drafter_open_sessions"));
}

}  // namespace
}  // namespace bitsplit::coordinator
