#pragma once
// Structured output in the drafter: a request's JSON Schema (or any JSON object) as the
// speculation::TokenConstraint its steps mask the target's choices with, over the model's
// vocabulary (common/text/json_constraint.h).
#include <memory>

#include "absl/status/statusor.h"
#include "common/io/gguf.h"
#include "common/speculation/session.h"
#include "common/text/json_constraint.h"

namespace bitsplit::drafter {

// The vocabulary constrained decoding masks, from the model's tokenizer: each token's bytes as it
// appends them to the text (control tokens none, so never inside JSON), and the tokenizer's
// end-of-generation ids, allowed once the document is complete.
absl::StatusOr<std::shared_ptr<const text::TokenVocabulary>> ConstraintVocabulary(
    const gguf::File& metadata);

class JsonTokenConstraint final : public speculation::TokenConstraint {
 public:
  // Both must outlive the constraint and its clones.
  JsonTokenConstraint(std::shared_ptr<const text::JsonConstraint> constraint,
                      std::shared_ptr<const text::TokenVocabulary> vocabulary)
      : constraint_(std::move(constraint)),
        vocabulary_(std::move(vocabulary)),
        state_(constraint_->Start()) {}

  std::unique_ptr<speculation::TokenConstraint> Clone() const override {
    return std::make_unique<JsonTokenConstraint>(*this);
  }
  void Allowed(std::vector<uint64_t>& mask) const override { state_.Allowed(*vocabulary_, mask); }
  bool Advance(int32_t token) override { return state_.Advance(*vocabulary_, token); }

 private:
  std::shared_ptr<const text::JsonConstraint> constraint_;
  std::shared_ptr<const text::TokenVocabulary> vocabulary_;
  text::JsonConstraintState state_;
};

}  // namespace bitsplit::drafter
