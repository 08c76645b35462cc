// Speculative decoding in process (common/speculation/session.h): the walk, the tree growth, and
// the losslessness invariant of docs/design.md §3 on the real SmolLM2 split model — speculative
// output equals plain decoding (one verifier token at a time, sampled at the token's index) for
// every tree shape and sampling setting.
#include <algorithm>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/llama_model.h"
#include "common/model/sampler.h"
#include "common/speculation/cpu_session.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/paths.h"
#include "tests/testing/speculation_runs.h"
#include "tests/testing/split_fixture.h"

namespace bitsplit::speculation {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kThreads = 2;

TEST(WalkTreeTest, DescendsWhileTheTargetPicksAChild) {
  // root(10) -> a(11) -> c(13)
  //          -> b(12) -> d(14)
  const std::vector<int32_t> tokens = {10, 11, 12, 13, 14};
  const std::vector<int32_t> parents = {-1, 0, 0, 1, 2};
  // The target picks 12 after the root (node b), then 14 after b (node d), then 99 after d.
  const std::vector<int32_t> targets = {12, 0, 14, 0, 99};
  const WalkResult walk = WalkTree(tokens, parents, targets);
  EXPECT_THAT(walk.path, ElementsAre(0, 2, 4));
  EXPECT_THAT(walk.tokens, ElementsAre(12, 14, 99));
}

TEST(WalkTreeTest, RejectingTheFirstLevelEmitsOnlyTheBonusToken) {
  const std::vector<int32_t> tokens = {10, 11, 12};
  const std::vector<int32_t> parents = {-1, 0, 0};
  const WalkResult walk = WalkTree(tokens, parents, std::vector<int32_t>{7, 1, 2});
  EXPECT_THAT(walk.path, ElementsAre(0));
  EXPECT_THAT(walk.tokens, ElementsAre(7));
}

TEST(WalkTreeTest, ATokenOfANonChildDoesNotCount) {
  // Node 2 carries the target's token but hangs below node 1, not the root.
  const std::vector<int32_t> tokens = {10, 11, 12};
  const std::vector<int32_t> parents = {-1, 0, 1};
  const WalkResult walk = WalkTree(tokens, parents, std::vector<int32_t>{12, 5, 6});
  EXPECT_THAT(walk.path, ElementsAre(0));
  EXPECT_THAT(walk.tokens, ElementsAre(12));
}

TEST(TreeShapeTest, RejectsMalformedShapesAndMeasuresDepths) {
  EXPECT_TRUE(ValidateTreeShape({.nodes = 0, .expansions = 0, .max_depth = 0}, 64).ok());
  EXPECT_THAT(ValidateTreeShape({.nodes = 65, .expansions = 4, .max_depth = 8}, 64).message(),
              HasSubstr("[0, 64]"));
  EXPECT_THAT(ValidateTreeShape({.nodes = -1, .expansions = 4, .max_depth = 8}, 64).message(),
              HasSubstr("nodes"));
  EXPECT_THAT(ValidateTreeShape({.nodes = 8, .expansions = 0, .max_depth = 8}, 64).message(),
              HasSubstr("expansions"));
  EXPECT_THAT(ValidateTreeShape({.nodes = 8, .expansions = 2, .max_depth = 0}, 64).message(),
              HasSubstr("depth"));
  EXPECT_THAT(TreeDepths(std::vector<int32_t>{-1, 0, 0, 1, 3}), ElementsAre(0, 1, 1, 2, 3));
}

// Prompts as token ids from the oracle fixture (tokenized by llama.cpp), cut to a short prefix.
std::vector<std::vector<int32_t>> OraclePrompts(size_t max_tokens) {
  std::ifstream in(std::string(BITSPLIT_SOURCE_DIR) +
                   "/tests/fixtures/oracle/smollm2_f32_logits.json");
  const nlohmann::json fixture = nlohmann::json::parse(in);
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& c : fixture["cases"]) {
    std::vector<int32_t> tokens = c["tokens"].get<std::vector<int32_t>>();
    if (tokens.size() > max_tokens) tokens.resize(max_tokens);
    prompts.push_back(std::move(tokens));
  }
  return prompts;
}

class SpeculationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const testing::SplitModelPaths& paths = testing::SmolLm2SplitModel();
    auto model = model::LlamaModel::LoadSplit(paths.base, paths.residual, kThreads);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = model->release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }

  static std::vector<int32_t> PlainDecode(const std::vector<int32_t>& prompt,
                                          const model::SamplingParams& sampling, int count) {
    return testing::PlainDecode(*model_, prompt, sampling, count);
  }
  static testing::SpecRun SpeculativeDecode(const std::vector<int32_t>& prompt,
                                            const model::SamplingParams& sampling, int count,
                                            const TreeShape& shape, model::ForwardMode draft_mode,
                                            DraftKv draft_kv = DraftKv::kShared) {
    return testing::SpeculativeDecode(*model_, prompt, sampling, count, shape, draft_mode,
                                      draft_kv);
  }

  static model::LlamaModel* model_;
};
model::LlamaModel* SpeculationTest::model_ = nullptr;

