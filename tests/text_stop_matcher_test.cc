#include <random>
#include <string>
#include <vector>

#include "common/text/stop_matcher.h"
#include "gtest/gtest.h"

namespace bitsplit::text {
namespace {

// The whole-text answer, computed with std::string::find: the stop string that completes first
// (smallest find + length; the longest on a tie) and the text before it.
struct Expected {
  std::string output;
  bool stopped = false;
};
Expected ReferenceCut(const std::string& text, const std::vector<std::string>& stops) {
  size_t best_end = std::string::npos;
  size_t best_length = 0;
  for (const std::string& stop : stops) {
    const size_t position = text.find(stop);
    if (position == std::string::npos) continue;
    const size_t end = position + stop.size();
    if (best_end == std::string::npos || end < best_end ||
        (end == best_end && stop.size() > best_length)) {
      best_end = end;
      best_length = stop.size();
    }
  }
  if (best_end == std::string::npos) return {text, false};
  return {text.substr(0, best_end - best_length), true};
}

// Brute force: the longest suffix of `text` equal to a proper prefix of some stop string.
size_t ReferenceHeldBytes(const std::string& text, const std::vector<std::string>& stops) {
  size_t longest = 0;
  for (const std::string& stop : stops) {
    for (size_t length = 1; length < stop.size() && length <= text.size(); ++length) {
      if (text.compare(text.size() - length, length, stop, 0, length) == 0) {
        longest = std::max(longest, length);
      }
    }
  }
  return longest;
}

// Feeds `chunks`, returns everything emitted (Flush included unless stopped).
std::string FeedAll(StopMatcher& matcher, const std::vector<std::string>& chunks) {
  std::string out;
  for (const std::string& chunk : chunks) out += matcher.Push(chunk);
  out += matcher.Flush();
  return out;
}

TEST(StopMatcherTest, WithoutStopStringsPassesTextThrough) {
  StopMatcher matcher({});
  EXPECT_EQ(matcher.Push("Hello"), "Hello");
  EXPECT_EQ(matcher.Push(", world"), ", world");
  EXPECT_EQ(matcher.Flush(), "");
  EXPECT_FALSE(matcher.stopped());
}

TEST(StopMatcherTest, StopStringSpanningThreeChunksIsCutAndNeverEmitted) {
  StopMatcher matcher({"<|end|>"});
  EXPECT_EQ(matcher.Push("The answer is 42.<|"), "The answer is 42.");
  EXPECT_EQ(matcher.held_bytes(), 2u);
  EXPECT_EQ(matcher.Push("en"), "");
  EXPECT_FALSE(matcher.stopped());
  EXPECT_EQ(matcher.Push("d|> trailing"), "");
  EXPECT_TRUE(matcher.stopped());
  EXPECT_EQ(matcher.matched_stop(), "<|end|>");
  EXPECT_EQ(matcher.Push("more text"), "");
  EXPECT_EQ(matcher.Flush(), "");
}

TEST(StopMatcherTest, HeldTextThatDoesNotBecomeAStopIsReleased) {
  StopMatcher matcher({"\n\n"});
  EXPECT_EQ(matcher.Push("line one\n"), "line one");
  EXPECT_EQ(matcher.Push("line two"), "\nline two");
  EXPECT_EQ(matcher.Push("\n"), "");
  EXPECT_EQ(matcher.Flush(), "\n");
  EXPECT_FALSE(matcher.stopped());
}

TEST(StopMatcherTest, StopAtTheVeryStartEmitsNothing) {
  StopMatcher matcher({"User:"});
  EXPECT_EQ(matcher.Push("User: hi"), "");
  EXPECT_TRUE(matcher.stopped());
}

TEST(StopMatcherTest, FirstStopToCompleteWins) {
  // "bc" completes at offset 3, before "abcd" (offset 4) although "abcd" starts earlier: a
  // generator has to stop when the first stop string completes.
  StopMatcher split({"abcd", "bc"});
  EXPECT_EQ(FeedAll(split, {"a", "b", "c", "d"}), "a");
  StopMatcher whole({"abcd", "bc"});
  EXPECT_EQ(FeedAll(whole, {"abcd"}), "a");
  EXPECT_EQ(whole.matched_stop(), "bc");
  // Same end offset: the longer stop string is cut.
  StopMatcher same_end({"cd", "bcd"});
  EXPECT_EQ(FeedAll(same_end, {"abcde"}), "a");
  EXPECT_EQ(same_end.matched_stop(), "bcd");
}

TEST(StopMatcherTest, MultiByteTextIsCutOnCharacterBoundaries) {
  // "é" is C3 A9 and "è" is C3 A8: the shared lead byte is held back until the next byte tells.
  StopMatcher matcher({"\xC3\xA9t\xC3\xA9"});
  EXPECT_EQ(matcher.Push("un \xC3\xA8"), "un \xC3\xA8");
  EXPECT_EQ(matcher.Push("t\xC3"), "t");
  EXPECT_EQ(matcher.held_bytes(), 1u);
  EXPECT_EQ(matcher.Push("\xA9t\xC3\xA9 fin"), "");
  EXPECT_TRUE(matcher.stopped());
}

// Random texts over a small alphabet (so stop strings occur, overlap and repeat), split at random
// points: the concatenated output equals the whole-text reference, every intermediate emission is
// final (a prefix of the reference answer for every continuation that could complete a stop
// string), and exactly the longest partial stop is held back.
TEST(StopMatcherTest, MatchesBruteForceReferenceOnRandomSplits) {
  std::mt19937 rng(20240611);
  const std::string alphabet = "abc\n";
  auto random_string = [&](size_t min_length, size_t max_length) {
    std::uniform_int_distribution<size_t> length_dist(min_length, max_length);
    std::uniform_int_distribution<size_t> char_dist(0, alphabet.size() - 1);
    std::string s(length_dist(rng), ' ');
    for (char& c : s) c = alphabet[char_dist(rng)];
    return s;
  };
  int stopped_cases = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    std::vector<std::string> stops(std::uniform_int_distribution<int>(1, 4)(rng));
    for (std::string& stop : stops) stop = random_string(1, 5);
    const std::string text = random_string(0, 40);
    std::vector<std::string> chunks;
    for (size_t at = 0; at < text.size();) {
      const size_t length = std::uniform_int_distribution<size_t>(0, 6)(rng);
      chunks.push_back(text.substr(at, length));
      at += length;
    }

    StopMatcher matcher(stops);
    std::string consumed, emitted;
    for (const std::string& chunk : chunks) {
      consumed += chunk;
      emitted += matcher.Push(chunk);
      for (const std::string& stop : stops) {
        for (size_t from = 0; from <= stop.size(); ++from) {
          const Expected continued = ReferenceCut(consumed + stop.substr(from), stops);
          ASSERT_EQ(continued.output.compare(0, emitted.size(), emitted), 0)
              << "emitted text a continuation retracts; text '" << consumed << "' + '"
              << stop.substr(from) << "'";
        }
      }
      if (matcher.stopped()) break;
      ASSERT_EQ(emitted.size() + matcher.held_bytes(), consumed.size());
      ASSERT_EQ(matcher.held_bytes(), ReferenceHeldBytes(consumed, stops)) << consumed;
    }
    emitted += matcher.Flush();
    const Expected expected = ReferenceCut(text, stops);
    ASSERT_EQ(emitted, expected.output) << "text '" << text << "'";
    ASSERT_EQ(matcher.stopped(), expected.stopped) << "text '" << text << "'";
    stopped_cases += expected.stopped;
  }
  // Both outcomes were exercised.
  EXPECT_GT(stopped_cases, 4000);
  EXPECT_LT(stopped_cases, 16000);
}

TEST(StopMatcherTest, ValidateAcceptsTheLimits) {
  EXPECT_TRUE(ValidateStopStrings({}).ok());
  EXPECT_TRUE(ValidateStopStrings(std::vector<std::string>(kMaxStopStrings, "x")).ok());
  EXPECT_TRUE(ValidateStopStrings({std::string(kMaxStopStringBytes, 'x'), "\xC3\xA9"}).ok());
}

TEST(StopMatcherTest, ValidateRejectsEmptyString) {
  const absl::Status status = ValidateStopStrings({"ok", ""});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("stop string 1 is empty"), absl::string_view::npos)
      << status.message();
}

TEST(StopMatcherTest, ValidateRejectsTooManyStrings) {
  EXPECT_EQ(ValidateStopStrings(std::vector<std::string>(kMaxStopStrings + 1, "x")).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(StopMatcherTest, ValidateRejectsTooLongString) {
  EXPECT_EQ(ValidateStopStrings({std::string(kMaxStopStringBytes + 1, 'x')}).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(StopMatcherTest, ValidateRejectsInvalidUtf8) {
  EXPECT_EQ(ValidateStopStrings({"ab\xFF"}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateStopStrings({"\xC3"}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(StopMatcherDeathTest, EmptyStopStringIsABug) {
  EXPECT_DEATH(StopMatcher({""}), "invariant violated");
}

}  // namespace
}  // namespace bitsplit::text
