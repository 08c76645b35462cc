// The expert-aware split of a mixture-of-experts model, in process: the random-weight qwen3moe of
// the oracle fixtures (3 layers, 16 experts of width 128, 4 used) quantized by the quantizer into
// a base and a residual file whose gate|up and down groups hold every expert as one tall matrix,
// then run in draft mode (base only) and verify mode (base + residual, each routed expert read
// once for all its rows). Random weights prove the arithmetic and the losslessness only.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/llama_model.h"
#include "common/model/residual_file.h"
#include "common/model/split_model.h"
#include "common/offline/calibration.h"
#include "common/offline/split_quantizer.h"
#include "common/ops/softmax.h"
#include "common/speculation/cpu_session.h"
#include "gtest/gtest.h"
#include "tests/testing/speculation_runs.h"
#include "tests/testing/split_fixture.h"
#include "tests/testing/synthetic_weights.h"

namespace bitsplit {
namespace {

constexpr char kFixture[] = "tests/fixtures/oracle/qwen3moe_synthetic_logits.json";

// The fixture's model, its split (the SmolLM2 fixture's knobs: b2 asym / g64 + r8 / g32,
// Hadamard-rotated in blocks of 64) and
// its Q8_0 (base only, the reference configuration), made once for the suite.
class MoeSplitTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    source_ = new testing::SyntheticModelFile(kFixture);
    ASSERT_TRUE(source_->ok());
    prefix_ =
        (std::filesystem::temp_directory_path() / absl::StrCat("bitsplit-moe-split-", getpid()))
            .string();
    const model::SplitQuantization q = testing::SplitFixtureQuantization();
    auto summary = offline::QuantizeSplitModel(source_->path(), model::SplitBasePath(prefix_),
                                               model::SplitResidualPath(prefix_),
                                               {.quantization = q, .num_threads = 2});
    ASSERT_TRUE(summary.ok()) << summary.status();
    model::SplitQuantization q8_0;
    q8_0.base_format = quant::SplitFormat::kQ8_0;
    q8_0.base_group = 32;
    q8_0.residual_format.reset();
    q8_0.residual_group = 0;
    summary = offline::QuantizeSplitModel(source_->path(), model::SplitBasePath(prefix_ + "-q8_0"),
                                          "", {.quantization = q8_0, .num_threads = 2});
    ASSERT_TRUE(summary.ok()) << summary.status();
  }
  static void TearDownTestSuite() {
    std::error_code ignored;
    std::filesystem::remove(model::SplitBasePath(prefix_), ignored);
    std::filesystem::remove(model::SplitResidualPath(prefix_), ignored);
    std::filesystem::remove(model::SplitBasePath(prefix_ + "-q8_0"), ignored);
    delete source_;
  }
  static std::unique_ptr<model::LlamaModel> Split(int threads = 2) {
    auto loaded = model::LlamaModel::LoadSplit(model::SplitBasePath(prefix_),
                                               model::SplitResidualPath(prefix_), threads);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return loaded.ok() ? std::move(*loaded) : nullptr;
  }
  static std::vector<int32_t> Prompt(size_t length) {
    const std::vector<int32_t> all = source_->fixture()["cases"][0]["tokens"];
    return std::vector<int32_t>(all.begin(), all.begin() + static_cast<int64_t>(length));
  }

  static testing::SyntheticModelFile* source_;
  static std::string prefix_;
};
testing::SyntheticModelFile* MoeSplitTest::source_ = nullptr;
std::string MoeSplitTest::prefix_;

// The split holds every expert (tall matrices) and the router at source precision. Verify mode
// (10.6 bits per weight) is as close to the GGUF as Q8_0 of the same weights (8.5), compared by
// the median over positions: the mean of either is dominated by the few rows whose hidden state,
// off by the quantization error, flips a top-k choice of the exact router. The 2-bit draft is far
// off.
TEST_F(MoeSplitTest, VerifyModeIsAsCloseAsQ8_0AndDraftModeFarOff) {
  auto split = Split();
  ASSERT_NE(split, nullptr);
  const model::SplitModelFiles& files = *split->split_files();
  ASSERT_TRUE(files.config().has_experts());
  const auto down = files.base_linear().group({1, model::LinearGroup::kDown});
  ASSERT_EQ(down.size(), 1u);
  EXPECT_EQ(down[0].rows, 16 * 256);  // 16 experts of d_model rows
  EXPECT_EQ(down[0].cols, 128);
  EXPECT_EQ(files.embedding_and_norms().layers[2].router.rows, 16);
  EXPECT_EQ(files.embedding_and_norms().layers[2].router.type, GgmlType::kF32);

  auto reference = model::LlamaModel::Load(source_->path(), 2);
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
  auto q8_0 = model::LlamaModel::LoadSplit(model::SplitBasePath(prefix_ + "-q8_0"), "", 2);
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
      "qwen3moe, %lld positions: median KL(reference || ...) verify %.3e, Q8_0 %.3e, "
      "draft %.3e\n",
      static_cast<long long>(n), kl_verify, kl_q8_0, kl_draft);
  EXPECT_LT(kl_verify, 2 * kl_q8_0);
  EXPECT_GT(kl_draft, 20 * kl_verify);  // the residual carries what the 2-bit base lacks
}

// Draft and verify rows of the split are bit-identical alone, in a batch and on another thread
// count: routing, the per-row activation quantization and the per-expert kernels depend on the
// row alone.
TEST_F(MoeSplitTest, SplitRowsAreBatchInvariant) {
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
TEST_F(MoeSplitTest, SpeculationIsLossless) {
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

// The cpu-residual service computes dense groups only: it refuses the residual of an MoE split
// by name (the drafter then needs the residual in process).
TEST_F(MoeSplitTest, TheResidualServiceFileRefusesExperts) {
  auto residual = model::ResidualFile::Open(model::SplitResidualPath(prefix_));
  ASSERT_FALSE(residual.ok());
  EXPECT_EQ(residual.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(residual.status().message().find("mixture-of-experts residual"), std::string::npos)
      << residual.status();
}

}  // namespace
}  // namespace bitsplit