const TreeShape kTree16 = {.nodes = 16, .expansions = 4, .max_depth = 8};
const TreeShape kChain8 = {.nodes = 8, .expansions = 1, .max_depth = 8};
const TreeShape kOff = {.nodes = 0, .expansions = 1, .max_depth = 1};

// Each step grows the tree its shape asks for (checked node by node), verifies it and commits
// the accepted path: the root and the accepted nodes' tokens, in order.
TEST_F(SpeculationTest, StepsGrowTheRequestedTreeAndCommitTheAcceptedPath) {
  const std::vector<int32_t> prompt = OraclePrompts(24)[2];
  auto session = *CpuSpeculativeSession::Create(*model_, model::ForwardMode::kVerify, *model_,
                                                model::ForwardMode::kDraft, {.capacity = 128});
  ASSERT_TRUE(
      PrefillInChunks(*session, std::span<const int32_t>(prompt).first(prompt.size() - 1), 8).ok());
  ASSERT_EQ(session->committed_length(), static_cast<int64_t>(prompt.size() - 1));
  int32_t root = prompt.back();
  // Depth cap 2 with 3 children per node holds at most 3 + 9 nodes: exactly 12 asked for.
  for (const TreeShape& shape :
       {kTree16, kChain8, TreeShape{.nodes = 12, .expansions = 3, .max_depth = 2}}) {
    SessionStep step{.root = root, .shape = shape};
    const int64_t length = session->committed_length();
    ASSERT_TRUE(session->Step(step).ok()) << step.status;
    const DraftTree& tree = step.tree;
    ASSERT_EQ(tree.size(), shape.nodes + 1);
    EXPECT_EQ(tree.tokens[0], root);
    EXPECT_EQ(tree.parents[0], -1);
    std::vector<int32_t> depth(static_cast<size_t>(tree.size()), 0);
    for (int32_t i = 1; i < tree.size(); ++i) {
      ASSERT_TRUE(tree.parents[i] >= 0 && tree.parents[i] < i) << "node " << i;
      depth[i] = depth[tree.parents[i]] + 1;
      EXPECT_LE(depth[i], shape.max_depth);
      EXPECT_TRUE(tree.tokens[i] >= 0 && tree.tokens[i] < model_->config().vocab_size);
      // Cumulative log-probabilities fall along every path, and siblings carry distinct tokens.
      EXPECT_LE(tree.logprobs[i], tree.logprobs[tree.parents[i]]);
      for (int32_t j = 1; j < i; ++j) {
        if (tree.parents[j] == tree.parents[i]) {
          EXPECT_NE(tree.tokens[j], tree.tokens[i]);
        }
      }
    }
    if (shape.expansions == 1) {
      for (int32_t i = 1; i < tree.size(); ++i) EXPECT_EQ(tree.parents[i], i - 1);
      EXPECT_EQ(tree.draft_forwards, shape.nodes);  // the last node is never run
    }
    // The committed tokens are the path's nodes: the root, then each accepted child.
    ASSERT_EQ(step.choices.size(), static_cast<size_t>(tree.size()));
    ASSERT_FALSE(step.walk.path.empty());
    EXPECT_EQ(step.walk.path[0], 0);
    EXPECT_EQ(session->committed_length(), length + static_cast<int64_t>(step.walk.path.size()));
    const std::span<const int32_t> committed =
        session->committed_tokens().last(step.walk.path.size());
    for (size_t i = 0; i < step.walk.path.size(); ++i) {
      EXPECT_EQ(committed[i], tree.tokens[static_cast<size_t>(step.walk.path[i])]);
      if (i > 0) {
        EXPECT_EQ(tree.parents[static_cast<size_t>(step.walk.path[i])], step.walk.path[i - 1]);
      }
    }
    root = step.walk.tokens.back();
  }
}

// With the verifier itself as the drafter, greedy drafts are the target's own choices, so a
// chain is accepted whole: every verify emits nodes + 1 tokens. This holds only if the draft
// forwards (grown over several forwards on pending KV) give bit-identical logits to the verify
// forward and the commit keeps the right KV.
TEST_F(SpeculationTest, APerfectDrafterHasItsChainsAcceptedWhole) {
  for (const std::vector<int32_t>& prompt : OraclePrompts(32)) {
    const testing::SpecRun run =
        SpeculativeDecode(prompt, {}, 27, kChain8, model::ForwardMode::kVerify);
    EXPECT_EQ(run.verify_steps, 3);
    EXPECT_EQ(run.tokens, PlainDecode(prompt, {}, 27));
  }
}

