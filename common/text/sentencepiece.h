#pragma once
// SentencePiece as llama.cpp's llm_tokenizer_spm (tokenizer.ggml.model = "llama"): spaces
// escaped to U+2581, score-driven bigram merges, <0xNN> byte fallback. Internal to common/text.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "common/io/gguf.h"

namespace bitsplit::text {

class SentencePieceEncoder {
 public:
  // tokenizer.ggml.scores, the merge priority of each of `vocab_size` tokens (all 0 when the key
  // is absent). INVALID_ARGUMENT when it has fewer entries than the vocabulary.
  static absl::StatusOr<std::vector<float>> ReadScores(const gguf::File& file, size_t vocab_size);

  // `token_ids` (vocabulary text -> id) must outlive the encoder; `scores` come from ReadScores.
  // A byte with neither a "<0xNN>" nor a single-byte token falls back to `unknown_id` (where
  // llama.cpp throws), or to nothing when that is Tokenizer::kNoToken.
  SentencePieceEncoder(const std::unordered_map<std::string_view, int32_t>& token_ids,
                       std::vector<float> scores, int32_t unknown_id);

  // Appends the tokens of `text`, which holds no special tokens. `space_prefix` puts a space
  // before it (add_space_prefix, at the start of the text and after a special token).
  void Encode(std::string_view text, bool space_prefix, std::vector<int32_t>& out) const;

 private:
  int32_t Find(std::string_view text) const;

  const std::unordered_map<std::string_view, int32_t>& token_ids_;
  std::vector<float> scores_;
  std::array<int32_t, 256> byte_tokens_{};
};

// SentencePiece's spelling of text, which Gemma 4's BPE vocabulary shares (llama.cpp's
// escape_whitespaces): every space as U+2581.
std::string EscapeWhitespace(std::string_view text);

// What a vocabulary entry stands for: its text with U+2581 back to spaces.
std::string DecodeSentencePiece(std::string_view token_text);

// The text of the byte-fallback token of `byte`: "<0xNN>", upper-case hex, as llama.cpp looks
// it up.
std::string ByteTokenText(uint8_t byte);

}  // namespace bitsplit::text
