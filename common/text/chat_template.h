#pragma once
// Chat prompt rendering. GGUF files carry a Jinja chat template (tokenizer.chat_template); we do
// not embed a Jinja engine but recognize the templates we support by their structure and render
// them natively, byte for byte what Jinja would produce (tests compare against jinja2 output).
// Anything unrecognized is an error rather than a silently different prompt.
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
  };

  // From tokenizer.chat_template. NOT_FOUND when the file has no template, UNIMPLEMENTED when
  // the template is not one we can render exactly.
  static absl::StatusOr<ChatTemplate> FromGguf(const gguf::File& file);
  // From Jinja source text; errors as FromGguf.
  static absl::StatusOr<ChatTemplate> FromSource(std::string_view jinja_source);
  // Plain ChatML, with an optional default system prompt.
  static ChatTemplate ChatMl(std::optional<std::string> default_system_prompt = std::nullopt);

  Kind kind() const { return kind_; }
  const std::optional<std::string>& default_system_prompt() const { return default_system_prompt_; }

  // The prompt for `messages`; with `add_generation_prompt` it ends with the opening of an
  // assistant turn. Message text is inserted verbatim: text that spells a control token (e.g.
  // "<|im_end|>") becomes that token if the prompt is encoded with parse_special.
  std::string Render(std::span<const ChatMessage> messages, bool add_generation_prompt) const;

 private:
  ChatTemplate(Kind kind, std::optional<std::string> default_system_prompt)
      : kind_(kind), default_system_prompt_(std::move(default_system_prompt)) {}

  Kind kind_;
  std::optional<std::string> default_system_prompt_;
};

}  // namespace bitsplit::text
