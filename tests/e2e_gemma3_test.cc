// gemma-3-270m through the three real processes (bitsplit-residual, bitsplit-drafter on the CPU
// backend, bitsplit-coordinator) and the public bitsplit.v1.Generation API: the streamed tokens
// are the same for a 16-node tree, an 8-node chain and no speculation, and equal to plain
// decoding of the same split model in this process, for greedy and sampled decoding, on six
// prompts of which two run past the local layers' 512-token sliding window (there a tree node
// must see exactly the window the same token sees in plain decoding). The chat prompts go
// through gemma's <start_of_turn> format, which the coordinator picks from the architecture
// because this pretrained GGUF has no chat template.
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
  testing::GenerationStack stack;
  ASSERT_TRUE(stack.Start(testing::Gemma3SplitModel(),
                          (testing::TestTempDir() / "e2e-gemma3").string(),
                          {.threads = 2, .coordinator_args = {}, .drafter_args = {}}));
  const std::vector<Prompt> prompts =
      Gemma3Prompts({"plain_short_capital", "plain_code", "chat_short_hi", "chat_explain",
                     "plain_long_gpl", "chat_long_mpl"});
  size_t past_window = 0;
  for (const Prompt& prompt : prompts) {
    past_window += stack.ReferencePromptTokens(prompt).size() > 512 ? 1 : 0;
  }
  EXPECT_GE(past_window, 2u);
  const std::string summary =
      testing::ExpectLosslessMatrix(stack, prompts,
                                    {{"greedy", {}},
                                     {"t0.8 seed 1", {.temperature = 0.8f, .seed = 1}},
                                     {"t0.8 seed 2", {.temperature = 0.8f, .seed = 2}}},
                                    {{"tree", testing::Tree(16, 4, 8), "tree N=16 k=4 depth<=8"},
                                     {"chain", testing::Tree(8, 1, 8), "tree N=8 k=1 depth<=8"},
                                     {"off", testing::Off(), "off"}},
                                    /*max_tokens=*/8);
  std::printf("gemma3 losslessness matrix: %s\n", summary.c_str());
  RecordProperty("matrix", summary);
}

}  // namespace
}  // namespace bitsplit
