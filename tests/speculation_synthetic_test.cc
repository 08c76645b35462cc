// The split of the random-weight models of the oracle fixtures, in process: qwen3moe (3 layers,
// 16 experts of width 128, 4 used), gemma4 (local and global layers of different shapes, one
// without attn_v) and gemma4's MoE shape (a dense FFN beside 16 fused-gate|up experts of width 64,
// 4 used) and gpt-oss (sinks, biases, YaRN, 16 biased MXFP4 experts of width 128, 4 used), each
// quantized by the quantizer into a base and a residual file (expert tensors held
// as tall matrices), then run in draft mode (base only) and verify mode (base + residual, each
// routed expert read once for all its rows). Random weights prove the arithmetic and the
// losslessness only.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/llama_model.h"
#include "common/model/remote_residual.h"
#include "common/model/residual_file.h"
#include "common/model/split_model.h"
#include "common/offline/calibration.h"
#include "common/offline/split_quantizer.h"
#include "common/ops/softmax.h"
#include "common/speculation/cpu_session.h"
#include "gtest/gtest.h"
#include "tests/testing/paths.h"
#include "tests/testing/speculation_runs.h"
#include "tests/testing/split_fixture.h"
#include "tests/testing/synthetic_weights.h"

namespace bitsplit {
namespace {

struct SplitCase {
  const char* name;
  const char* fixture;
};

// Each fixture's model, its split (the SmolLM2 fixture's knobs: b2 asym / g64 + r8 / g32,
// Hadamard-rotated in blocks of 64) and its Q8_0 (base only, the reference configuration), made
// once per fixture for the suite.
class SyntheticSplitTest : public ::testing::TestWithParam<SplitCase> {
 protected:
  struct Files {
    std::unique_ptr<testing::SyntheticModelFile> source;
    std::string prefix;
  };

  void SetUp() override {
    Files& files = (*made_)[GetParam().name];
    if (files.source != nullptr) return;
    files.source = std::make_unique<testing::SyntheticModelFile>(GetParam().fixture);
    ASSERT_TRUE(files.source->ok());
    files.prefix =
        (testing::TestTempDir() / absl::StrCat("bitsplit-split-", GetParam().name, "-", getpid()))
            .string();
    const model::SplitQuantization q = testing::SplitFixtureQuantization();
    auto summary = offline::QuantizeSplitModel(
        files.source->path(), model::SplitBasePath(files.prefix),
        model::SplitResidualPath(files.prefix), {.quantization = q, .num_threads = 2});
    ASSERT_TRUE(summary.ok()) << summary.status();
    model::SplitQuantization q8_0;
    q8_0.base_format = quant::SplitFormat::kQ8_0;
    q8_0.base_group = 32;
    q8_0.residual_format.reset();
    q8_0.residual_group = 0;
    summary = offline::QuantizeSplitModel(files.source->path(),
                                          model::SplitBasePath(files.prefix + "-q8_0"), "",
                                          {.quantization = q8_0, .num_threads = 2});
    ASSERT_TRUE(summary.ok()) << summary.status();
  }
  static void TearDownTestSuite() {
    for (auto& [name, files] : *made_) {
      std::error_code ignored;
      std::filesystem::remove(model::SplitBasePath(files.prefix), ignored);
      std::filesystem::remove(model::SplitResidualPath(files.prefix), ignored);
      std::filesystem::remove(model::SplitBasePath(files.prefix + "-q8_0"), ignored);
    }
    made_->clear();
  }
  const Files& files() const { return (*made_)[GetParam().name]; }
  std::string prefix() const { return files().prefix; }
  std::unique_ptr<model::LlamaModel> Split(int threads = 2) const {
    auto loaded = model::LlamaModel::LoadSplit(model::SplitBasePath(prefix()),
                                               model::SplitResidualPath(prefix()), threads);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return loaded.ok() ? std::move(*loaded) : nullptr;
  }
  std::vector<int32_t> Prompt(size_t length) const {
    const std::vector<int32_t> all = files().source->fixture()["cases"][0]["tokens"];
    return std::vector<int32_t>(all.begin(), all.begin() + static_cast<int64_t>(length));
  }

