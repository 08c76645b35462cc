#include "services/gpu-drafter/json_token_constraint.h"

#include <string>
#include <vector>

#include "common/text/tokenizer.h"
#include "common/util/status_macros.h"

namespace bitsplit::drafter {

absl::StatusOr<std::shared_ptr<const text::TokenVocabulary>> ConstraintVocabulary(
    const gguf::File& metadata) {
  BITSPLIT_ASSIGN_OR_RETURN(std::unique_ptr<text::Tokenizer> tokenizer,
                            text::Tokenizer::FromGguf(metadata));
  std::vector<std::string> pieces(static_cast<size_t>(tokenizer->vocab_size()));
  for (int32_t id = 0; id < tokenizer->vocab_size(); ++id) {
    // Control tokens come back empty (TokenToPiece hides them): never allowed inside JSON.
    BITSPLIT_ASSIGN_OR_RETURN(const std::string_view piece, tokenizer->TokenToPiece(id));
    pieces[static_cast<size_t>(id)] = std::string(piece);
  }
  BITSPLIT_ASSIGN_OR_RETURN(
      text::TokenVocabulary vocabulary,
      text::TokenVocabulary::Create(std::move(pieces), tokenizer->end_of_generation_ids()));
  return std::make_shared<const text::TokenVocabulary>(std::move(vocabulary));
}

JsonTokenConstraint::JsonTokenConstraint(std::shared_ptr<const text::JsonConstraint> constraint,
                                         std::shared_ptr<const text::TokenVocabulary> vocabulary,
                                         std::vector<int32_t> prefix, std::vector<int32_t> suffix)
    : constraint_(std::move(constraint)),
      vocabulary_(std::move(vocabulary)),
      prefix_(std::make_shared<const std::vector<int32_t>>(std::move(prefix))),
      suffix_(std::make_shared<const std::vector<int32_t>>(std::move(suffix))),
      state_(constraint_->Start()),
      phase_(prefix_->empty() ? Phase::kDocument : Phase::kPrefix) {}

void JsonTokenConstraint::Allowed(std::vector<uint64_t>& mask) const {
  const auto only = [&](int32_t token) {
    mask.assign(vocabulary_->mask_words(), 0);
    mask[static_cast<size_t>(token) / 64] |= uint64_t{1} << (token % 64);
  };
  switch (phase_) {
    case Phase::kPrefix:
      only((*prefix_)[matched_]);
      return;
    case Phase::kSuffix:
      only((*suffix_)[matched_]);
      return;
    case Phase::kDocument:
      state_.Allowed(*vocabulary_, mask);
      if (!suffix_->empty()) {
        // The document is followed by the suffix, not by the end.
        for (int32_t end : vocabulary_->end_of_generation_ids()) {
          mask[static_cast<size_t>(end) / 64] &= ~(uint64_t{1} << (end % 64));
        }
        if (state_.IsComplete()) {
          const int32_t next = suffix_->front();
          mask[static_cast<size_t>(next) / 64] |= uint64_t{1} << (next % 64);
        }
      }
      return;
    case Phase::kEnd:
      mask.assign(vocabulary_->mask_words(), 0);
      for (int32_t end : vocabulary_->end_of_generation_ids()) {
        mask[static_cast<size_t>(end) / 64] |= uint64_t{1} << (end % 64);
      }
      return;
    case Phase::kEnded:
      mask.assign(vocabulary_->mask_words(), 0);
      return;
  }
}

bool JsonTokenConstraint::Advance(int32_t token) {
  switch (phase_) {
    case Phase::kPrefix:
      if (token != (*prefix_)[matched_]) return false;
      if (++matched_ == prefix_->size()) phase_ = Phase::kDocument, matched_ = 0;
      return true;
    case Phase::kDocument:
      if (suffix_->empty()) return state_.Advance(*vocabulary_, token);
      if (vocabulary_->IsEndOfGeneration(token)) return false;
      if (state_.Advance(*vocabulary_, token)) return true;
      if (!state_.IsComplete() || token != suffix_->front()) return false;
      matched_ = 1;
      phase_ = matched_ == suffix_->size() ? Phase::kEnd : Phase::kSuffix;
      return true;
    case Phase::kSuffix:
      if (token != (*suffix_)[matched_]) return false;
      if (++matched_ == suffix_->size()) phase_ = Phase::kEnd;
      return true;
    case Phase::kEnd:
      if (!vocabulary_->IsEndOfGeneration(token)) return false;
      phase_ = Phase::kEnded;
      return true;
    case Phase::kEnded:
      return false;
  }
  return false;
}

}  // namespace bitsplit::drafter
