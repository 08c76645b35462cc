#include "common/text/sentencepiece.h"

#include <optional>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/text/bigram_merge.h"
#include "common/text/tokenizer.h"
#include "common/util/status_macros.h"

namespace bitsplit::text {
namespace {

constexpr int32_t kNoToken = Tokenizer::kNoToken;

// SentencePiece's whitespace marker, U+2581 LOWER ONE EIGHTH BLOCK.
constexpr std::string_view kSpace = "\xE2\x96\x81";

void ReplaceAll(std::string& text, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  size_t found;
  while ((found = text.find(from, pos)) != std::string::npos) {
    out.append(text, pos, found - pos).append(to);
    pos = found + from.size();
  }
  out.append(text, pos, std::string::npos);
  text.swap(out);
}

}  // namespace

absl::StatusOr<std::vector<float>> SentencePieceEncoder::ReadScores(const gguf::File& file,
                                                                    size_t vocab_size) {
  std::vector<float> scores(vocab_size, 0.0f);
  if (file.Find("tokenizer.ggml.scores") == nullptr) return scores;
  BITSPLIT_ASSIGN_OR_RETURN(const std::vector<double> stored,
                            file.GetFloatArray("tokenizer.ggml.scores"));
  if (stored.size() < vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: tokenizer.ggml.scores has %d entries for %d tokens", file.name(),
                        stored.size(), vocab_size));
  }
  for (size_t id = 0; id < vocab_size; ++id) scores[id] = static_cast<float>(stored[id]);
  return scores;
}

SentencePieceEncoder::SentencePieceEncoder(
    const std::unordered_map<std::string_view, int32_t>& token_ids, std::vector<float> scores,
    int32_t unknown_id)
    : token_ids_(token_ids), scores_(std::move(scores)) {
  // llama.cpp's byte_to_token: "<0xNN>" (upper-case hex), else the byte itself as a token.
  for (int byte = 0; byte < 256; ++byte) {
    int32_t id = Find(ByteTokenText(static_cast<uint8_t>(byte)));
    if (id == kNoToken) id = Find(std::string(1, static_cast<char>(byte)));
    byte_tokens_[byte] = id == kNoToken ? unknown_id : id;
  }
}

int32_t SentencePieceEncoder::Find(std::string_view text) const {
  const auto it = token_ids_.find(text);
  return it == token_ids_.end() ? kNoToken : it->second;
}

void SentencePieceEncoder::Encode(std::string_view text, bool space_prefix,
                                  std::vector<int32_t>& out) const {
  std::string spaced;
  if (space_prefix) spaced.push_back(' ');
  spaced.append(text);
  const std::string escaped = EscapeWhitespace(spaced);
  // llama.cpp's llm_tokenizer_spm_session: the pair whose concatenation is the token with the
  // highest score merges first. Every merged symbol is a token by construction; a leftover
  // character that is not one becomes byte tokens.
  const auto negated_score = [this](std::string_view left,
                                    std::string_view right) -> std::optional<float> {
    const int32_t id = Find(std::string_view(left.data(), left.size() + right.size()));
    if (id == kNoToken) return std::nullopt;
    return -scores_[id];
  };
  for (std::string_view symbol : MergeBigrams(escaped, negated_score)) {
    const int32_t id = Find(symbol);
    if (id != kNoToken) {
      out.push_back(id);
      continue;
    }
    for (char byte : symbol) {
      const int32_t byte_id = byte_tokens_[static_cast<uint8_t>(byte)];
      if (byte_id != kNoToken) out.push_back(byte_id);
    }
  }
}

std::string EscapeWhitespace(std::string_view text) {
  std::string escaped(text);
  ReplaceAll(escaped, " ", kSpace);
  return escaped;
}

std::string DecodeSentencePiece(std::string_view token_text) {
  std::string text(token_text);
  ReplaceAll(text, kSpace, " ");
  return text;
}

std::string ByteTokenText(uint8_t byte) { return absl::StrFormat("<0x%02X>", byte); }

}  // namespace bitsplit::text
