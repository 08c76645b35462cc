#include "common/text/harmony.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "common/text/tool_calls.h"
#include "common/util/json_nesting.h"
#include "nlohmann/json.hpp"

namespace bitsplit::text {
namespace {

constexpr std::string_view kStart = "<|start|>";
constexpr std::string_view kAssistantStart = "<|start|>assistant";
constexpr std::string_view kChannel = "<|channel|>";
constexpr std::string_view kMessage = "<|message|>";
constexpr std::string_view kConstrain = "<|constrain|>";
constexpr std::string_view kEnd = "<|end|>";
constexpr std::string_view kReturn = "<|return|>";
constexpr std::string_view kCall = "<|call|>";
constexpr std::string_view kFunctionsPrefix = "functions.";
constexpr std::string_view kTo = "to=";
// A header longer than this is not one (the longest real ones name a function and a type).
constexpr size_t kMaxHeaderBytes = 512;
// nlohmann's parser recurses; hostile output must not exhaust the stack.
constexpr int kMaxJsonDepth = 256;

// Where the first message end is in `text` and which marker it is; npos when none.
std::pair<size_t, std::string_view> FindEnd(std::string_view text) {
  size_t best = std::string_view::npos;
  std::string_view which;
  for (std::string_view marker : {kEnd, kReturn, kCall}) {
    const size_t found = text.find(marker);
    if (found < best) {
      best = found;
      which = marker;
    }
  }
  return {best, which};
}

// The length of the longest tail of `text` that is a proper prefix of a message end.
size_t EndPrefixTail(std::string_view text) {
  size_t longest = 0;
  for (std::string_view marker : {kEnd, kReturn, kCall}) {
    for (size_t length = std::min(marker.size() - 1, text.size()); length > longest; --length) {
      if (marker.starts_with(text.substr(text.size() - length))) {
        longest = length;
        break;
      }
    }
  }
  return longest;
}

// Whether `text` (no <|message|> yet) may still become a header.
bool MayBeHeader(std::string_view text) {
  if (text.size() >= kMaxHeaderBytes) return false;
  for (std::string_view opening : {kChannel, std::string_view(" to=")}) {
    if (text.starts_with(opening) || opening.starts_with(text)) return true;
  }
  return false;
}

bool IsNameChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
}

}  // namespace

bool WritesHarmony(std::string_view template_source) {
  return template_source.find(kChannel) != std::string_view::npos &&
         template_source.find(kAssistantStart) != std::string_view::npos;
}

HarmonyStream::HarmonyStream(std::function<bool(std::string_view)> allows,
                             std::function<std::string()> next_id)
    : allows_(std::move(allows)), next_id_(std::move(next_id)) {}

std::string HarmonyStream::CallHeader(std::string_view function) {
  std::string header(kChannel);
  for (std::string_view part :
       {std::string_view("commentary "), kTo, kFunctionsPrefix, function, std::string_view(" "),
        kConstrain, std::string_view("json"), kMessage}) {
    header += part;
  }
  return header;
}

std::vector<std::string_view> HarmonyStream::Markers() {
  return {kStart, kChannel, kMessage, kConstrain, kEnd};
}

