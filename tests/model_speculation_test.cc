// Speculative decoding in process (common/model/speculation.h): the walk, the tree growth, and
// the losslessness invariant of docs/design.md §3 on the real SmolLM2 split model — speculative
// output equals plain decoding (one verifier token at a time, sampled at the token's index) for
// every tree shape and sampling setting.
#include <algorithm>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/model/llama_model.h"
#include "common/model/sampler.h"
#include "common/model/speculation.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/paths.h"
#include "tests/testing/speculation_runs.h"
#include "tests/testing/split_fixture.h"

namespace bitsplit::model {
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

TEST(TreeValidationTest, RejectsMalformedTreesAndShapes) {
  EXPECT_THAT(ValidateTree({}, {}, 100, 64).message(), HasSubstr("empty"));
  EXPECT_THAT(ValidateTree(std::vector<int32_t>{1, 2}, std::vector<int32_t>{-1}, 100, 64).message(),
              HasSubstr("parents"));
  EXPECT_THAT(
      ValidateTree(std::vector<int32_t>{1, 2}, std::vector<int32_t>{0, 0}, 100, 64).message(),
      HasSubstr("parent"));
  EXPECT_THAT(
      ValidateTree(std::vector<int32_t>{1, 2}, std::vector<int32_t>{-1, 1}, 100, 64).message(),
      HasSubstr("precedes"));
  EXPECT_THAT(
      ValidateTree(std::vector<int32_t>{1, 200}, std::vector<int32_t>{-1, 0}, 100, 64).message(),
      HasSubstr("vocabulary"));
  EXPECT_THAT(
      ValidateTree(std::vector<int32_t>{1, 2, 3}, std::vector<int32_t>{-1, 0, 0}, 100, 2).message(),
      HasSubstr("at most 2"));
  EXPECT_TRUE(ValidateTree(std::vector<int32_t>{1, 2}, std::vector<int32_t>{-1, 0}, 100, 64).ok());

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
    auto model = LlamaModel::LoadSplit(paths.base, paths.residual, kThreads);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = model->release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }

  static std::vector<int32_t> PlainDecode(const std::vector<int32_t>& prompt,
                                          const SamplingParams& sampling, int count) {
    return testing::PlainDecode(*model_, prompt, sampling, count);
  }
  static testing::SpecRun SpeculativeDecode(const std::vector<int32_t>& prompt,
                                            const SamplingParams& sampling, int count,
                                            const TreeShape& shape, ForwardMode draft_mode,
                                            DraftKv draft_kv = DraftKv::kShared) {
    return testing::SpeculativeDecode(*model_, prompt, sampling, count, shape, draft_mode,
                                      draft_kv);
  }

  static LlamaModel* model_;
};
LlamaModel* SpeculationTest::model_ = nullptr;

const TreeShape kTree16 = {.nodes = 16, .expansions = 4, .max_depth = 8};
const TreeShape kChain8 = {.nodes = 8, .expansions = 1, .max_depth = 8};
const TreeShape kOff = {.nodes = 0, .expansions = 1, .max_depth = 1};

TEST_F(SpeculationTest, DraftGrowsTheRequestedTreeShape) {
  const std::vector<int32_t> prompt = OraclePrompts(24)[2];
  auto session = *CpuSpeculativeSession::Create(*model_, ForwardMode::kVerify, *model_,
                                                ForwardMode::kDraft, {.capacity = 128});
  ASSERT_TRUE(session->Prefill(prompt).ok());
  const int32_t root = prompt.back();
  for (const TreeShape& shape :
       {kTree16, kChain8, TreeShape{.nodes = 12, .expansions = 3, .max_depth = 2}}) {
    auto tree = session->Draft(root, shape);
    ASSERT_TRUE(tree.ok()) << tree.status();
    ASSERT_EQ(tree->size(), shape.nodes + 1);
    EXPECT_TRUE(ValidateTree(tree->tokens, tree->parents, model_->config().vocab_size, 64).ok());
    const std::vector<int32_t> depths = TreeDepths(tree->parents);
    EXPECT_LE(*std::max_element(depths.begin(), depths.end()), shape.max_depth);
    for (int32_t i = 1; i < tree->size(); ++i) {
      // Cumulative log-probabilities fall along every path, and siblings carry distinct tokens.
      EXPECT_LE(tree->logprobs[i], tree->logprobs[tree->parents[i]]);
      for (int32_t j = 1; j < i; ++j) {
        if (tree->parents[j] == tree->parents[i]) {
          EXPECT_NE(tree->tokens[j], tree->tokens[i]);
        }
      }
    }
    if (shape.expansions == 1) {
      for (int32_t i = 1; i < tree->size(); ++i) EXPECT_EQ(tree->parents[i], i - 1);
      EXPECT_EQ(tree->draft_forwards, shape.nodes);  // the last node is never run
    }
    EXPECT_EQ(session->committed_length(), static_cast<int64_t>(prompt.size()));
  }
  // Depth cap 2 with 3 children per node holds at most 3 + 9 nodes: exactly 12 here.
  auto capped = *session->Draft(root, {.nodes = 12, .expansions = 3, .max_depth = 2});
  EXPECT_EQ(capped.size(), 13);
}

