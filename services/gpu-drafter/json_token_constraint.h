#pragma once
// Structured output in the drafter: a request's JSON Schema (or any JSON object) as the
// speculation::TokenConstraint its steps mask the target's choices with, over the model's
// vocabulary (common/text/json_constraint.h), optionally framed by fixed tokens before and after
// the document (a forced tool call: <tool_call>, the call, </tool_call>).
#include <memory>
#include <vector>

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

// The output: `prefix` token by token, a document of `constraint`, `suffix` token by token, then
// an end-of-generation token. The frame's tokens are matched by id, so control tokens may be
// among them. With an empty suffix the document ends as the JSON constraint alone says.
class JsonTokenConstraint final : public speculation::TokenConstraint {
 public:
  // Both must outlive the constraint and its clones. Frame ids must be in the vocabulary.
  JsonTokenConstraint(std::shared_ptr<const text::JsonConstraint> constraint,
                      std::shared_ptr<const text::TokenVocabulary> vocabulary,
                      std::vector<int32_t> prefix = {}, std::vector<int32_t> suffix = {});

  std::unique_ptr<speculation::TokenConstraint> Clone() const override {
    return std::make_unique<JsonTokenConstraint>(*this);
  }
  void Allowed(std::vector<uint64_t>& mask) const override;
  bool Advance(int32_t token) override;

 private:
  enum class Phase { kPrefix, kDocument, kSuffix, kEnd, kEnded };

  std::shared_ptr<const text::JsonConstraint> constraint_;
  std::shared_ptr<const text::TokenVocabulary> vocabulary_;
  // Shared between clones: the frame never changes.
  std::shared_ptr<const std::vector<int32_t>> prefix_;
  std::shared_ptr<const std::vector<int32_t>> suffix_;
  text::JsonConstraintState state_;
  Phase phase_ = Phase::kPrefix;
  size_t matched_ = 0;  // frame tokens matched so far in kPrefix / kSuffix
};

}  // namespace bitsplit::drafter
