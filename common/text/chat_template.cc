#include "common/text/chat_template.h"

#include <algorithm>
#include <iterator>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/util/status_macros.h"

namespace bitsplit::text {
namespace {

// A Jinja template reduced to what decides its output: the code inside {{ }} / {% %} with
// whitespace removed and every string literal replaced by kLiteralMark, plus the literals
// (escapes decoded) and the raw text between tags (kept verbatim, since it is output).
// Two templates with equal Shapes render identically.
struct Shape {
  std::string code;
  std::vector<std::string> literals;
};

constexpr char kLiteralMark = '\x01';
constexpr char kRawTextMark = '\x02';

absl::StatusOr<Shape> ShapeOf(std::string_view source) {
  Shape shape;
  size_t pos = 0;
  while (pos < source.size()) {
    const std::string_view rest = source.substr(pos);
    if (rest.starts_with("{#")) {
      const size_t close = source.find("#}", pos + 2);
      if (close == std::string_view::npos) {
        return absl::InvalidArgumentError("chat template: unterminated {# comment");
      }
      pos = close + 2;
      continue;
    }
    if (rest.starts_with("{{") || rest.starts_with("{%")) {
      const std::string_view close = rest[1] == '{' ? "}}" : "%}";
      shape.code.append(rest.substr(0, 2).data(), 2);
      pos += 2;
      bool closed = false;
      while (pos < source.size()) {
        const char c = source[pos];
        if (source.substr(pos, 2) == close) {
          shape.code.append(close);
          pos += 2;
          closed = true;
          break;
        }
        if (c == '\'' || c == '"') {
          std::string literal;
          ++pos;
          while (pos < source.size() && source[pos] != c) {
            if (source[pos] != '\\') {
              literal.push_back(source[pos++]);
              continue;
            }
            if (pos + 1 >= source.size()) break;
            const char escaped = source[pos + 1];
            switch (escaped) {
              case 'n':
                literal.push_back('\n');
                break;
              case 't':
                literal.push_back('\t');
                break;
              case 'r':
                literal.push_back('\r');
                break;
              case '\\':
              case '\'':
              case '"':
                literal.push_back(escaped);
                break;
              default:
                return absl::UnimplementedError(
                    absl::StrFormat("chat template: unsupported string escape '\\%c'", escaped));
            }
            pos += 2;
          }
          if (pos >= source.size()) {
            return absl::InvalidArgumentError("chat template: unterminated string literal");
          }
          ++pos;  // closing quote
          shape.code.push_back(kLiteralMark);
          shape.literals.push_back(std::move(literal));
          continue;
        }
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') shape.code.push_back(c);
        ++pos;
      }
      if (!closed) {
        return absl::InvalidArgumentError(
            absl::StrCat("chat template: unterminated tag, expected '", std::string(close), "'"));
      }
      continue;
    }
    size_t end = pos;
    while (end < source.size() && !source.substr(end).starts_with("{{") &&
           !source.substr(end).starts_with("{%") && !source.substr(end).starts_with("{#")) {
      ++end;
    }
    shape.code.push_back(kRawTextMark);
    shape.literals.emplace_back(source.substr(pos, end - pos));
    pos = end;
  }
  return shape;
}

// The literal in a known template that holds the default system prompt, with this marker
// standing for the prompt text.
constexpr std::string_view kSystemPromptMarker = "{SYSTEM}";

// ChatML that inserts a default system message (SmolLM2's template, Qwen2's has the same shape).
constexpr std::string_view kChatMlWithDefaultSystem =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\n{SYSTEM}<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// Plain ChatML as published with many Hugging Face models.
constexpr std::string_view kChatMlPlain =
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// Whether `shape` has the structure of `known`; if `known` has a system prompt marker, the
// text in its place goes to `system_prompt`.
bool Matches(const Shape& shape, std::string_view known,
             std::optional<std::string>& system_prompt) {
  const absl::StatusOr<Shape> known_shape = ShapeOf(known);
  BITSPLIT_CHECK(known_shape.ok());
  if (shape.code != known_shape->code || shape.literals.size() != known_shape->literals.size()) {
    return false;
  }
  system_prompt.reset();
  for (size_t i = 0; i < shape.literals.size(); ++i) {
    const std::string& expected = known_shape->literals[i];
    const std::string& actual = shape.literals[i];
    const size_t marker = expected.find(kSystemPromptMarker);
    if (marker == std::string::npos) {
      if (actual != expected) return false;
      continue;
    }
    const std::string_view prefix = std::string_view(expected).substr(0, marker);
    const std::string_view suffix =
        std::string_view(expected).substr(marker + kSystemPromptMarker.size());
    if (actual.size() < prefix.size() + suffix.size() ||
        !std::string_view(actual).starts_with(prefix) ||
        !std::string_view(actual).ends_with(suffix)) {
      return false;
    }
    system_prompt = actual.substr(prefix.size(), actual.size() - prefix.size() - suffix.size());
  }
  return true;
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::FromGguf(const gguf::File& file) {
  if (file.Find("tokenizer.chat_template") == nullptr) {
    return absl::NotFoundError(
        absl::StrFormat("%s: no tokenizer.chat_template in the model file", file.name()));
  }
  BITSPLIT_ASSIGN_OR_RETURN(const std::string source, file.GetString("tokenizer.chat_template"));
  absl::StatusOr<ChatTemplate> result = FromSource(source);
  if (!result.ok()) {
    return absl::Status(result.status().code(),
                        absl::StrCat(file.name(), ": ", result.status().message()));
  }
  return result;
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromSource(std::string_view jinja_source) {
  BITSPLIT_ASSIGN_OR_RETURN(const Shape shape, ShapeOf(jinja_source));
  std::optional<std::string> system_prompt;
  if (Matches(shape, kChatMlWithDefaultSystem, system_prompt)) {
    return ChatTemplate(Kind::kChatMl, std::move(system_prompt));
  }
  if (Matches(shape, kChatMlPlain, system_prompt)) return ChatTemplate(Kind::kChatMl, std::nullopt);
  // llama.cpp's detection of its built-in gemma format (llm_chat_detect_template); gemma's
  // templates are far from ChatML, so no ChatML shape above can contain this.
  if (jinja_source.find("<start_of_turn>") != std::string_view::npos) return Gemma();
  if (jinja_source.find("<|turn>") != std::string_view::npos) return Gemma4();
  constexpr size_t kExcerpt = 120;
  return absl::UnimplementedError(
      absl::StrFormat("unsupported chat template (only ChatML variants and gemma's and gemma4's "
                      "turn formats are implemented): \"%s%s\"",
                      absl::CHexEscape(std::string(jinja_source.substr(0, kExcerpt))),
                      jinja_source.size() > kExcerpt ? "..." : ""));
}

absl::StatusOr<ChatTemplate::Choice> ChatTemplate::FromGgufOrArchitecture(const gguf::File& file) {
  if (file.Find("tokenizer.chat_template") != nullptr) {
    BITSPLIT_ASSIGN_OR_RETURN(ChatTemplate chat_template, FromGguf(file));
    return Choice{
        .chat_template = std::move(chat_template), .from_architecture = false, .note = ""};
  }
  std::string architecture;
  if (file.Find("general.architecture") != nullptr) {
    BITSPLIT_ASSIGN_OR_RETURN(architecture, file.GetString("general.architecture"));
  }
  static constexpr const char* kGemmaFamily[] = {"gemma", "gemma2", "gemma3", "gemma3n", "gemma4"};
  if (std::find(std::begin(kGemmaFamily), std::end(kGemmaFamily), architecture) !=
      std::end(kGemmaFamily)) {
    const bool gemma4 = architecture == "gemma4";
    return Choice{
        .chat_template = gemma4 ? Gemma4() : Gemma(),
        .from_architecture = true,
        .note = absl::StrFormat(
            "%s has no tokenizer.chat_template; using the %s turn format of architecture '%s'",
            file.name(), gemma4 ? "gemma4" : "gemma", architecture)};
  }
  return absl::NotFoundError(absl::StrFormat(
      "%s: no tokenizer.chat_template in the model file, and architecture '%s' has no default "
      "chat format (known: %s)",
      file.name(), architecture, absl::StrJoin(kGemmaFamily, ", ")));
}

ChatTemplate ChatTemplate::ChatMl(std::optional<std::string> default_system_prompt) {
  return ChatTemplate(Kind::kChatMl, std::move(default_system_prompt));
}

ChatTemplate ChatTemplate::Gemma() { return ChatTemplate(Kind::kGemma, std::nullopt); }

ChatTemplate ChatTemplate::Gemma4() { return ChatTemplate(Kind::kGemma4, std::nullopt); }

std::string ChatTemplate::Render(std::span<const ChatMessage> messages,
                                 bool add_generation_prompt) const {
  switch (kind_) {
    case Kind::kChatMl:
      return RenderChatMl(messages, add_generation_prompt);
    case Kind::kGemma:
      return RenderGemma(messages, add_generation_prompt);
    case Kind::kGemma4:
      return RenderGemma4(messages, add_generation_prompt);
  }
  return RenderChatMl(messages, add_generation_prompt);
}

namespace {

// llama-chat.cpp's trim: the C locale's isspace (space, \t, \n, \v, \f, \r) at both ends.
std::string_view TrimAsciiSpace(std::string_view text) {
  const auto is_space = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
  };
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  return text;
}

// The length of the Python white-space character (str.isspace) at the start of `text`, or 0.
size_t PythonSpaceAt(std::string_view text) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  if (text.empty()) return 0;
  const unsigned char c = byte(0);
  if ((c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20)) return 1;
  if (c == 0xC2 && text.size() >= 2 && (byte(1) == 0x85 || byte(1) == 0xA0)) return 2;
  if (text.size() < 3) return 0;
  const uint32_t cp = ((c & 0x0Fu) << 12) | ((byte(1) & 0x3Fu) << 6) | (byte(2) & 0x3Fu);
  if ((c & 0xF0) != 0xE0 || (byte(1) & 0xC0) != 0x80 || (byte(2) & 0xC0) != 0x80) return 0;
  const bool space = cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
                     cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
  return space ? 3 : 0;
}

// jinja's trim: Python's str.strip(), Unicode white space at both ends of UTF-8 text.
std::string_view TrimPythonSpace(std::string_view text) {
  while (size_t n = PythonSpaceAt(text)) text.remove_prefix(n);
  for (bool trimmed = true; trimmed && !text.empty();) {
    trimmed = false;
    for (size_t n = 1; n <= 3 && n <= text.size(); ++n) {
      if (PythonSpaceAt(text.substr(text.size() - n)) == n) {
        text.remove_suffix(n);
        trimmed = true;
        break;
      }
    }
  }
  return text;
}

// The template's strip_thinking: every <|channel>...<channel|> span cut, then trimmed.
std::string StripThinking(std::string_view text) {
  constexpr std::string_view kOpen = "<|channel>", kClose = "<channel|>";
  std::string result;
  while (true) {
    const size_t close = text.find(kClose);
    const std::string_view part = text.substr(0, close);
    result.append(part.substr(0, part.find(kOpen)));
    if (close == std::string_view::npos) break;
    text.remove_prefix(close + kClose.size());
  }
  return std::string(TrimPythonSpace(result));
}

}  // namespace

std::string ChatTemplate::RenderGemma4(std::span<const ChatMessage> messages,
                                       bool add_generation_prompt) const {
  // Mirrors google-gemma-4-31B-it.jinja for chats of text without tools or thinking.
  std::string prompt;
  size_t first = 0;
  if (!messages.empty() && (messages[0].role == "system" || messages[0].role == "developer")) {
    prompt.append("<|turn>system\n")
        .append(TrimPythonSpace(messages[0].content))
        .append("<turn|>\n");
    first = 1;
  }
  std::string_view previous_role;  // of the last message that was not a tool message
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    if (message.role == "tool") continue;
    const bool model = message.role == "assistant";
    if (!(model && previous_role == "assistant")) {
      absl::StrAppend(&prompt, "<|turn>", model ? "model" : message.role, "\n");
    }
    if (model) {
      prompt.append(StripThinking(message.content));
    } else {
      prompt.append(TrimPythonSpace(message.content));
    }
    prompt.append("<turn|>\n");
    previous_role = message.role;
  }
  if (add_generation_prompt) prompt.append("<|turn>model\n<|channel>thought\n<channel|>");
  return prompt;
}

std::string ChatTemplate::RenderGemma(std::span<const ChatMessage> messages,
                                      bool add_generation_prompt) const {
  // Mirrors llama.cpp's LLM_CHAT_TEMPLATE_GEMMA branch of llm_chat_apply_template.
  std::string prompt;
  std::string system_prompt;
  for (const ChatMessage& message : messages) {
    if (message.role == "system") {
      system_prompt.append(TrimAsciiSpace(message.content));
      continue;
    }
    const std::string role = message.role == "assistant" ? "model" : message.role;
    absl::StrAppend(&prompt, "<start_of_turn>", role, "\n");
    if (!system_prompt.empty() && role != "model") {
      absl::StrAppend(&prompt, system_prompt, "\n\n");
      system_prompt.clear();
    }
    prompt.append(TrimAsciiSpace(message.content)).append("<end_of_turn>\n");
  }
  if (add_generation_prompt) prompt.append("<start_of_turn>model\n");
  return prompt;
}

std::string ChatTemplate::RenderChatMl(std::span<const ChatMessage> messages,
                                       bool add_generation_prompt) const {
  std::string prompt;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i == 0 && default_system_prompt_.has_value() && messages[0].role != "system") {
      absl::StrAppend(&prompt, "<|im_start|>system\n", *default_system_prompt_, "<|im_end|>\n");
    }
    absl::StrAppend(&prompt, "<|im_start|>", messages[i].role, "\n", messages[i].content,
                    "<|im_end|>\n");
  }
  if (add_generation_prompt) prompt.append("<|im_start|>assistant\n");
  return prompt;
}

}  // namespace bitsplit::text
