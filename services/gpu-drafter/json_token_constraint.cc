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

}  // namespace bitsplit::drafter
