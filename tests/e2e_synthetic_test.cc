// gemma4 through the three real processes (bitsplit-residual, bitsplit-drafter on the CPU
// backend, bitsplit-coordinator) and the public bitsplit.v1.Generation API: the random-weight
// gemma4 of the oracle fixture (local layers of 4 heads over 2 KV heads of 64 with a 32-token
// window, global layers of 4 heads over 1 KV head of 128, one global layer whose values are its
// keys), given the real qwen2 vocabulary so that it can be served, split by the quantizer. The
// streamed tokens must equal plain decoding of the same split model in this process for a tree,
// a chain and no speculation, greedy and sampled with two seeds, on a prompt past the window. The
// cpu-residual service answers the layers without attn_v with two matrices, so the qkv groups
// of one model have two widths on the wire. Random weights prove the arithmetic and the
// losslessness only.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/io/gguf.h"
#include "common/model/split_model.h"
#include "common/offline/split_quantizer.h"
#include "gtest/gtest.h"
#include "tests/testing/generation_stack.h"
#include "tests/testing/paths.h"
#include "tests/testing/split_fixture.h"
#include "tests/testing/synthetic_weights.h"

namespace bitsplit {
namespace {

constexpr char kVocabFile[] = "DeepSeek-R1-Distill-Qwen-7B.vocab.gguf";

TEST(E2eSyntheticTest, Gemma4SpeculationIsLosslessThroughTheServices) {
  auto vocab = gguf::File::Open(testing::ModelPath(kVocabFile));
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  const testing::SyntheticModelFile source("tests/fixtures/oracle/gemma4_synthetic_logits.json",
                                           vocab->get());
  ASSERT_TRUE(source.ok());
  const std::string prefix = (testing::TestTempDir() / "gemma4-synthetic").string();
  auto summary = offline::QuantizeSplitModel(
      source.path(), model::SplitBasePath(prefix), model::SplitResidualPath(prefix),
      {.quantization = testing::SplitFixtureQuantization(), .num_threads = 2});
  ASSERT_TRUE(summary.ok()) << summary.status();

  testing::GenerationStack stack;
  ASSERT_TRUE(stack.Start({model::SplitBasePath(prefix), model::SplitResidualPath(prefix)},
                          (testing::TestTempDir() / "e2e-gemma4").string(),
                          {.threads = 2, .coordinator_args = {}, .drafter_args = {}}));
  ASSERT_FALSE(stack.model().config().UniformAttention());
  ASSERT_TRUE(stack.model().config().ValueIsKey(2));

  // Past the 32-token window of the local layers.
  const testing::Prompt prompt{
      "license",
      "Licensed under the Apache License, Version 2.0 (the \"License\"); you may not use this "
      "file except in compliance with the License. You may obtain a copy of the License at",
      {}};
  ASSERT_GT(stack.ReferencePromptTokens(prompt).size(), 32u);
  const std::vector<testing::MatrixSampling> samplings = {
      {"greedy", {}},
      {"t0.8 seed 1", {.temperature = 0.8f, .seed = 1}},
      {"t0.8 seed 2", {.temperature = 0.8f, .seed = 2}}};
  const std::vector<testing::MatrixShape> shapes = {
      {"tree", testing::Tree(8, 2, 4), "tree N=8 k=2 depth<=4"},
      {"chain", testing::Tree(4, 1, 4), "tree N=4 k=1 depth<=4"},
      {"off", testing::Off(), "off"}};
  std::vector<testing::MatrixRow> rows;
  const std::string matrix =
      testing::ExpectLosslessMatrix(stack, {prompt}, samplings, shapes, 24, &rows);
  std::printf("gemma4 (random weights) losslessness matrix: %s\n", matrix.c_str());
  RecordProperty("matrix", matrix);
  EXPECT_EQ(rows.size(), samplings.size() * shapes.size());
}

}  // namespace
}  // namespace bitsplit
