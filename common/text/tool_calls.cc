#include "common/text/tool_calls.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/text/harmony.h"
#include "common/text/json_constraint.h"
#include "common/util/status_macros.h"

namespace bitsplit::text {
namespace {

using OrderedJson = nlohmann::ordered_json;

constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kToolCallOpen = "<tool_call>";
constexpr std::string_view kToolCallClose = "</tool_call>";
constexpr std::string_view kFunctionOpen = "<function=";
constexpr std::string_view kFunctionClose = "</function>";
constexpr std::string_view kParameterOpen = "<parameter=";
constexpr std::string_view kParameterClose = "</parameter>";
constexpr std::string_view kMistralToolCalls = "[TOOL_CALLS]";
constexpr std::string_view kMistralCallId = "[CALL_ID]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kGemmaCallOpen = "<|tool_call>";
constexpr std::string_view kGemmaCallClose = "<tool_call|>";
constexpr std::string_view kGemmaQuote = "<|\"|>";

// Deep enough for any real arguments, shallow enough that the recursive Gemma reader (and
// nlohmann's recursive dump of parsed JSON) cannot exhaust the stack on hostile output.
constexpr int kMaxGemmaDepth = 64;
constexpr size_t kMaxJsonDepth = 256;

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

size_t LeadingSpace(std::string_view text) {
  size_t n = 0;
  while (n < text.size() && IsSpace(text[n])) ++n;
  return n;
}

size_t TrailingSpace(std::string_view text) {
  size_t n = 0;
  while (n < text.size() && IsSpace(text[text.size() - 1 - n])) ++n;
  return n;
}

std::string DumpCompact(const OrderedJson& value) {
  return value.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
}

// kIncomplete: the text ran out before the syntax decided; more text may complete it.
enum class Outcome { kOk, kIncomplete, kInvalid };

#define TOOL_CALLS_RETURN_UNLESS_OK(expr)                              \
  do {                                                                 \
    const Outcome tool_calls_outcome = (expr);                         \
    if (tool_calls_outcome != Outcome::kOk) return tool_calls_outcome; \
  } while (false)

// Where the scan of an unfinished JSON object stopped. A call's JSON can be long and arrives a
// token at a time; resuming the scan keeps the work linear instead of rescanning from the start
// on every chunk.
struct JsonScan {
  bool active = false;
  size_t start = 0;    // the container's first byte, in the candidate call's text
  size_t scanned = 0;  // the first byte not scanned yet (after the container once complete)
  std::string expected_closers;
  bool in_string = false;
  bool escaped = false;
};

// Brackets balanced outside strings; the caller parses the span, which checks the rest.
Outcome ContinueJsonScan(std::string_view text, JsonScan& scan) {
  for (size_t i = scan.scanned; i < text.size(); ++i) {
    const char c = text[i];
    if (scan.in_string) {
      if (scan.escaped) {
        scan.escaped = false;
      } else if (c == '\\') {
        scan.escaped = true;
      } else if (c == '"') {
        scan.in_string = false;
      }
      continue;
    }
    if (c == '"') {
      scan.in_string = true;
    } else if (c == '{' || c == '[') {
      if (scan.expected_closers.size() == kMaxJsonDepth) return Outcome::kInvalid;
      scan.expected_closers.push_back(c == '{' ? '}' : ']');
    } else if (c == '}' || c == ']') {
      if (scan.expected_closers.empty() || scan.expected_closers.back() != c) {
        return Outcome::kInvalid;
      }
      scan.expected_closers.pop_back();
      if (scan.expected_closers.empty()) {
        scan.scanned = i + 1;
        return Outcome::kOk;
      }
    }
  }
  scan.scanned = text.size();
  return Outcome::kIncomplete;
}

class Reader {
 public:
  // `json_scan` (optional) carries an unfinished JSON scan of this same text, grown since.
  explicit Reader(std::string_view text, JsonScan* json_scan = nullptr)
      : text_(text), json_scan_(json_scan) {}

  size_t pos() const { return pos_; }
  bool at_end() const { return pos_ == text_.size(); }
  char peek() const { return text_[pos_]; }
  void Advance(size_t n) { pos_ += n; }
  void SkipSpace() { pos_ += LeadingSpace(text_.substr(pos_)); }

  // Consumes `literal` when the text continues with it.
  Outcome Literal(std::string_view literal) {
    const std::string_view rest = text_.substr(pos_);
    if (rest.size() < literal.size()) {
      return literal.starts_with(rest) ? Outcome::kIncomplete : Outcome::kInvalid;
    }
    if (!rest.starts_with(literal)) return Outcome::kInvalid;
    pos_ += literal.size();
    return Outcome::kOk;
  }

  // The text up to `delimiter`, consumed together with it.
  Outcome Until(std::string_view delimiter, std::string_view& out) {
    const size_t found = text_.find(delimiter, pos_);
    if (found == std::string_view::npos) return Outcome::kIncomplete;
    out = text_.substr(pos_, found - pos_);
    pos_ = found + delimiter.size();
    return Outcome::kOk;
  }

  // A name up to `terminator` (not consumed), failing as soon as a character that no name has
  // shows up, so that ordinary text after a marker is released early rather than held.
  Outcome Name(char terminator, std::string_view& out) {
    for (size_t i = pos_; i < text_.size(); ++i) {
      const char c = text_[i];
      if (c == terminator) {
        if (i == pos_) return Outcome::kInvalid;
        out = text_.substr(pos_, i - pos_);
        pos_ = i;
        return Outcome::kOk;
      }
      if (IsSpace(c) || std::string_view("<>{}[]()\"',:;=|").find(c) != std::string_view::npos) {
        return Outcome::kInvalid;
      }
    }
    return Outcome::kIncomplete;
  }

