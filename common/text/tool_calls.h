#pragma once
// Tool calls in a model's generated text, turned back into OpenAI's shape: the plain content and
// a list of calls {id, name, arguments as a JSON-object string}.
//
// A model asked to call tools answers in the syntax its own chat template writes tool calls into
// the history with, which differs per family. Recognized (the template source picks one, see
// DetectToolCallFormat):
//
//   kLlama3Json        Llama 3.1 / 3.2 / 3.3. The message itself is the call:
//                      {"name": "f", "parameters": {...}} ("arguments" is accepted too, and a
//                      "type": "function" member), optionally after <|python_tag|>. Several calls
//                      may be separated by ";" (small Llama models do that, though the template
//                      renders one call per message). A JSON object counts as a call only at the
//                      start of the message, after <|python_tag|> or after another call; elsewhere
//                      it is content. Llama 3.1's built-in tools:
//                      <|python_tag|>brave_search.call(query="...") gives {"query": "..."}.
//   kHermes            Hermes 2 Pro / 3, Qwen 2.5 / 3, QwQ, Granite 4, and other templates writing
//                      <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call> blocks, any
//                      number of them, with free text before.
//   kQwen3CoderXml     Qwen3-Coder, Qwen 3.5, Nemotron 3 Nano, Step 3.5:
//                      <tool_call>\n<function=f>\n<parameter=x>\nvalue\n</parameter>\n</function>
//                      \n</tool_call>. A value is typed by the parameter's JSON schema when the
//                      tools are given (options.tools): a string parameter keeps the raw text,
//                      boolean takes true/false in any case (the template writes Python's True),
//                      null takes null/None, number/integer/object/array parse as JSON; a value
//                      that does not fit stays a string. Without a schema a value that parses as a
//                      JSON number, boolean, null, object or array is that; anything else a string.
//   kMistralJsonArray  Mistral Nemo 2407: [TOOL_CALLS][{"name": "f", "arguments": {...},
//                      "id": "abcdefghi"}, ...].
//   kMistralNameArgs   Mistral Small 3.2, Devstral, Ministral 3: [TOOL_CALLS]f[ARGS]{...}, with
//                      [CALL_ID]id between name and [ARGS] where the template writes one (Small
//                      3.2). Both Mistral formats accept both syntaxes; they differ in detection.
//   kGemma4            Gemma 4: <|tool_call>call:f{key:value,...}<tool_call|>. Strings are
//                      delimited by <|"|> (no escaping inside), keys are bare (or <|"|>-quoted),
//                      values are strings, numbers, true/false, null (or None, which the template
//                      writes for Python's None), {...} and [...]; the arguments are rebuilt as
//                      JSON.
//   kHarmony           gpt-oss (OpenAI's harmony format): channels, not a call syntax inside
//                      the text: <|channel|>analysis<|message|>...<|end|> is reasoning, the final
//                      channel the content, and a message to=functions.f the call with its JSON
//                      arguments. Parsed by HarmonyStream (harmony.h), which also fills
//                      `reasoning`; every other rule below is the other formats'.
//
// What counts as a call: the complete syntax of the format, with a function name and an
// arguments object. Anything else - malformed JSON, an unterminated block at the end of the
// stream, a call to a tool that is not among options.tools (when given) - stays content, byte for
// byte; no call is invented. White space right before and right after a call belongs to the call
// (templates put newlines there), not to the content. Arguments are re-serialized compactly in
// the model's member order (so {"a": 1} comes back as {"a":1}).
//
// Ids: Mistral's model-written ids ("id" in the array, [CALL_ID]) are kept. Otherwise an id is
// drawn from options.next_id, or, when that is empty, from ToolCallIdGenerator(options.id_seed,
// DefaultIdStyle(format)): "call_" + 24 alphanumerics (OpenAI's shape), or 9 alphanumerics for
// the Mistral formats, whose templates refuse any other id when the call is sent back.
//
// Streaming: ToolCallStreamParser takes the generated text in chunks of any size and returns
// what is safe to show now: content that can no longer be part of a call (text that could still
// be the start of a marker, and white space that may precede one, is held back until the next
// chunk decides it or the stream ends), and tool-call deltas in OpenAI's streaming shape. A call
// is delivered once its closing syntax has arrived, as two deltas: {index, id, name} and then
// {index, arguments} with the whole arguments string. Arguments are not streamed fragment by
// fragment because until the call closes its text may still turn out malformed and then must be
// content; this keeps the streamed result identical to ParseToolCalls over the whole text for
// every chunking (that is how ParseToolCalls is built). The cost: a long call (a file written
// through a tool) shows up at once when it ends, and a long JSON answer at the start of a Llama
// message is held until its object closes.
//
// Limits: JSON nested deeper than 256 levels (64 in Gemma's syntax) is not a call. Reasoning blocks
// (<think>, Gemma's <|channel>thought) are not separated here except harmony's analysis channel;
// they are content to this module. Other families' syntaxes (GLM's <arg_key>, MiniMax's <invoke>,
// Functionary, DeepSeek, Kimi, Command R, Granite 3, Apriel's <tool_calls>) are refused by
// DetectToolCallFormat. Llama 3.1's code_interpreter (raw Python after <|python_tag|>) stays
// content. Qwen3-Coder calls that omit the opening <tool_call> are not recognized. Content and
// arguments are passed through as bytes; chunks that split UTF-8 characters give content deltas
// that split them too.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace bitsplit::text {

