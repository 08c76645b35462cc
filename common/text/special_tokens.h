#pragma once
// The special tokens of a vocabulary, as llama.cpp finds them: the ids that the GGUF metadata
// names (with llama.cpp's defaults), the tokens it recognizes by their text alone, the set that
// ends generation, and the cutting of text around special tokens before the model's encoder
// sees it. Internal to common/text.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "absl/status/statusor.h"
#include "common/io/gguf.h"
#include "common/text/tokenizer.h"

namespace bitsplit::text {

// Per-token attribute bits, as llama.cpp's llama_token_attr.
enum TokenAttr : uint32_t {
  kAttrUnknown = 1u << 0,
  kAttrUnused = 1u << 1,
  kAttrNormal = 1u << 2,
  kAttrControl = 1u << 3,
  kAttrUserDefined = 1u << 4,
  kAttrByte = 1u << 5,
};

class SpecialTokens {
 public:
  // A piece of text: a special token, or a stretch of ordinary text between them.
  struct Fragment {
    int32_t token;  // Tokenizer::kNoToken for ordinary text
    std::string_view text;
  };

  // llama.cpp's ids for a model whose metadata names none, per tokenizer.ggml.model
  // (Tokenizer::kNoToken: none).
  struct Defaults {
    int32_t bos_id;
    int32_t eos_id;
    int32_t unk_id;
  };

  // Reads the special token ids (tokenizer.ggml.*_token_id; an id outside the vocabulary keeps
  // the default) for the vocabulary `tokens` (texts, unique). Tokens that llama.cpp recognizes
  // by their text get its attributes in `attrs`: control for end-of-turn, FIM and
  // end-of-generation texts, and its overrides for a few chat formats.
  static absl::StatusOr<std::unique_ptr<SpecialTokens>> Load(const gguf::File& file,
                                                             const Defaults& defaults,
                                                             std::span<const std::string> tokens,
                                                             std::span<uint32_t> attrs);

  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  int32_t eot_id() const { return eot_id_; }
  int32_t unk_id() const { return unk_id_; }

  bool IsEndOfGeneration(int32_t id) const { return eog_set_.count(id) > 0; }
  const std::vector<int32_t>& end_of_generation_ids() const { return eog_ids_; }

  // Cuts `text` at every occurrence of a special token (llama.cpp's tokenizer_st_partition),
  // longer tokens first. Without `parse_special` only user-defined tokens are cut out.
  std::vector<Fragment> Partition(std::string_view text, bool parse_special) const;

 private:
  struct Special {
    int32_t id;
    std::string text;
    bool needs_parse_special;  // control or unknown
  };

  SpecialTokens() = default;

  int32_t bos_id_ = Tokenizer::kNoToken;
  int32_t eos_id_ = Tokenizer::kNoToken;
  int32_t eot_id_ = Tokenizer::kNoToken;
  int32_t unk_id_ = Tokenizer::kNoToken;
  std::vector<int32_t> eog_ids_;  // ascending
  std::unordered_set<int32_t> eog_set_;
  std::vector<Special> specials_;  // control, user-defined and unknown tokens, longest text first
};

}  // namespace bitsplit::text