  // Skips a JSON object or array by its brackets, outside strings; the caller parses the span.
  Outcome SkipJsonContainer() {
    JsonScan scan;
    if (json_scan_ != nullptr && json_scan_->active && json_scan_->start == pos_) {
      scan = *json_scan_;
    } else {
      if (at_end()) return Outcome::kIncomplete;
      if (peek() != '{' && peek() != '[') return Outcome::kInvalid;
      scan.start = pos_;
      scan.scanned = pos_;
    }
    const Outcome outcome = ContinueJsonScan(text_, scan);
    if (json_scan_ != nullptr) {
      *json_scan_ = scan;
      json_scan_->active = outcome == Outcome::kIncomplete;
    }
    if (outcome == Outcome::kOk) pos_ = scan.scanned;
    return outcome;
  }

  // A JSON object or array, parsed.
  Outcome JsonContainer(OrderedJson& out) {
    const size_t start = pos_;
    TOOL_CALLS_RETURN_UNLESS_OK(SkipJsonContainer());
    out =
        OrderedJson::parse(text_.substr(start, pos_ - start), nullptr, /*allow_exceptions=*/false);
    return out.is_discarded() ? Outcome::kInvalid : Outcome::kOk;
  }

 private:
  std::string_view text_;
  size_t pos_ = 0;
  JsonScan* json_scan_;
};

struct RawCall {
  std::string id;  // empty when the text carries none
  std::string name;
  std::string arguments;
};

// The declared tools: which names may be called, and each one's parameter schemas.
struct DeclaredTools {
  bool any = false;
  std::map<std::string, OrderedJson, std::less<>> parameters;

  bool Allows(std::string_view name) const { return !any || parameters.contains(name); }

