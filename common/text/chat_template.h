#pragma once
// Chat prompts as the model ships them: the GGUF's tokenizer.chat_template rendered by the Jinja
// engine (jinja.h) with the context Hugging Face transformers gives it (messages,
// add_generation_prompt, bos_token, eos_token, tools when there are any). A template the engine
// cannot render is refused when it loads, never rendered differently.
//
// BOS/EOS: many templates write {{ bos_token }} themselves while the tokenizer adds BOS too; as
// llama.cpp does, a rendered prompt loses a leading BOS text when the tokenizer adds BOS, and a
// trailing EOS text when it adds EOS, so the prompt is encoded with exactly one of each.
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/io/gguf.h"
#include "common/text/harmony.h"
#include "common/text/jinja.h"
#include "common/text/tokenizer.h"

namespace bitsplit::text {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ... (given to the template verbatim)
  std::string content;
};

class ChatTemplate {
 public:
  // The special-token texts the template sees, and whether the tokenizer adds them itself.
  struct SpecialTokens {
    std::string bos_token = {};
    std::string eos_token = {};
    bool tokenizer_adds_bos = false;
    bool tokenizer_adds_eos = false;
  };

  // What FromGgufOrArchitecture chose.
  struct Choice;

  // Parses `source`. INVALID_ARGUMENT for a syntax error or a construct the engine does not
  // implement; UNIMPLEMENTED when it cannot render a one-message conversation (so a template
  // that would fail every request fails at load instead). Filters and tests the engine lacks
  // fail, as in jinja2, only where rendering reaches them (unimplemented_names lists them for
  // the caller to warn about at load): a conversation that reaches one is refused, never
  // rendered differently.
  static absl::StatusOr<ChatTemplate> FromSource(std::string_view source,
                                                 SpecialTokens special_tokens);
  // FromSource with `tokenizer`'s BOS/EOS (a template given apart from the model file).
  static absl::StatusOr<ChatTemplate> FromSourceFor(std::string_view source,
                                                    const Tokenizer& tokenizer);
  // From tokenizer.chat_template, with `tokenizer`'s BOS/EOS. NOT_FOUND when the file has none;
  // other errors as FromSource, prefixed with the file's name.
  static absl::StatusOr<ChatTemplate> FromGguf(const gguf::File& file, const Tokenizer& tokenizer);
  // FromGguf, or, when the file has no tokenizer.chat_template, the template its model family
  // publishes (general.architecture gemma, gemma2, gemma3, gemma3n: Gemma 3's instruction
  // template), with Choice::note saying so for the caller to show. NOT_FOUND when there is
  // neither a template nor a known family.
  static absl::StatusOr<Choice> FromGgufOrArchitecture(const gguf::File& file,
                                                       const Tokenizer& tokenizer);

  // The prompt for `messages`; with `add_generation_prompt` it ends with the opening of an
  // assistant turn. Message text is inserted verbatim: text that spells a control token becomes
  // that token if the prompt is encoded with parse_special. INVALID_ARGUMENT when the template
  // refuses the conversation (raise_exception: e.g. roles that do not alternate).
  absl::StatusOr<std::string> Render(std::span<const ChatMessage> messages,
                                     bool add_generation_prompt) const;
  // The same with the messages (and the tools, when not None) as template values, for
  // conversations that carry more than role and content.
  absl::StatusOr<std::string> Render(const jinja::Value& messages, const jinja::Value& tools,
                                     bool add_generation_prompt) const;

  const std::string& source() const { return *source_; }
  // The filters and tests the template names that the engine does not implement ("filter
  // 'from_json'"), sorted; empty for most templates.
  const std::vector<std::string>& unimplemented_names() const { return unimplemented_names_; }
  const SpecialTokens& special_tokens() const { return special_tokens_; }
  // Whether the template writes OpenAI's harmony messages (gpt-oss; text::WritesHarmony).
  bool harmony() const { return harmony_; }

 private:
  ChatTemplate(std::shared_ptr<const std::string> source, jinja::Template parsed,
               SpecialTokens special_tokens)
      : source_(std::move(source)),
        parsed_(std::move(parsed)),
        special_tokens_(std::move(special_tokens)),
        harmony_(WritesHarmony(*source_)) {}

  std::shared_ptr<const std::string> source_;
  jinja::Template parsed_;
  SpecialTokens special_tokens_;
  std::vector<std::string> unimplemented_names_;
  bool harmony_ = false;
};

struct ChatTemplate::Choice {
  ChatTemplate chat_template;
  // True when the file has no template and the family's was used.
  bool from_architecture = false;
  // For from_architecture, one line naming the file, the architecture and the template used.
  std::string note;
};

// Gemma 3's published instruction template: the template of the gemma family's GGUFs that carry
// none (pretrained checkpoints).
std::string_view GemmaDefaultTemplate();

}  // namespace bitsplit::text
