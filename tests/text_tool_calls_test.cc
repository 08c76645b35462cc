// Tool calls parsed back from generated text. The rendered fixtures are the real chat templates'
// own tool-call syntax (tests/oracle/tool_call_fixtures.py renders an assistant message with
// tool_calls through each template with jinja2 and cuts the assistant's turn out), so the
// expected calls are the ones that were rendered; edge_cases.json adds hand-written outputs.
// Every fixture is also streamed in several chunkings, one byte at a time included, and must
// give exactly the one-shot result.
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "common/text/json_constraint.h"
#include "common/text/tool_calls.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/paths.h"

namespace bitsplit::text {
namespace {

nlohmann::json ReadFixture(const std::string& relative) {
  std::ifstream in(testing::SourcePath(relative));
  EXPECT_TRUE(in.good()) << "missing fixture " << relative;
  return in.good() ? nlohmann::json::parse(in) : nlohmann::json();
}

// Generated ids are "generated_<n>", so a test sees which calls got a generated id. The tools are
// the fixture's own, else its file's.
ToolCallParserOptions OptionsFor(const nlohmann::json& fixture, const nlohmann::json& file) {
  ToolCallParserOptions options;
  options.tools =
      fixture.contains("tools") ? fixture["tools"] : file.value("tools", nlohmann::json());
  options.next_id = [counter = 0]() mutable { return "generated_" + std::to_string(counter++); };
  return options;
}

absl::StatusOr<ParsedToolCalls> Stream(ToolCallFormat format, const std::string& text,
                                       const std::vector<size_t>& chunk_sizes,
                                       ToolCallParserOptions options) {
  absl::StatusOr<ToolCallStreamParser> parser =
      ToolCallStreamParser::Create(format, std::move(options));
  if (!parser.ok()) return parser.status();
  ParsedToolCalls message;
  size_t pos = 0;
  for (size_t i = 0; pos < text.size(); ++i) {
    const size_t size = std::min(chunk_sizes[i % chunk_sizes.size()], text.size() - pos);
    const ToolCallStreamDelta delta = parser->Feed(std::string_view(text).substr(pos, size));
    for (const ToolCallDelta& piece : delta.tool_calls) {
      // OpenAI's streaming shape: the header, then arguments only.
      if (!piece.name.empty()) {
        EXPECT_FALSE(piece.id.empty());
        EXPECT_TRUE(piece.arguments.empty());
      }
    }
    absl::Status appended = AppendToolCallStreamDelta(delta, message);
    if (!appended.ok()) return appended;
    pos += size;
  }
  absl::Status appended = AppendToolCallStreamDelta(parser->Finish(), message);
  if (!appended.ok()) return appended;
  EXPECT_EQ(parser->held_bytes(), 0u);
  return message;
}

std::vector<std::vector<size_t>> Chunkings(size_t text_size) {
  std::vector<std::vector<size_t>> chunkings = {{1}, {2}, {3}, {5}, {7}, {16}, {1, 4, 2, 9}};
  std::mt19937 random(static_cast<uint32_t>(text_size));
  for (int round = 0; round < 4; ++round) {
    std::vector<size_t> sizes;
    for (int i = 0; i < 32; ++i) sizes.push_back(1 + random() % 12);
    chunkings.push_back(std::move(sizes));
  }
  return chunkings;
}

void CheckFixture(const nlohmann::json& fixture, const nlohmann::json& file) {
  SCOPED_TRACE(fixture["name"].get<std::string>());
  absl::StatusOr<ToolCallFormat> format =
      ToolCallFormatFromName(fixture["format"].get<std::string>());
  ASSERT_TRUE(format.ok()) << format.status();
  const std::string output = fixture["output"].get<std::string>();
  absl::StatusOr<ParsedToolCalls> parsed =
      ParseToolCalls(*format, output, OptionsFor(fixture, file));
  ASSERT_TRUE(parsed.ok()) << parsed.status();

  EXPECT_EQ(parsed->reasoning, fixture.value("reasoning", ""));
  EXPECT_EQ(parsed->content, fixture["content"].get<std::string>());
  const nlohmann::json& expected_calls = fixture["tool_calls"];
  ASSERT_EQ(parsed->tool_calls.size(), expected_calls.size()) << output;
  int generated = 0;
  for (size_t i = 0; i < expected_calls.size(); ++i) {
    const nlohmann::json& expected = expected_calls[i];
    const ToolCall& call = parsed->tool_calls[i];
    EXPECT_EQ(call.name, expected["name"].get<std::string>());
    EXPECT_EQ(call.id, expected.contains("id") ? expected["id"].get<std::string>()
                                               : "generated_" + std::to_string(generated++));
    const nlohmann::json arguments = nlohmann::json::parse(call.arguments, nullptr, false);
    ASSERT_TRUE(arguments.is_object()) << call.arguments;
    EXPECT_EQ(arguments, expected["arguments"]) << call.arguments;
    if (expected.contains("arguments_text")) {
      EXPECT_EQ(call.arguments, expected["arguments_text"].get<std::string>());
    }
  }

  for (const std::vector<size_t>& chunking : Chunkings(output.size())) {
    absl::StatusOr<ParsedToolCalls> streamed =
        Stream(*format, output, chunking, OptionsFor(fixture, file));
    ASSERT_TRUE(streamed.ok()) << streamed.status();
    EXPECT_EQ(*streamed, *parsed) << "chunk sizes from " << chunking[0];
  }
}

TEST(ToolCallsTest, RenderedTemplateOutputsParseToTheRenderedCalls) {
  const nlohmann::json fixtures = ReadFixture("tests/fixtures/tool_calls/rendered.json");
  ASSERT_GE(fixtures["fixtures"].size(), 100u);
  for (const nlohmann::json& fixture : fixtures["fixtures"]) CheckFixture(fixture, fixtures);
}

TEST(ToolCallsTest, EdgeCases) {
  const nlohmann::json fixtures = ReadFixture("tests/fixtures/tool_calls/edge_cases.json");
  ASSERT_GE(fixtures["fixtures"].size(), 40u);
  for (const nlohmann::json& fixture : fixtures["fixtures"]) CheckFixture(fixture, fixtures);
}

// The format each rendered fixture was parsed with is the one its template source selects.
TEST(ToolCallsTest, DetectsTheRenderedTemplatesFormats) {
  const nlohmann::json corpus = ReadFixture("tests/fixtures/chat_templates/corpus.json");
  const nlohmann::json fixtures = ReadFixture("tests/fixtures/tool_calls/rendered.json");
  std::map<std::string, std::string> sources;
  for (const nlohmann::json& entry : corpus["templates"]) {
    sources[entry["file"].get<std::string>()] = entry["source"].get<std::string>();
  }
  std::set<std::string> seen;
  for (const nlohmann::json& fixture : fixtures["fixtures"]) {
    const std::string file = fixture["template"].get<std::string>();
    if (!seen.insert(file).second) continue;
    ASSERT_TRUE(sources.contains(file)) << file;
    absl::StatusOr<ToolCallFormat> format = DetectToolCallFormat(sources[file]);
    ASSERT_TRUE(format.ok()) << file << ": " << format.status();
    EXPECT_EQ(ToolCallFormatName(*format), fixture["format"].get<std::string>()) << file;
  }
  EXPECT_EQ(seen.size(), 24u);
}

// Every other template of the corpus is refused: NOT_FOUND for the few that render no tools,
// UNIMPLEMENTED for the others' syntaxes (GLM, MiniMax, DeepSeek, Kimi, ...).
TEST(ToolCallsTest, RefusesTemplatesWithOtherOrNoToolSyntax) {
  const std::set<std::string> kWithoutTools = {
      "HuggingFaceTB-SmolLM3-3B.jinja", "google-gemma-2-2b-it.jinja", "llama-cpp-rwkv-world.jinja",
      "microsoft-Phi-3.5-mini-instruct.jinja"};
  const nlohmann::json corpus = ReadFixture("tests/fixtures/chat_templates/corpus.json");
  const nlohmann::json fixtures = ReadFixture("tests/fixtures/tool_calls/rendered.json");
  std::set<std::string> supported;
  for (const nlohmann::json& fixture : fixtures["fixtures"]) {
    supported.insert(fixture["template"].get<std::string>());
  }
  int refused = 0;
  for (const nlohmann::json& entry : corpus["templates"]) {
    const std::string file = entry["file"].get<std::string>();
    if (supported.contains(file)) continue;
    absl::StatusOr<ToolCallFormat> format =
        DetectToolCallFormat(entry["source"].get<std::string>());
    ASSERT_FALSE(format.ok()) << file << " detected as " << ToolCallFormatName(*format);
    EXPECT_EQ(format.status().code(), kWithoutTools.contains(file)
                                          ? absl::StatusCode::kNotFound
                                          : absl::StatusCode::kUnimplemented)
        << file << ": " << format.status();
    ++refused;
  }
  EXPECT_GE(refused, 40);
  EXPECT_EQ(DetectToolCallFormat("{{ messages[0].content }}").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(ToolCallsTest, HoldsBackOnlyWhatCouldStillBeAMarker) {
  auto parser = ToolCallStreamParser::Create(ToolCallFormat::kHermes, {});
  ASSERT_TRUE(parser.ok());
  EXPECT_EQ(parser->Feed("Hello, <").content, "Hello,");
  EXPECT_EQ(parser->held_bytes(), 2u);  // " <": the space goes with a call if one follows
  EXPECT_EQ(parser->Feed("tool_").content, "");
  ToolCallStreamDelta delta = parser->Feed("x> world");
  EXPECT_EQ(delta.content, " <tool_x> world");
  EXPECT_EQ(parser->held_bytes(), 0u);
  delta = parser->Feed("\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}");
  EXPECT_EQ(delta.content, "");
  EXPECT_TRUE(delta.tool_calls.empty());  // the closing tag has not come yet
  delta = parser->Feed("\n</tool_call>");
  ASSERT_EQ(delta.tool_calls.size(), 2u);
  EXPECT_EQ(delta.tool_calls[0].index, 0u);
  EXPECT_EQ(delta.tool_calls[0].name, "f");
  EXPECT_TRUE(delta.tool_calls[0].id.starts_with("call_"));
  EXPECT_EQ(delta.tool_calls[0].arguments, "");
  EXPECT_EQ(delta.tool_calls[1].index, 0u);
  EXPECT_EQ(delta.tool_calls[1].name, "");
  EXPECT_EQ(delta.tool_calls[1].arguments, "{\"a\":1}");
  EXPECT_TRUE(parser->Finish().empty());
}

TEST(ToolCallsTest, GeneratedIdsAreDeterministicAndShapedPerFormat) {
  ToolCallIdGenerator openai(42, ToolCallIdStyle::kOpenAi);
  ToolCallIdGenerator again(42, ToolCallIdStyle::kOpenAi);
  ToolCallIdGenerator other(43, ToolCallIdStyle::kOpenAi);
  const std::string first = openai.Next();
  EXPECT_TRUE(std::regex_match(first, std::regex("call_[A-Za-z0-9]{24}"))) << first;
  EXPECT_EQ(again.Next(), first);
  EXPECT_NE(openai.Next(), first);
  EXPECT_NE(other.Next(), first);
  ToolCallIdGenerator mistral(42, ToolCallIdStyle::kMistral);
  EXPECT_TRUE(std::regex_match(mistral.Next(), std::regex("[A-Za-z0-9]{9}")));

  // Without next_id the parser draws from the seeded generator of the format's style.
  ToolCallParserOptions options;
  options.id_seed = 7;
  auto parsed = ParseToolCalls(ToolCallFormat::kMistralNameArgs,
                               "[TOOL_CALLS]a[ARGS]{}[TOOL_CALLS]b[ARGS]{}", options);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->tool_calls.size(), 2u);
  ToolCallIdGenerator expected(7, ToolCallIdStyle::kMistral);
  EXPECT_EQ(parsed->tool_calls[0].id, expected.Next());
  EXPECT_EQ(parsed->tool_calls[1].id, expected.Next());
  EXPECT_EQ(DefaultIdStyle(ToolCallFormat::kGemma4), ToolCallIdStyle::kOpenAi);
}

TEST(ToolCallsTest, RefusesMalformedTools) {
  ToolCallParserOptions options;
  options.tools = nlohmann::json::object();
  EXPECT_EQ(ToolCallStreamParser::Create(ToolCallFormat::kHermes, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.tools = nlohmann::json::parse(R"([{"type": "function", "function": {"name": 3}}])");
  EXPECT_EQ(ParseToolCalls(ToolCallFormat::kHermes, "x", options).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ToolCallFormatFromName("pythonic").status().code(), absl::StatusCode::kInvalidArgument);
}

// The arguments of `call` with their keys in the order of the tool's schema (the order a forced
// call is generated in).
nlohmann::ordered_json InSchemaOrder(const nlohmann::ordered_json& tools, const std::string& name,
                                     const nlohmann::json& arguments) {
  for (const nlohmann::ordered_json& tool : tools) {
    if (tool["function"]["name"] != name) continue;
    nlohmann::ordered_json ordered = nlohmann::ordered_json::object();
    for (const auto& [key, unused] : tool["function"]["parameters"]["properties"].items()) {
      if (arguments.contains(key))
        ordered[key] = nlohmann::ordered_json::parse(arguments[key].dump());
    }
    EXPECT_EQ(ordered.size(), arguments.size()) << "an argument outside the schema";
    return ordered;
  }
  ADD_FAILURE() << "no tool " << name;
  return {};
}

bool SchemaAccepts(const nlohmann::ordered_json& schema, const std::string& document) {
  absl::StatusOr<JsonConstraint> constraint = JsonConstraint::FromSchema(schema);
  EXPECT_TRUE(constraint.ok()) << constraint.status();
  if (!constraint.ok()) return false;
  JsonConstraintState state = constraint->Start();
  return state.Advance(document) && state.IsComplete();
}

// Every single call of the rendered fixtures, written the way a forced call's shape prescribes
// (prefix, the document with the name and the arguments, suffix): the schema accepts the document
// and the parser reads back exactly that call and no content. Forcing the call's own name and
// forcing any tool both admit it; forcing another name rejects it.
TEST(ToolCallsTest, ForcedCallShapesParseBackToTheCall) {
  std::ifstream in(testing::SourcePath("tests/fixtures/tool_calls/rendered.json"));
  ASSERT_TRUE(in.good());
  const nlohmann::ordered_json file = nlohmann::ordered_json::parse(in);
  const nlohmann::ordered_json& tools = file["tools"];
  int checked = 0;
  for (const nlohmann::ordered_json& fixture : file["fixtures"]) {
    const ToolCallFormat format = *ToolCallFormatFromName(fixture["format"].get<std::string>());
    if (format == ToolCallFormat::kQwen3CoderXml || format == ToolCallFormat::kGemma4) continue;
    if (fixture["tool_calls"].size() != 1) continue;
    SCOPED_TRACE(fixture["name"].get<std::string>());
    const std::string name = fixture["tool_calls"][0]["name"].get<std::string>();
    // Llama 3.1's built-in tools are not among the request's tools.
    if (fixture.contains("tools") || name == "brave_search" || name == "wolfram_alpha") continue;
    const nlohmann::ordered_json arguments = InSchemaOrder(
        tools, name, nlohmann::json::parse(fixture["tool_calls"][0]["arguments"].dump()));
    for (const std::string& forced_name : {name, std::string()}) {
      for (const bool parallel : {false, true}) {
        absl::StatusOr<ForcedToolCall> forced =
            ForcedToolCallOutput(format, tools, forced_name, parallel);
        if (format == ToolCallFormat::kHarmony && forced_name.empty()) {
          // The name is in the header, which no JSON schema chooses among several tools.
          EXPECT_EQ(forced.status().code(), absl::StatusCode::kUnimplemented);
          continue;
        }
        ASSERT_TRUE(forced.ok()) << forced.status();
        nlohmann::ordered_json call = {{"name", name}};
        call[format == ToolCallFormat::kLlama3Json ? "parameters" : "arguments"] = arguments;
        std::string document = call.dump();
        if (format == ToolCallFormat::kMistralJsonArray ||
            (format == ToolCallFormat::kMistralNameArgs && forced_name.empty())) {
          document = "[" + document + "]";
        } else if (format == ToolCallFormat::kMistralNameArgs) {
          document = arguments.dump();
          EXPECT_EQ(forced->prefix, "[TOOL_CALLS]" + name + "[ARGS]");
        } else if (format == ToolCallFormat::kHarmony) {
          document = arguments.dump();
          EXPECT_EQ(forced->prefix,
                    "<|channel|>commentary to=functions." + name + " <|constrain|>json<|message|>");
        }
        ASSERT_TRUE(SchemaAccepts(forced->schema, document)) << document;
        ToolCallParserOptions options;
        options.tools = nlohmann::json::parse(tools.dump());
        absl::StatusOr<ParsedToolCalls> parsed =
            ParseToolCalls(format, forced->prefix + document + forced->suffix, options);
        ASSERT_TRUE(parsed.ok()) << parsed.status();
        EXPECT_EQ(parsed->content, "");
        ASSERT_EQ(parsed->tool_calls.size(), 1u);
        EXPECT_EQ(parsed->tool_calls[0].name, name);
        EXPECT_EQ(nlohmann::json::parse(parsed->tool_calls[0].arguments),
                  nlohmann::json::parse(arguments.dump()));
        ++checked;
      }
    }
    // Another tool forced: the document naming this one is not admitted.
    const std::string other = name == "get_time" ? "search" : "get_time";
    absl::StatusOr<ForcedToolCall> forced_other = ForcedToolCallOutput(format, tools, other, false);
    ASSERT_TRUE(forced_other.ok());
    if (format == ToolCallFormat::kHarmony) {
      EXPECT_NE(forced_other->prefix.find("to=functions." + other + " "), std::string::npos);
      continue;
    }
    nlohmann::ordered_json call = {{"name", name}, {"arguments", arguments}};
    EXPECT_FALSE(SchemaAccepts(forced_other->schema, call.dump()));
    EXPECT_FALSE(SchemaAccepts(forced_other->schema, "[" + call.dump() + "]"));
  }
  EXPECT_GE(checked, 4 * 30);
}

// Several calls in one forced array only with parallel_tool_calls.
TEST(ToolCallsTest, ForcedMistralArrayHoldsSeveralCallsOnlyWhenParallel) {
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "a"}},
          {"type": "function", "function": {"name": "b", "parameters": {"type": "object",
           "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}])");
  const std::string two = R"([{"name":"a","arguments":{}},{"name":"b","arguments":{"x":1}}])";
  for (const ToolCallFormat format :
       {ToolCallFormat::kMistralJsonArray, ToolCallFormat::kMistralNameArgs}) {
    absl::StatusOr<ForcedToolCall> parallel = ForcedToolCallOutput(format, tools, "", true);
    absl::StatusOr<ForcedToolCall> single = ForcedToolCallOutput(format, tools, "", false);
    ASSERT_TRUE(parallel.ok() && single.ok());
    EXPECT_TRUE(SchemaAccepts(parallel->schema, two));
    EXPECT_FALSE(SchemaAccepts(single->schema, two));
    EXPECT_FALSE(SchemaAccepts(parallel->schema, "[]"));
    EXPECT_FALSE(SchemaAccepts(parallel->schema, R"([{"name":"b","arguments":{}}])"));
    ToolCallParserOptions options;
    absl::StatusOr<ParsedToolCalls> parsed =
        ParseToolCalls(format, parallel->prefix + two + parallel->suffix, options);
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(parsed->tool_calls.size(), 2u);
  }
}

TEST(ToolCallsTest, ForcingRefusesWhatItCannotConstrain) {
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "a"}},
          {"type": "function", "function": {"name": "b", "parameters": {"type": "object",
           "properties": {"x": {"type": "integer", "minimum": 3}}}}}])");
  for (const ToolCallFormat format : {ToolCallFormat::kQwen3CoderXml, ToolCallFormat::kGemma4}) {
    EXPECT_EQ(ForcedToolCallOutput(format, tools, "a", false).status().code(),
              absl::StatusCode::kUnimplemented);
  }
  const absl::Status missing =
      ForcedToolCallOutput(ToolCallFormat::kHermes, tools, "c", false).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.message().find("\"c\" is not among the tools"), std::string::npos) << missing;
  const absl::Status unsupported =
      ForcedToolCallOutput(ToolCallFormat::kHermes, tools, "", false).status();
  EXPECT_EQ(unsupported.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unsupported.message().find("tools[1].function.parameters"), std::string::npos)
      << unsupported;
  EXPECT_NE(unsupported.message().find("minimum"), std::string::npos) << unsupported;
  // Only the forced function's schema has to compile.
  EXPECT_TRUE(ForcedToolCallOutput(ToolCallFormat::kHermes, tools, "a", false).ok());
  EXPECT_EQ(
      ForcedToolCallOutput(ToolCallFormat::kHermes, nlohmann::ordered_json::array(), "", false)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
}

// The first marker of each format opens a call: the parser holds it back until the call is
// decided, so it must reach the parser as text.
TEST(ToolCallsTest, TheFirstMarkerOpensACall) {
  for (const ToolCallFormat format :
       {ToolCallFormat::kLlama3Json, ToolCallFormat::kHermes, ToolCallFormat::kQwen3CoderXml,
        ToolCallFormat::kMistralJsonArray, ToolCallFormat::kMistralNameArgs,
        ToolCallFormat::kGemma4}) {  // harmony's messages start without a marker
    const std::vector<std::string_view> markers = ToolCallMarkers(format);
    ASSERT_FALSE(markers.empty());
    absl::StatusOr<ToolCallStreamParser> parser = ToolCallStreamParser::Create(format, {});
    ASSERT_TRUE(parser.ok());
    const ToolCallStreamDelta delta = parser->Feed("text " + std::string(markers[0]));
    EXPECT_EQ(delta.content, "text") << ToolCallFormatName(format);
    EXPECT_EQ(parser->held_bytes(), markers[0].size() + 1) << ToolCallFormatName(format);
  }
}

TEST(ToolCallsTest, RejectsDeltasOutOfShape) {
  ParsedToolCalls message;
  ToolCallStreamDelta delta;
  delta.tool_calls.push_back({1, "id", "f", ""});
  EXPECT_EQ(AppendToolCallStreamDelta(delta, message).code(), absl::StatusCode::kInternal);
  delta.tool_calls = {{0, "id", "f", ""}, {0, "id", "f", ""}};
  EXPECT_EQ(AppendToolCallStreamDelta(delta, message).code(), absl::StatusCode::kInternal);
}

// Deep nesting is refused, not recursed into without bound.
TEST(ToolCallsTest, JsonNestingIsBounded) {
  const std::string deep =
      "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": " + std::string(10000, '[') +
      std::string(10000, ']') + "}}</tool_call>";
  auto parsed = ParseToolCalls(ToolCallFormat::kHermes, deep, {});
  ASSERT_TRUE(parsed.ok());
  EXPECT_TRUE(parsed->tool_calls.empty());
  EXPECT_EQ(parsed->content, deep);
  // Harmony: 256 levels are a call, 257 are content.
  for (const int levels : {255, 256}) {
    const std::string arguments =
        "{\"a\": " + std::string(levels, '[') + std::string(levels, ']') + "}";
    const std::string output =
        "<|channel|>commentary to=functions.f json<|message|>" + arguments + "<|call|>";
    auto harmony = ParseToolCalls(ToolCallFormat::kHarmony, output, {});
    ASSERT_TRUE(harmony.ok());
    EXPECT_EQ(harmony->tool_calls.size(), levels == 255 ? 1u : 0u) << levels;
    EXPECT_EQ(harmony->content, levels == 255 ? "" : output) << levels;
  }
}

TEST(ToolCallsTest, GemmaNestingIsBounded) {
  const std::string deep =
      "<|tool_call>call:f{a:" + std::string(10000, '[') + std::string(10000, ']') + "}<tool_call|>";
  auto parsed = ParseToolCalls(ToolCallFormat::kGemma4, deep, {});
  ASSERT_TRUE(parsed.ok());
  EXPECT_TRUE(parsed->tool_calls.empty());
  EXPECT_EQ(parsed->content, deep);
}

}  // namespace
}  // namespace bitsplit::text