enum class ToolCallFormat {
  kLlama3Json,
  kHermes,
  kQwen3CoderXml,
  kMistralJsonArray,
  kMistralNameArgs,
  kGemma4,
  kHarmony,
};

// "llama3_json", "hermes", "qwen3_coder_xml", "mistral_json_array", "mistral_name_args",
// "gemma4", "harmony": the names the test fixtures use.
std::string_view ToolCallFormatName(ToolCallFormat format);
// INVALID_ARGUMENT for a name ToolCallFormatName does not return.
absl::StatusOr<ToolCallFormat> ToolCallFormatFromName(std::string_view name);

// The tool-call syntax a chat template writes, from its source text. UNIMPLEMENTED when the
// template renders tool calls in a syntax this module does not parse; NOT_FOUND when it mentions
// no tools at all.
absl::StatusOr<ToolCallFormat> DetectToolCallFormat(std::string_view template_source);

// The spellings of `format`'s call syntax that tokenizers make single special tokens (Mistral's
// [TOOL_CALLS], Llama's <|python_tag|>, Gemma 4's <|tool_call>, ...). Where such a token is a
// control token, detokenization hides it by default; the text the parser reads must show it.
std::vector<std::string_view> ToolCallMarkers(ToolCallFormat format);

// What the output must be when the request forces a call (tool_choice "required" or a named
// function): `prefix`, then one JSON document valid under `schema`, then `suffix`; together
// exactly one call in `format`'s syntax, which ParseToolCalls reads back as that call.
//   kLlama3Json        {"name": ..., "parameters": {...}}
//   kHermes            <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
//   kMistralJsonArray  [TOOL_CALLS][{"name": ..., "arguments": {...}}] (more than one element
//                      when `parallel`)
//   kMistralNameArgs   [TOOL_CALLS]name[ARGS]{...} for one function; the array form above when
//                      any of several may be called (the parser reads both)
//   kHarmony           <|channel|>commentary to=functions.name <|constrain|>json<|message|>{...}
//                      (the turn then ends with <|call|>, an end-of-generation token); one
//                      function only, since the name sits in the header, outside the JSON
// The name is a const (an enum over the tools for "required"); the arguments follow the tool's
// `parameters` schema (any object when it has none), as JSON Schema in JsonConstraint's subset.
// The prefix and suffix may hold special-token spellings: tokenize them with special tokens.
struct ForcedToolCall {
  std::string prefix;
  nlohmann::ordered_json schema;
  std::string suffix;
};

// `tools`: the request's tools in OpenAI's shape, as ordered_json so that properties keep the
// client's order; `function`: the forced function's name, or empty for any of them.
// INVALID_ARGUMENT when `function` is not among the tools, or a tool's parameters are not a
// schema JsonConstraint compiles (naming tools[i].function.parameters); UNIMPLEMENTED for the
// formats whose arguments are not JSON (Qwen3-Coder's XML, Gemma 4's) and for harmony when
// more than one function may be called.
absl::StatusOr<ForcedToolCall> ForcedToolCallOutput(ToolCallFormat format,
                                                    const nlohmann::ordered_json& tools,
                                                    std::string_view function, bool parallel);