  const OrderedJson* ParameterSchema(std::string_view tool, std::string_view parameter) const {
    const auto found = parameters.find(tool);
    if (found == parameters.end()) return nullptr;
    const OrderedJson& schema = found->second;
    if (!schema.is_object() || !schema.contains("properties")) return nullptr;
    const OrderedJson& properties = schema["properties"];
    if (!properties.is_object()) return nullptr;
    const auto property = properties.find(std::string(parameter));
    return property == properties.end() ? nullptr : &*property;
  }
};

absl::StatusOr<DeclaredTools> ReadDeclaredTools(const nlohmann::json& tools) {
  DeclaredTools declared;
  if (tools.is_null()) return declared;
  if (!tools.is_array()) return absl::InvalidArgumentError("tools must be an array");
  for (size_t i = 0; i < tools.size(); ++i) {
    const nlohmann::json& tool = tools[i];
    const nlohmann::json* function = &tool;
    if (tool.is_object() && tool.contains("function")) function = &tool["function"];
    if (!function->is_object() || !function->contains("name") || !(*function)["name"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("tools[", i, "] has no function name"));
    }
    OrderedJson parameters;
    if (function->contains("parameters")) {
      parameters = OrderedJson::parse((*function)["parameters"].dump());
    }
    declared.parameters[(*function)["name"].get<std::string>()] = std::move(parameters);
    declared.any = true;
  }
  return declared;
}

// {"name": "f", "arguments" or "parameters": {...}}, arguments possibly a string holding the
// object (some fine-tunes double-encode them).
std::optional<RawCall> CallFromJson(const OrderedJson& object) {
  if (!object.is_object()) return std::nullopt;
  const auto name = object.find("name");
  if (name == object.end() || !name->is_string() || name->get<std::string>().empty()) {
    return std::nullopt;
  }
  auto arguments = object.find("arguments");
  if (arguments == object.end()) arguments = object.find("parameters");
  if (arguments == object.end()) return std::nullopt;
  const auto type = object.find("type");
  if (type != object.end() && *type != "function") return std::nullopt;
  RawCall call;
  call.name = name->get<std::string>();
  if (arguments->is_object()) {
    call.arguments = DumpCompact(*arguments);
  } else if (arguments->is_string()) {
    const OrderedJson decoded =
        OrderedJson::parse(arguments->get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (decoded.is_discarded() || !decoded.is_object()) return std::nullopt;
    call.arguments = DumpCompact(decoded);
  } else {
    return std::nullopt;
  }
  const auto id = object.find("id");
  if (id != object.end() && id->is_string()) call.id = id->get<std::string>();
  return call;
}

// ---- Gemma 4 values -------------------------------------------------------------------------

Outcome GemmaValue(Reader& reader, OrderedJson& out, int depth);

Outcome GemmaString(Reader& reader, std::string& out) {
  TOOL_CALLS_RETURN_UNLESS_OK(reader.Literal(kGemmaQuote));
  std::string_view text;
  TOOL_CALLS_RETURN_UNLESS_OK(reader.Until(kGemmaQuote, text));
  out = std::string(text);
  return Outcome::kOk;
}

// A bare key runs to the colon; one that meets a character a key cannot hold first is not a key.
Outcome GemmaKey(Reader& reader, std::string& out) {
  if (!reader.at_end() && reader.peek() == '<') return GemmaString(reader, out);
  std::string_view key;
  TOOL_CALLS_RETURN_UNLESS_OK(reader.Name(':', key));
  out = std::string(key);
  return Outcome::kOk;
}

Outcome GemmaObject(Reader& reader, OrderedJson& out, int depth) {
  TOOL_CALLS_RETURN_UNLESS_OK(reader.Literal("{"));
  out = OrderedJson::object();
  reader.SkipSpace();
  if (reader.at_end()) return Outcome::kIncomplete;
  if (reader.peek() == '}') {
    reader.Advance(1);
    return Outcome::kOk;
  }
  while (true) {
    std::string key;
    TOOL_CALLS_RETURN_UNLESS_OK(GemmaKey(reader, key));
    reader.SkipSpace();
    TOOL_CALLS_RETURN_UNLESS_OK(reader.Literal(":"));
    reader.SkipSpace();
    OrderedJson value;
    TOOL_CALLS_RETURN_UNLESS_OK(GemmaValue(reader, value, depth + 1));
    out[key] = std::move(value);
    reader.SkipSpace();
    if (reader.at_end()) return Outcome::kIncomplete;
    const char c = reader.peek();
    reader.Advance(1);
    if (c == '}') return Outcome::kOk;
    if (c != ',') return Outcome::kInvalid;
    reader.SkipSpace();
  }
}

Outcome GemmaArray(Reader& reader, OrderedJson& out, int depth) {
  TOOL_CALLS_RETURN_UNLESS_OK(reader.Literal("["));
  out = OrderedJson::array();
  reader.SkipSpace();
  if (reader.at_end()) return Outcome::kIncomplete;
  if (reader.peek() == ']') {
    reader.Advance(1);
    return Outcome::kOk;
  }
  while (true) {
    OrderedJson value;
    TOOL_CALLS_RETURN_UNLESS_OK(GemmaValue(reader, value, depth + 1));
    out.push_back(std::move(value));
    reader.SkipSpace();
    if (reader.at_end()) return Outcome::kIncomplete;
    const char c = reader.peek();
    reader.Advance(1);
    if (c == ']') return Outcome::kOk;
    if (c != ',') return Outcome::kInvalid;
    reader.SkipSpace();
  }
}

// A number is known complete only when the character after it has arrived.
Outcome GemmaNumber(Reader& reader, OrderedJson& out) {
  std::string token;
  while (!reader.at_end() &&
         std::string_view("0123456789+-.eE").find(reader.peek()) != std::string_view::npos) {
    token.push_back(reader.peek());
    reader.Advance(1);
  }
  if (reader.at_end()) return Outcome::kIncomplete;
  out = OrderedJson::parse(token, nullptr, /*allow_exceptions=*/false);
  return !out.is_discarded() && out.is_number() ? Outcome::kOk : Outcome::kInvalid;
}

Outcome GemmaValue(Reader& reader, OrderedJson& out, int depth) {
  if (depth > kMaxGemmaDepth) return Outcome::kInvalid;
  if (reader.at_end()) return Outcome::kIncomplete;
  switch (reader.peek()) {
    case '<': {
      std::string text;
      TOOL_CALLS_RETURN_UNLESS_OK(GemmaString(reader, text));
      out = std::move(text);
      return Outcome::kOk;
    }
    case '{':
      return GemmaObject(reader, out, depth);
    case '[':
      return GemmaArray(reader, out, depth);
    case 't':
      out = true;
      return reader.Literal("true");
    case 'f':
      out = false;
      return reader.Literal("false");
    case 'n':
      out = nullptr;
      return reader.Literal("null");
    case 'N':  // Python's None, as the template's format_argument writes it
      out = nullptr;
      return reader.Literal("None");
    default:
      return GemmaNumber(reader, out);
  }
}

// ---- Qwen3-Coder values ---------------------------------------------------------------------

void CollectSchemaTypes(const OrderedJson& schema, std::set<std::string>& types) {
  if (!schema.is_object()) return;
  if (const auto type = schema.find("type"); type != schema.end()) {
    if (type->is_string()) types.insert(type->get<std::string>());
    if (type->is_array()) {
      for (const OrderedJson& each : *type) {
        if (each.is_string()) types.insert(each.get<std::string>());
      }
    }
  }
  for (const char* combinator : {"anyOf", "oneOf"}) {
    if (const auto options = schema.find(combinator);
        options != schema.end() && options->is_array()) {
      for (const OrderedJson& option : *options) CollectSchemaTypes(option, types);
    }
  }
}

OrderedJson QwenParameterValue(std::string_view raw, const OrderedJson* schema) {
  std::string_view trimmed = raw;
  trimmed.remove_prefix(LeadingSpace(trimmed));
  trimmed.remove_suffix(TrailingSpace(trimmed));
  const OrderedJson parsed = OrderedJson::parse(trimmed, nullptr, /*allow_exceptions=*/false);
  std::set<std::string> types;
  if (schema != nullptr) CollectSchemaTypes(*schema, types);
  if (types.empty()) {
    if (!parsed.is_discarded() && !parsed.is_string()) return parsed;
    return std::string(raw);
  }
  if (types.size() == 1 && types.contains("string")) return std::string(raw);
  std::string lower(trimmed);
  for (char& c : lower) c = absl::ascii_tolower(static_cast<unsigned char>(c));
  if (types.contains("boolean") && (lower == "true" || lower == "false")) return lower == "true";
  if (types.contains("null") && (trimmed == "null" || trimmed == "None")) return nullptr;
  if (!parsed.is_discarded()) {
    if ((types.contains("number") || types.contains("integer")) && parsed.is_number()) {
      return parsed;
    }
    if (types.contains("object") && parsed.is_object()) return parsed;
    if (types.contains("array") && parsed.is_array()) return parsed;
  }
  return std::string(raw);
}

// ---- Llama 3.1 built-in tools ---------------------------------------------------------------

// name.call(key="value", ...), as the template writes a built-in tool's call.
Outcome LlamaBuiltinCall(Reader& reader, RawCall& call) {
  std::string_view name;
  TOOL_CALLS_RETURN_UNLESS_OK(reader.Name('.', name));
  TOOL_CALLS_RETURN_UNLESS_OK(reader.Literal(".call("));
  OrderedJson arguments = OrderedJson::object();
  reader.SkipSpace();
  if (reader.at_end()) return Outcome::kIncomplete;
  if (reader.peek() != ')') {
    while (true) {
      std::string_view key;
      TOOL_CALLS_RETURN_UNLESS_OK(reader.Name('=', key));
      reader.Advance(1);
      reader.SkipSpace();
      TOOL_CALLS_RETURN_UNLESS_OK(reader.Literal("\""));
      // The template does not escape the value: it runs to the next quote.
      std::string_view value;
      TOOL_CALLS_RETURN_UNLESS_OK(reader.Until("\"", value));
      arguments[std::string(key)] = std::string(value);
      reader.SkipSpace();
      if (reader.at_end()) return Outcome::kIncomplete;
      if (reader.peek() == ')') break;
      TOOL_CALLS_RETURN_UNLESS_OK(reader.Literal(","));
      reader.SkipSpace();
    }
  }
  reader.Advance(1);
  call.name = std::string(name);
  call.arguments = DumpCompact(arguments);
  return Outcome::kOk;
}

// What starts at the current position of the undecided text.
struct CallMatch {
  enum class Kind { kNone, kIncomplete, kCalls, kSeparator };
  Kind kind = Kind::kNone;
  size_t length = 0;
  std::vector<RawCall> calls;
};

std::vector<std::string_view> StartMarkers(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kLlama3Json:
      return {kPythonTag};
    case ToolCallFormat::kHermes:
    case ToolCallFormat::kQwen3CoderXml:
      return {kToolCallOpen};
    case ToolCallFormat::kMistralJsonArray:
    case ToolCallFormat::kMistralNameArgs:
      return {kMistralToolCalls};
    case ToolCallFormat::kGemma4:
      return {kGemmaCallOpen};
    case ToolCallFormat::kHarmony:
      return {};  // HarmonyStream reads the whole text
  }
  return {};
}

}  // namespace

// ---- The parser -----------------------------------------------------------------------------

struct ToolCallStreamParser::State {
  ToolCallFormat format;
  DeclaredTools tools;
  std::function<std::string()> next_id;
  std::vector<std::string_view> markers;
  std::string pending;      // fed, not yet decided
  bool at_start = true;     // nothing but white space decided so far
  bool after_call = false;  // the last thing decided was a call (or Llama's ";" after one)
  bool finished = false;
  size_t calls_emitted = 0;
  size_t erased = 0;  // bytes decided and dropped from `pending`, over the whole stream
  // The JSON scan of the candidate call starting at stream offset json_scan_candidate.
  mutable JsonScan json_scan;
  mutable size_t json_scan_candidate = 0;
  std::unique_ptr<HarmonyStream> harmony;  // kHarmony's reader

