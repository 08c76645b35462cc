#pragma once
// Stop strings over streamed text. Generated text arrives in pieces (one or several tokens per
// speculation step), and a stop string may span pieces, so text that could still turn out to be
// the start of a stop string is held back until the next piece decides it.
//
// The stop happens where a stop string first *completes*: at the smallest end offset e such that
// some stop string ends at e; of the stop strings ending there the longest one is cut. This is a
// property of the text alone, not of how it was split into pieces, and it is the point where a
// generator must stop anyway (it cannot wait for later text to find an earlier-starting match).
// It differs from "the smallest std::string::find position" only for stop strings that overlap
// each other (stops {"abcd", "bc"} on "abcd": "bc" completes first, so "a" is emitted).
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace bitsplit::text {

inline constexpr size_t kMaxStopStrings = 16;
inline constexpr size_t kMaxStopStringBytes = 256;

// INVALID_ARGUMENT unless there are at most kMaxStopStrings strings, each non-empty, at most
// kMaxStopStringBytes bytes and valid UTF-8 (so cutting text before a stop string never splits a
// character). The message names the offending string's index.
absl::Status ValidateStopStrings(const std::vector<std::string>& stops);

class StopMatcher {
 public:
  // `stops` must pass ValidateStopStrings (checked: an empty string is a bug here). No stop
  // strings: Push returns its input unchanged.
  explicit StopMatcher(std::vector<std::string> stops);

  // Feeds decoded text; returns the text that is safe to emit now: everything that can no
  // longer become part of a stop string. When a stop string completes, stopped() becomes true,
  // the returned text ends right before that stop string (which is never emitted), and every
  // later Push or Flush returns "".
  std::string Push(std::string_view text);

  // The end of the stream: returns the held-back text (it did not become a stop string) and
  // clears it.
  std::string Flush();

  bool stopped() const { return stopped_; }
  // The stop string that completed ("" until stopped()).
  const std::string& matched_stop() const { return matched_stop_; }
  // Bytes held back (always shorter than the longest stop string).
  size_t held_bytes() const { return held_.size(); }

 private:
  // Length of the longest suffix of `text` that is a proper prefix of some stop string.
  size_t LongestPartialStopSuffix(std::string_view text) const;

  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
  std::string matched_stop_;
};

}  // namespace bitsplit::text
