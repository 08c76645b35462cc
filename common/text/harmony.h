#pragma once
// OpenAI's harmony response format (gpt-oss), read back from generated text: the analysis
// channel is the reasoning, the final channel (and commentary without a recipient, the preambles)
// the content, and a message addressed to a function a tool call.
//
// The template's generation prompt ends with <|start|>assistant, so the generated text starts
// with a message header; every message is
//   [ to=RECIPIENT]<|channel|>CHANNEL[ to=RECIPIENT][ [<|constrain|>]TYPE]<|message|>BODY END
// where END is <|end|> (another <|start|>assistant message follows), <|return|> or <|call|> (the
// turn's end; both are end-of-generation tokens, so the text usually stops before them). The
// recipient may sit in the role header or the channel header (the template writes the first, the
// models the second, as llama.cpp's parser accepts both); " to=assistant" is no recipient.
// A recipient "functions.NAME" makes the body the call's JSON arguments; other recipients
// (built-in tools such as browser.search) are calls named as written.
//
// What is not this structure - a header that does not parse, text between messages other than
// <|start|>assistant, a call whose arguments are not a JSON object or whose function is not among
// the tools - is content from there on, byte for byte (headers and markers included); nothing is
// invented and nothing dropped.
//
// Streaming: reasoning and content are released as they arrive, holding back only a tail that
// may still grow into an END marker; a header is held until its <|message|>, a call until its END
// or the end of the stream. The result does not depend on how the text is chunked.
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace bitsplit::text {

struct ToolCallStreamDelta;

// Whether a chat template's source writes harmony messages (gpt-oss's template).
bool WritesHarmony(std::string_view template_source);

class HarmonyStream {
 public:
  // `allows`: whether a call to a function of this name is a call (false: the message is
  // content); `next_id`: the id of each call.
  HarmonyStream(std::function<bool(std::string_view)> allows, std::function<std::string()> next_id);

  // Decides a prefix of `pending` (the fed text not yet decided), appending what it decided to
  // `delta`; returns that prefix's length. With `at_end` it decides everything.
  size_t Run(std::string_view pending, bool at_end, ToolCallStreamDelta& delta);

  // The header of a final-channel message.
  static constexpr std::string_view kFinalHeader = "<|channel|>final<|message|>";
  // The header of a message calling `function` with JSON arguments, as the models write it.
  static std::string CallHeader(std::string_view function);

  // The markers that are single control tokens in gpt-oss's vocabulary: the text must show them.
  static std::vector<std::string_view> Markers();

 private:
  enum class Phase { kHeader, kBody, kBetween, kRaw };
  enum class Channel { kReasoning, kContent, kCall };

  // The header before <|message|>: sets channel_ and call_name_; false when it does not parse.
  bool ParseHeader(std::string_view header);

  std::function<bool(std::string_view)> allows_;
  std::function<std::string()> next_id_;
  Phase phase_ = Phase::kHeader;
  Channel channel_ = Channel::kContent;
  std::string call_name_;
  std::string header_;  // the current call's header with its <|message|>, for the fallback
  size_t calls_emitted_ = 0;
};

}  // namespace bitsplit::text
