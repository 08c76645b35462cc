// gemma-3-270m through the three real processes (bitsplit-residual, bitsplit-drafter on the CPU
// backend, bitsplit-coordinator) and the public bitsplit.v1.Generation API: the streamed tokens
// are equal to plain decoding of the same split model in this process for a 16-node tree, a
// 4-node chain and no speculation, on two prompts that run past the local layers' 512-token
// sliding window (greedy on every shape, sampled on the tree) and one short one (both on every
// shape). The drafter's KV cache is q8_0 (and so is the reference decoder's): losslessness holds
// for any cache type, since the draft and the verifier read the same rows. Past the window a tree
// node must see exactly the window the same token sees in plain decoding; each row there runs
// several verify steps, each drafting and verifying against a window that the paths committed by
// the steps before it have moved. The chat prompt goes through gemma's <start_of_turn> format,
// which the coordinator picks from the architecture because this pretrained GGUF has no chat
// template.
//
// Each drafted token costs a draft forward over the 262,144-token head, so on 2 cores the rows
// are few and long rather than many and short.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/generation_stack.h"
#include "tests/testing/paths.h"
#include "tests/testing/split_fixture.h"

namespace bitsplit {
namespace {

using testing::Prompt;

// The gemma3 oracle prompts (tests/oracle/gemma3_logit_prompts.json) named here.
std::vector<Prompt> Gemma3Prompts(const std::vector<std::string>& names) {
  std::ifstream in(testing::SourcePath("tests/oracle/gemma3_logit_prompts.json"));
  const nlohmann::json entries = nlohmann::json::parse(in);
  std::vector<Prompt> prompts;
  for (const std::string& name : names) {
    for (const auto& entry : entries) {
      if (entry["name"] != name) continue;
      Prompt prompt{name, std::nullopt, {}};
      if (entry["kind"] == "chat") {
        for (const auto& m : entry["messages"]) {
          prompt.messages.push_back(
              {m["role"].get<std::string>(), m["content"].get<std::string>()});
        }
      } else {
        prompt.text = entry["text"].get<std::string>();
      }
      prompts.push_back(std::move(prompt));
    }
  }
  EXPECT_EQ(prompts.size(), names.size()) << "a prompt is missing from the gemma3 prompt set";
  return prompts;
}

TEST(E2eGemma3Test, SpeculationIsLosslessPastTheSlidingWindow) {
  constexpr size_t kWindow = 512;
  constexpr int kMaxTokens = 48;
  testing::GenerationStack stack;
  ASSERT_TRUE(stack.Start(
      testing::Gemma3SplitModel(), (testing::TestTempDir() / "e2e-gemma3").string(),
      {.threads = 2, .coordinator_args = {}, .drafter_args = {}, .kv_type = model::KvType::kQ8_0}));
  const testing::MatrixSampling greedy = {"greedy", {}};
  const testing::MatrixSampling sampled = {"t0.8 seed 1", {.temperature = 0.8f, .seed = 1}};
  const testing::MatrixShape tree = {"tree", testing::Tree(16, 4, 8), "tree N=16 k=4 depth<=8"};
  // As many draft forwards a step as the tree (4): chains accept few tokens past the first
  // here, and each forward costs a pass over the 262,144-token head.
  const testing::MatrixShape chain = {"chain", testing::Tree(4, 1, 4), "tree N=4 k=1 depth<=4"};
  const testing::MatrixShape off = {"off", testing::Off(), "off"};
  auto run = [&](const char* label, const std::vector<Prompt>& prompts,
                 const testing::MatrixSampling& sampling,
                 const std::vector<testing::MatrixShape>& shapes, int max_tokens,
                 std::vector<testing::MatrixRow>* rows) {
    const std::string summary =
        testing::ExpectLosslessMatrix(stack, prompts, {sampling}, shapes, max_tokens, rows);
    std::printf("gemma3 losslessness matrix, %s: %s\n", label, summary.c_str());
    RecordProperty(label, summary);
  };

  // Past the window: greedy on every shape, sampling on the tree (a chain is a tree, and
  // sampling without speculation is the short prompt's row below).
  const std::vector<Prompt> long_prompts = Gemma3Prompts({"plain_long_gpl", "chat_long_mpl"});
  for (const Prompt& prompt : long_prompts) {
    EXPECT_GT(stack.ReferencePromptTokens(prompt).size(), kWindow) << prompt.name;
  }
  std::vector<testing::MatrixRow> rows;
  run("past the window, greedy", long_prompts, greedy, {tree, chain, off}, kMaxTokens, &rows);
  run("past the window, sampled", long_prompts, sampled, {tree}, kMaxTokens, &rows);
  // Every row must have run to the length limit: a tree step commits at most depth + 1 = 9
  // tokens, so that is at least 6 verify steps a row, all of them past the window.
  EXPECT_EQ(rows.size(), long_prompts.size() * 4);
  for (const testing::MatrixRow& row : rows) {
    SCOPED_TRACE(row.prompt + " / " + row.sampling + " / " + row.shape);
    EXPECT_EQ(row.completion_tokens, kMaxTokens);
    EXPECT_GE(row.verify_steps, (kMaxTokens + 8) / 9);
  }

  // Inside the window the local layers see the whole context: short rows suffice.
  const std::vector<Prompt> short_prompt = Gemma3Prompts({"plain_short_capital"});
  run("inside the window, greedy", short_prompt, greedy, {tree, chain, off}, 16, nullptr);
  run("inside the window, sampled", short_prompt, sampled, {tree, chain, off}, 16, nullptr);
}

}  // namespace
}  // namespace bitsplit
