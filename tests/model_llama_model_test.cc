// Forward pass of the real SmolLM2 model: batch invariance (bit-exact across batch sizes,
// thread counts and tree layouts), KV compaction after tree verification, input validation.
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "common/model/llama_model.h"
#include "gtest/gtest.h"
#include "tests/testing/paths.h"

namespace bitsplit::model {
namespace {

// A fixed token sequence (ids of ordinary English subwords in the SmolLM2 vocabulary).
const std::vector<int32_t> kPrefix = {1, 504, 3458, 5264, 28, 2002};
const std::vector<int32_t> kTokens = {314, 1345, 16,   1184, 282,  260,  3458, 5264,
                                      43,  2378, 4289, 30,   1015, 6549, 9416, 1173};
constexpr int64_t kCapacity = 64;

std::unique_ptr<LlamaModel> LoadModel(int threads) {
  auto model = LlamaModel::Load(testing::ModelPath(testing::kSmolLm2File), threads);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

// Logits and KV cache after running the prefix then kTokens in chunks of `chunk` tokens.
struct RunResult {
  std::vector<float> logits;  // [kTokens.size(), vocab]
  KvCache cache;
};

RunResult RunChunked(LlamaModel& model, size_t chunk, KvType kv_type = KvType::kF32) {
  const int64_t vocab = model.config().vocab_size;
  auto cache = model.NewKvCache(kCapacity, kv_type);
  EXPECT_TRUE(cache.ok()) << cache.status();
  std::vector<float> prefix_logits(vocab);
  Batch prefill = Batch::Causal(kPrefix, 0);
  prefill.logit_rows = {static_cast<int32_t>(kPrefix.size()) - 1};
  EXPECT_TRUE(model.Forward(prefill, *cache, prefix_logits).ok());
  EXPECT_TRUE(cache->Commit(prefill.size()).ok());

  std::vector<float> logits(kTokens.size() * vocab);
  for (size_t start = 0; start < kTokens.size(); start += chunk) {
    const size_t count = std::min(chunk, kTokens.size() - start);
    const Batch batch = Batch::Causal(std::span(kTokens).subspan(start, count),
                                      static_cast<int32_t>(cache->committed_length()));
    const absl::Status status =
        model.Forward(batch, *cache, std::span(logits).subspan(start * vocab, count * vocab));
    EXPECT_TRUE(status.ok()) << status;
    EXPECT_TRUE(cache->Commit(static_cast<int64_t>(count)).ok());
  }
  return {std::move(logits), std::move(*cache)};
}

bool SameBits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

// Committed slots of both caches hold identical bytes in every layer.
void ExpectSameCommittedCache(const KvCache& a, const KvCache& b) {
  ASSERT_EQ(a.committed_length(), b.committed_length());
  ASSERT_EQ(a.type(), b.type());
  for (int64_t layer = 0; layer < a.num_layers(); ++layer) {
    const size_t n = static_cast<size_t>(a.committed_length() * a.row_bytes(layer));
    EXPECT_EQ(std::memcmp(a.keys(layer).data, b.keys(layer).data, n), 0) << "keys of " << layer;
    EXPECT_EQ(std::memcmp(a.values(layer).data, b.values(layer).data, n), 0)
        << "values of layer " << layer;
  }
}

TEST(LlamaModelTest, LogitsAndCacheAreBatchAndThreadInvariant) {
  auto single_thread = LoadModel(1);
  ASSERT_NE(single_thread, nullptr);
  const int64_t vocab = single_thread->config().vocab_size;
  for (const KvType kv_type : {KvType::kF32, KvType::kF16, KvType::kQ8_0}) {
    const RunResult one_at_a_time = RunChunked(*single_thread, 1, kv_type);
    for (int threads : {1, 2, 3}) {
      auto model = LoadModel(threads);
      ASSERT_NE(model, nullptr);
      for (size_t chunk : {size_t{16}, size_t{5}}) {
        SCOPED_TRACE(::testing::Message() << KvTypeName(kv_type) << " cache, " << threads
                                          << " threads, chunks of " << chunk);
        const RunResult batched = RunChunked(*model, chunk, kv_type);
        for (size_t t = 0; t < kTokens.size(); ++t) {
          EXPECT_TRUE(SameBits(batched.logits.data() + t * vocab,
                               one_at_a_time.logits.data() + t * vocab, vocab))
              << "logits of token " << t;
        }
        ExpectSameCommittedCache(batched.cache, one_at_a_time.cache);
      }
    }
  }
}

// An f16 or q8_0 cache holds, in the first layer, exactly the encoding of what an f32 cache
// holds: that layer's keys and values do not depend on the cache. Later layers read the encoded
// values, so their contents and the logits move, the q8_0 cache's further than the f16 one's.
TEST(LlamaModelTest, EncodedCachesHoldTheEncodedFirstLayer) {
  auto model = LoadModel(2);
  ASSERT_NE(model, nullptr);
  const int64_t vocab = model->config().vocab_size;
  const int64_t tokens = static_cast<int64_t>(kTokens.size());
  auto exact = model->NewKvCache(kCapacity);
  ASSERT_TRUE(exact.ok());
  std::vector<float> exact_logits(kTokens.size() * vocab);
  ASSERT_TRUE(model->Forward(Batch::Causal(kTokens, 0), *exact, exact_logits).ok());
  const int64_t kv_dim = model->config().KvDim(0);
  std::vector<float> exact_keys(tokens * kv_dim);
  exact->ReadKeys(0, 0, tokens, exact_keys.data());
  double max_change[2] = {0, 0};
  for (const KvType type : {KvType::kF16, KvType::kQ8_0}) {
    SCOPED_TRACE(KvTypeName(type));
    auto encoded = model->NewKvCache(kCapacity, type);
    ASSERT_TRUE(encoded.ok());
    std::vector<float> logits(kTokens.size() * vocab);
    ASSERT_TRUE(model->Forward(Batch::Causal(kTokens, 0), *encoded, logits).ok());
    // The f32 keys, encoded then decoded outside the cache.
    std::vector<uint8_t> bytes(static_cast<size_t>(tokens * encoded->row_bytes(0)));
    ops::EncodeKvRows(type, exact_keys.data(), tokens, kv_dim, bytes.data());
    std::vector<float> want(exact_keys.size()), got(exact_keys.size());
    for (int64_t t = 0; t < tokens; ++t) {
      ops::DecodeKvElements(type, bytes.data() + t * encoded->row_bytes(0), 0, kv_dim,
                            want.data() + t * kv_dim);
    }
    encoded->ReadKeys(0, 0, tokens, got.data());
    ASSERT_TRUE(SameBits(want.data(), got.data(), want.size()));
    EXPECT_FALSE(SameBits(exact_keys.data(), got.data(), got.size()));
    double change = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
      change = std::max(change, static_cast<double>(std::fabs(logits[i] - exact_logits[i])));
    }
    max_change[type == KvType::kF16 ? 0 : 1] = change;
    EXPECT_GT(change, 0.0);
  }
  EXPECT_LT(max_change[0], max_change[1]);
}

TEST(LlamaModelTest, SelectedLogitRowsEqualTheFullRows) {
  auto model = LoadModel(2);
  ASSERT_NE(model, nullptr);
  const int64_t vocab = model->config().vocab_size;
  auto cache = model->NewKvCache(kCapacity);
  ASSERT_TRUE(cache.ok());
  Batch batch = Batch::Causal(kTokens, 0);
  std::vector<float> all(kTokens.size() * vocab);
  ASSERT_TRUE(model->Forward(batch, *cache, all).ok());
  batch.logit_rows = {15, 3};
  std::vector<float> selected(2 * vocab);
  ASSERT_TRUE(model->Forward(batch, *cache, selected).ok());
  EXPECT_TRUE(SameBits(selected.data(), all.data() + 15 * vocab, vocab));
  EXPECT_TRUE(SameBits(selected.data() + vocab, all.data() + 3 * vocab, vocab));

  // More rows than the batch has (repeats) is allowed too.
  Batch one = Batch::Causal(std::span(kTokens).first(1), 0);
  one.logit_rows = {0, 0, 0};
  std::vector<float> repeated(3 * vocab);
  ASSERT_TRUE(model->Forward(one, *cache, repeated).ok());
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(SameBits(repeated.data() + i * vocab, all.data(), vocab));
}

// Runs `path` as a plain causal continuation of the committed kPrefix.
RunResult RunPathAlone(LlamaModel& model, const std::vector<int32_t>& path) {
  const int64_t vocab = model.config().vocab_size;
  auto cache = model.NewKvCache(kCapacity);
  EXPECT_TRUE(cache.ok());
  std::vector<float> logits(std::max(kPrefix.size(), path.size()) * vocab);
  EXPECT_TRUE(model.Forward(Batch::Causal(kPrefix, 0), *cache, logits).ok());
  EXPECT_TRUE(cache->Commit(static_cast<int64_t>(kPrefix.size())).ok());
  logits.resize(path.size() * vocab);
  EXPECT_TRUE(
      model.Forward(Batch::Causal(path, static_cast<int32_t>(kPrefix.size())), *cache, logits)
          .ok());
  EXPECT_TRUE(cache->Commit(static_cast<int64_t>(path.size())).ok());
  return {std::move(logits), std::move(*cache)};
}

TEST(LlamaModelTest, TreeBranchesGetTheLogitsOfRunningEachBranchAlone) {
  auto model = LoadModel(2);
  ASSERT_NE(model, nullptr);
  const int64_t vocab = model->config().vocab_size;

  // Two branches from the prefix: a = (a0 a1 a2) with a side branch a0 -> c, and b = (b0 b1).
  // Batch order interleaves them:  0:a0  1:b0  2:a1  3:c  4:b1  5:a2
  const int32_t a0 = 314, a1 = 1345, a2 = 16, b0 = 3458, b1 = 5264, c = 2378;
  const std::vector<int32_t> tokens = {a0, b0, a1, c, b1, a2};
  const std::vector<int32_t> parents = {-1, -1, 0, 0, 1, 2};
  auto tree = Batch::Tree(tokens, parents, static_cast<int32_t>(kPrefix.size()));
  ASSERT_TRUE(tree.ok()) << tree.status();
  EXPECT_EQ(tree->positions, (std::vector<int32_t>{6, 6, 7, 7, 7, 8}));

  auto cache = model->NewKvCache(kCapacity);
  ASSERT_TRUE(cache.ok());
  std::vector<float> prefix_logits(kPrefix.size() * vocab);
  ASSERT_TRUE(model->Forward(Batch::Causal(kPrefix, 0), *cache, prefix_logits).ok());
  ASSERT_TRUE(cache->Commit(static_cast<int64_t>(kPrefix.size())).ok());
  std::vector<float> tree_logits(tokens.size() * vocab);
  ASSERT_TRUE(model->Forward(*tree, *cache, tree_logits).ok());

  struct Branch {
    std::vector<int32_t> path;
    std::vector<int32_t> rows;  // the path's batch rows in the tree
  };
  const std::vector<Branch> branches = {
      {{a0, a1, a2}, {0, 2, 5}}, {{a0, c}, {0, 3}}, {{b0, b1}, {1, 4}}};
  for (const Branch& branch : branches) {
    const RunResult alone = RunPathAlone(*model, branch.path);
    for (size_t i = 0; i < branch.path.size(); ++i) {
      EXPECT_TRUE(SameBits(tree_logits.data() + branch.rows[i] * vocab,
                           alone.logits.data() + i * vocab, vocab))
          << "branch starting " << branch.path[0] << ", node " << i;
    }
  }

  // Accept branch a: after compaction the cache equals the one of running a alone, and the
  // next decode step agrees bit for bit.
  ASSERT_TRUE(cache->CommitSlots(branches[0].rows).ok());
  RunResult alone = RunPathAlone(*model, branches[0].path);
  ExpectSameCommittedCache(*cache, alone.cache);
  const std::vector<int32_t> next = {43};
  const Batch step = Batch::Causal(next, static_cast<int32_t>(cache->committed_length()));
  std::vector<float> after_tree(vocab), after_alone(vocab);
  ASSERT_TRUE(model->Forward(step, *cache, after_tree).ok());
  ASSERT_TRUE(model->Forward(step, alone.cache, after_alone).ok());
  EXPECT_TRUE(SameBits(after_tree.data(), after_alone.data(), vocab));
}

TEST(BatchTest, CausalAndTreeMasks) {
  const std::vector<int32_t> tokens = {7, 8, 9};
  const Batch causal = Batch::Causal(tokens, 4);
  EXPECT_EQ(causal.positions, (std::vector<int32_t>{4, 5, 6}));
  EXPECT_EQ(causal.attention_mask, (std::vector<uint8_t>{1, 0, 0, 1, 1, 0, 1, 1, 1}));
  auto tree = Batch::Tree(tokens, std::vector<int32_t>{-1, -1, 1}, 4);
  ASSERT_TRUE(tree.ok());
  EXPECT_EQ(tree->positions, (std::vector<int32_t>{4, 4, 5}));
  EXPECT_EQ(tree->attention_mask, (std::vector<uint8_t>{1, 0, 0, 0, 1, 0, 0, 1, 1}));
  EXPECT_FALSE(Batch::Tree(tokens, std::vector<int32_t>{-1, 2, 0}, 0).ok());
  EXPECT_FALSE(Batch::Tree(tokens, std::vector<int32_t>{-2, 0, 0}, 0).ok());
  EXPECT_FALSE(Batch::Tree(tokens, std::vector<int32_t>{-1, 0}, 0).ok());
}

class ForwardValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = LoadModel(1);
    ASSERT_NE(model_, nullptr);
    auto cache = model_->NewKvCache(8);
    ASSERT_TRUE(cache.ok());
    cache_ = std::make_unique<KvCache>(std::move(*cache));
    ASSERT_TRUE(cache_->BeginPending(2).ok());
    ASSERT_TRUE(cache_->Commit(2).ok());
    ASSERT_TRUE(cache_->BeginPending(1).ok());
    logits_.resize(8 * model_->config().vocab_size);
  }