bool HarmonyStream::ParseHeader(std::string_view header) {
  std::string recipient;
  std::string channel;
  bool saw_type = false;
  size_t pos = 0;
  // Reads a recipient "to=NAME" at pos.
  const auto read_recipient = [&]() {
    pos += kTo.size();
    const size_t begin = pos;
    while (pos < header.size() && IsNameChar(header[pos])) ++pos;
    if (pos == begin) return false;
    std::string_view name = header.substr(begin, pos - begin);
    if (name != "assistant") {
      if (!recipient.empty()) return false;
      recipient = std::string(name);
    }
    return true;
  };
  if (header.starts_with(" to=")) {
    pos = 1;
    if (!read_recipient()) return false;
  }
  // Reads "<|channel|>NAME" at pos.
  const auto read_channel = [&]() {
    pos += kChannel.size();
    const size_t begin = pos;
    while (pos < header.size() && absl::ascii_isalpha(static_cast<unsigned char>(header[pos]))) {
      ++pos;
    }
    channel = std::string(header.substr(begin, pos - begin));
  };
  if (!header.substr(pos).starts_with(kChannel)) return false;
  read_channel();
  // Then, in any order: " to=NAME", " [<|constrain|>]TYPE", and another <|channel|>, which wins
  // (gpt-oss-20b sometimes starts with a stray "<|channel|>commentary to=assistant").
  while (pos < header.size()) {
    const size_t spaces = pos;
    while (pos < header.size() && header[pos] == ' ') ++pos;
    if (pos == header.size()) break;
    const std::string_view rest = header.substr(pos);
    if (rest.starts_with(kTo) && pos > spaces) {
      if (!read_recipient()) return false;
      continue;
    }
    if (rest.starts_with(kChannel) && !saw_type) {
      read_channel();
      continue;
    }
    if (rest.starts_with(kConstrain)) pos += kConstrain.size();
    const size_t type_begin = pos;
    while (pos < header.size() && IsNameChar(header[pos])) ++pos;
    if (pos == type_begin || saw_type) return false;
    saw_type = true;
  }
  if (!recipient.empty()) {
    if (channel != "commentary" && channel != "analysis") return false;
    channel_ = Channel::kCall;
    call_name_ = recipient.starts_with(kFunctionsPrefix) ? recipient.substr(kFunctionsPrefix.size())
                                                         : recipient;
    return !call_name_.empty();
  }
  if (channel == "analysis") {
    channel_ = Channel::kReasoning;
  } else if (channel == "final" || channel == "commentary") {
    channel_ = Channel::kContent;
  } else {
    return false;
  }
  return true;
}

// Every decision depends only on the text it covers; undecidable text waits for more.
size_t HarmonyStream::Run(std::string_view pending, bool at_end, ToolCallStreamDelta& delta) {
  size_t decided = 0;
  while (decided < pending.size()) {
    const std::string_view text = pending.substr(decided);
    switch (phase_) {
      case Phase::kRaw:
        delta.content.append(text);
        decided = pending.size();
        break;
      case Phase::kHeader: {
        const size_t found = text.find(kMessage);
        if (found == std::string_view::npos || found >= kMaxHeaderBytes) {
          if (!at_end && MayBeHeader(text)) return decided;
          phase_ = Phase::kRaw;
          break;
        }
        if (!ParseHeader(text.substr(0, found))) {
          phase_ = Phase::kRaw;
          break;
        }
        header_ = std::string(text.substr(0, found + kMessage.size()));
        decided += found + kMessage.size();
        phase_ = Phase::kBody;
        break;
      }
      case Phase::kBody: {
        const auto [found, marker] = FindEnd(text);
        if (channel_ == Channel::kCall) {
          if (found == std::string_view::npos && !at_end) return decided;
          const std::string_view body = text.substr(0, found);
          nlohmann::ordered_json arguments;
          if (util::JsonNestingExceeds(body, kMaxJsonDepth) == std::string_view::npos) {
            arguments = nlohmann::ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
          }
          if (arguments.is_object() && allows_(call_name_)) {
            ToolCallDelta header;
            header.index = calls_emitted_++;
            header.id = next_id_();
            header.name = call_name_;
            ToolCallDelta rest;
            rest.index = header.index;
            rest.arguments = arguments.dump();
            delta.tool_calls.push_back(std::move(header));
            delta.tool_calls.push_back(std::move(rest));
          } else {
            delta.content.append(header_).append(body);
            if (found != std::string_view::npos) delta.content.append(marker);
          }
        } else {
          std::string& out = channel_ == Channel::kReasoning ? delta.reasoning : delta.content;
          if (found == std::string_view::npos) {
            const size_t length = at_end ? text.size() : text.size() - EndPrefixTail(text);
            out.append(text.substr(0, length));
            decided += length;
            if (!at_end) return decided;
            break;
          }
          out.append(text.substr(0, found));
        }
        if (found == std::string_view::npos) {
          decided = pending.size();
          break;
        }
        decided += found + marker.size();
        phase_ = Phase::kBetween;
        break;
      }
      case Phase::kBetween:
        if (text.starts_with(kAssistantStart)) {
          decided += kAssistantStart.size();
          phase_ = Phase::kHeader;
        } else if (!at_end && kAssistantStart.starts_with(text)) {
          return decided;
        } else {
          phase_ = Phase::kRaw;
        }
        break;
    }
  }
  return decided;
}

}  // namespace bitsplit::text
