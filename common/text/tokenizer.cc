#include "common/text/tokenizer.h"

#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/text/bpe.h"
#include "common/text/sentencepiece.h"
#include "common/text/special_tokens.h"
#include "common/util/status_macros.h"

namespace bitsplit::text {

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const gguf::File& file) {
  auto tokenizer = std::unique_ptr<Tokenizer>(new Tokenizer());
  BITSPLIT_RETURN_IF_ERROR(tokenizer->Load(file));
  return tokenizer;
}

absl::Status Tokenizer::Load(const gguf::File& file) {
  const std::string& where = file.name();
  BITSPLIT_ASSIGN_OR_RETURN(const std::string model, file.GetString("tokenizer.ggml.model"));
  // llama.cpp's special ids where the metadata names none.
  SpecialTokens::Defaults special_defaults{.bos_id = 11, .eos_id = 11, .unk_id = kNoToken};
  if (model == "gpt2" || model == "gemma4") {
    model_ = TokenizerModel::kBytePairEncoding;
  } else if (model == "llama") {
    model_ = TokenizerModel::kSentencePiece;
    special_defaults = {.bos_id = 1, .eos_id = 2, .unk_id = 0};
  } else {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: unsupported tokenizer.ggml.model '%s' (supported: 'gpt2' = byte-level BPE, "
        "'llama' = SentencePiece, 'gemma4' = Gemma 4's BPE over SentencePiece-escaped text)",
        where, model));
  }
  // A missing pre-tokenizer is "default" (llama.cpp does the same, with a warning).
  pre_name_ = "default";
  if (model == "gemma4") {
    // llama.cpp ignores tokenizer.ggml.pre here and has no default special ids.
    pre_name_ = "gemma4";
    special_defaults = {.bos_id = kNoToken, .eos_id = kNoToken, .unk_id = kNoToken};
  } else if (file.Find("tokenizer.ggml.pre") != nullptr) {
    BITSPLIT_ASSIGN_OR_RETURN(pre_name_, file.GetString("tokenizer.ggml.pre"));
  }

  BITSPLIT_ASSIGN_OR_RETURN(tokens_, file.GetStringArray("tokenizer.ggml.tokens"));
  if (tokens_.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: tokenizer.ggml.tokens is empty", where));
  }
  if (tokens_.size() > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: tokenizer.ggml.tokens has too many entries", where));
  }
  const size_t n = tokens_.size();

  std::vector<int64_t> types;
  if (file.Find("tokenizer.ggml.token_type") != nullptr) {
    BITSPLIT_ASSIGN_OR_RETURN(types, file.GetIntArray("tokenizer.ggml.token_type"));
    if (types.size() < n) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: tokenizer.ggml.token_type has %d entries for %d tokens", where, types.size(), n));
    }
  }

  std::vector<float> scores;
  if (model_ == TokenizerModel::kSentencePiece) {
    // llama.cpp's SentencePiece defaults; tokenizer.ggml.pre plays no part.
    add_bos_ = true;
    add_space_prefix_ = true;
    BITSPLIT_ASSIGN_OR_RETURN(scores, SentencePieceEncoder::ReadScores(file, n));
  } else {
    BITSPLIT_ASSIGN_OR_RETURN(bpe_, BpeEncoder::Create(file, pre_name_, token_ids_));
    add_bos_ = bpe_->add_bos();
  }
  // Read for both models, as llama.cpp does after the model's defaults.
  if (file.Find("tokenizer.ggml.add_space_prefix") != nullptr) {
    BITSPLIT_ASSIGN_OR_RETURN(add_space_prefix_, file.GetBool("tokenizer.ggml.add_space_prefix"));
  }

  attrs_.assign(n, kAttrNormal);
  for (size_t id = 0; id < n; ++id) {
    if (tokens_[id].empty()) tokens_[id] = absl::StrCat("[EMPTY_", id, "]");  // as llama.cpp
    if (types.empty()) continue;
    switch (static_cast<TokenType>(types[id])) {
      case TokenType::kUnknown:
        attrs_[id] = kAttrUnknown;
        break;
      case TokenType::kUnused:
        attrs_[id] = kAttrUnused;
        break;
      case TokenType::kNormal:
        attrs_[id] = kAttrNormal;
        break;
      case TokenType::kControl:
        attrs_[id] = kAttrControl;
        break;
      case TokenType::kUserDefined:
        attrs_[id] = kAttrUserDefined;
        break;
      case TokenType::kByte:
        attrs_[id] = kAttrByte;
        break;
      default:
        attrs_[id] = 0;  // undefined: decodes to nothing
        break;
    }
  }
  token_ids_.reserve(n);
  for (size_t id = 0; id < n; ++id) {
    const auto [it, inserted] = token_ids_.emplace(tokens_[id], static_cast<int32_t>(id));
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: tokenizer.ggml.tokens has the same text at ids %d and %d", where, it->second, id));
    }
  }

  BITSPLIT_ASSIGN_OR_RETURN(special_, SpecialTokens::Load(file, special_defaults, tokens_, attrs_));
  if (file.Find("tokenizer.ggml.add_bos_token") != nullptr) {
    BITSPLIT_ASSIGN_OR_RETURN(add_bos_, file.GetBool("tokenizer.ggml.add_bos_token"));
  }
  // llama.cpp adds BOS for gemma4 even where tokenizer.ggml.add_bos_token says not to.
  if (bpe_ != nullptr && bpe_->force_add_bos()) add_bos_ = true;
  if (file.Find("tokenizer.ggml.add_eos_token") != nullptr) {
    BITSPLIT_ASSIGN_OR_RETURN(add_eos_, file.GetBool("tokenizer.ggml.add_eos_token"));
  }
  if (model_ == TokenizerModel::kSentencePiece) {
    // Last, as its byte fallback needs the unknown token.
    spm_ = std::make_unique<const SentencePieceEncoder>(token_ids_, std::move(scores),
                                                        special_->unk_id());
  }
  BuildPieces();
  return absl::OkStatus();
}