// With the verifier itself as the drafter, greedy drafts are the target's own choices, so a
// chain is accepted whole: every verify emits nodes + 1 tokens. This holds only if the draft
// forwards (grown over several forwards on pending KV) give bit-identical logits to the verify
// forward and the commit keeps the right KV.
TEST_F(SpeculationTest, APerfectDrafterHasItsChainsAcceptedWhole) {
  for (const std::vector<int32_t>& prompt : OraclePrompts(32)) {
    const testing::SpecRun run = SpeculativeDecode(prompt, {}, 27, kChain8, ForwardMode::kVerify);
    EXPECT_EQ(run.verify_steps, 3);
    EXPECT_EQ(run.tokens, PlainDecode(prompt, {}, 27));
  }
}

// The invariant, for the real 2-bit drafter, a perfect drafter (deep acceptance), and the draft's
// own KV: every shape, greedy and sampled, equals plain decoding token for token.
TEST_F(SpeculationTest, SpeculativeOutputEqualsPlainDecoding) {
  const std::vector<std::vector<int32_t>> prompts = OraclePrompts(24);
  const SamplingParams samplings[] = {{},
                                      {.temperature = 0.8f, .seed = 1},
                                      {.temperature = 0.8f, .top_k = 40, .seed = 2},
                                      {.temperature = 0.8f, .top_p = 0.9f, .seed = 3}};
  constexpr int kTokens = 16;
  int accepted_beyond_root = 0;
  for (size_t p = 0; p < prompts.size(); p += 2) {
    for (const SamplingParams& sampling : samplings) {
      const std::vector<int32_t> expected = PlainDecode(prompts[p], sampling, kTokens);
      for (const TreeShape& shape : {kTree16, kChain8, kOff}) {
        for (ForwardMode draft : {ForwardMode::kDraft, ForwardMode::kVerify}) {
          if (shape.nodes == 0 && draft == ForwardMode::kVerify) continue;
          const testing::SpecRun run =
              SpeculativeDecode(prompts[p], sampling, kTokens, shape, draft);
          EXPECT_EQ(run.tokens, expected)
              << "prompt " << p << " T=" << sampling.temperature << " seed " << sampling.seed
              << " nodes " << shape.nodes << " k " << shape.expansions << " draft "
              << ForwardModeName(draft);
          if (draft == ForwardMode::kVerify) accepted_beyond_root += kTokens - run.verify_steps;
        }
      }
    }
  }
  // The perfect drafter must actually have exercised multi-token acceptance.
  EXPECT_GT(accepted_beyond_root, 100);
}

// A 128-node tree of depth up to 16 (twice the default depth cap, more rows than a 64-row
// residual request): lossless greedy and sampled; with the verifier as a perfect drafter greedy
// steps accept several tokens (best-first growth spends nodes on likely siblings too, so the
// accepted path is shorter than 16; measured: 20 greedy tokens in 4 steps).
TEST_F(SpeculationTest, DeepTreesOf128NodesAreLossless) {
  const TreeShape deep = {.nodes = 128, .expansions = 8, .max_depth = 16};
  const std::vector<int32_t> prompt = OraclePrompts(24)[1];
  constexpr int kTokens = 16;
  for (const SamplingParams& sampling :
       {SamplingParams{}, SamplingParams{.temperature = 0.8f, .seed = 11}}) {
    const std::vector<int32_t> expected = PlainDecode(prompt, sampling, kTokens);
    EXPECT_EQ(SpeculativeDecode(prompt, sampling, kTokens, deep, ForwardMode::kDraft).tokens,
              expected)
        << "T=" << sampling.temperature;
    const testing::SpecRun perfect =
        SpeculativeDecode(prompt, sampling, kTokens, deep, ForwardMode::kVerify);
    EXPECT_EQ(perfect.tokens, expected) << "T=" << sampling.temperature;
    if (sampling.temperature == 0.0f) {
      EXPECT_LT(perfect.verify_steps, kTokens / 2);  // more than 2 tokens per step
    }
  }
}