  Outcome HermesCalls(Reader& reader, std::vector<RawCall>& calls) const;
  Outcome QwenCoderCalls(Reader& reader, std::vector<RawCall>& calls) const;
  Outcome MistralCalls(Reader& reader, std::vector<RawCall>& calls) const;
  Outcome GemmaCalls(Reader& reader, std::vector<RawCall>& calls) const;
  Outcome LlamaJsonCall(Reader& reader, std::vector<RawCall>& calls) const;
  Outcome LlamaTaggedCalls(Reader& reader, std::vector<RawCall>& calls) const;
  CallMatch MatchAt(std::string_view text, bool at_end, size_t stream_offset) const;
  size_t ContentLength(std::string_view text, bool at_end) const;
};

Outcome ToolCallStreamParser::State::HermesCalls(Reader& reader,
                                                 std::vector<RawCall>& calls) const {
  TOOL_CALLS_RETURN_UNLESS_OK(reader.Literal(kToolCallOpen));
  reader.SkipSpace();
  OrderedJson object;
  TOOL_CALLS_RETURN_UNLESS_OK(reader.JsonContainer(object));
  std::optional<RawCall> call = CallFromJson(object);
  if (!call) return Outcome::kInvalid;
  reader.SkipSpace();
  TOOL_CALLS_RETURN_UNLESS_OK(reader.Literal(kToolCallClose));
  call->id.clear();  // Hermes does not carry ids; an "id" member is the model's invention
  calls.push_back(*std::move(call));
  return Outcome::kOk;
}

Outcome ToolCallStreamParser::State::QwenCoderCalls(Reader& reader,
                                                    std::vector<RawCall>& calls) const {
  TOOL_CALLS_RETURN_UNLESS_OK(reader.Literal(kToolCallOpen));
  reader.SkipSpace();
  TOOL_CALLS_RETURN_UNLESS_OK(reader.Literal(kFunctionOpen));
  std::string_view name;
  TOOL_CALLS_RETURN_UNLESS_OK(reader.Name('>', name));
  reader.Advance(1);
  OrderedJson arguments = OrderedJson::object();
  while (true) {
    reader.SkipSpace();
    const Outcome parameter = reader.Literal(kParameterOpen);
    if (parameter == Outcome::kIncomplete) return parameter;
    if (parameter == Outcome::kInvalid) {
      TOOL_CALLS_RETURN_UNLESS_OK(reader.Literal(kFunctionClose));
      break;
    }
    std::string_view parameter_name;
    TOOL_CALLS_RETURN_UNLESS_OK(reader.Name('>', parameter_name));
    reader.Advance(1);
    std::string_view value;
    TOOL_CALLS_RETURN_UNLESS_OK(reader.Until(kParameterClose, value));
    // The template puts the value on lines of its own.
    if (value.starts_with('\n')) value.remove_prefix(1);
    if (value.ends_with('\n')) value.remove_suffix(1);
    arguments[std::string(parameter_name)] =
        QwenParameterValue(value, tools.ParameterSchema(name, parameter_name));
  }
  reader.SkipSpace();
  TOOL_CALLS_RETURN_UNLESS_OK(reader.Literal(kToolCallClose));
  calls.push_back(RawCall{"", std::string(name), DumpCompact(arguments)});
  return Outcome::kOk;
}

Outcome ToolCallStreamParser::State::MistralCalls(Reader& reader,
                                                  std::vector<RawCall>& calls) const {
  TOOL_CALLS_RETURN_UNLESS_OK(reader.Literal(kMistralToolCalls));
  reader.SkipSpace();
  if (reader.at_end()) return Outcome::kIncomplete;
  if (reader.peek() == '[') {  // Nemo: a JSON array of calls
    OrderedJson array;
    TOOL_CALLS_RETURN_UNLESS_OK(reader.JsonContainer(array));
    if (!array.is_array() || array.empty()) return Outcome::kInvalid;
    for (const OrderedJson& element : array) {
      std::optional<RawCall> call = CallFromJson(element);
      if (!call) return Outcome::kInvalid;
      calls.push_back(*std::move(call));
    }
    return Outcome::kOk;
  }
  RawCall call;
  std::string_view name;
  TOOL_CALLS_RETURN_UNLESS_OK(reader.Name('[', name));
  call.name = std::string(name);
  const Outcome call_id = reader.Literal(kMistralCallId);
  if (call_id == Outcome::kIncomplete) return call_id;
  if (call_id == Outcome::kOk) {
    std::string_view id;
    TOOL_CALLS_RETURN_UNLESS_OK(reader.Name('[', id));
    call.id = std::string(id);
  }
  TOOL_CALLS_RETURN_UNLESS_OK(reader.Literal(kMistralArgs));
  reader.SkipSpace();
  OrderedJson arguments;
  TOOL_CALLS_RETURN_UNLESS_OK(reader.JsonContainer(arguments));
  if (!arguments.is_object()) return Outcome::kInvalid;
  call.arguments = DumpCompact(arguments);
  calls.push_back(std::move(call));
  return Outcome::kOk;
}

Outcome ToolCallStreamParser::State::GemmaCalls(Reader& reader, std::vector<RawCall>& calls) const {
  TOOL_CALLS_RETURN_UNLESS_OK(reader.Literal(kGemmaCallOpen));
  TOOL_CALLS_RETURN_UNLESS_OK(reader.Literal("call:"));
  std::string_view name;
  TOOL_CALLS_RETURN_UNLESS_OK(reader.Name('{', name));
  OrderedJson arguments;
  TOOL_CALLS_RETURN_UNLESS_OK(GemmaObject(reader, arguments, 0));
  TOOL_CALLS_RETURN_UNLESS_OK(reader.Literal(kGemmaCallClose));
  calls.push_back(RawCall{"", std::string(name), DumpCompact(arguments)});
  return Outcome::kOk;
}

Outcome ToolCallStreamParser::State::LlamaJsonCall(Reader& reader,
                                                   std::vector<RawCall>& calls) const {
  OrderedJson object;
  TOOL_CALLS_RETURN_UNLESS_OK(reader.JsonContainer(object));
  std::optional<RawCall> call = CallFromJson(object);
  if (!call) return Outcome::kInvalid;
  call->id.clear();
  calls.push_back(*std::move(call));
  return Outcome::kOk;
}

Outcome ToolCallStreamParser::State::LlamaTaggedCalls(Reader& reader,
                                                      std::vector<RawCall>& calls) const {
  TOOL_CALLS_RETURN_UNLESS_OK(reader.Literal(kPythonTag));
  reader.SkipSpace();
  if (reader.at_end()) return Outcome::kIncomplete;
  if (reader.peek() == '{') return LlamaJsonCall(reader, calls);
  RawCall call;
  TOOL_CALLS_RETURN_UNLESS_OK(LlamaBuiltinCall(reader, call));
  calls.push_back(std::move(call));
  return Outcome::kOk;
}

CallMatch ToolCallStreamParser::State::MatchAt(std::string_view text, bool at_end,
                                               size_t stream_offset) const {
  if (json_scan_candidate != stream_offset) {
    json_scan = JsonScan();
    json_scan_candidate = stream_offset;
  }
  CallMatch match;
  if (format == ToolCallFormat::kLlama3Json && after_call && text[0] == ';') {
    match.kind = CallMatch::Kind::kSeparator;
    match.length = 1;
    return match;
  }
  Reader reader(text, &json_scan);
  Outcome outcome = Outcome::kInvalid;
  switch (format) {
    case ToolCallFormat::kLlama3Json:
      if (text[0] == '{') {
        if (at_start || after_call) outcome = LlamaJsonCall(reader, match.calls);
      } else {
        outcome = LlamaTaggedCalls(reader, match.calls);
      }
      break;
    case ToolCallFormat::kHermes:
      outcome = HermesCalls(reader, match.calls);
      break;
    case ToolCallFormat::kQwen3CoderXml:
      outcome = QwenCoderCalls(reader, match.calls);
      break;
    case ToolCallFormat::kMistralJsonArray:
    case ToolCallFormat::kMistralNameArgs:
      outcome = MistralCalls(reader, match.calls);
      break;
    case ToolCallFormat::kGemma4:
      outcome = GemmaCalls(reader, match.calls);
      break;
    case ToolCallFormat::kHarmony:
      break;  // Run hands harmony to HarmonyStream
  }
  if (outcome == Outcome::kIncomplete && !at_end) {
    match.kind = CallMatch::Kind::kIncomplete;
    return match;
  }
  if (outcome != Outcome::kOk) return CallMatch{};
  for (const RawCall& call : match.calls) {
    if (!tools.Allows(call.name)) return CallMatch{};
  }
  match.kind = CallMatch::Kind::kCalls;
  match.length = reader.pos();
  return match;
}

// How much of `text` (which does not start a call) is content for sure: up to the first marker
// after its first byte, or, without one, up to a tail that could still grow into a marker; the
// white space before either waits too, since it goes with a call if one follows.
size_t ToolCallStreamParser::State::ContentLength(std::string_view text, bool at_end) const {
  size_t end = text.size();
  for (std::string_view marker : markers) {
    const size_t found = text.find(marker, 1);
    if (found != std::string_view::npos) end = std::min(end, found);
  }
  if (end == text.size() && !at_end) {
    for (std::string_view marker : markers) {
      const size_t longest = std::min(marker.size() - 1, text.size() - 1);
      for (size_t length = longest; length > 0; --length) {
        if (marker.starts_with(text.substr(text.size() - length))) {
          end = std::min(end, text.size() - length);
          break;
        }
      }
    }
  }
  if (end < text.size() || !at_end) end -= TrailingSpace(text.substr(0, end));
  return std::max<size_t>(end, 1);
}

ToolCallStreamParser::ToolCallStreamParser(std::unique_ptr<State> state)
    : state_(std::move(state)) {}
ToolCallStreamParser::ToolCallStreamParser(ToolCallStreamParser&&) noexcept = default;
ToolCallStreamParser& ToolCallStreamParser::operator=(ToolCallStreamParser&&) noexcept = default;
ToolCallStreamParser::~ToolCallStreamParser() = default;

absl::StatusOr<ToolCallStreamParser> ToolCallStreamParser::Create(ToolCallFormat format,
                                                                  ToolCallParserOptions options) {
  auto state = std::make_unique<State>();
  state->format = format;
  BITSPLIT_ASSIGN_OR_RETURN(state->tools, ReadDeclaredTools(options.tools));
  state->next_id = std::move(options.next_id);
  if (!state->next_id) {
    state->next_id = [generator =
                          ToolCallIdGenerator(options.id_seed, DefaultIdStyle(format))]() mutable {
      return generator.Next();
    };
  }
  state->markers = StartMarkers(format);
  if (format == ToolCallFormat::kHarmony) {
    state->harmony = std::make_unique<HarmonyStream>(
        [tools = state->tools, calls = options.calls](std::string_view name) {
          return calls && tools.Allows(name);
        },
        state->next_id);
  }
  return ToolCallStreamParser(std::move(state));
}

ToolCallStreamDelta ToolCallStreamParser::Feed(std::string_view text) {
  BITSPLIT_CHECK(!state_->finished);
  state_->pending.append(text);
  return Run(/*at_end=*/false);
}

ToolCallStreamDelta ToolCallStreamParser::Finish() {
  BITSPLIT_CHECK(!state_->finished);
  ToolCallStreamDelta delta = Run(/*at_end=*/true);
  state_->finished = true;
  BITSPLIT_CHECK(state_->pending.empty());
  return delta;
}

size_t ToolCallStreamParser::held_bytes() const { return state_->pending.size(); }

// Every decision depends only on the text it covers (never on where a chunk happened to end),
// and undecidable text waits; so any chunking makes the same decisions.
ToolCallStreamDelta ToolCallStreamParser::Run(bool at_end) {
  State& s = *state_;
  ToolCallStreamDelta delta;
  const std::string_view pending = s.pending;
  size_t decided = 0;
  if (s.harmony) {
    decided = s.harmony->Run(pending, at_end, delta);
    s.pending.erase(0, decided);
    s.erased += decided;
    return delta;
  }
  while (decided < pending.size()) {
    const std::string_view text = pending.substr(decided);
    const size_t space = LeadingSpace(text);
    if (space > 0 && s.after_call) {
      decided += space;  // white space after a call goes with it
      continue;
    }
    if (space == text.size()) {
      if (!at_end) break;  // a call may follow and claim it
      delta.content.append(text);
      decided += space;
      s.at_start = false;
      continue;
    }
    const CallMatch match = s.MatchAt(text.substr(space), at_end, s.erased + decided + space);
    if (match.kind == CallMatch::Kind::kIncomplete) break;
    if (match.kind == CallMatch::Kind::kSeparator) {
      decided += space + match.length;
      continue;
    }
    if (match.kind == CallMatch::Kind::kCalls) {
      for (const RawCall& call : match.calls) {
        ToolCallDelta header;
        header.index = s.calls_emitted++;
        header.id = call.id.empty() ? s.next_id() : call.id;
        header.name = call.name;
        ToolCallDelta arguments;
        arguments.index = header.index;
        arguments.arguments = call.arguments;
        delta.tool_calls.push_back(std::move(header));
        delta.tool_calls.push_back(std::move(arguments));
      }
      decided += space + match.length;
      s.at_start = false;
      s.after_call = true;
      continue;
    }
    const size_t length = space > 0 ? space : s.ContentLength(text, at_end);
    delta.content.append(text.substr(0, length));
    decided += length;
    s.at_start = false;
    s.after_call = false;
  }
  s.pending.erase(0, decided);
  s.erased += decided;
  return delta;
}

// ---- Formats, ids, the one-shot parse -------------------------------------------------------

std::string_view ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kLlama3Json:
      return "llama3_json";
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kQwen3CoderXml:
      return "qwen3_coder_xml";
    case ToolCallFormat::kMistralJsonArray:
      return "mistral_json_array";
    case ToolCallFormat::kMistralNameArgs:
      return "mistral_name_args";
    case ToolCallFormat::kGemma4:
      return "gemma4";
    case ToolCallFormat::kHarmony:
      return "harmony";
  }
  return "unknown";
}

