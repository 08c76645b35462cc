// The drafter's structured-output constraint (services/gpu-drafter/json_token_constraint.h) with
// a frame of fixed tokens around the document, as a forced tool call uses it: in every state the
// mask is exactly the set of tokens Advance accepts (checked token by token on copies), the frame
// is matched by id (control tokens with no text included), and the end comes only after the
// suffix.
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "services/gpu-drafter/json_token_constraint.h"

namespace bitsplit::drafter {
namespace {

// Token ids of the toy vocabulary.
enum : int32_t { kOpen, kBrace, kClose, kEmpty, kNewline, kCloseTag, kLetter, kEnd, kVocab };

std::shared_ptr<const text::TokenVocabulary> Vocabulary() {
  // kOpen and kCloseTag are control tokens: no text, so never inside the document.
  std::vector<std::string> pieces = {"", "{", "}", "{}", "\n", "", "a", ""};
  auto vocabulary = text::TokenVocabulary::Create(std::move(pieces), {kEnd});
  EXPECT_TRUE(vocabulary.ok()) << vocabulary.status();
  return std::make_shared<const text::TokenVocabulary>(*std::move(vocabulary));
}

std::vector<int32_t> AllowedIds(const speculation::TokenConstraint& constraint) {
  std::vector<uint64_t> mask;
  constraint.Allowed(mask);
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < kVocab; ++id) {
    if (mask[static_cast<size_t>(id) / 64] >> (id % 64) & 1) ids.push_back(id);
  }
  return ids;
}

// The mask against Advance on a copy, for every token.
void ExpectMaskIsWhatAdvances(const speculation::TokenConstraint& constraint) {
  const std::vector<int32_t> allowed = AllowedIds(constraint);
  for (int32_t id = 0; id < kVocab; ++id) {
    std::unique_ptr<speculation::TokenConstraint> copy = constraint.Clone();
    const bool in_mask = std::find(allowed.begin(), allowed.end(), id) != allowed.end();
    EXPECT_EQ(copy->Advance(id), in_mask) << "token " << id;
  }
}

TEST(FramedJsonConstraintTest, PrefixDocumentSuffixThenEnd) {
  const auto object =
      std::make_shared<const text::JsonConstraint>(text::JsonConstraint::AnyJsonObject());
  JsonTokenConstraint constraint(object, Vocabulary(), {kOpen, kNewline}, {kNewline, kCloseTag});
  const std::vector<std::pair<int32_t, std::vector<int32_t>>> walk = {
      {kOpen, {kOpen}},            // the control token first, nothing else
      {kNewline, {kNewline}},      // the rest of the prefix
      {kEmpty, {kBrace, kEmpty}},  // the document: no end, no suffix yet
      {kNewline, {kNewline}},      // complete: only the suffix may follow, not the end
      {kCloseTag, {kCloseTag}},    // the suffix's control token
      {kEnd, {kEnd}},              // then the end
  };
  for (const auto& [token, expected] : walk) {
    EXPECT_EQ(AllowedIds(constraint), expected) << "before token " << token;
    ExpectMaskIsWhatAdvances(constraint);
    ASSERT_TRUE(constraint.Advance(token)) << token;
  }
  EXPECT_TRUE(AllowedIds(constraint).empty());
  EXPECT_FALSE(constraint.Advance(kEnd));
}

TEST(FramedJsonConstraintTest, ClonesAreIndependentAndTheDocumentMaySpanTokens) {
  const auto object =
      std::make_shared<const text::JsonConstraint>(text::JsonConstraint::AnyJsonObject());
  JsonTokenConstraint constraint(object, Vocabulary(), {kOpen}, {kCloseTag});
  ASSERT_TRUE(constraint.Advance(kOpen));
  ASSERT_TRUE(constraint.Advance(kBrace));
  std::unique_ptr<speculation::TokenConstraint> branch = constraint.Clone();
  ASSERT_TRUE(branch->Advance(kClose));
  EXPECT_EQ(AllowedIds(*branch), std::vector<int32_t>({kCloseTag}));
  ExpectMaskIsWhatAdvances(*branch);
  // The original still stands inside the object.
  EXPECT_EQ(AllowedIds(constraint), std::vector<int32_t>({kClose, kNewline}));
  ExpectMaskIsWhatAdvances(constraint);
  EXPECT_FALSE(constraint.Advance(kCloseTag));
}

TEST(FramedJsonConstraintTest, WithoutAFrameTheDocumentEndsAlone) {
  const auto object =
      std::make_shared<const text::JsonConstraint>(text::JsonConstraint::AnyJsonObject());
  JsonTokenConstraint constraint(object, Vocabulary());
  EXPECT_EQ(AllowedIds(constraint), std::vector<int32_t>({kBrace, kEmpty}));
  ASSERT_TRUE(constraint.Advance(kEmpty));
  EXPECT_EQ(AllowedIds(constraint), std::vector<int32_t>({kEnd}));
  ExpectMaskIsWhatAdvances(constraint);
}

}  // namespace
}  // namespace bitsplit::drafter
