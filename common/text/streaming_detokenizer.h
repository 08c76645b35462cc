#pragma once
// Turns a stream of token ids into text that is always complete, valid UTF-8. Byte-level BPE
// tokens can end in the middle of a character (an emoji is often 2-4 tokens), so the bytes of
// an unfinished character are held back until the tokens that complete it arrive.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/text/tokenizer.h"

namespace bitsplit::text {

// True when `bytes` is well-formed UTF-8 (no overlong forms, surrogates or values above
// U+10FFFF).
bool IsValidUtf8(std::string_view bytes);

// `bytes` with every ill-formed sequence replaced by U+FFFD, one per maximal ill-formed
// subpart (the Unicode-recommended practice, also Python's errors="replace").
std::string ReplaceInvalidUtf8(std::string_view bytes);

class StreamingDetokenizer {
 public:
  // `tokenizer` must outlive this object. `render_special` as in Tokenizer::TokenToPiece; the
  // tokens of `rendered_ids` are rendered either way (the markers a parser of the text needs).
  explicit StreamingDetokenizer(const Tokenizer& tokenizer, bool render_special = false,
                                std::vector<int32_t> rendered_ids = {});

  // Adds one token; returns the text that became complete (possibly empty). The concatenation
  // of everything Push and Finish return equals ReplaceInvalidUtf8(tokenizer.Decode(ids)),
  // i.e. exactly Decode(ids) whenever that is valid UTF-8. OUT_OF_RANGE for a bad id, which
  // leaves the state unchanged.
  absl::StatusOr<std::string> Push(int32_t id);

  // Ends the stream: a held-back incomplete character becomes U+FFFD. Resets the state, so the
  // object can start a new stream.
  std::string Finish();

  // Bytes held back waiting for the rest of a character (at most 3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer& tokenizer_;
  bool render_special_;
  std::vector<int32_t> rendered_ids_;  // sorted
  std::string pending_;
};

}  // namespace bitsplit::text
