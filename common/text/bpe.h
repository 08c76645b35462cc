#pragma once
// BPE as llama.cpp's llm_tokenizer_bpe (tokenizer.ggml.model = "gpt2", and "gemma4"): text is
// cut into words by the pre-tokenizer that tokenizer.ggml.pre names (its regexes run with
// PCRE2), each word's bytes are mapped to GPT-2's printable code points and merged in the order
// of tokenizer.ggml.merges. The gemma4 pre-tokenizer instead spells the text as SentencePiece
// does (spaces as U+2581), cuts it only at newlines, merges the UTF-8 as it is, and falls back to
// "<0xNN>" byte tokens. Internal to common/text.
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "common/io/gguf.h"

namespace bitsplit::text {

// Thread safety: Encode may be called from any number of threads at once (a mutex guards the
// word memo).
class BpeEncoder {
 public:
  // Selects the pre-tokenizer named `pre_name` and reads tokenizer.ggml.merges from `file`.
  // INVALID_ARGUMENT, listing the supported names, for an unknown pre-tokenizer. Encode looks
  // tokens up in `token_ids` (vocabulary text -> id), which must outlive the encoder; Create
  // does not read it.
  static absl::StatusOr<std::unique_ptr<BpeEncoder>> Create(
      const gguf::File& file, std::string_view pre_name,
      const std::unordered_map<std::string_view, int32_t>& token_ids);

  ~BpeEncoder();
  BpeEncoder(const BpeEncoder&) = delete;
  BpeEncoder& operator=(const BpeEncoder&) = delete;

  // The pre-tokenizer's settings in llama.cpp: whether a prompt starts with BOS by default, and
  // whether regardless of tokenizer.ggml.add_bos_token (gemma4); whether Detokenize applies
  // CleanSpaces; whether vocabulary entries spell spaces as U+2581 (DecodeSentencePiece gives
  // what a normal token stands for) rather than byte-level (DecodeByteLevel).
  bool add_bos() const { return add_bos_; }
  bool force_add_bos() const { return force_add_bos_; }
  bool clean_spaces() const { return clean_spaces_; }
  bool escape_whitespace() const { return escape_whitespace_; }

  // Appends the tokens of `text`, which holds no special tokens. Invalid UTF-8 is tokenized as
  // U+FFFD per bad byte. With escape_whitespace(), spaces are escaped here.
  void Encode(std::string_view text, std::vector<int32_t>& out) const;

 private:
  class PreTokenizer;  // regex stages that cut text into words

  explicit BpeEncoder(const std::unordered_map<std::string_view, int32_t>& token_ids);
  // BPE of one pre-tokenized word (UTF-8), memoized.
  void EncodeWord(std::string_view word, std::vector<int32_t>& out) const;
  std::vector<int32_t> BytePairMerge(std::string_view encoded_word) const;
  int MergeRank(std::string_view left, std::string_view right) const;

  const std::unordered_map<std::string_view, int32_t>& token_ids_;
  std::unique_ptr<const PreTokenizer> pre_tokenizer_;
  std::unordered_map<std::string, int> merge_ranks_;  // "left right" -> rank
  bool ignore_merges_ = false;  // llama3-style: a word that is a whole token skips the merges
  bool add_bos_ = false;
  bool force_add_bos_ = false;
  bool clean_spaces_ = true;
  bool escape_whitespace_ = false;
  // false: words are merged as raw UTF-8 and leftover bytes become "<0xNN>" tokens.
  bool byte_encode_ = true;
  // A word of newlines only is the token of that text where the vocabulary has one (gemma4).
  bool whole_newline_words_ = false;

  // Word -> ids memo: natural text repeats words constantly, and BPE of a word is the
  // expensive part of Encode.
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> word_cache_;
};

// What a vocabulary entry stands for: its byte-level text mapped back to bytes (llama.cpp's
// llama_decode_text, including its marker for characters outside the byte mapping).
std::string DecodeByteLevel(std::string_view token_text);

// llama.cpp's clean_spaces passes of llama_detokenize, on the same bytes and in the same order
// (each pass reads what the previous ones left, including the NUL the second one writes).
void CleanSpaces(std::string& text);

}  // namespace bitsplit::text
