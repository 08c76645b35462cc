#include "common/text/stop_matcher.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/text/streaming_detokenizer.h"
#include "common/util/status_macros.h"

namespace bitsplit::text {

absl::Status ValidateStopStrings(const std::vector<std::string>& stops) {
  if (stops.size() > kMaxStopStrings) {
    return absl::InvalidArgumentError(
        absl::StrCat("too many stop strings: ", stops.size(), " (at most ", kMaxStopStrings, ")"));
  }
  for (size_t i = 0; i < stops.size(); ++i) {
    const std::string& stop = stops[i];
    if (stop.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("stop string ", i, " is empty"));
    }
    if (stop.size() > kMaxStopStringBytes) {
      return absl::InvalidArgumentError(absl::StrCat("stop string ", i, " has ", stop.size(),
                                                     " bytes (at most ", kMaxStopStringBytes, ")"));
    }
    if (!IsValidUtf8(stop)) {
      return absl::InvalidArgumentError(absl::StrCat("stop string ", i, " is not valid UTF-8"));
    }
  }
  return absl::OkStatus();
}

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const std::string& stop : stops_) BITSPLIT_CHECK(!stop.empty());
}

size_t StopMatcher::LongestPartialStopSuffix(std::string_view text) const {
  size_t longest = 0;
  for (const std::string& stop : stops_) {
    const size_t max_length = std::min(stop.size() - 1, text.size());
    // Longest first, so the first hit is this stop string's answer.
    for (size_t length = max_length; length > longest; --length) {
      const std::string_view suffix = text.substr(text.size() - length);
      if (suffix.front() == stop.front() && suffix == std::string_view(stop).substr(0, length)) {
        longest = length;
        break;
      }
    }
  }
  return longest;
}

std::string StopMatcher::Push(std::string_view text) {
  if (stopped_) return "";
  if (stops_.empty()) return std::string(text);
  std::string combined = std::move(held_);
  held_.clear();
  combined.append(text);

  // The held text contains no whole stop string and everything emitted before it can start
  // none, so the first stop string to complete in `combined` is the first in the stream.
  size_t best_end = std::string::npos;
  const std::string* best = nullptr;
  for (const std::string& stop : stops_) {
    const size_t position = combined.find(stop);
    if (position == std::string::npos) continue;
    const size_t end = position + stop.size();
    if (best == nullptr || end < best_end || (end == best_end && stop.size() > best->size())) {
      best_end = end;
      best = &stop;
    }
  }
  if (best != nullptr) {
    stopped_ = true;
    matched_stop_ = *best;
    combined.resize(best_end - best->size());
    return combined;
  }

  const size_t keep = LongestPartialStopSuffix(combined);
  held_.assign(combined, combined.size() - keep, keep);
  combined.resize(combined.size() - keep);
  return combined;
}

std::string StopMatcher::Flush() {
  if (stopped_) return "";
  return std::exchange(held_, std::string());
}

}  // namespace bitsplit::text