void Tokenizer::BuildPieces() {
  pieces_.resize(tokens_.size());
  for (size_t id = 0; id < tokens_.size(); ++id) {
    const uint32_t attr = attrs_[id];
    const std::string& text = tokens_[id];
    if (attr & (kAttrUnknown | kAttrControl | kAttrUserDefined)) {
      pieces_[id] = text;
    } else if (attr & kAttrNormal) {
      const bool escaped_spaces =
          model_ == TokenizerModel::kSentencePiece || bpe_->escape_whitespace();
      pieces_[id] = escaped_spaces ? DecodeSentencePiece(text) : DecodeByteLevel(text);
    } else if (attr & kAttrByte) {
      // "<0xAB>" style byte tokens.
      const std::string hex = text.size() >= 5 ? text.substr(3, 2) : "";
      pieces_[id] = std::string(1, static_cast<char>(std::strtol(hex.c_str(), nullptr, 16)));
    }  // unused / undefined tokens decode to nothing
  }
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool parse_special) const {
  return Tokenize(text, /*add_special=*/false, parse_special);
}

std::vector<int32_t> Tokenizer::Tokenize(std::string_view text, bool add_special,
                                         bool parse_special) const {
  std::vector<int32_t> ids;
  if (add_special && add_bos_ && bos_id() != kNoToken) ids.push_back(bos_id());
  // SentencePiece's leading space goes before the first text and before text that follows a
  // special token (llama.cpp's is_prev_special), BOS or not.
  bool after_special = true;
  for (const SpecialTokens::Fragment& fragment : special_->Partition(text, parse_special)) {
    if (fragment.token != kNoToken) {
      ids.push_back(fragment.token);
      after_special = true;
      continue;
    }
    if (model_ == TokenizerModel::kSentencePiece) {
      spm_->Encode(fragment.text, add_space_prefix_ && after_special, ids);
    } else {
      bpe_->Encode(fragment.text, ids);
    }
    after_special = false;
  }
  if (add_special && add_eos_ && eos_id() != kNoToken) ids.push_back(eos_id());
  return ids;
}