  static std::map<std::string, Files>* made_;
};
std::map<std::string, SyntheticSplitTest::Files>* SyntheticSplitTest::made_ =
    new std::map<std::string, SyntheticSplitTest::Files>();

// The split holds every expert (tall matrices) and the router at source precision. Verify mode
// (10.6 bits per weight) is as close to the GGUF as Q8_0 of the same weights (8.5), compared by
// the median over positions: the mean of either is dominated by the few rows whose hidden state,
// off by the quantization error, flips a top-k choice of the exact router. The 2-bit draft is far
// off.
TEST_P(SyntheticSplitTest, VerifyModeIsAsCloseAsQ8_0AndDraftModeFarOff) {
  auto split = Split();
  ASSERT_NE(split, nullptr);
  const model::SplitModelFiles& files = *split->split_files();
  const model::ModelConfig& config = files.config();
  if (config.has_experts()) {
    const auto down = files.base_linear().group({1, model::LinearGroup::kExpertDown});
    ASSERT_EQ(down.size(), 1u);
    EXPECT_EQ(down[0].rows, config.num_experts * config.d_model);  // every expert's d_model rows
    EXPECT_EQ(down[0].cols, config.d_ff_expert);
    EXPECT_EQ(files.embedding_and_norms().layers[2].router.rows, config.num_experts);
    EXPECT_EQ(files.embedding_and_norms().layers[2].router.type, GgmlType::kF32);
  }
  EXPECT_EQ(
      config.layer_value_is_key,
      (*model::LlamaModel::Load(this->files().source->path(), 1))->config().layer_value_is_key);

  auto reference = model::LlamaModel::Load(this->files().source->path(), 2);
  ASSERT_TRUE(reference.ok()) << reference.status();
  const std::vector<int32_t> prompt = Prompt(48);
  const int64_t n = static_cast<int64_t>(prompt.size());
  const int64_t vocab = split->config().vocab_size;
  auto run = [&](model::LlamaModel& m, model::ForwardMode mode) {
    std::vector<float> logits(static_cast<size_t>(n * vocab));
    auto cache = m.NewKvCache(n);
    EXPECT_TRUE(cache.ok());
    const absl::Status status = m.Forward(model::Batch::Causal(prompt, 0), *cache, logits, mode);
    EXPECT_TRUE(status.ok()) << status;
    return logits;
  };
  const std::vector<float> exact = run(**reference, model::ForwardMode::kReference);
  const std::vector<float> verify = run(*split, model::ForwardMode::kVerify);
  const std::vector<float> draft = run(*split, model::ForwardMode::kDraft);
  auto q8_0 = model::LlamaModel::LoadSplit(model::SplitBasePath(prefix() + "-q8_0"), "", 2);
  ASSERT_TRUE(q8_0.ok()) << q8_0.status();
  const std::vector<float> eight_bit = run(**q8_0, model::ForwardMode::kDraft);
  // Median KL(reference || mode) over the positions.
  auto median_kl = [&](const std::vector<float>& logits) {
    std::vector<double> kl(static_cast<size_t>(n), 0.0);
    std::vector<float> p(static_cast<size_t>(vocab)), q(static_cast<size_t>(vocab));
    for (int64_t t = 0; t < n; ++t) {
      ops::LogSoftmax(exact.data() + t * vocab, vocab, p.data());
      ops::LogSoftmax(logits.data() + t * vocab, vocab, q.data());
      for (int64_t i = 0; i < vocab; ++i) kl[t] += std::exp(p[i]) * (p[i] - q[i]);
    }
    std::nth_element(kl.begin(), kl.begin() + n / 2, kl.end());
    return kl[static_cast<size_t>(n / 2)];
  };
  const double kl_verify = median_kl(verify), kl_draft = median_kl(draft);
  const double kl_q8_0 = median_kl(eight_bit);
  std::printf(
      "%s, %lld positions: median KL(reference || ...) verify %.3e, Q8_0 %.3e, draft %.3e\n",
      GetParam().name, static_cast<long long>(n), kl_verify, kl_q8_0, kl_draft);
  EXPECT_LT(kl_verify, 2 * kl_q8_0);
  EXPECT_GT(kl_draft, 20 * kl_verify);  // the residual carries what the 2-bit base lacks
}

// Draft and verify rows of the split are bit-identical alone, in a batch and on another thread
// count: routing, the per-row activation quantization and the per-expert kernels depend on the
// row alone.
TEST_P(SyntheticSplitTest, SplitRowsAreBatchInvariant) {
  auto two = Split(2);
  auto one = Split(1);
  ASSERT_NE(two, nullptr);
  ASSERT_NE(one, nullptr);
  const std::vector<int32_t> prompt = Prompt(24);
  const int64_t n = static_cast<int64_t>(prompt.size());
  const int64_t vocab = two->config().vocab_size;
  for (const model::ForwardMode mode : {model::ForwardMode::kDraft, model::ForwardMode::kVerify}) {
    auto cache = two->NewKvCache(n);
    ASSERT_TRUE(cache.ok());
    std::vector<float> batched(static_cast<size_t>(n * vocab));
    ASSERT_TRUE(two->Forward(model::Batch::Causal(prompt, 0), *cache, batched, mode).ok());
    auto single_cache = one->NewKvCache(n);
    ASSERT_TRUE(single_cache.ok());
    std::vector<float> single(static_cast<size_t>(vocab));
    for (int64_t t = 0; t < n; ++t) {
      const std::vector<int32_t> token = {prompt[static_cast<size_t>(t)]};
      ASSERT_TRUE(one->Forward(model::Batch::Causal(token, static_cast<int32_t>(t)), *single_cache,
                               single, mode)
                      .ok());
      ASSERT_TRUE(single_cache->Commit(1).ok());
      ASSERT_EQ(0, std::memcmp(single.data(), batched.data() + t * vocab, vocab * sizeof(float)))
          << model::ForwardModeName(mode) << " position " << t;
    }
  }
}

// Speculation with the base drafting and base + residual verifying gives exactly the verifier's
// own decoding: greedy and sampled, trees and chains.
TEST_P(SyntheticSplitTest, SpeculationIsLossless) {
  auto split = Split();
  ASSERT_NE(split, nullptr);
  const std::vector<int32_t> prompt = Prompt(20);
  constexpr int kTokens = 24;
  for (const float temperature : {0.0f, 0.8f}) {
    for (const uint64_t seed : {7u, 11u}) {
      const model::SamplingParams sampling{
          .temperature = temperature, .top_k = 0, .top_p = 1.0f, .seed = seed};
      const std::vector<int32_t> plain = testing::PlainDecode(*split, prompt, sampling, kTokens);
      for (const speculation::TreeShape shape :
           {speculation::TreeShape{.nodes = 8, .expansions = 2, .max_depth = 4},
            speculation::TreeShape{.nodes = 4, .expansions = 1, .max_depth = 4}}) {
        const testing::SpecRun run = testing::SpeculativeDecode(*split, prompt, sampling, kTokens,
                                                                shape, model::ForwardMode::kDraft);
        EXPECT_EQ(run.tokens, plain)
            << "temperature " << temperature << " seed " << seed << " nodes " << shape.nodes;
      }
      if (temperature == 0.0f) break;  // greedy ignores the seed
    }
  }
}

// The residual file on its own, as cpu-residual opens it, has the model's groups and shapes:
// each layer's q|k|v as the file has it (q|k where the values are the keys), and for an MoE
// model the expert groups with the expert count taken from the tall down matrix.
TEST_P(SyntheticSplitTest, TheResidualServiceFileHasTheModelsGroups) {
  auto split = Split();
  ASSERT_NE(split, nullptr);
  const model::ModelConfig& config = split->config();
  auto residual = model::ResidualFile::Open(model::SplitResidualPath(prefix()));
  ASSERT_TRUE(residual.ok()) << residual.status();
  EXPECT_EQ((*residual)->shapes(), model::ResidualShapes::FromConfig(config));
  EXPECT_EQ((*residual)->shapes().num_experts, config.num_experts);
  for (int32_t layer = 0; layer < config.num_layers; ++layer) {
    const model::ResidualGroupShape* qkv =
        (*residual)->shapes().Find({layer, model::LinearGroup::kQkv});
    ASSERT_NE(qkv, nullptr);
    EXPECT_EQ(qkv->rows.size(), config.ValueIsKey(layer) ? 2u : 3u) << "layer " << layer;
    if (config.has_experts()) {
      EXPECT_EQ((*residual)->shapes().OutputRows({layer, model::LinearGroup::kExpertDown}),
                std::vector<int64_t>{config.d_model});
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Families, SyntheticSplitTest,
    ::testing::Values(SplitCase{"qwen3moe", "tests/fixtures/oracle/qwen3moe_synthetic_logits.json"},
                      SplitCase{"gemma4", "tests/fixtures/oracle/gemma4_synthetic_logits.json"},
                      SplitCase{"gemma4moe",
                                "tests/fixtures/oracle/gemma4moe_synthetic_logits.json"},
                      SplitCase{"gpt_oss", "tests/fixtures/oracle/gpt-oss_synthetic_logits.json"}),
    [](const ::testing::TestParamInfo<SplitCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace bitsplit
