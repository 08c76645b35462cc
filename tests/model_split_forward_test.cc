// The split model's forward modes on the real SmolLM2 weights: verify (base + residual) is far
// closer to the reference (the source GGUF) than draft (base only), greedy continuations of
// verify mode follow the reference, both modes are batch- and thread-invariant and share the
// reference's KV cache layout, and unsupported modes are refused.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/model/llama_model.h"
#include "common/ops/softmax.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/paths.h"
#include "tests/testing/split_fixture.h"

namespace bitsplit::model {
namespace {

using ::testing::HasSubstr;

constexpr int kThreads = 2;

std::unique_ptr<LlamaModel> LoadReference(int threads = kThreads) {
  auto model = LlamaModel::Load(testing::ModelPath(testing::kSmolLm2File), threads);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

std::unique_ptr<LlamaModel> LoadSplit(int threads = kThreads, bool with_residual = true) {
  const testing::SplitModelPaths& paths = testing::SmolLm2SplitModel();
  auto model = LlamaModel::LoadSplit(paths.base, with_residual ? paths.residual : "", threads);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

// Token sequences of real text (prompts of the llama.cpp oracle fixture and llama.cpp's greedy
// continuations of them).
struct TextCase {
  std::vector<int32_t> prompt;
  std::vector<int32_t> continuation;
};
std::vector<TextCase> TextCases() {
  std::ifstream in(testing::SourcePath("tests/fixtures/oracle/smollm2_f32_logits.json"));
  const nlohmann::json fixture = nlohmann::json::parse(in);
  std::vector<TextCase> cases;
  for (const auto& c : fixture["cases"]) {
    cases.push_back(
        {c["tokens"].get<std::vector<int32_t>>(), c["continuation"].get<std::vector<int32_t>>()});
  }
  return cases;
}

// Logits of every position of `tokens`, run causally in chunks of 64 from an empty cache.
std::vector<float> TeacherForcedLogits(LlamaModel& model, ForwardMode mode,
                                       const std::vector<int32_t>& tokens) {
  const int64_t vocab = model.config().vocab_size;
  auto cache = model.NewKvCache(static_cast<int64_t>(tokens.size()));
  EXPECT_TRUE(cache.ok());
  std::vector<float> logits(tokens.size() * vocab);
  for (size_t begin = 0; begin < tokens.size(); begin += 64) {
    const size_t count = std::min<size_t>(64, tokens.size() - begin);
    const Batch batch =
        Batch::Causal(std::span(tokens).subspan(begin, count), static_cast<int32_t>(begin));
    const absl::Status status =
        model.Forward(batch, *cache, std::span(logits).subspan(begin * vocab, count * vocab), mode);
    EXPECT_TRUE(status.ok()) << status;
    EXPECT_TRUE(cache->Commit(static_cast<int64_t>(count)).ok());
  }
  return logits;
}

// KL(p || q) of the softmaxes of two logit rows, in nats.
double Kl(const float* p_logits, const float* q_logits, int64_t vocab) {
  const double p_lse = ops::LogSumExp(p_logits, vocab);
  const double q_lse = ops::LogSumExp(q_logits, vocab);
  double kl = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    const double log_p = p_logits[i] - p_lse;
    kl += std::exp(log_p) * (log_p - (q_logits[i] - q_lse));
  }
  return std::max(kl, 0.0);
}

int64_t ArgMax(const float* logits, int64_t vocab) {
  return std::max_element(logits, logits + vocab) - logits;
}

TEST(SplitForwardTest, VerifyIsMuchCloserToTheReferenceThanDraft) {
  auto reference = LoadReference();
  auto split = LoadSplit();
  ASSERT_NE(reference, nullptr);
  ASSERT_NE(split, nullptr);
  const int64_t vocab = reference->config().vocab_size;
  double kl_draft = 0, kl_verify = 0;
  int64_t positions = 0, top1_draft = 0, top1_verify = 0;
  const std::vector<TextCase> cases = TextCases();
  for (size_t c : {0, 2, 3}) {  // 547 positions of licence text and chat prompts
    std::vector<int32_t> tokens = cases[c].prompt;
    tokens.insert(tokens.end(), cases[c].continuation.begin(), cases[c].continuation.end());
    const auto ref = TeacherForcedLogits(*reference, ForwardMode::kReference, tokens);
    const auto draft = TeacherForcedLogits(*split, ForwardMode::kDraft, tokens);
    const auto verify = TeacherForcedLogits(*split, ForwardMode::kVerify, tokens);
    for (size_t t = 0; t < tokens.size(); ++t) {
      const float* r = ref.data() + t * vocab;
      kl_draft += Kl(r, draft.data() + t * vocab, vocab);
      kl_verify += Kl(r, verify.data() + t * vocab, vocab);
      top1_draft += ArgMax(r, vocab) == ArgMax(draft.data() + t * vocab, vocab);
      top1_verify += ArgMax(r, vocab) == ArgMax(verify.data() + t * vocab, vocab);
      ++positions;
    }
  }
  kl_draft /= positions;
  kl_verify /= positions;
  std::printf(
      "%s vs the Q4_1 source over %lld positions: mean KL draft %.5f nats (top-1 %.1f%%), "
      "verify %.6f nats (top-1 %.1f%%)\n",
      SplitQuantizationString(split->split_files()->quantization()).c_str(),
      static_cast<long long>(positions), kl_draft, 100.0 * top1_draft / positions, kl_verify,
      100.0 * top1_verify / positions);
  EXPECT_GE(positions, 500);
  EXPECT_LT(kl_verify, 0.01);
  EXPECT_LT(kl_verify * 20, kl_draft);
  EXPECT_GE(static_cast<double>(top1_verify) / positions, 0.95);
}

// Greedy decoding from each prompt; the number of leading tokens equal to the reference's.
std::vector<int32_t> Greedy(LlamaModel& model, ForwardMode mode, const std::vector<int32_t>& prompt,
                            int count) {
  const int64_t vocab = model.config().vocab_size;
  auto cache = model.NewKvCache(static_cast<int64_t>(prompt.size()) + count);
  EXPECT_TRUE(cache.ok());
  std::vector<float> logits(vocab);
  Batch batch = Batch::Causal(prompt, 0);
  batch.logit_rows = {static_cast<int32_t>(prompt.size()) - 1};
  std::vector<int32_t> out;
  for (int i = 0; i < count; ++i) {
    EXPECT_TRUE(model.Forward(batch, *cache, logits, mode).ok());
    EXPECT_TRUE(cache->Commit(batch.size()).ok());
    out.push_back(static_cast<int32_t>(ArgMax(logits.data(), vocab)));
    const int32_t next[1] = {out.back()};
    batch = Batch::Causal(next, static_cast<int32_t>(cache->committed_length()));
  }
  return out;
}

TEST(SplitForwardTest, GreedyVerifyFollowsTheReference) {
  auto reference = LoadReference();
  auto split = LoadSplit();
  ASSERT_NE(reference, nullptr);
  ASSERT_NE(split, nullptr);
  constexpr int kTokens = 24;
  int verify_matched = 0, draft_matched = 0, total = 0;
  for (const TextCase& c : TextCases()) {
    const auto ref = Greedy(*reference, ForwardMode::kReference, c.prompt, kTokens);
    const auto verify = Greedy(*split, ForwardMode::kVerify, c.prompt, kTokens);
    const auto draft = Greedy(*split, ForwardMode::kDraft, c.prompt, kTokens);
    auto leading = [&](const std::vector<int32_t>& other) {
      return static_cast<int>(std::mismatch(ref.begin(), ref.end(), other.begin()).first -
                              ref.begin());
    };
    verify_matched += leading(verify);
    draft_matched += leading(draft);
    total += kTokens;
  }
  std::printf(
      "greedy %d-token continuations of %d prompts: tokens before the first difference "
      "from the reference: verify %d/%d, draft %d/%d\n",
      kTokens, total / kTokens, verify_matched, total, draft_matched, total);
  EXPECT_GE(verify_matched, total * 3 / 4);
  EXPECT_GT(verify_matched, draft_matched);
}

// Logits of kTokens after a committed prefix, run in chunks of `chunk` tokens.
const std::vector<int32_t> kPrefix = {1, 504, 3458, 5264, 28, 2002};
const std::vector<int32_t> kTokens = {314, 1345, 16,   1184, 282,  260,  3458, 5264,
                                      43,  2378, 4289, 30,   1015, 6549, 9416, 1173};

struct RunResult {
  std::vector<float> logits;
  KvCache cache;
};

RunResult RunChunked(LlamaModel& model, ForwardMode mode, size_t chunk) {
  const int64_t vocab = model.config().vocab_size;
  auto cache = model.NewKvCache(64);
  EXPECT_TRUE(cache.ok());
  std::vector<float> prefix_logits(kPrefix.size() * vocab);
  EXPECT_TRUE(model.Forward(Batch::Causal(kPrefix, 0), *cache, prefix_logits, mode).ok());
  EXPECT_TRUE(cache->Commit(static_cast<int64_t>(kPrefix.size())).ok());
  std::vector<float> logits(kTokens.size() * vocab);
  for (size_t start = 0; start < kTokens.size(); start += chunk) {
    const size_t count = std::min(chunk, kTokens.size() - start);
    const Batch batch = Batch::Causal(std::span(kTokens).subspan(start, count),
                                      static_cast<int32_t>(cache->committed_length()));
    EXPECT_TRUE(
        model.Forward(batch, *cache, std::span(logits).subspan(start * vocab, count * vocab), mode)
            .ok());
    EXPECT_TRUE(cache->Commit(static_cast<int64_t>(count)).ok());
  }
  return {std::move(logits), std::move(*cache)};
}

bool SameBits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

TEST(SplitForwardTest, DraftAndVerifyAreBatchAndThreadInvariant) {
  auto single_thread = LoadSplit(1);
  ASSERT_NE(single_thread, nullptr);
  const int64_t vocab = single_thread->config().vocab_size;
  for (ForwardMode mode : {ForwardMode::kVerify, ForwardMode::kDraft}) {
    const RunResult alone = RunChunked(*single_thread, mode, 1);
    for (int threads : {1, 2}) {
      auto model = LoadSplit(threads);
      ASSERT_NE(model, nullptr);
      SCOPED_TRACE(::testing::Message()
                   << ForwardModeName(mode) << ", " << threads << " threads, batch of 16");
      const RunResult batched = RunChunked(*model, mode, 16);
      for (size_t t = 0; t < kTokens.size(); ++t) {
        EXPECT_TRUE(
            SameBits(batched.logits.data() + t * vocab, alone.logits.data() + t * vocab, vocab))
            << "logits of token " << t;
      }
      for (int64_t layer = 0; layer < alone.cache.num_layers(); ++layer) {
        const size_t n =
            static_cast<size_t>(alone.cache.committed_length() * alone.cache.row_bytes(layer));
        EXPECT_EQ(std::memcmp(batched.cache.keys(layer).data, alone.cache.keys(layer).data, n), 0);
        EXPECT_EQ(std::memcmp(batched.cache.values(layer).data, alone.cache.values(layer).data, n),
                  0);
      }
    }
  }
}

TEST(SplitForwardTest, TreeBranchesGetTheirCausalLogitsInVerifyMode) {
  auto model = LoadSplit();
  ASSERT_NE(model, nullptr);
  const int64_t vocab = model->config().vocab_size;
  // Two branches after the prefix: {a, b} and {c}; tree order a, c, b (parents 0 -> a, -1).
  const std::vector<int32_t> tree_tokens = {314, 1184, 1345};
  const std::vector<int32_t> parents = {-1, -1, 0};
  auto cache = model->NewKvCache(32);
  ASSERT_TRUE(cache.ok());
  std::vector<float> scratch(kPrefix.size() * vocab);
  ASSERT_TRUE(
      model->Forward(Batch::Causal(kPrefix, 0), *cache, scratch, ForwardMode::kVerify).ok());
  ASSERT_TRUE(cache->Commit(static_cast<int64_t>(kPrefix.size())).ok());
  auto tree = Batch::Tree(tree_tokens, parents, static_cast<int32_t>(kPrefix.size()));
  ASSERT_TRUE(tree.ok());
  std::vector<float> tree_logits(3 * vocab);
  ASSERT_TRUE(model->Forward(*tree, *cache, tree_logits, ForwardMode::kVerify).ok());

  for (const auto& [path, node_rows] :
       std::vector<std::pair<std::vector<int32_t>, std::vector<int>>>{{{314, 1345}, {0, 2}},
                                                                      {{1184}, {1}}}) {
    auto causal_cache = model->NewKvCache(32);
    ASSERT_TRUE(causal_cache.ok());
    std::vector<int32_t> sequence = kPrefix;
    sequence.insert(sequence.end(), path.begin(), path.end());
    std::vector<float> causal(sequence.size() * vocab);
    ASSERT_TRUE(
        model->Forward(Batch::Causal(sequence, 0), *causal_cache, causal, ForwardMode::kVerify)
            .ok());
    for (size_t i = 0; i < path.size(); ++i) {
      EXPECT_TRUE(SameBits(tree_logits.data() + node_rows[i] * vocab,
                           causal.data() + (kPrefix.size() + i) * vocab, vocab))
          << "tree node " << node_rows[i];
    }
  }
}

TEST(SplitForwardTest, DraftRunsOnTheVerifiersCache) {
  // The drafter extends the verifier's committed prefix with base weights only: same cache, no
  // copy. Its logits then differ from a draft-only run by the prefix KV alone.
  auto model = LoadSplit();
  ASSERT_NE(model, nullptr);
  const int64_t vocab = model->config().vocab_size;
  auto cache = model->NewKvCache(32);
  ASSERT_TRUE(cache.ok());
  std::vector<float> logits(kPrefix.size() * vocab);
  ASSERT_TRUE(model->Forward(Batch::Causal(kPrefix, 0), *cache, logits, ForwardMode::kVerify).ok());
  ASSERT_TRUE(cache->Commit(static_cast<int64_t>(kPrefix.size())).ok());
  const int32_t next[1] = {314};
  std::vector<float> on_verify_cache(vocab), on_draft_cache(vocab);
  const Batch step = Batch::Causal(next, static_cast<int32_t>(kPrefix.size()));
  ASSERT_TRUE(model->Forward(step, *cache, on_verify_cache, ForwardMode::kDraft).ok());

  auto draft_cache = model->NewKvCache(32);
  ASSERT_TRUE(draft_cache.ok());
  ASSERT_TRUE(
      model->Forward(Batch::Causal(kPrefix, 0), *draft_cache, logits, ForwardMode::kDraft).ok());
  ASSERT_TRUE(draft_cache->Commit(static_cast<int64_t>(kPrefix.size())).ok());
  ASSERT_TRUE(model->Forward(step, *draft_cache, on_draft_cache, ForwardMode::kDraft).ok());
  EXPECT_FALSE(SameBits(on_verify_cache.data(), on_draft_cache.data(), vocab));
}

TEST(SplitForwardTest, RefusesModesTheModelCannotRun) {
  auto reference = LoadReference(1);
  auto base_only = LoadSplit(1, /*with_residual=*/false);
  ASSERT_NE(reference, nullptr);
  ASSERT_NE(base_only, nullptr);
  EXPECT_EQ(reference->default_mode(), ForwardMode::kReference);
  EXPECT_EQ(base_only->default_mode(), ForwardMode::kDraft);
  EXPECT_FALSE(base_only->SupportsMode(ForwardMode::kVerify));
  const int64_t vocab = reference->config().vocab_size;
  std::vector<float> logits(kPrefix.size() * vocab);
  for (auto [model, mode] : {std::pair{reference.get(), ForwardMode::kDraft},
                             std::pair{base_only.get(), ForwardMode::kVerify},
                             std::pair{base_only.get(), ForwardMode::kReference}}) {
    auto cache = model->NewKvCache(16);
    ASSERT_TRUE(cache.ok());
    const absl::Status status = model->Forward(Batch::Causal(kPrefix, 0), *cache, logits, mode);
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_EQ(cache->pending_length(), 0);
  }
  EXPECT_THAT(ParseForwardMode("fast").status().message(), HasSubstr("unknown forward mode"));
}

}  // namespace
}  // namespace bitsplit::model