absl::StatusOr<ToolCallFormat> ToolCallFormatFromName(std::string_view name) {
  for (ToolCallFormat format :
       {ToolCallFormat::kLlama3Json, ToolCallFormat::kHermes, ToolCallFormat::kQwen3CoderXml,
        ToolCallFormat::kMistralJsonArray, ToolCallFormat::kMistralNameArgs,
        ToolCallFormat::kGemma4, ToolCallFormat::kHarmony}) {
    if (ToolCallFormatName(format) == name) return format;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown tool-call format \"", std::string(name), "\""));
}

absl::StatusOr<ToolCallFormat> DetectToolCallFormat(std::string_view source) {
  const auto has = [source](std::string_view needle) {
    return source.find(needle) != std::string_view::npos;
  };
  if (WritesHarmony(source)) return ToolCallFormat::kHarmony;
  // Gemma 4 first: its <|tool_call> contains no "<tool_call>", but check the specific before the
  // general anyway.
  if (has("<|tool_call>call:")) return ToolCallFormat::kGemma4;
  if (has(kMistralToolCalls)) {
    return has(kMistralArgs) ? ToolCallFormat::kMistralNameArgs : ToolCallFormat::kMistralJsonArray;
  }
  if (has(kToolCallOpen)) {
    if (has(kFunctionOpen) && has(kParameterOpen)) return ToolCallFormat::kQwen3CoderXml;
    // <tool_call> with something other than a JSON object inside (GLM's <arg_key>, MiniMax's
    // <invoke>), or a prompt that mentions <tool_call> while the history uses <tool_calls>.
    for (std::string_view other : {"<arg_key>", "<invoke", "<tool_calls>", "<function name="}) {
      if (has(other)) {
        return absl::UnimplementedError(absl::StrCat(
            "the template writes tool calls inside <tool_call> in an unsupported syntax (",
            std::string(other), ")"));
      }
    }
    return ToolCallFormat::kHermes;
  }
  // Functionary v3.1 has <|python_tag|> too, with <function=...> calls.
  if (!has(kFunctionOpen) &&
      (has(kPythonTag) || has("\"parameters\": dictionary of argument name and its value"))) {
    return ToolCallFormat::kLlama3Json;
  }
  if (has("tool_calls") || has("tools")) {
    return absl::UnimplementedError("the template renders tool calls in an unsupported syntax");
  }
  return absl::NotFoundError("the template does not render tools");
}

