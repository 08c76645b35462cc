// The `bitsplit quantize` command and `bitsplit generate` on split models, run as the built
// binary: error paths (one clear line, exit status 2), a base-only Q8_0 quantization with
// calibration, generation in draft and verify mode, and the tokenizer carried by the base file.
// The full 2-bit + r8 quantization is the CTest fixture split_fixture.quantize_smollm2
// (tests/CMakeLists.txt), which these tests read.
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/io/split_file.h"
#include "common/model/llama_model.h"
#include "common/model/split_model.h"
#include "common/text/chat_template.h"
#include "common/text/tokenizer.h"
#include "common/util/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/paths.h"
#include "tests/testing/shell.h"
#include "tests/testing/split_fixture.h"

namespace bitsplit {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

using Result = testing::CommandResult;

// Runs the bitsplit binary with `args` and captures its output.
Result Bitsplit(const std::vector<std::string>& args) {
  static int calls = 0;
  const std::string err_path = (testing::TestTempDir() / absl::StrCat("stderr.", calls++)).string();
  return testing::RunCapturing(std::string(BITSPLIT_BINARY_DIR) + "/tools/bitsplit/bitsplit", args,
                               err_path);
}

// A bad-input failure: exit status 2 and exactly one line on stderr.
void ExpectOneLineBadInput(const Result& result, const std::string& expected) {
  EXPECT_EQ(result.exit_code, 2) << result.err;
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
  EXPECT_THAT(result.err, HasSubstr(expected));
}

std::string SourceModel() { return testing::ModelPath(testing::kSmolLm2File); }
std::string TempPath(const std::string& name) { return (testing::TestTempDir() / name).string(); }

TEST(QuantizeCommandTest, RejectsAMissingSourceFile) {
  const Result result = Bitsplit({"quantize", "/nonexistent/model.gguf", "-o", TempPath("x")});
  ExpectOneLineBadInput(result, "/nonexistent/model.gguf");
}

TEST(QuantizeCommandTest, RejectsAGroupThatDoesNotFitNamingTheTensor) {
  const std::string prefix = TempPath("bad_group");
  const Result result = Bitsplit({"quantize", SourceModel(), "-o", prefix, "--group", "128"});
  ExpectOneLineBadInput(result, "blk.0.attn_q.weight");
  EXPECT_THAT(result.err, HasSubstr("32, 64, 96, 192"));
  EXPECT_FALSE(std::filesystem::exists(prefix + ".base.bsplit"));
  EXPECT_FALSE(std::filesystem::exists(prefix + ".base.bsplit.tmp"));
}

TEST(QuantizeCommandTest, RejectsKnobsThatDoNotFit) {
  const std::string prefix = TempPath("bad");
  ExpectOneLineBadInput(
      Bitsplit({"quantize", SourceModel(), "-o", prefix, "--rotate-block", "128"}),
      "rotation block 128");
  ExpectOneLineBadInput(
      Bitsplit({"quantize", SourceModel(), "-o", prefix, "--base-bits", "8", "--group", "32"}),
      "symmetric");
  ExpectOneLineBadInput(Bitsplit({"quantize", SourceModel(), "-o", prefix, "--base-bits", "8",
                                  "--base-format", "sym", "--group", "32"}),
                        "takes no residual");
  ExpectOneLineBadInput(Bitsplit({"quantize", SourceModel(), "-o", prefix, "--base-format", "tern",
                                  "--base-bits", "3"}),
                        "drop --base-bits");
  EXPECT_EQ(
      Bitsplit({"quantize", SourceModel(), "-o", prefix, "--base-format", "ternary"}).exit_code, 2);
  EXPECT_EQ(Bitsplit({"quantize", SourceModel(), "-o", prefix, "--base-bits", "5"}).exit_code, 2);
  EXPECT_EQ(Bitsplit({"quantize", SourceModel(), "-o", prefix, "--residual-bits", "7"}).exit_code,
            2);
  ExpectOneLineBadInput(
      Bitsplit({"quantize", SourceModel(), "-o", TempPath("no/such/dir/x"), "--base-bits", "8",
                "--base-format", "sym", "--group", "32", "--residual-bits", "0"}),
      "no/such/dir");
}

// Quantizes SmolLM2 to the Q8_0 base-only configuration (fast: no base fit) with calibration.
std::string QuantizeQ8_0(const std::string& name) {
  const std::string text_path = TempPath("calibration.txt");
  std::ofstream(text_path) << "The quick brown fox jumps over the lazy dog. "
                              "Licences grant rights to copy, modify and distribute software.\n";
  const std::string prefix = TempPath(name);
  const Result result =
      Bitsplit({"quantize", SourceModel(), "-o", prefix, "--base-bits", "8", "--base-format", "sym",
                "--group", "32", "--residual-bits", "0", "--no-rotate", "--calib", text_path,
                "--calib-window", "16", "--threads", "2"});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_THAT(result.out, HasSubstr("q8_0/g32 (base only), calibrated on"));
  EXPECT_THAT(result.out, HasSubstr("RAM (residual): none (base only)"));
  EXPECT_THAT(result.out, HasSubstr("linear weights 8.500 bits/weight"));
  EXPECT_THAT(result.out, HasSubstr("q8_0: 211"));
  // stderr is not a terminal here: whole progress lines, in steps of at least 5%, ending at 100%.
  const std::vector<std::string> lines = absl::StrSplit(result.err, '\n', absl::SkipEmpty());
  std::vector<double> percents;
  for (const std::string& line : lines) {
    EXPECT_EQ(line.find('\r'), std::string::npos) << line;
    double percent = 0;
    if (std::sscanf(line.c_str(), "[quantize] %lf%%", &percent) == 1) percents.push_back(percent);
  }
  EXPECT_GE(percents.size(), 2u) << result.err;
  EXPECT_EQ(percents.empty() ? 0.0 : percents.back(), 100.0) << result.err;
  for (size_t i = 1; i + 1 < percents.size(); ++i) {
    EXPECT_GE(percents[i] - percents[i - 1], 0.0) << result.err;
    EXPECT_GE(std::floor(percents[i] / 5), std::floor(percents[i - 1] / 5) + 1) << result.err;
  }
  EXPECT_THAT(result.err, HasSubstr("ETA"));
  EXPECT_FALSE(std::filesystem::exists(prefix + ".residual.bsplit"));
  auto base = SplitFile::Open(prefix + ".base.bsplit", SplitFileKind::kBase,
                              model::SplitFormatRowSizeOracle());
  EXPECT_TRUE(base.ok()) << base.status();
  if (base.ok()) {
    const std::string text = testing::ReadFile(text_path);
    EXPECT_EQ((*base)->metadata()["bitsplit"]["quantization"]["calibration_sha256"],
              Sha256Hex(Sha256Of(text.data(), text.size())));
  }
  return prefix + ".base.bsplit";
}

TEST(QuantizeCommandTest, VramBudgetRefusesWhatCannotFitAndFixedBits) {
  // SmolLM2's fewest base bits need 42 MiB for the linear weights, 338 MiB with a 2048-token
  // session and the scratch of 256-row forwards; the refusal comes before any measurement.
  const std::string calib = testing::SourcePath("README.md");
  Result result = Bitsplit({"quantize", SourceModel(), "-o", TempPath("budget"), "--vram-budget",
                            "300MiB", "--calib", calib});
  ExpectOneLineBadInput(result, "even the fewest base bits (every linear weight b2_asym)");
  EXPECT_THAT(result.err, HasSubstr("base b2_asym/g64 (42.0 MiB)"));
  EXPECT_THAT(result.err, HasSubstr("fits: context"));
  result = Bitsplit({"quantize", SourceModel(), "-o", TempPath("budget"), "--vram-budget", "25%",
                     "--calib", calib});
  ExpectOneLineBadInput(result, "even the fewest base bits");
  result = Bitsplit({"quantize", SourceModel(), "-o", TempPath("budget"), "--vram-budget", "40%"});
  ExpectOneLineBadInput(result, "pass --calib FILE");
  result = Bitsplit({"quantize", SourceModel(), "-o", TempPath("budget"), "--vram-budget", "40%",
                     "--calib", calib, "--base-bits", "3"});
  ExpectOneLineBadInput(result, "drop --base-bits and --residual-bits");
  result = Bitsplit({"quantize", SourceModel(), "-o", TempPath("budget"), "--vram-budget", "lots",
                     "--calib", calib});
  ExpectOneLineBadInput(result, "--vram-budget \"lots\" is neither a size");
  result = Bitsplit({"quantize", SourceModel(), "-o", TempPath("budget"), "--vram-budget", "40%",
                     "--calib", calib, "--quality", "q9"});
  ExpectOneLineBadInput(result, "--quality \"q9\" is neither q8_0 nor q8_0*F");
  result = Bitsplit({"quantize", SourceModel(), "-o", TempPath("budget"), "--vram-budget", "40%",
                     "--calib", calib, "--plan-kv-type", "f32"});
  ExpectOneLineBadInput(result, "--plan-kv-type \"f32\" is neither f16 nor q8_0");
  EXPECT_FALSE(std::filesystem::exists(TempPath("budget.base.bsplit")));
}

TEST(QuantizeCommandTest, WritesABaseOnlyQ8_0ModelThatGenerateRunsInDraftMode) {
  const std::string base = QuantizeQ8_0("q8_0");
  const Result draft = Bitsplit(
      {"generate", "--model", base, "-p", "The capital of France is", "-n", "8", "--threads", "2"});
  EXPECT_EQ(draft.exit_code, 0) << draft.err;
  EXPECT_THAT(draft.err, HasSubstr("draft mode"));
  EXPECT_THAT(draft.out, Not(::testing::IsEmpty()));
  ExpectOneLineBadInput(
      Bitsplit({"generate", "--model", base, "--mode", "verify", "-p", "Hi", "-n", "2"}),
      "--mode verify needs a split model with its --residual file");
}

TEST(GenerateCommandTest, RunsTheSplitModelInVerifyAndDraftMode) {
  const testing::SplitModelPaths& split = testing::SmolLm2SplitModel();
  const std::vector<std::string> prompt = {
      "-p", "The capital of France is", "-n", "12", "--threads", "2"};
  auto run = [&](std::vector<std::string> args) {
    args.insert(args.end(), prompt.begin(), prompt.end());
    return Bitsplit(args);
  };
  const Result reference = run({"generate", "--model", SourceModel()});
  const Result verify = run({"generate", "--model", split.base, "--residual", split.residual});
  const Result draft =
      run({"generate", "--model", split.base, "--residual", split.residual, "--mode", "draft"});
  for (const Result* r : {&reference, &verify, &draft}) {
    EXPECT_EQ(r->exit_code, 0) << r->err;
    EXPECT_THAT(r->out, Not(::testing::IsEmpty()));
  }
  EXPECT_THAT(reference.err, HasSubstr("reference mode"));
  EXPECT_THAT(verify.err, HasSubstr("verify mode"));  // the default with a residual
  EXPECT_THAT(draft.err, HasSubstr("draft mode"));
  std::printf("reference: %sverify:    %sdraft:     %s", reference.out.c_str(), verify.out.c_str(),
              draft.out.c_str());
}

// The reference engine through the CLI: every bad-input path is one line and exit status 2;
// a good run streams the answer and ends with the stats line.
TEST(GenerateCommandTest, ReferenceRunStreamsTextAndEndsWithStats) {
  const Result chat = Bitsplit({"generate", "--model", SourceModel(), "--chat",
                                "What is the capital of France?", "-n", "200", "-n", "12"});
  EXPECT_EQ(chat.exit_code, 0) << chat.err;
  EXPECT_THAT(chat.out, HasSubstr("Paris"));
  // A repeated option takes its last value (-n 12): at most 12 tokens generated.
  EXPECT_THAT(chat.err, ::testing::ContainsRegex("prompt [0-9]+ tokens.*generated ([1-9]|1[0-2]) "
                                                 "tokens.*tok/s"));
}

TEST(GenerateCommandTest, RejectsBadArgumentsAndFilesWithOneLine) {
  const std::string model = SourceModel();
  ExpectOneLineBadInput(Bitsplit({"generate", "--model", "/nonexistent.gguf", "-p", "hi"}),
                        "File does not exist");
  ExpectOneLineBadInput(Bitsplit({"generate", "--model", model}), "--prompt or --chat");
  ExpectOneLineBadInput(Bitsplit({"generate", "--model", model, "-p", "a", "-c", "b"}), "excludes");
  ExpectOneLineBadInput(Bitsplit({"generate", "--model", model, "-p", "hi", "-n", "0"}),
                        "-n must be at least 1");
  ExpectOneLineBadInput(Bitsplit({"generate", "--model", model, "-p", "hi", "-n", "x"}),
                        "max-tokens");
  ExpectOneLineBadInput(Bitsplit({"generate", "--model", model, "-p", "hi", "--temperature", "-1"}),
                        "temperature");
  ExpectOneLineBadInput(Bitsplit({"generate", "--model", model, "-p", "hi", "--top-p", "2"}),
                        "top_p");
  ExpectOneLineBadInput(Bitsplit({"generate", "--model", model, "-p", "hi", "--top-k", "-3"}),
                        "top_k");
  ExpectOneLineBadInput(Bitsplit({"generate", "--model", model, "-p", "hi", "-n", "100000"}),
                        "exceeds the model's context");
  ExpectOneLineBadInput(Bitsplit({"generate", "--model", model, "-p", ""}), "empty");
  const std::string not_gguf = TempPath("not_a_model.gguf");
  std::ofstream(not_gguf) << "# definitely not a GGUF file\n";
  ExpectOneLineBadInput(Bitsplit({"generate", "--model", not_gguf, "-p", "hi"}), "bad magic");
  // A vocabulary-only GGUF (the qwen2 tokenizer file setup.sh derives) has no weights to run.
  ExpectOneLineBadInput(
      Bitsplit({"generate", "--model", testing::ModelPath("DeepSeek-R1-Distill-Qwen-7B.vocab.gguf"),
                "-p", "hi"}),
      "token_embd.weight");
  ExpectOneLineBadInput(Bitsplit({"frobnicate"}), "bitsplit: error");
}

TEST(GenerateCommandTest, RejectsMisassembledSplitModels) {
  const testing::SplitModelPaths& split = testing::SmolLm2SplitModel();
  const std::vector<std::string> prompt = {"-p", "Hi", "-n", "2"};
  auto run = [&](std::vector<std::string> args) {
    args.insert(args.end(), prompt.begin(), prompt.end());
    return Bitsplit(args);
  };
  ExpectOneLineBadInput(run({"generate", "--model", split.base, "--residual", split.base}),
                        "given as the residual file");
  ExpectOneLineBadInput(run({"generate", "--model", split.residual}), "given as the base file");
  ExpectOneLineBadInput(run({"generate", "--model", SourceModel(), "--residual", split.residual}),
                        "--residual needs a split model");
  ExpectOneLineBadInput(run({"generate", "--model", SourceModel(), "--mode", "draft"}),
                        "--mode draft needs a split model");
  ExpectOneLineBadInput(run({"generate", "--model", split.base, "--mode", "reference"}),
                        "--mode reference needs a GGUF model");
  ExpectOneLineBadInput(run({"generate", "--model", "/nonexistent.base.bsplit"}),
                        "/nonexistent.base.bsplit");
  // A base file of another quantize run (Q8_0) with the fixture's residual.
  const Result mismatched =
      run({"generate", "--model", QuantizeQ8_0("other"), "--residual", split.residual});
  ExpectOneLineBadInput(mismatched, "do not belong together");
  EXPECT_THAT(mismatched.err, HasSubstr("fingerprint"));
}

TEST(SplitModelTextTest, TheBaseFileCarriesTheSourceTokenizerAndChatTemplate) {
  auto source = gguf::File::Open(SourceModel());
  ASSERT_TRUE(source.ok()) << source.status();
  auto split = model::LlamaModel::LoadSplit(testing::SmolLm2SplitModel().base, "", 1);
  ASSERT_TRUE(split.ok()) << split.status();
  auto expected = text::Tokenizer::FromGguf(**source);
  auto actual = text::Tokenizer::FromGguf((*split)->gguf_metadata());
  ASSERT_TRUE(expected.ok() && actual.ok());
  for (const std::string sample : {"Hello, world!", "  indented\n\tcode();",
                                   "<|im_start|>user\nCafé ünïcödé 🙂<|im_end|>"}) {
    EXPECT_EQ((*actual)->Encode(sample, true), (*expected)->Encode(sample, true)) << sample;
  }
  EXPECT_EQ((*actual)->bos_id(), (*expected)->bos_id());
  EXPECT_EQ((*actual)->eos_id(), (*expected)->eos_id());
  auto expected_template = text::ChatTemplate::FromGguf(**source, **expected);
  auto actual_template = text::ChatTemplate::FromGguf((*split)->gguf_metadata(), **actual);
  ASSERT_TRUE(expected_template.ok() && actual_template.ok());
  EXPECT_EQ(actual_template->source(), expected_template->source());
  const std::vector<text::ChatMessage> messages = {{"user", "Why is the sky blue?"}};
  EXPECT_EQ(*actual_template->Render(messages, true), *expected_template->Render(messages, true));
}

}  // namespace
}  // namespace bitsplit