TEST_F(SpeculationTest, OwnDraftKvIsLosslessToo) {
  const std::vector<int32_t> prompt = OraclePrompts(24)[3];
  for (const SamplingParams& sampling :
       {SamplingParams{}, SamplingParams{.temperature = 0.8f, .seed = 7}}) {
    const std::vector<int32_t> expected = PlainDecode(prompt, sampling, 20);
    EXPECT_EQ(
        SpeculativeDecode(prompt, sampling, 20, kTree16, ForwardMode::kDraft, DraftKv::kOwn).tokens,
        expected);
    const testing::SpecRun perfect =
        SpeculativeDecode(prompt, sampling, 20, kChain8, ForwardMode::kVerify, DraftKv::kOwn);
    EXPECT_EQ(perfect.tokens, expected);
  }
}

TEST_F(SpeculationTest, BadCallsAreRejectedAndChangeNothing) {
  const std::vector<int32_t> prompt = OraclePrompts(16)[1];
  auto session = *CpuSpeculativeSession::Create(*model_, ForwardMode::kVerify, *model_,
                                                ForwardMode::kDraft, {.capacity = 40});
  ASSERT_TRUE(session->Prefill(prompt).ok());
  const int64_t length = session->committed_length();

  EXPECT_EQ(session->Commit(std::vector<int32_t>{0}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(session->Prefill(std::vector<int32_t>{1, -3}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(session->Prefill(std::vector<int32_t>(30, 5)).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(session->Draft(1, {.nodes = 30, .expansions = 4, .max_depth = 8}).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(session->Draft(-1, kChain8).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(session->Draft(1, {.nodes = 4, .expansions = 0, .max_depth = 8}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(session->Verify(std::vector<int32_t>{1, 2}, std::vector<int32_t>{-1, 5}, {}, 0, false)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(session
                ->Verify(std::vector<int32_t>{1}, std::vector<int32_t>{-1}, {.temperature = -1.0f},
                         0, false)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(session->committed_length(), length);

  auto choices =
      session->Verify(std::vector<int32_t>{1, 2, 3}, std::vector<int32_t>{-1, 0, 0}, {}, 3, true);
  ASSERT_TRUE(choices.ok());
  // Greedy: the choice is the most likely token, and the top list starts with it.
  EXPECT_EQ((*choices)[0].top_ids.size(), 3u);
  EXPECT_EQ((*choices)[0].top_ids[0], (*choices)[0].token);
  EXPECT_FLOAT_EQ((*choices)[0].top_logprobs[0], (*choices)[0].logprob);
  EXPECT_LE((*choices)[0].logprob, 0.0f);
  EXPECT_GE((*choices)[0].top_logprobs[0], (*choices)[0].top_logprobs[1]);
  // Node 2 is not a child of node 1.
  EXPECT_EQ(session->Commit(std::vector<int32_t>{0, 1, 2}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(session->Commit(std::vector<int32_t>{1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(session->committed_length(), length);
  ASSERT_TRUE(session->Commit(std::vector<int32_t>{0, 2}).ok());
  EXPECT_EQ(session->committed_length(), length + 2);
  EXPECT_THAT(session->committed_tokens().last(2), ElementsAre(1, 3));
}

// Continuous batching, at the forward: sequences run together (a causal prefill chunk, a
// draft-tree batch, a decode row, each on its own cache) give every sequence the logits and K/V
// its Forward alone gives, bit for bit.
TEST_F(SpeculationTest, SequencesForwardedTogetherEqualEachForwardedAlone) {
  const std::vector<std::vector<int32_t>> prompts = OraclePrompts(24);
  const int64_t vocab = model_->config().vocab_size;
  constexpr int kSequences = 3;
  std::vector<KvCache> together, alone;
  std::vector<Batch> batches;
  for (int s = 0; s < kSequences; ++s) {
    together.push_back(*model_->NewKvCache(64));
    alone.push_back(*model_->NewKvCache(64));
    // A committed prefix of s * 5 tokens first, the same in both caches.
    const std::vector<int32_t> prefix(prompts[s].begin(), prompts[s].begin() + 5 * s);
    if (!prefix.empty()) {
      std::vector<float> ignored(static_cast<size_t>(prefix.size() * vocab));
      for (KvCache* cache : {&together.back(), &alone.back()}) {
        ASSERT_TRUE(model_->Forward(Batch::Causal(prefix, 0), *cache, ignored).ok());
        ASSERT_TRUE(cache->Commit(static_cast<int64_t>(prefix.size())).ok());
      }
    }
  }
  batches.push_back(Batch::Causal(std::vector<int32_t>(prompts[0].begin(), prompts[0].end()), 0));
  batches.back().logit_rows = {static_cast<int32_t>(prompts[0].size() - 1)};
  batches.push_back(
      *Batch::Tree(std::vector<int32_t>{11, 12, 13, 14}, std::vector<int32_t>{-1, 0, 0, 1}, 5));
  batches.push_back(Batch::Causal(std::vector<int32_t>{prompts[2][10]}, 10));
  std::vector<std::vector<float>> logits_together(kSequences), logits_alone(kSequences);
  std::vector<SequenceForward> forwards;
  for (int s = 0; s < kSequences; ++s) {
    const size_t size = static_cast<size_t>(batches[s].num_logit_rows() * vocab);
    logits_together[s].resize(size);
    logits_alone[s].resize(size);
    forwards.push_back({.batch = &batches[s], .cache = &together[s], .logits = logits_together[s]});
  }
  ASSERT_TRUE(model_->ForwardSequences(forwards, ForwardMode::kVerify).ok());
  const int64_t kv = model_->config().kv_dim();
  for (int s = 0; s < kSequences; ++s) {
    ASSERT_TRUE(model_->Forward(batches[s], alone[s], logits_alone[s], ForwardMode::kVerify).ok());
    EXPECT_EQ(logits_together[s], logits_alone[s]) << "sequence " << s;
    const int64_t first = alone[s].committed_length();
    for (int64_t layer = 0; layer < model_->config().num_layers; ++layer) {
      const size_t n = static_cast<size_t>(batches[s].size() * kv);
      EXPECT_TRUE(std::equal(together[s].keys(layer) + first * kv,
                             together[s].keys(layer) + first * kv + n,
                             alone[s].keys(layer) + first * kv))
          << "sequence " << s << " layer " << layer;
      EXPECT_TRUE(std::equal(together[s].values(layer) + first * kv,
                             together[s].values(layer) + first * kv + n,
                             alone[s].values(layer) + first * kv));
    }
  }
  // A cache twice, or a malformed sequence, is refused before anything runs.
  forwards[1].cache = &together[0];
  EXPECT_THAT(model_->ForwardSequences(forwards, ForwardMode::kVerify).message(),
              HasSubstr("share one KV cache"));
  forwards[1].cache = &together[1];
  Batch bad = batches[2];
  bad.tokens[0] = static_cast<int32_t>(vocab);
  forwards[2].batch = &bad;
  EXPECT_THAT(model_->ForwardSequences(forwards, ForwardMode::kVerify).message(),
              HasSubstr("sequence 2"));
}

// Continuous batching, at the session: generations with different settings stepped together
// by StepMany (one joining late with a prompt prefilled in chunks between the others' steps,
// one failing a step of its own) each emit exactly their plain decoding.
TEST_F(SpeculationTest, SessionsSteppedTogetherEqualPlainDecoding) {
  const std::vector<std::vector<int32_t>> prompts = OraclePrompts(24);
  struct Generation {
    std::vector<int32_t> prompt;
    SamplingParams sampling;
    TreeShape shape;
    int join_iteration = 0;
    std::unique_ptr<CpuSpeculativeSession> session;
    size_t prefilled = 0;
    int32_t root = 0;
    std::vector<int32_t> tokens;
  };
  constexpr int kTokens = 20;
  std::vector<Generation> generations(5);
  auto set = [&](size_t i, size_t prompt, SamplingParams sampling, TreeShape shape, int join) {
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
    g.session = *CpuSpeculativeSession::Create(*model_, ForwardMode::kVerify, *model_,
                                               ForwardMode::kDraft, {.capacity = 96});
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
}  // namespace bitsplit::model