// The invariant, for the real 2-bit drafter, a perfect drafter (deep acceptance), and the draft's
// own KV: every shape, greedy and sampled, equals plain decoding token for token.
TEST_F(SpeculationTest, SpeculativeOutputEqualsPlainDecoding) {
  const std::vector<std::vector<int32_t>> prompts = OraclePrompts(24);
  const model::SamplingParams samplings[] = {{},
                                             {.temperature = 0.8f, .seed = 1},
                                             {.temperature = 0.8f, .top_k = 40, .seed = 2},
                                             {.temperature = 0.8f, .top_p = 0.9f, .seed = 3}};
  constexpr int kTokens = 16;
  int accepted_beyond_root = 0;
  for (size_t p = 0; p < prompts.size(); p += 2) {
    for (const model::SamplingParams& sampling : samplings) {
      const std::vector<int32_t> expected = PlainDecode(prompts[p], sampling, kTokens);
      for (const TreeShape& shape : {kTree16, kChain8, kOff}) {
        for (model::ForwardMode draft : {model::ForwardMode::kDraft, model::ForwardMode::kVerify}) {
          if (shape.nodes == 0 && draft == model::ForwardMode::kVerify) continue;
          const testing::SpecRun run =
              SpeculativeDecode(prompts[p], sampling, kTokens, shape, draft);
          EXPECT_EQ(run.tokens, expected)
              << "prompt " << p << " T=" << sampling.temperature << " seed " << sampling.seed
              << " nodes " << shape.nodes << " k " << shape.expansions << " draft "
              << model::ForwardModeName(draft);
          if (draft == model::ForwardMode::kVerify)
            accepted_beyond_root += kTokens - run.verify_steps;
        }
      }
    }
  }
  // The perfect drafter must actually have exercised multi-token acceptance.
  EXPECT_GT(accepted_beyond_root, 100);
}

// The KV cache's type changes the verifier's outputs (its rows are rounded), not losslessness:
// the draft and the verifier read the same rows, and the plain decoder reads rows of that type.
TEST_F(SpeculationTest, EncodedKvCachesAreLossless) {
  const std::vector<int32_t> prompt = OraclePrompts(24)[5];
  constexpr int kTokens = 16;
  for (const model::KvType kv_type : {model::KvType::kF16, model::KvType::kQ8_0}) {
    for (const model::SamplingParams& sampling :
         {model::SamplingParams{}, model::SamplingParams{.temperature = 0.8f, .seed = 4}}) {
      const std::vector<int32_t> expected =
          testing::PlainDecode(*model_, prompt, sampling, kTokens, kv_type);
      for (const TreeShape& shape : {kTree16, kChain8}) {
        for (model::ForwardMode draft : {model::ForwardMode::kDraft, model::ForwardMode::kVerify}) {
          EXPECT_EQ(testing::SpeculativeDecode(*model_, prompt, sampling, kTokens, shape, draft,
                                               DraftKv::kShared, nullptr, kv_type)
                        .tokens,
                    expected)
              << model::KvTypeName(kv_type) << " T=" << sampling.temperature << " nodes "
              << shape.nodes << " draft " << model::ForwardModeName(draft);
        }
      }
    }
  }
}

// Runs `session` from its committed tokens: prefills prompt[committed, n-1) in chunks of `chunk`,
// then speculation steps from prompt's last token until at least `count` tokens are emitted; all
// of them (the last step may emit beyond `count`).
std::vector<int32_t> Continue(CpuSpeculativeSession& session, const std::vector<int32_t>& prompt,
                              int64_t chunk, const model::SamplingParams& sampling, int count) {
  const std::span<const int32_t> rest = std::span<const int32_t>(prompt).subspan(
      static_cast<size_t>(session.committed_length()),
      prompt.size() - 1 - static_cast<size_t>(session.committed_length()));
  const absl::Status prefilled = PrefillInChunks(session, rest, chunk);
  EXPECT_TRUE(prefilled.ok()) << prefilled;
  std::vector<int32_t> tokens;
  int32_t root = prompt.back();
  while (static_cast<int>(tokens.size()) < count) {
    SessionStep step{.root = root, .shape = kTree16, .sampling = sampling};
    const absl::Status stepped = session.Step(step);
    EXPECT_TRUE(stepped.ok()) << stepped;
    if (!stepped.ok()) break;
    tokens.insert(tokens.end(), step.walk.tokens.begin(), step.walk.tokens.end());
    root = step.walk.tokens.back();
  }
  return tokens;
}

std::vector<int32_t> First(std::vector<int32_t> tokens, int count) {
  tokens.resize(static_cast<size_t>(count));
  return tokens;
}