// What a constrained answer (response_format) starts with in `format`: harmony's final-channel
// header "<|channel|>final<|message|>" (the generation prompt ends at <|start|>assistant);
// nothing for the other formats.
std::string_view ConstrainedAnswerPrefix(ToolCallFormat format);

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON object, compact

  bool operator==(const ToolCall&) const = default;
};

struct ParsedToolCalls {
  std::string reasoning;  // harmony's analysis channel; empty for the other formats
  std::string content;
  std::vector<ToolCall> tool_calls;

  bool operator==(const ParsedToolCalls&) const = default;
};

enum class ToolCallIdStyle {
  kOpenAi,   // "call_" + 24 alphanumerics
  kMistral,  // 9 alphanumerics
};

ToolCallIdStyle DefaultIdStyle(ToolCallFormat format);

// Deterministic ids: the same seed gives the same sequence, so a test (or a request replayed
// with the same seed) sees the same ids. The caller seeds it per request (e.g. from the request
// id) so that ids differ between the turns of a conversation.
class ToolCallIdGenerator {
 public:
  ToolCallIdGenerator(uint64_t seed, ToolCallIdStyle style) : seed_(seed), style_(style) {}
  std::string Next();

 private:
  uint64_t seed_;
  uint64_t counter_ = 0;
  ToolCallIdStyle style_;
};

struct ToolCallParserOptions {
  // The request's `tools` in OpenAI's shape ([{"type": "function", "function": {"name": ...,
  // "parameters": {...}}}]), or null. When it lists tools, a call to any other name is content,
  // and Qwen3-Coder values are typed by the parameters' schemas.
  nlohmann::json tools;
  // Ids for calls whose text carries none; empty: ToolCallIdGenerator(id_seed, the format's
  // DefaultIdStyle).
  std::function<std::string()> next_id;
  uint64_t id_seed = 0;
  // false: nothing is a call (a request without tools, or tool_choice "none"); only harmony's
  // channels are still read (a parser is only made without calls for harmony).
  bool calls = true;
};

// One piece of a streamed call, as OpenAI's `delta.tool_calls[i]`: a call's first delta has its
// id and name and empty arguments, the following ones (same index) carry arguments fragments.
struct ToolCallDelta {
  size_t index = 0;
  std::string id;
  std::string name;
  std::string arguments;

  bool operator==(const ToolCallDelta&) const = default;
};

struct ToolCallStreamDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;

  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

class ToolCallStreamParser {
 public:
  // INVALID_ARGUMENT when options.tools is neither null nor an array of function tools each
  // with a string name.
  static absl::StatusOr<ToolCallStreamParser> Create(ToolCallFormat format,
                                                     ToolCallParserOptions options);

  ToolCallStreamParser(ToolCallStreamParser&&) noexcept;
  ToolCallStreamParser& operator=(ToolCallStreamParser&&) noexcept;
  ~ToolCallStreamParser();

  // Feeds the next chunk of generated text; returns what it decided.
  ToolCallStreamDelta Feed(std::string_view text);
  // The end of the generation: decides everything held back (an unfinished call is content).
  // Feed after Finish is a bug.
  ToolCallStreamDelta Finish();

  // Bytes fed but not yet decided.
  size_t held_bytes() const;

 private:
  struct State;
  explicit ToolCallStreamParser(std::unique_ptr<State> state);
  ToolCallStreamDelta Run(bool at_end);

  std::unique_ptr<State> state_;
};

// The whole generated text at once; the same result as feeding it to a ToolCallStreamParser in
// any chunks and putting the deltas together. Errors as ToolCallStreamParser::Create.
absl::StatusOr<ParsedToolCalls> ParseToolCalls(ToolCallFormat format, std::string_view text,
                                               ToolCallParserOptions options);

// Puts streamed deltas together into the non-streaming result: reasoning and content concatenated,
// each call's id and name from its first delta and its arguments the concatenation of its
// fragments. INTERNAL when the deltas break the streaming shape (an index that skips one, a name
// twice).
absl::Status AppendToolCallStreamDelta(const ToolCallStreamDelta& delta, ParsedToolCalls& message);

}  // namespace bitsplit::text