std::vector<std::string_view> ToolCallMarkers(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kLlama3Json:
      return {kPythonTag};
    case ToolCallFormat::kHermes:
    case ToolCallFormat::kQwen3CoderXml:
      return {kToolCallOpen, kToolCallClose};
    case ToolCallFormat::kMistralJsonArray:
    case ToolCallFormat::kMistralNameArgs:
      return {kMistralToolCalls, kMistralCallId, kMistralArgs};
    case ToolCallFormat::kGemma4:
      return {kGemmaCallOpen, kGemmaCallClose, kGemmaQuote};
    case ToolCallFormat::kHarmony:
      return HarmonyStream::Markers();
  }
  return {};
}

absl::StatusOr<ForcedToolCall> ForcedToolCallOutput(ToolCallFormat format,
                                                    const nlohmann::ordered_json& tools,
                                                    std::string_view function, bool parallel) {
  using Json = nlohmann::ordered_json;
  if (format == ToolCallFormat::kQwen3CoderXml || format == ToolCallFormat::kGemma4) {
    return absl::UnimplementedError(
        absl::StrCat("forcing a tool call needs its arguments as JSON; the template's ",
                     std::string(ToolCallFormatName(format)), " syntax writes them otherwise"));
  }
  if (!tools.is_array() || tools.empty()) {
    return absl::InvalidArgumentError("forcing a tool call needs tools");
  }
  // (name, parameters schema) of each candidate.
  std::vector<std::pair<std::string, Json>> candidates;
  for (size_t t = 0; t < tools.size(); ++t) {
    const Json& tool = tools[t];
    if (!tool.is_object() || !tool.contains("function") || !tool["function"].is_object() ||
        !tool["function"].contains("name") || !tool["function"]["name"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tools[", t, "]: must be {\"type\": \"function\", \"function\": {\"name\": ...}}"));
    }
    const Json& spec = tool["function"];
    const std::string name = spec["name"].get<std::string>();
    if (!function.empty() && name != function) continue;
    Json parameters = spec.contains("parameters") && !spec["parameters"].is_null()
                          ? spec["parameters"]
                          : Json{{"type", "object"}};
    if (absl::StatusOr<JsonConstraint> compiled = JsonConstraint::FromSchema(parameters);
        !compiled.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tools[", t, "].function.parameters: ", compiled.status().message()));
    }
    candidates.emplace_back(name, std::move(parameters));
  }
  if (candidates.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the function \"", std::string(function), "\" is not among the tools"));
  }
  const auto call_schema = [&candidates](std::string_view arguments_key) {
    Json any_of = Json::array();
    for (const auto& [name, parameters] : candidates) {
      any_of.push_back(
          Json{{"type", "object"},
               {"properties", {{"name", {{"const", name}}}, {arguments_key, parameters}}},
               {"required", {"name", arguments_key}}});
    }
    return any_of.size() == 1 ? any_of[0] : Json{{"anyOf", any_of}};
  };
  const auto call_array = [&] {
    Json array = {{"type", "array"}, {"items", call_schema("arguments")}, {"minItems", 1}};
    if (!parallel) array["maxItems"] = 1;
    return array;
  };
  ForcedToolCall forced;
  switch (format) {
    case ToolCallFormat::kLlama3Json:
      forced.schema = call_schema("parameters");
      break;
    case ToolCallFormat::kHermes:
      forced.prefix = std::string(kToolCallOpen) + "\n";
      forced.schema = call_schema("arguments");
      forced.suffix = "\n" + std::string(kToolCallClose);
      break;
    case ToolCallFormat::kMistralNameArgs:
      if (candidates.size() == 1) {
        forced.prefix =
            std::string(kMistralToolCalls) + candidates[0].first + std::string(kMistralArgs);
        forced.schema = candidates[0].second;
        break;
      }
      [[fallthrough]];
    case ToolCallFormat::kMistralJsonArray:
      forced.prefix = std::string(kMistralToolCalls);
      forced.schema = call_array();
      break;
    case ToolCallFormat::kHarmony:
      if (candidates.size() > 1) {
        return absl::UnimplementedError(
            "the harmony format names the function in the message header, outside the JSON "
            "arguments: name one function in tool_choice (or give one tool)");
      }
      forced.prefix = HarmonyStream::CallHeader(candidates[0].first);
      forced.schema = candidates[0].second;
      break;
    default:
      break;
  }
  return forced;
}