// The prefix cache's premise: a session that served one request (a chunked prefill, then
// speculation steps committing tree paths), cut back to a prefix and grown for a longer request,
// holds exactly the KV rows a fresh prefill of that prefix writes, byte for byte, and continues
// exactly as a fresh session does.
TEST_F(SpeculationTest, AReusedSessionEqualsAFreshOne) {
  const std::vector<std::vector<int32_t>> prompts = OraclePrompts(24);
  constexpr int kTokens = 12;
  for (const model::KvType kv_type : {model::KvType::kF16, model::KvType::kQ8_0}) {
    for (const model::SamplingParams& sampling :
         {model::SamplingParams{}, model::SamplingParams{.temperature = 0.8f, .seed = 5}}) {
      SCOPED_TRACE(
          absl::StrCat(std::string(model::KvTypeName(kv_type)), " T=", sampling.temperature));
      const std::vector<int32_t>& first = prompts[1];
      auto used = *CpuSpeculativeSession::Create(
          *model_, model::ForwardMode::kVerify, *model_, model::ForwardMode::kDraft,
          {.capacity = static_cast<int64_t>(first.size()) + kTokens + 17, .kv_type = kv_type});
      const std::vector<int32_t> answer = Continue(*used, first, 7, sampling, kTokens);
      // The next turn: the first prompt, its answer, then another prompt's tokens.
      std::vector<int32_t> next = first;
      next.insert(next.end(), answer.begin(), answer.end());
      next.insert(next.end(), prompts[3].begin(), prompts[3].end());
      const std::span<const int32_t> committed = used->committed_tokens();
      ASSERT_TRUE(std::equal(committed.begin(), committed.end(), next.begin()));
      const int64_t capacity = static_cast<int64_t>(next.size()) + kTokens + 17;
      for (const int64_t kept : {used->committed_length(), int64_t{5}}) {
        SCOPED_TRACE(absl::StrCat("kept ", kept));
        ASSERT_TRUE(used->Reuse(kept, capacity).ok());
        EXPECT_EQ(used->committed_length(), kept);
        EXPECT_EQ(used->capacity(), capacity);
        auto fresh = *CpuSpeculativeSession::Create(*model_, model::ForwardMode::kVerify, *model_,
                                                    model::ForwardMode::kDraft,
                                                    {.capacity = capacity, .kv_type = kv_type});
        const absl::Status prefilled = PrefillInChunks(
            *fresh, std::span<const int32_t>(next).first(static_cast<size_t>(kept)), 5);
        ASSERT_TRUE(prefilled.ok()) << prefilled;
        const model::KvCache& a = used->target_cache();
        const model::KvCache& b = fresh->target_cache();
        for (int64_t layer = 0; layer < a.num_layers(); ++layer) {
          const size_t bytes = static_cast<size_t>(kept * a.row_bytes(layer));
          EXPECT_EQ(std::memcmp(a.keys(layer).data, b.keys(layer).data, bytes), 0) << layer;
          EXPECT_EQ(std::memcmp(a.values(layer).data, b.values(layer).data, bytes), 0) << layer;
        }
        EXPECT_TRUE(std::equal(a.positions(), a.positions() + kept, b.positions()));
        const std::vector<int32_t> expected =
            First(Continue(*fresh, next, 6, sampling, kTokens), kTokens);
        EXPECT_EQ(First(Continue(*used, next, 6, sampling, kTokens), kTokens), expected);
        EXPECT_EQ(expected, testing::PlainDecode(*model_, next, sampling, kTokens, kv_type));
        // Back to the kept prefix for the next case.
        ASSERT_TRUE(used->Reuse(kept, capacity).ok());
      }
    }
  }
}

// A constraint whose allowed set changes with every token: after n tokens, the ids t with
// (t + 5n) % 3 == 0. Three of every nine ids, never the same three twice in a row.
class RotatingThirds final : public TokenConstraint {
 public:
  explicit RotatingThirds(int64_t vocab) : vocab_(vocab) {}
  std::unique_ptr<TokenConstraint> Clone() const override {
    return std::make_unique<RotatingThirds>(*this);
  }
  void Allowed(std::vector<uint64_t>& mask) const override {
    mask.assign(static_cast<size_t>((vocab_ + 63) / 64), 0);
    for (int64_t t = 0; t < vocab_; ++t) {
      if (Allows(t)) mask[static_cast<size_t>(t / 64)] |= uint64_t{1} << (t % 64);
    }
  }
  bool Advance(int32_t token) override {
    if (token < 0 || token >= vocab_ || !Allows(token)) return false;
    ++count_;
    return true;
  }

 private:
  bool Allows(int64_t token) const { return (token + 5 * count_) % 3 == 0; }
  int64_t vocab_;
  int64_t count_ = 0;
};

// Constrained decoding through speculation: the target samples every tree node from its masked
// distribution (the mask of the node's own path), so the tokens equal plain constrained
// decoding's, greedy and sampled, for trees and chains; every token obeys the constraint.
TEST_F(SpeculationTest, ConstrainedSpeculationEqualsConstrainedPlainDecoding) {
  const std::vector<std::vector<int32_t>> prompts = OraclePrompts(24);
  const int64_t vocab = model_->config().vocab_size;
  constexpr int kTokens = 16;
  for (size_t p : {size_t{4}}) {
    for (const model::SamplingParams& sampling :
         {model::SamplingParams{}, model::SamplingParams{.temperature = 0.8f, .seed = 9},
          model::SamplingParams{.temperature = 0.7f, .top_k = 20, .top_p = 0.9f, .seed = 3}}) {
      RotatingThirds plain_constraint(vocab);
      const std::vector<int32_t> expected = testing::PlainDecode(
          *model_, prompts[p], sampling, kTokens, model::KvType::kF32, &plain_constraint);
      RotatingThirds check(vocab);
      for (int32_t token : expected) EXPECT_TRUE(check.Advance(token));
      EXPECT_NE(expected, PlainDecode(prompts[p], sampling, kTokens));  // the mask mattered
      for (const TreeShape& shape : {kTree16, kChain8, kOff}) {
        for (model::ForwardMode draft : {model::ForwardMode::kDraft, model::ForwardMode::kVerify}) {
          if (shape.nodes == 0 && draft == model::ForwardMode::kVerify) continue;
          RotatingThirds constraint(vocab);
          const testing::SpecRun run = testing::SpeculativeDecode(
              *model_, prompts[p], sampling, kTokens, shape, draft, DraftKv::kShared, nullptr,
              model::KvType::kF32, &constraint);
          EXPECT_EQ(run.tokens, expected)
              << "prompt " << p << " T=" << sampling.temperature << " nodes " << shape.nodes
              << " draft " << model::ForwardModeName(draft);
          // The draft proposes from masked rows: every drafted node is on an allowed path.
          EXPECT_EQ(run.forbidden_drafts, 0) << "of " << run.drafted_nodes;
          if (shape.nodes > 0) {
            EXPECT_GT(run.drafted_nodes, 0);
          }
        }
      }
    }
  }
}

