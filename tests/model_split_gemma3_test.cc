// gemma-3-270m through the split engine: the quantized files carry the family's extra vectors
// at source precision, and speculative decoding stays lossless (docs/design.md §3) on prompts
// longer than the local layers' 512-token sliding window, where a tree node must see exactly the
// window the same token sees in plain decoding.
#include <fstream>
#include <string>
#include <vector>

#include "common/model/llama_model.h"
#include "common/model/sampler.h"
#include "common/speculation/tree.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/paths.h"
#include "tests/testing/speculation_runs.h"
#include "tests/testing/split_fixture.h"

namespace bitsplit::model {
namespace {

constexpr int kThreads = 2;

class Gemma3SplitTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const testing::SplitModelPaths& paths = testing::Gemma3SplitModel();
    auto model = LlamaModel::LoadSplit(paths.base, paths.residual, kThreads);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = model->release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }

  // The oracle fixture's prompt `name` (llama.cpp's tokens, BOS first).
  static std::vector<int32_t> OraclePrompt(const std::string& name) {
    std::ifstream in(
        testing::SourcePath("tests/fixtures/oracle/gemma3_f32_exact_gelu_logits.json"));
    const nlohmann::json fixture = nlohmann::json::parse(in);
    for (const auto& c : fixture["cases"]) {
      if (c["name"] == name) return c["tokens"].get<std::vector<int32_t>>();
    }
    ADD_FAILURE() << "no prompt " << name << " in the gemma3 oracle fixture";
    return {2};
  }

  static LlamaModel* model_;
};
LlamaModel* Gemma3SplitTest::model_ = nullptr;

TEST_F(Gemma3SplitTest, FilesCarryTheFamilyConfigAndVectors) {
  auto source = gguf::File::Open(testing::ModelPath(testing::kGemma3File));
  ASSERT_TRUE(source.ok()) << source.status();
  auto source_config = ModelConfigFromGguf(**source);
  ASSERT_TRUE(source_config.ok()) << source_config.status();
  const ModelConfig& config = model_->config();
  EXPECT_EQ(config.architecture, "gemma3");
  EXPECT_EQ(config.sliding_window, source_config->sliding_window);
  EXPECT_EQ(config.layer_is_local, source_config->layer_is_local);
  EXPECT_EQ(config.attention_scale, source_config->attention_scale);
  EXPECT_EQ(config.embedding_scale, source_config->embedding_scale);
  EXPECT_TRUE(model_->SupportsMode(ForwardMode::kVerify));
  // The vectors are copied, not quantized: the base file's bytes equal the source tensor's.
  auto weights = ModelWeightsFromGguf(**source, *source_config);
  ASSERT_TRUE(weights.ok()) << weights.status();
  const EmbeddingAndNorms& split = model_->embedding_and_norms();
  for (int64_t layer : {0, 5, 17}) {
    const LayerNorms& ours = split.layers[static_cast<size_t>(layer)];
    const LayerNorms& theirs = weights->layers[static_cast<size_t>(layer)].vectors;
    for (const LayerVectorSpec& spec : LayerVectorSpecs(config, layer)) {
      ASSERT_NE(ours.*spec.field, nullptr) << spec.tensor;
      EXPECT_EQ(std::vector<float>(ours.*spec.field, ours.*spec.field + spec.length),
                std::vector<float>(theirs.*spec.field, theirs.*spec.field + spec.length))
          << "layer " << layer << " " << spec.tensor;
    }
  }
}

// Greedy, tree / chain / no speculation, on a prompt past the 512-token window, in process: the
// prefix is prefilled in chunks of 16 in the speculative session and in one batch in plain
// decoding, so the window is applied both across forwards and inside one. (tests/e2e_gemma3_test.cc
// runs the prompt x sampling x shape matrix through the services.)
TEST_F(Gemma3SplitTest, SpeculationIsLosslessPastTheSlidingWindow) {
  const std::vector<std::vector<int32_t>> prompts = {OraclePrompt("plain_long_gpl")};
  ASSERT_GT(prompts[0].size(), 600u);
  const SamplingParams samplings[] = {{}};
  const speculation::TreeShape shapes[] = {{.nodes = 16, .expansions = 4, .max_depth = 8},
                                           {.nodes = 8, .expansions = 1, .max_depth = 8},
                                           {.nodes = 0, .expansions = 1, .max_depth = 1}};
  constexpr int kTokens = 12;
  int accepted_beyond_root = 0;
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (const SamplingParams& sampling : samplings) {
      const std::vector<int32_t> expected =
          testing::PlainDecode(*model_, prompts[p], sampling, kTokens);
      for (const speculation::TreeShape& shape : shapes) {
        const testing::SpecRun run = testing::SpeculativeDecode(
            *model_, prompts[p], sampling, kTokens, shape, ForwardMode::kDraft);
        EXPECT_EQ(run.tokens, expected) << "prompt " << p << " T=" << sampling.temperature
                                        << " seed " << sampling.seed << " nodes " << shape.nodes;
        if (shape.nodes > 0) accepted_beyond_root += kTokens - run.verify_steps;
      }
    }
  }
  // The 2-bit draft must have had some of its tokens accepted, or the trees tested nothing.
  EXPECT_GT(accepted_beyond_root, 0);
}

}  // namespace
}  // namespace bitsplit::model
