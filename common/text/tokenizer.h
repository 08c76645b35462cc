#pragma once
// The tokenizers llama.cpp reads from GGUF metadata, reproduced token for token
// (tests/text_tokenizer_oracle_test.cc checks them against llama.cpp on a committed corpus for
// SmolLM2, gemma3 and a qwen2 vocabulary; tests/text_gemma4_tokenizer_test.cc against
// llama.cpp's own test strings for the Gemma 4 vocabulary):
//   * byte-level BPE (tokenizer.ggml.model = "gpt2", bpe.h): the same pre-tokenizer regexes (run
//     with PCRE2), merge order and tie-breaking;
//   * Gemma 4's BPE (tokenizer.ggml.model = "gemma4", bpe.h, llama.cpp's BPE with its gemma4
//     pre-tokenizer): the same merges over text spelled as SentencePiece spells it (spaces as
//     U+2581), cut only at newlines, with <0xNN> byte fallback and BOS always added;
//   * SentencePiece (tokenizer.ggml.model = "llama", llama.cpp's llm_tokenizer_spm,
//     sentencepiece.h): spaces escaped to U+2581, score-driven bigram merges, <0xNN> byte
//     fallback, the optional leading space (tokenizer.ggml.add_space_prefix).
// All share llama.cpp's special-token splitting and its token attributes, including the
// tokens it marks as control or end-of-generation by their text (special_tokens.h).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "common/io/gguf.h"

namespace bitsplit::text {

// Values of the GGUF tokenizer.ggml.token_type array (llama.cpp's llama_token_type).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// The two algorithms, by their tokenizer.ggml.model names.
enum class TokenizerModel {
  kBytePairEncoding,  // "gpt2", and "gemma4" (llama.cpp's BPE with the gemma4 pre-tokenizer)
  kSentencePiece,     // "llama"
};

class BpeEncoder;
class SentencePieceEncoder;
class SpecialTokens;

// Thread safety: immutable after FromGguf but for the BPE word memo, which a mutex guards, so
// every method may be called from any number of threads at once.
class Tokenizer {
 public:
  static constexpr int32_t kNoToken = -1;

  // Reads tokenizer.ggml.* from `file` (a whole model, or a GGUF that holds only metadata).
  // Fails with INVALID_ARGUMENT / NOT_FOUND, naming the key, on a missing vocabulary, missing
  // merges (BPE), an unsupported tokenizer.ggml.model (supported: "gpt2", "llama", "gemma4"), an
  // unknown tokenizer.ggml.pre ("gpt2" only: like llama.cpp, SentencePiece ignores it and
  // "gemma4" implies its own), or malformed arrays. Both error messages list what is supported.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const gguf::File& file);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Text to token ids; never adds BOS/EOS (see add_bos()). With `parse_special`, the text of
  // control tokens (e.g. "<|im_start|>") becomes that token; without it, only user-defined tokens
  // are matched and control-token text is tokenized as ordinary text. BPE tokenizes invalid
  // UTF-8 as U+FFFD per bad byte, SentencePiece as byte tokens, as llama.cpp does. With
  // add_space_prefix(), SentencePiece puts a space before the text at the start and after every
  // special token. Thread-safe.
  std::vector<int32_t> Encode(std::string_view text, bool parse_special) const;

  // llama.cpp's llama_tokenize: Encode, with BOS first when `add_special` and add_bos(), and EOS
  // last when `add_special` and add_eos() (a missing BOS/EOS id adds nothing). Thread-safe.
  std::vector<int32_t> Tokenize(std::string_view text, bool add_special, bool parse_special) const;

  // The bytes a token stands for (not necessarily complete UTF-8: byte-level tokens can hold a
  // part of a character). Control and unknown tokens give "" unless `render_special`.
  // OUT_OF_RANGE for an id outside [0, vocab_size()).
  absl::StatusOr<std::string_view> TokenToPiece(int32_t id, bool render_special = false) const;

  // Concatenation of TokenToPiece over `ids` (llama.cpp's token_to_piece loop, with no space
  // clean-up). May be invalid UTF-8 when `ids` is not the encoding of a text.
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids,
                                     bool render_special = false) const;

  // llama.cpp's llama_detokenize: Decode, except that with add_space_prefix() the first piece
  // loses one leading space; `remove_special` drops a leading BOS (then no space is removed)
  // when add_bos() and a trailing EOS when add_eos(); and pre-tokenizers with llama.cpp's
  // clean_spaces (gpt-2, llama3, default, gemma4, ...) remove the spaces it removes before ?!., and
  // contractions. For SentencePiece with a space prefix this is what inverts Encode.
  absl::StatusOr<std::string> Detokenize(std::span<const int32_t> ids, bool remove_special,
                                         bool unparse_special) const;

  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  int32_t bos_id() const;  // kNoToken when the model has none
  int32_t eos_id() const;
  int32_t eot_id() const;
  int32_t unk_id() const;
  // Whether a prompt should start with BOS (tokenizer.ggml.add_bos_token, else the default of
  // the pre-tokenizer (BPE) or true (SentencePiece); always true for gemma4, as llama.cpp).
  // Encode never adds it; Tokenize does, or callers prepend bos_id().
  bool add_bos() const { return add_bos_; }
  // Whether a prompt should end with EOS (tokenizer.ggml.add_eos_token, default false).
  bool add_eos() const { return add_eos_; }
  // tokenizer.ggml.add_space_prefix; absent, true for SentencePiece and false for BPE.
  bool add_space_prefix() const { return add_space_prefix_; }
  TokenizerModel model() const { return model_; }
  // tokenizer.ggml.pre as stored ("default" when absent; "gemma4" for that model whatever is
  // stored).
  const std::string& pre_tokenizer_name() const { return pre_name_; }

  // End of generation: EOS, EOT, and the tokens llama.cpp treats as such by their text
  // ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", FIM repo/pad/separator tokens, ...).
  // False for out-of-range ids.
  bool IsEndOfGeneration(int32_t id) const;
  const std::vector<int32_t>& end_of_generation_ids() const;

  // True for control/unknown tokens (the ones TokenToPiece hides unless render_special).
  bool IsControl(int32_t id) const;
  absl::StatusOr<TokenType> GetTokenType(int32_t id) const;
  // The vocabulary entry for `id` as stored in the GGUF (byte-level BPE: byte-level encoded,
  // e.g. "Ġthe"; SentencePiece and gemma4: spaces as U+2581, e.g. "▁the").
  absl::StatusOr<std::string_view> GetTokenText(int32_t id) const;
  // The id whose vocabulary text is exactly `text`, or kNoToken.
  int32_t FindToken(std::string_view text) const;

 private:
  Tokenizer();
  absl::Status Load(const gguf::File& file);
  void BuildPieces();

  TokenizerModel model_ = TokenizerModel::kBytePairEncoding;
  std::string pre_name_;
  bool add_bos_ = false;
  bool add_eos_ = false;
  bool add_space_prefix_ = false;

  std::vector<std::string> tokens_;                          // vocabulary text as stored
  std::vector<uint32_t> attrs_;                              // TokenAttr bits
  std::vector<std::string> pieces_;                          // decoded bytes of each token
  std::unordered_map<std::string_view, int32_t> token_ids_;  // views into tokens_
  std::unique_ptr<const SpecialTokens> special_;
  // The model's encoder: exactly one is set.
  std::unique_ptr<const BpeEncoder> bpe_;
  std::unique_ptr<const SentencePieceEncoder> spm_;
};

}  // namespace bitsplit::text
