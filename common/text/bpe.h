#pragma once
// Byte-level BPE as llama.cpp's llm_tokenizer_bpe (tokenizer.ggml.model = "gpt2"): text is cut
// into words by the pre-tokenizer that tokenizer.ggml.pre names (its regexes run with PCRE2),
// each word's bytes are mapped to GPT-2's printable code points and merged in the order of
// tokenizer.ggml.merges. Internal to common/text.
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

  // The pre-tokenizer's defaults in llama.cpp: whether a prompt starts with BOS, and whether
  // Detokenize applies CleanSpaces.
  bool add_bos() const { return add_bos_; }
  bool clean_spaces() const { return clean_spaces_; }

  // Appends the tokens of `text`, which holds no special tokens. Invalid UTF-8 is tokenized as
  // U+FFFD per bad byte.
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
  bool clean_spaces_ = true;

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
