// The random-weight models of the oracle fixtures through the three real processes
// (bitsplit-residual, bitsplit-drafter on the CPU backend, bitsplit-coordinator) and the public
// bitsplit.v1.Generation API, each given the real qwen2 vocabulary so that it can be served and
// split by the quantizer:
//
//   gemma4     local layers of 4 heads over 2 KV heads of 64 with a 32-token window, global
//              layers of 4 heads over 1 KV head of 128, one global layer whose values are its
//              keys (the service answers that layer's qkv with two matrices);
//   gemma4moe  3 such layers, each a dense FFN beside 16 fused-gate|up experts, 4 used;
//   qwen3moe   3 layers of 16 experts of width 128, 4 used, no dense FFN;
//   gpt_oss    4 layers alternating local (32-token window) and global attention with sinks and
//              q/k/v/o biases, YaRN RoPE, 16 biased MXFP4 experts of width 128 with 4 used (the
//              split quantizes the MXFP4 source like any other).
//
// For the MoE models every verify sends cpu-residual each expert group's routed rows with their
// experts (the expert segments of the shared-memory channel), and the service reads each routed
// expert's residual once. The streamed tokens must equal plain decoding of the same split model
// in this process for a tree, a chain and no speculation, greedy and sampled with two seeds, on
// a prompt past the window, and again with 4 streams at once. Random weights prove the
// arithmetic and the losslessness only.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <future>
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

struct SyntheticCase {
  const char* name;
  const char* fixture;
};

class E2eSyntheticTest : public ::testing::TestWithParam<SyntheticCase> {};

TEST_P(E2eSyntheticTest, SpeculationIsLosslessThroughTheServices) {
  auto vocab = gguf::File::Open(testing::ModelPath(kVocabFile));
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  const testing::SyntheticModelFile source(GetParam().fixture, vocab->get());
  ASSERT_TRUE(source.ok());
  const std::string prefix =
      (testing::TestTempDir() / absl::StrCat(GetParam().name, "-synthetic")).string();
  auto summary = offline::QuantizeSplitModel(
      source.path(), model::SplitBasePath(prefix), model::SplitResidualPath(prefix),
      {.quantization = testing::SplitFixtureQuantization(), .num_threads = 2});
  ASSERT_TRUE(summary.ok()) << summary.status();

  testing::GenerationStack stack;
  // A verify of N rows routes N x 4 rows to the experts: the service's channel of 256 rows
  // carries the coordinator's default trees (16 nodes and the root) in batches of 64 rows.
  ASSERT_TRUE(stack.Start({model::SplitBasePath(prefix), model::SplitResidualPath(prefix)},
                          (testing::TestTempDir() / absl::StrCat("e2e-", GetParam().name)).string(),
                          {.threads = 2,
                           .coordinator_args = {},
                           .drafter_args = {"--max-tree-nodes", "17", "--max-batch-rows", "64"}}));

  // Past the 32-token window of gemma4's local layers.
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
  std::printf("%s (random weights) losslessness matrix: %s\n", GetParam().name, matrix.c_str());
  RecordProperty("matrix", matrix);
  EXPECT_EQ(rows.size(), samplings.size() * shapes.size());

  // Four streams at once (their rows share every forward): each equals its own plain decoding.
  struct Stream {
    testing::Prompt prompt;
    model::SamplingParams sampling;
    v1::SpeculationSettings speculation;
  };
  const std::vector<Stream> streams = {
      {prompt, {}, testing::Tree(8, 2, 4)},
      {{"capital", "The capital of France is", {}},
       {.temperature = 0.8f, .seed = 1},
       testing::Tree(4, 1, 4)},
      {{"story", "Once upon a time,", {}}, {.temperature = 0.8f, .seed = 2}, testing::Off()},
      {{"chat", std::nullopt, {{"user", "What is the tallest mountain?"}}},
       {},
       testing::Tree(8, 2, 4)}};
  constexpr int kTokens = 16;
  std::vector<std::future<testing::StreamResult>> running;
  for (const Stream& stream : streams) {
    v1::GenerateRequest request = testing::RequestFor(stream.prompt);
    request.set_max_tokens(kTokens);
    if (stream.sampling.temperature > 0) {
      request.set_temperature(stream.sampling.temperature);
      request.set_seed(stream.sampling.seed);
    }
    *request.mutable_speculation() = stream.speculation;
    running.push_back(std::async(std::launch::async, [&stack, request] {
      return stack.Generate(request, std::chrono::minutes(3));
    }));
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    const testing::StreamResult result = running[i].get();
    SCOPED_TRACE(streams[i].prompt.name);
    ASSERT_TRUE(result.status.ok()) << result.status.error_message();
    EXPECT_EQ(result.tokens, stack.PlainDecode(stack.ReferencePromptTokens(streams[i].prompt),
                                               streams[i].sampling, kTokens));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Families, E2eSyntheticTest,
    ::testing::Values(
        SyntheticCase{"gemma4", "tests/fixtures/oracle/gemma4_synthetic_logits.json"},
        SyntheticCase{"gemma4moe", "tests/fixtures/oracle/gemma4moe_synthetic_logits.json"},
        SyntheticCase{"qwen3moe", "tests/fixtures/oracle/qwen3moe_synthetic_logits.json"},
        SyntheticCase{"gpt_oss", "tests/fixtures/oracle/gpt-oss_synthetic_logits.json"}),
    [](const ::testing::TestParamInfo<SyntheticCase>& info) {
      return std::string(info.param.name);
    });

}  // namespace
}  // namespace bitsplit