  // Forward must fail with `code` and a message containing `text`, leaving the cache as it was.
  void ExpectRejected(const Batch& batch, absl::StatusCode code, const std::string& text) {
    const absl::Status status = model_->Forward(batch, *cache_, logits_);
    EXPECT_EQ(status.code(), code) << status;
    EXPECT_NE(status.message().find(text), std::string::npos) << status;
    EXPECT_EQ(cache_->committed_length(), 2);
    EXPECT_EQ(cache_->pending_length(), 1);
  }

  Batch Valid(size_t n) { return Batch::Causal(std::vector<int32_t>(n, 100), 2); }

  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<KvCache> cache_;
  std::vector<float> logits_;
};

TEST_F(ForwardValidationTest, RejectsMalformedBatches) {
  ExpectRejected(Batch{}, absl::StatusCode::kInvalidArgument, "empty");

  Batch token = Valid(2);
  token.tokens[1] = 49152;
  ExpectRejected(token, absl::StatusCode::kInvalidArgument, "token id 49152 at batch row 1");
  token.tokens[1] = -1;
  ExpectRejected(token, absl::StatusCode::kInvalidArgument, "token id -1");

  Batch positions = Valid(2);
  positions.positions.pop_back();
  ExpectRejected(positions, absl::StatusCode::kInvalidArgument, "positions");
  positions = Valid(2);
  positions.positions[0] = -3;
  ExpectRejected(positions, absl::StatusCode::kInvalidArgument, "negative position");

  Batch mask = Valid(2);
  mask.attention_mask.resize(3);
  ExpectRejected(mask, absl::StatusCode::kInvalidArgument, "attention mask");
  mask = Valid(2);
  mask.attention_mask[3] = 0;
  ExpectRejected(mask, absl::StatusCode::kInvalidArgument, "does not attend to itself");

  Batch rows = Valid(2);
  rows.logit_rows = {2};
  ExpectRejected(rows, absl::StatusCode::kInvalidArgument, "logit row 2");
}

TEST_F(ForwardValidationTest, RejectsBatchesBeyondTheCacheCapacity) {
  ExpectRejected(Valid(7), absl::StatusCode::kResourceExhausted, "capacity of 8");
  const absl::Status ok = model_->Forward(Valid(6), *cache_, logits_);
  EXPECT_TRUE(ok.ok()) << ok;
}

TEST_F(ForwardValidationTest, RejectsSmallLogitBuffersAndForeignCaches) {
  std::vector<float> small(model_->config().vocab_size);
  const absl::Status status = model_->Forward(Valid(2), *cache_, small);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("logits buffer"), std::string::npos) << status;

  auto foreign = KvCache::Create(2, 192, 8);
  ASSERT_TRUE(foreign.ok());
  const absl::Status shape = model_->Forward(Valid(1), *foreign, logits_);
  EXPECT_EQ(shape.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(shape.message().find("KV cache shaped for 2 layers"), std::string::npos) << shape;
}

}  // namespace
}  // namespace bitsplit::model