TEST(NodeMasksTest, EachNodeSeesItsOwnPath) {
  // The root (its token is not advanced past: the constraint is its state already), children
  // 0 (allowed) and 1 (not), and under 0 the children 4 (allowed after one token) and 5 (not).
  RotatingThirds root(12);
  const std::vector<int32_t> tokens = {7, 0, 1, 4, 5};
  const std::vector<int32_t> parents = {-1, 0, 0, 1, 1};
  const auto masks = NodeMasks(root, tokens, parents);
  ASSERT_EQ(masks.size(), 5u);
  EXPECT_EQ(masks[0], std::vector<uint64_t>{0b001001001001});  // n = 0: 0, 3, 6, 9
  EXPECT_EQ(masks[1], std::vector<uint64_t>{0b010010010010});  // n = 1: 1, 4, 7, 10
  EXPECT_TRUE(masks[2].empty());
  EXPECT_EQ(masks[3], std::vector<uint64_t>{0b100100100100});  // n = 2: 2, 5, 8, 11
  EXPECT_TRUE(masks[4].empty());
}

// Allows token 1 once, then nothing: an end token's state.
class OneTokenThenEnd final : public TokenConstraint {
 public:
  std::unique_ptr<TokenConstraint> Clone() const override {
    return std::make_unique<OneTokenThenEnd>(*this);
  }
  void Allowed(std::vector<uint64_t>& mask) const override {
    mask.assign(1, ended_ ? 0 : uint64_t{1} << 1);
  }
  bool Advance(int32_t token) override {
    if (ended_ || token != 1) return false;
    ended_ = true;
    return true;
  }

 private:
  bool ended_ = false;
};

// A node after which the constraint allows nothing has no mask (nothing is chosen after an end),
// like a node on a forbidden path; the tracker grown node by node gives the same masks.
TEST(NodeMasksTest, AnEndedStateHasNoMask) {
  const OneTokenThenEnd root;
  const std::vector<int32_t> tokens = {9, 1, 1, 2};
  const std::vector<int32_t> parents = {-1, 0, 1, 0};
  const auto masks = NodeMasks(root, tokens, parents);
  ASSERT_EQ(masks.size(), 4u);
  EXPECT_EQ(masks[0], std::vector<uint64_t>{0b10});
  EXPECT_TRUE(masks[1].empty());  // ended
  EXPECT_TRUE(masks[2].empty());  // forbidden below an end
  EXPECT_TRUE(masks[3].empty());  // forbidden
  NodeMaskTracker tracker(root);
  for (size_t n = 1; n <= tokens.size(); ++n) {
    tracker.Extend(std::span(tokens).first(n), std::span(parents).first(n));
  }
  EXPECT_EQ(tracker.masks(), masks);
}