std::string_view ConstrainedAnswerPrefix(ToolCallFormat format) {
  return format == ToolCallFormat::kHarmony ? HarmonyStream::kFinalHeader : std::string_view();
}

ToolCallIdStyle DefaultIdStyle(ToolCallFormat format) {
  return format == ToolCallFormat::kMistralJsonArray || format == ToolCallFormat::kMistralNameArgs
             ? ToolCallIdStyle::kMistral
             : ToolCallIdStyle::kOpenAi;
}

std::string ToolCallIdGenerator::Next() {
  constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  // SplitMix64 over (seed, counter): cheap, and distinct counters give unrelated ids.
  uint64_t state = seed_ + 0x9E3779B97F4A7C15ull * (++counter_);
  const auto next = [&state] {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  const bool openai = style_ == ToolCallIdStyle::kOpenAi;
  std::string id = openai ? "call_" : "";
  for (int i = 0; i < (openai ? 24 : 9); ++i) id.push_back(kAlphabet[next() % kAlphabet.size()]);
  return id;
}

absl::Status AppendToolCallStreamDelta(const ToolCallStreamDelta& delta, ParsedToolCalls& message) {
  message.reasoning.append(delta.reasoning);
  message.content.append(delta.content);
  for (const ToolCallDelta& piece : delta.tool_calls) {
    if (piece.index == message.tool_calls.size()) {
      if (piece.name.empty()) {
        return absl::InternalError(
            absl::StrCat("tool call ", piece.index, " starts without a name"));
      }
      message.tool_calls.push_back(ToolCall{piece.id, piece.name, piece.arguments});
    } else if (piece.index + 1 == message.tool_calls.size()) {
      if (!piece.name.empty() || !piece.id.empty()) {
        return absl::InternalError(absl::StrCat("tool call ", piece.index, " named twice"));
      }
      message.tool_calls.back().arguments.append(piece.arguments);
    } else {
      return absl::InternalError(absl::StrCat("tool call delta out of order: index ", piece.index,
                                              " after ", message.tool_calls.size(), " calls"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ParsedToolCalls> ParseToolCalls(ToolCallFormat format, std::string_view text,
                                               ToolCallParserOptions options) {
  BITSPLIT_ASSIGN_OR_RETURN(ToolCallStreamParser parser,
                            ToolCallStreamParser::Create(format, std::move(options)));
  ParsedToolCalls message;
  BITSPLIT_RETURN_IF_ERROR(AppendToolCallStreamDelta(parser.Feed(text), message));
  BITSPLIT_RETURN_IF_ERROR(AppendToolCallStreamDelta(parser.Finish(), message));
  return message;
}

#undef TOOL_CALLS_RETURN_UNLESS_OK

}  // namespace bitsplit::text
