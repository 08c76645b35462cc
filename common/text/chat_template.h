#pragma once
// Chat prompt rendering. GGUF files carry a Jinja chat template (tokenizer.chat_template); we do
// not embed a Jinja engine but recognize the templates we support and render them natively:
// ChatML byte for byte what Jinja would produce (tests compare against jinja2 output), the gemma
// turn format byte for byte what llama.cpp's built-in "gemma" template produces (tests compare
// against llama_chat_apply_template). Anything unrecognized is an error rather than a silently
// different prompt.
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/io/gguf.h"

namespace bitsplit::text {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ... (rendered verbatim)
  std::string content;
};

class ChatTemplate {
 public:
  enum class Kind {
    // <|im_start|>{role}\n{content}<|im_end|>\n per message, optionally preceded by a default
    // system message when the conversation does not start with one (SmolLM2, Qwen2).
    kChatMl,
    // <start_of_turn>{user|model}\n{content}<end_of_turn>\n per message ("assistant" is rendered
    // "model"), the generation prompt <start_of_turn>model\n; contents trimmed of ASCII
    // whitespace; system messages (trimmed, concatenated) go in front of the next non-model turn
    // followed by "\n\n". No BOS: the tokenizer adds it (gemma2/gemma3).
    kGemma,
    // Gemma 4's template (google-gemma-4-31B-it.jinja) for text chats without tools or thinking:
    // a first system (or developer) message as <|turn>system\n{content}<turn|>\n, then
    // <|turn>{role}\n{content}<turn|>\n per message ("assistant" is "model"; a model message
    // right after another continues its turn without a header; "tool" messages render nothing),
    // contents trimmed of Unicode white space as Python's str.strip, thinking channels
    // (<|channel>...<channel|>) cut from model messages; the generation prompt
    // <|turn>model\n<|channel>thought\n<channel|> (thinking off). No BOS: the tokenizer adds it.
    kGemma4,
  };

  // What FromGgufOrArchitecture chose.
  struct Choice;

  // From tokenizer.chat_template. NOT_FOUND when the file has no template, UNIMPLEMENTED when
  // the template is not one we can render exactly.
  static absl::StatusOr<ChatTemplate> FromGguf(const gguf::File& file);
  // From Jinja source text; errors as FromGguf. A template that is not one of the ChatML shapes
  // but contains "<start_of_turn>" is kGemma, as llama.cpp decides for its built-in templates;
  // one that contains "<|turn>" is kGemma4.
  static absl::StatusOr<ChatTemplate> FromSource(std::string_view jinja_source);
  // FromGguf, or, when the file has no tokenizer.chat_template, the format of its model family
  // (general.architecture gemma, gemma2, gemma3, gemma3n: kGemma; gemma4: kGemma4), with
  // Choice::note saying so
  // for the caller to show. NOT_FOUND when there is neither a template nor a known family.
  static absl::StatusOr<Choice> FromGgufOrArchitecture(const gguf::File& file);
  // Plain ChatML, with an optional default system prompt.
  static ChatTemplate ChatMl(std::optional<std::string> default_system_prompt = std::nullopt);
  static ChatTemplate Gemma();
  static ChatTemplate Gemma4();

  Kind kind() const { return kind_; }
  const std::optional<std::string>& default_system_prompt() const { return default_system_prompt_; }

  // The prompt for `messages`; with `add_generation_prompt` it ends with the opening of an
  // assistant turn. Message text is inserted verbatim: text that spells a control token (e.g.
  // "<|im_end|>") becomes that token if the prompt is encoded with parse_special.
  std::string Render(std::span<const ChatMessage> messages, bool add_generation_prompt) const;

 private:
  ChatTemplate(Kind kind, std::optional<std::string> default_system_prompt)
      : kind_(kind), default_system_prompt_(std::move(default_system_prompt)) {}

  std::string RenderChatMl(std::span<const ChatMessage> messages, bool add_generation_prompt) const;
  std::string RenderGemma(std::span<const ChatMessage> messages, bool add_generation_prompt) const;
  std::string RenderGemma4(std::span<const ChatMessage> messages, bool add_generation_prompt) const;

  Kind kind_;
  std::optional<std::string> default_system_prompt_;
};

struct ChatTemplate::Choice {
  ChatTemplate chat_template;
  // True when the file has no template and the format was picked from general.architecture.
  bool from_architecture = false;
  // For from_architecture, one line naming the file, the architecture and the format used.
  std::string note;
};

}  // namespace bitsplit::text