TEST_F(SpeculationTest, ReuseChecksItsArguments) {
  auto session = *CpuSpeculativeSession::Create(*model_, model::ForwardMode::kVerify, *model_,
                                                model::ForwardMode::kDraft, {.capacity = 32});
  const std::vector<int32_t> prompt = OraclePrompts(8)[0];
  ASSERT_TRUE(PrefillInChunks(*session, std::span<const int32_t>(prompt), 8).ok());
  const int64_t length = session->committed_length();
  EXPECT_EQ(session->Reuse(length + 1, 64).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(session->Reuse(-1, 64).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(session->Reuse(4, 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(session->Reuse(4, model_->config().context_length + 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(session->committed_length(), length);  // refusals change nothing
  ASSERT_TRUE(session->Reuse(4, 16).ok());         // smaller than the cache: the storage is kept
  EXPECT_EQ(session->capacity(), 16);
  EXPECT_EQ(session->target_cache().capacity(), 32);
  EXPECT_EQ(session->committed_tokens().size(), 4u);
}

// A 128-node tree of depth up to 16 (twice the default depth cap, more rows than a 64-row
// residual request): lossless greedy and sampled; with the verifier as a perfect drafter greedy
// steps accept several tokens (best-first growth spends nodes on likely siblings too, so the
// accepted path is shorter than 16; measured: 20 greedy tokens in 4 steps).
TEST_F(SpeculationTest, DeepTreesOf128NodesAreLossless) {
  const TreeShape deep = {.nodes = 128, .expansions = 8, .max_depth = 16};
  const std::vector<int32_t> prompt = OraclePrompts(24)[1];
  constexpr int kTokens = 16;
  for (const model::SamplingParams& sampling :
       {model::SamplingParams{}, model::SamplingParams{.temperature = 0.8f, .seed = 11}}) {
    const std::vector<int32_t> expected = PlainDecode(prompt, sampling, kTokens);
    EXPECT_EQ(SpeculativeDecode(prompt, sampling, kTokens, deep, model::ForwardMode::kDraft).tokens,
              expected)
        << "T=" << sampling.temperature;
    const testing::SpecRun perfect =
        SpeculativeDecode(prompt, sampling, kTokens, deep, model::ForwardMode::kVerify);
    EXPECT_EQ(perfect.tokens, expected) << "T=" << sampling.temperature;
    if (sampling.temperature == 0.0f) {
      EXPECT_LT(perfect.verify_steps, kTokens / 2);  // more than 2 tokens per step
    }
  }
}

TEST_F(SpeculationTest, OwnDraftKvIsLosslessToo) {
  const std::vector<int32_t> prompt = OraclePrompts(24)[3];
  for (const model::SamplingParams& sampling :
       {model::SamplingParams{}, model::SamplingParams{.temperature = 0.8f, .seed = 7}}) {
    const std::vector<int32_t> expected = PlainDecode(prompt, sampling, 20);
    EXPECT_EQ(
        SpeculativeDecode(prompt, sampling, 20, kTree16, model::ForwardMode::kDraft, DraftKv::kOwn)
            .tokens,
        expected);
    const testing::SpecRun perfect = SpeculativeDecode(prompt, sampling, 20, kChain8,
                                                       model::ForwardMode::kVerify, DraftKv::kOwn);
    EXPECT_EQ(perfect.tokens, expected);
  }
}

// The ablation of a separate draft model: the split model's source GGUF in reference mode, which
// agrees with the verifier almost always, so that multi-token paths are accepted and committed;
// reading the verifier's KV or computing its own.
TEST_F(SpeculationTest, SeparateDraftModelIsLosslessWithSharedAndOwnKv) {
  auto source = model::LlamaModel::Load(testing::ModelPath(testing::kSmolLm2File), kThreads);
  ASSERT_TRUE(source.ok()) << source.status();
  const std::vector<int32_t> prompt = OraclePrompts(24)[0];
  constexpr int kTokens = 16;
  const std::vector<int32_t> expected = PlainDecode(prompt, {}, kTokens);
  for (const DraftKv kv : {DraftKv::kShared, DraftKv::kOwn}) {
    SCOPED_TRACE(kv == DraftKv::kShared ? "shared KV" : "own KV");
    const testing::SpecRun run = testing::SpeculativeDecode(
        *model_, prompt, {}, kTokens, kTree16, model::ForwardMode::kReference, kv, source->get());
    EXPECT_EQ(run.tokens, expected);
    EXPECT_LT(run.verify_steps, kTokens) << "no drafted token was accepted";
  }
}

TEST_F(SpeculationTest, BadStepsAreRejectedAndChangeNothing) {
  const std::vector<int32_t> prompt = OraclePrompts(16)[1];
  auto session = *CpuSpeculativeSession::Create(*model_, model::ForwardMode::kVerify, *model_,
                                                model::ForwardMode::kDraft, {.capacity = 40});
  ASSERT_TRUE(PrefillInChunks(*session, prompt, 64).ok());
  const int64_t length = session->committed_length();
  const std::vector<int32_t> tokens(session->committed_tokens().begin(),
                                    session->committed_tokens().end());
  const int32_t vocab = static_cast<int32_t>(model_->config().vocab_size);
  auto code = [&](SessionStep step) {
    (void)session->Step(step);
    return step.status.code();
  };
  using Code = absl::StatusCode;
  EXPECT_EQ(code({.prefill = {1, -3}}), Code::kInvalidArgument);
  EXPECT_EQ(code({.prefill = {1, vocab}}), Code::kInvalidArgument);
  EXPECT_EQ(code({.prefill = std::vector<int32_t>(30, 5)}), Code::kResourceExhausted);
  EXPECT_EQ(code({.root = 1, .shape = {.nodes = 30, .expansions = 4, .max_depth = 8}}),
            Code::kResourceExhausted);
  EXPECT_EQ(code({.root = -1, .shape = kChain8}), Code::kInvalidArgument);
  EXPECT_EQ(code({.root = vocab, .shape = kOff}), Code::kInvalidArgument);
  EXPECT_EQ(code({.root = 1, .shape = {.nodes = 4, .expansions = 0, .max_depth = 8}}),
            Code::kInvalidArgument);
  EXPECT_EQ(code({.root = 1, .shape = {.nodes = 4, .expansions = 2, .max_depth = 0}}),
            Code::kInvalidArgument);
  EXPECT_EQ(code({.root = 1, .shape = kOff, .sampling = {.temperature = -1.0f}}),
            Code::kInvalidArgument);
  EXPECT_EQ(code({.root = 1, .shape = kOff, .top_logprobs = -1}), Code::kInvalidArgument);
  EXPECT_EQ(session->committed_length(), length);
  EXPECT_TRUE(std::equal(tokens.begin(), tokens.end(), session->committed_tokens().begin()));

  // Log-probabilities: greedy picks the most likely token, and the top list starts with it.
  SessionStep step{.root = 1, .shape = kOff, .top_logprobs = 3, .with_logprobs = true};
  ASSERT_TRUE(session->Step(step).ok()) << step.status;
  ASSERT_EQ(step.choices.size(), 1u);
  const TargetChoice& choice = step.choices[0];
  EXPECT_EQ(choice.top_ids.size(), 3u);
  EXPECT_EQ(choice.top_ids[0], choice.token);
  EXPECT_FLOAT_EQ(choice.top_logprobs[0], choice.logprob);
  EXPECT_LE(choice.logprob, 0.0f);
  EXPECT_GE(choice.top_logprobs[0], choice.top_logprobs[1]);
  EXPECT_GE(choice.top_logprobs[1], choice.top_logprobs[2]);
  EXPECT_EQ(session->committed_length(), length + 1);
  EXPECT_THAT(session->committed_tokens().last(1), ElementsAre(1));
  // A session one token short of its capacity takes the root alone: a tree no longer fits.
  ASSERT_TRUE(PrefillInChunks(*session, std::vector<int32_t>(40 - length - 2, 5), 64).ok());
  EXPECT_EQ(code({.root = 1, .shape = {.nodes = 1, .expansions = 1, .max_depth = 1}}),
            Code::kResourceExhausted);
  EXPECT_EQ(code({.root = 1, .shape = kOff}), Code::kOk);
  EXPECT_EQ(session->committed_length(), 40);
  EXPECT_EQ(code({.root = 1, .shape = kOff}), Code::kResourceExhausted);
}

// Continuous batching, at the forward: sequences run together (a causal prefill chunk, a
// draft-tree batch, a decode row, each on its own cache) give every sequence the logits and K/V
// its Forward alone gives, bit for bit.
TEST_F(SpeculationTest, SequencesForwardedTogetherEqualEachForwardedAlone) {
  const std::vector<std::vector<int32_t>> prompts = OraclePrompts(24);
  const int64_t vocab = model_->config().vocab_size;
  constexpr int kSequences = 3;
  std::vector<model::KvCache> together, alone;
  std::vector<model::Batch> batches;
  for (int s = 0; s < kSequences; ++s) {
    together.push_back(*model_->NewKvCache(64, model::KvType::kF16));
    alone.push_back(*model_->NewKvCache(64, model::KvType::kF16));
    // A committed prefix of s * 5 tokens first, the same in both caches.
    const std::vector<int32_t> prefix(prompts[s].begin(), prompts[s].begin() + 5 * s);
    if (!prefix.empty()) {
      std::vector<float> ignored(static_cast<size_t>(prefix.size() * vocab));
      for (model::KvCache* cache : {&together.back(), &alone.back()}) {
        ASSERT_TRUE(model_->Forward(model::Batch::Causal(prefix, 0), *cache, ignored).ok());
        ASSERT_TRUE(cache->Commit(static_cast<int64_t>(prefix.size())).ok());
      }
    }
  }
  batches.push_back(
      model::Batch::Causal(std::vector<int32_t>(prompts[0].begin(), prompts[0].end()), 0));
  batches.back().logit_rows = {static_cast<int32_t>(prompts[0].size() - 1)};
  batches.push_back(*model::Batch::Tree(std::vector<int32_t>{11, 12, 13, 14},
                                        std::vector<int32_t>{-1, 0, 0, 1}, 5));
  batches.push_back(model::Batch::Causal(std::vector<int32_t>{prompts[2][10]}, 10));
  std::vector<std::vector<float>> logits_together(kSequences), logits_alone(kSequences);
  std::vector<model::SequenceForward> forwards;
  for (int s = 0; s < kSequences; ++s) {
    const size_t size = static_cast<size_t>(batches[s].num_logit_rows() * vocab);
    logits_together[s].resize(size);
    logits_alone[s].resize(size);
    forwards.push_back({.batch = &batches[s], .cache = &together[s], .logits = logits_together[s]});
  }
  ASSERT_TRUE(model_->ForwardSequences(forwards, model::ForwardMode::kVerify).ok());
  for (int s = 0; s < kSequences; ++s) {
    ASSERT_TRUE(
        model_->Forward(batches[s], alone[s], logits_alone[s], model::ForwardMode::kVerify).ok());
    EXPECT_EQ(logits_together[s], logits_alone[s]) << "sequence " << s;
    const int64_t first = alone[s].committed_length();
    for (int64_t layer = 0; layer < model_->config().num_layers; ++layer) {
      const int64_t row_bytes = alone[s].row_bytes(layer);
      const size_t n = static_cast<size_t>(batches[s].size() * row_bytes);
      const size_t at = static_cast<size_t>(first * row_bytes);
      EXPECT_EQ(std::memcmp(together[s].keys(layer).data + at, alone[s].keys(layer).data + at, n),
                0)
          << "sequence " << s << " layer " << layer;
      EXPECT_EQ(
          std::memcmp(together[s].values(layer).data + at, alone[s].values(layer).data + at, n), 0);
    }
  }
  // A cache twice, or a malformed sequence, is refused before anything runs.
  forwards[1].cache = &together[0];
  EXPECT_THAT(model_->ForwardSequences(forwards, model::ForwardMode::kVerify).message(),
              HasSubstr("share one KV cache"));
  forwards[1].cache = &together[1];
  model::Batch bad = batches[2];
  bad.tokens[0] = static_cast<int32_t>(vocab);
  forwards[2].batch = &bad;
  EXPECT_THAT(model_->ForwardSequences(forwards, model::ForwardMode::kVerify).message(),
              HasSubstr("sequence 2"));
}

// Continuous batching, at the session: generations with different settings stepped together
// by StepMany (one joining late with a prompt prefilled in chunks between the others' steps,
// one failing a step of its own) each emit exactly their plain decoding.
TEST_F(SpeculationTest, SessionsSteppedTogetherEqualPlainDecoding) {
  const std::vector<std::vector<int32_t>> prompts = OraclePrompts(24);
  struct Generation {
    std::vector<int32_t> prompt;
    model::SamplingParams sampling;
    TreeShape shape;
    int join_iteration = 0;
    std::unique_ptr<CpuSpeculativeSession> session;
    size_t prefilled = 0;
    int32_t root = 0;
    std::vector<int32_t> tokens;
  };
  constexpr int kTokens = 20;
  std::vector<Generation> generations(5);
  auto set = [&](size_t i, size_t prompt, model::SamplingParams sampling, TreeShape shape,
                 int join) {
    generations[i].prompt = prompts[prompt];
    generations[i].sampling = sampling;
    generations[i].shape = shape;
    generations[i].join_iteration = join;
  };
  set(0, 0, {}, kTree16, 0);
  set(1, 1, {.temperature = 0.8f, .seed = 5}, kChain8, 0);
  set(2, 2, {.temperature = 0.8f, .top_k = 40, .seed = 9}, kOff, 0);
  set(3, 3, {}, kTree16, 3);
  set(4, 4, {.temperature = 0.8f, .seed = 2}, kTree16, 1);
  for (Generation& g : generations) {
    g.session = *CpuSpeculativeSession::Create(*model_, model::ForwardMode::kVerify, *model_,
                                               model::ForwardMode::kDraft, {.capacity = 96});
    g.root = g.prompt.back();
  }
  constexpr size_t kPrefillChunk = 7;  // every prompt takes several iterations to prefill
  bool rejected = false;
  for (int iteration = 0; iteration < 200; ++iteration) {
    std::vector<CpuSpeculativeSession*> sessions;
    std::vector<SessionStep> steps;
    std::vector<Generation*> stepped;
    for (Generation& g : generations) {
      if (iteration < g.join_iteration || static_cast<int>(g.tokens.size()) >= kTokens) continue;
      SessionStep step;
      const size_t target = g.prompt.size() - 1;
      if (g.prefilled < target) {
        const size_t rows = std::min(kPrefillChunk, target - g.prefilled);
        step.prefill.assign(g.prompt.begin() + g.prefilled, g.prompt.begin() + g.prefilled + rows);
      } else {
        step.root = g.root;
        step.shape = g.shape;
        step.sampling = g.sampling;
      }
      sessions.push_back(g.session.get());
      steps.push_back(std::move(step));
      stepped.push_back(&g);
    }
    if (steps.empty()) break;
    // Once, generation 0's step asks for a root outside the vocabulary: it alone fails.
    const bool reject_now = !rejected && iteration == 4;
    int32_t kept_root = 0;
    if (reject_now) {
      ASSERT_TRUE(steps[0].prefill.empty());
      kept_root = steps[0].root;
      steps[0].root = static_cast<int32_t>(model_->config().vocab_size);
    }
    CpuSpeculativeSession::StepMany(sessions, steps);
    for (size_t i = 0; i < steps.size(); ++i) {
      Generation& g = *stepped[i];
      if (reject_now && i == 0) {
        EXPECT_EQ(steps[i].status.code(), absl::StatusCode::kInvalidArgument);
        g.root = kept_root;
        rejected = true;
        continue;
      }
      ASSERT_TRUE(steps[i].status.ok()) << steps[i].status;
      if (!steps[i].prefill.empty()) {
        g.prefilled += steps[i].prefill.size();
        continue;
      }
      EXPECT_EQ(steps[i].tree.size(), g.shape.nodes + 1);
      g.tokens.insert(g.tokens.end(), steps[i].walk.tokens.begin(), steps[i].walk.tokens.end());
      g.root = steps[i].walk.tokens.back();
    }
  }
  EXPECT_TRUE(rejected);
  for (size_t i = 0; i < generations.size(); ++i) {
    Generation& g = generations[i];
    ASSERT_GE(g.tokens.size(), static_cast<size_t>(kTokens)) << "generation " << i;
    g.tokens.resize(kTokens);
    EXPECT_EQ(g.tokens, PlainDecode(g.prompt, g.sampling, kTokens)) << "generation " << i;
  }
}

}  // namespace
}  // namespace bitsplit::speculation