absl::StatusOr<std::string_view> Tokenizer::TokenToPiece(int32_t id, bool render_special) const {
  if (id < 0 || id >= vocab_size()) {
    return absl::OutOfRangeError(
        absl::StrFormat("token id %d is outside the vocabulary [0, %d)", id, vocab_size()));
  }
  if (!render_special && (attrs_[id] & (kAttrUnknown | kAttrControl))) return std::string_view();
  return std::string_view(pieces_[id]);
}

absl::StatusOr<std::string> Tokenizer::Decode(std::span<const int32_t> ids,
                                              bool render_special) const {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto piece = TokenToPiece(ids[i], render_special);
    if (!piece.ok()) {
      return absl::OutOfRangeError(
          absl::StrCat(piece.status().message(), " (position ", i, " of ", ids.size(), ")"));
    }
    text.append(*piece);
  }
  return text;
}

absl::StatusOr<std::string> Tokenizer::Detokenize(std::span<const int32_t> ids, bool remove_special,
                                                  bool unparse_special) const {
  bool remove_space = add_space_prefix_;
  if (remove_special && add_bos_ && !ids.empty() && ids.front() == bos_id()) {
    remove_space = false;
    ids = ids.subspan(1);
  }
  if (remove_special && add_eos_ && !ids.empty() && ids.back() == eos_id()) {
    ids = ids.subspan(0, ids.size() - 1);
  }
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    auto piece = TokenToPiece(ids[i], unparse_special);
    if (!piece.ok()) {
      return absl::OutOfRangeError(
          absl::StrCat(piece.status().message(), " (position ", i, " of ", ids.size(), ")"));
    }
    // Only the first piece, hidden or not, may lose its space.
    if (remove_space && piece->starts_with(' ')) piece->remove_prefix(1);
    remove_space = false;
    text.append(*piece);
  }
  if (bpe_ != nullptr && bpe_->clean_spaces()) CleanSpaces(text);
  return text;
}

int32_t Tokenizer::bos_id() const { return special_->bos_id(); }
int32_t Tokenizer::eos_id() const { return special_->eos_id(); }
int32_t Tokenizer::eot_id() const { return special_->eot_id(); }
int32_t Tokenizer::unk_id() const { return special_->unk_id(); }

bool Tokenizer::IsEndOfGeneration(int32_t id) const { return special_->IsEndOfGeneration(id); }

const std::vector<int32_t>& Tokenizer::end_of_generation_ids() const {
  return special_->end_of_generation_ids();
}

bool Tokenizer::IsControl(int32_t id) const {
  return id >= 0 && id < vocab_size() && (attrs_[id] & (kAttrUnknown | kAttrControl));
}

absl::StatusOr<TokenType> Tokenizer::GetTokenType(int32_t id) const {
  if (id < 0 || id >= vocab_size()) {
    return absl::OutOfRangeError(
        absl::StrFormat("token id %d is outside the vocabulary [0, %d)", id, vocab_size()));
  }
  const uint32_t attr = attrs_[id];
  if (attr & kAttrControl) return TokenType::kControl;
  if (attr & kAttrUserDefined) return TokenType::kUserDefined;
  if (attr & kAttrUnknown) return TokenType::kUnknown;
  if (attr & kAttrByte) return TokenType::kByte;
  if (attr & kAttrUnused) return TokenType::kUnused;
  if (attr & kAttrNormal) return TokenType::kNormal;
  return TokenType::kUndefined;
}

absl::StatusOr<std::string_view> Tokenizer::GetTokenText(int32_t id) const {
  if (id < 0 || id >= vocab_size()) {
    return absl::OutOfRangeError(
        absl::StrFormat("token id %d is outside the vocabulary [0, %d)", id, vocab_size()));
  }
  return std::string_view(tokens_[id]);
}

int32_t Tokenizer::FindToken(std::string_view text) const {
  const auto it = token_ids_.find(text);
  return it == token_ids_.end() ? kNoToken : it->second;
}

}  // namespace bitsplit::text
