#include "common/text/chat_template.h"

#include <algorithm>
#include <iterator>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/util/status_macros.h"

namespace bitsplit::text {
namespace {

#include "common/text/default_templates.inc"

absl::Status WithFileName(const gguf::File& file, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(file.name(), ": ", status.message()));
}

ChatTemplate::SpecialTokens SpecialTokensOf(const Tokenizer& tokenizer) {
  const auto text_of = [&](int32_t id) {
    if (id == Tokenizer::kNoToken) return std::string();
    const absl::StatusOr<std::string_view> piece =
        tokenizer.TokenToPiece(id, /*render_special=*/true);
    return piece.ok() ? std::string(*piece) : std::string();
  };
  return {.bos_token = text_of(tokenizer.bos_id()),
          .eos_token = text_of(tokenizer.eos_id()),
          .tokenizer_adds_bos = tokenizer.add_bos(),
          .tokenizer_adds_eos = tokenizer.add_eos()};
}

}  // namespace

std::string_view GemmaDefaultTemplate() { return kGemmaTemplateSource; }

absl::StatusOr<ChatTemplate> ChatTemplate::FromSource(std::string_view source,
                                                      SpecialTokens special_tokens) {
  BITSPLIT_ASSIGN_OR_RETURN(jinja::Template parsed, jinja::Template::Parse(source));
  std::vector<std::string> unknown = parsed.UnknownNames();
  ChatTemplate chat_template(std::make_shared<const std::string>(source), std::move(parsed),
                             std::move(special_tokens));
  chat_template.unimplemented_names_ = std::move(unknown);
  const ChatMessage probe[] = {{"user", "Hello"}};
  if (absl::StatusOr<std::string> rendered = chat_template.Render(probe, true); !rendered.ok()) {
    return absl::UnimplementedError(absl::StrCat(
        "the chat template fails on a one-message conversation: ", rendered.status().message()));
  }
  return chat_template;
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromSourceFor(std::string_view source,
                                                         const Tokenizer& tokenizer) {
  return FromSource(source, SpecialTokensOf(tokenizer));
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromGguf(const gguf::File& file,
                                                    const Tokenizer& tokenizer) {
  if (file.Find("tokenizer.chat_template") == nullptr) {
    return absl::NotFoundError(
        absl::StrFormat("%s: no tokenizer.chat_template in the model file", file.name()));
  }
  BITSPLIT_ASSIGN_OR_RETURN(const std::string source, file.GetString("tokenizer.chat_template"));
  absl::StatusOr<ChatTemplate> result = FromSource(source, SpecialTokensOf(tokenizer));
  if (!result.ok()) return WithFileName(file, result.status());
  return result;
}

absl::StatusOr<ChatTemplate::Choice> ChatTemplate::FromGgufOrArchitecture(
    const gguf::File& file, const Tokenizer& tokenizer) {
  if (file.Find("tokenizer.chat_template") != nullptr) {
    BITSPLIT_ASSIGN_OR_RETURN(ChatTemplate chat_template, FromGguf(file, tokenizer));
    return Choice{
        .chat_template = std::move(chat_template), .from_architecture = false, .note = ""};
  }
  std::string architecture;
  if (file.Find("general.architecture") != nullptr) {
    BITSPLIT_ASSIGN_OR_RETURN(architecture, file.GetString("general.architecture"));
  }
  static constexpr const char* kGemmaFamily[] = {"gemma", "gemma2", "gemma3", "gemma3n"};
  if (std::find(std::begin(kGemmaFamily), std::end(kGemmaFamily), architecture) ==
      std::end(kGemmaFamily)) {
    return absl::NotFoundError(absl::StrFormat(
        "%s: no tokenizer.chat_template in the model file, and architecture '%s' has no default "
        "chat template (known: %s)",
        file.name(), architecture, absl::StrJoin(kGemmaFamily, ", ")));
  }
  absl::StatusOr<ChatTemplate> chat_template =
      FromSource(GemmaDefaultTemplate(), SpecialTokensOf(tokenizer));
  if (!chat_template.ok()) return WithFileName(file, chat_template.status());
  return Choice{.chat_template = *std::move(chat_template),
                .from_architecture = true,
                .note = absl::StrFormat(
                    "%s has no tokenizer.chat_template; using Gemma 3's chat template for "
                    "architecture '%s'",
                    file.name(), architecture)};
}

absl::StatusOr<std::string> ChatTemplate::Render(std::span<const ChatMessage> messages,
                                                 bool add_generation_prompt) const {
  jinja::Value::List list;
  list.reserve(messages.size());
  for (const ChatMessage& message : messages) {
    jinja::Dict dict;
    dict.Set("role", message.role);
    dict.Set("content", message.content);
    list.emplace_back(std::move(dict));
  }
  return Render(jinja::Value(std::move(list)), jinja::Value::None(), add_generation_prompt);
}

absl::StatusOr<std::string> ChatTemplate::Render(const jinja::Value& messages,
                                                 const jinja::Value& tools,
                                                 bool add_generation_prompt) const {
  // The context llama.cpp's server gives a template (common_chat_template_direct_apply): tools
  // only when there are some, since templates test `tools is defined`.
  jinja::Dict context;
  context.Set("messages", messages);
  if (!tools.is_none() && !tools.is_undefined()) context.Set("tools", tools);
  context.Set("add_generation_prompt", add_generation_prompt);
  context.Set("bos_token", special_tokens_.bos_token);
  context.Set("eos_token", special_tokens_.eos_token);
  BITSPLIT_ASSIGN_OR_RETURN(std::string prompt, parsed_.Render(jinja::Value(std::move(context))));
  const std::string& bos = special_tokens_.bos_token;
  const std::string& eos = special_tokens_.eos_token;
  if (special_tokens_.tokenizer_adds_bos && !bos.empty() && prompt.starts_with(bos)) {
    prompt.erase(0, bos.size());
  }
  if (special_tokens_.tokenizer_adds_eos && !eos.empty() && prompt.ends_with(eos)) {
    prompt.erase(prompt.size() - eos.size());
  }
  return prompt;
}

}  // namespace bitsplit::text
