// `bitsplit tokenize`, run as the built binary, against llama.cpp's ids in the committed
// tokenizer fixtures (tests/fixtures/tokenizer/*_tokens.json): gemma3's full model file, the
// metadata-only qwen2 GGUF, and a split model's base file; plus the error paths (one line on
// stderr, exit status 2). A vocabulary whose model file is absent is skipped.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/gguf_builder.h"
#include "tests/testing/paths.h"
#include "tests/testing/shell.h"

namespace bitsplit {
namespace {

using ::testing::HasSubstr;

constexpr char kQwen2VocabFile[] = "DeepSeek-R1-Distill-Qwen-7B.vocab.gguf";

using Result = testing::CommandResult;

// Runs the bitsplit binary with `args`, `stdin_text` on its standard input when given (else
// /dev/null).
Result Bitsplit(const std::vector<std::string>& args,
                const std::optional<std::string>& stdin_text = std::nullopt) {
  static int calls = 0;
  const int call = calls++;
  const std::string err_path = (testing::TestTempDir() / absl::StrCat("stderr.", call)).string();
  std::string in_path = "/dev/null";
  if (stdin_text) {
    in_path = (testing::TestTempDir() / absl::StrCat("stdin.", call)).string();
    std::ofstream(in_path, std::ios::binary) << *stdin_text;
  }
  return testing::RunCapturing(std::string(BITSPLIT_BINARY_DIR) + "/tools/bitsplit/bitsplit", args,
                               err_path, in_path);
}

void ExpectOneLineBadInput(const Result& result, const std::string& expected) {
  EXPECT_EQ(result.exit_code, 2) << result.err;
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
  EXPECT_THAT(result.err, HasSubstr(expected));
  EXPECT_EQ(result.out, "");
}

nlohmann::json Fixture(const std::string& vocabulary) {
  std::ifstream in(
      testing::SourcePath(absl::StrCat("tests/fixtures/tokenizer/", vocabulary, "_tokens.json")));
  EXPECT_TRUE(in) << "missing fixture for " << vocabulary;
  return in ? nlohmann::json::parse(in) : nlohmann::json::object();
}

std::string JsonIds(const std::vector<int32_t>& ids) {
  return absl::StrCat("[", absl::StrJoin(ids, ", "), "]\n");
}

// The first string of every category (a spread of scripts, whitespace, numbers, special-token
// text, ...), as the command is slow enough per call that the whole corpus would be too much.
std::vector<const nlohmann::json*> OnePerCategory(const nlohmann::json& fixture) {
  std::vector<const nlohmann::json*> picked;
  std::set<std::string> seen;
  for (const auto& c : fixture["cases"]) {
    if (seen.insert(c["category"].get<std::string>()).second) picked.push_back(&c);
  }
  return picked;
}

// Checks the command's ids for `model` against the fixture: the default (BOS as the model asks,
// no special parsing) and --special through --text, --no-bos through standard input.
void ExpectFixtureIds(const std::string& model, const nlohmann::json& fixture) {
  const std::vector<const nlohmann::json*> cases = OnePerCategory(fixture);
  ASSERT_GE(cases.size(), 10u);
  size_t agree = 0;
  for (const nlohmann::json* c : cases) {
    const std::string text = (*c)["text"];
    const bool has_nul = text.find('\0') != std::string::npos;  // not passable in argv
    const Result plain = has_nul
                             ? Bitsplit({"tokenize", "--model", model, "--json"}, text)
                             : Bitsplit({"tokenize", "--model", model, "--json", "--text", text});
    EXPECT_EQ(plain.exit_code, 0) << plain.err;
    const std::string expected = JsonIds((*c)["ids_plain_added"]);
    EXPECT_EQ(plain.out, expected) << nlohmann::json(text).dump();
    if (plain.out == expected) ++agree;
  }
  EXPECT_EQ(agree, cases.size());
  for (size_t i = 0; i < cases.size(); i += 3) {
    const nlohmann::json& c = *cases[i];
    const std::string text = c["text"];
    const Result special = Bitsplit({"tokenize", "--model", model, "--json", "--special"}, text);
    EXPECT_EQ(special.out, JsonIds(c["ids_special_added"])) << nlohmann::json(text).dump();
    const Result no_bos = Bitsplit({"tokenize", "-m", model, "--json", "--no-bos"}, text);
    EXPECT_EQ(no_bos.out, JsonIds(c["ids_plain"])) << nlohmann::json(text).dump();
  }
}

TEST(TokenizeCommandTest, Gemma3MatchesLlamaCpp) {
  const std::string model = testing::ModelPath(testing::kGemma3File);
  if (!std::filesystem::exists(model)) {
    GTEST_SKIP() << model << " is missing (scripts/setup.sh --models)";
  }
  ExpectFixtureIds(model, Fixture("gemma3"));
}

TEST(TokenizeCommandTest, Qwen2MetadataOnlyGgufMatchesLlamaCpp) {
  const std::string model = testing::ModelPath(kQwen2VocabFile);
  if (!std::filesystem::exists(model)) {
    GTEST_SKIP() << model << " is missing (scripts/setup.sh --models)";
  }
  ExpectFixtureIds(model, Fixture("qwen2"));
}

TEST(TokenizeCommandTest, DefaultOutputIsLlamaTokenizeStyle) {
  const std::string model = testing::ModelPath(testing::kGemma3File);
  if (!std::filesystem::exists(model)) {
    GTEST_SKIP() << model << " is missing (scripts/setup.sh --models)";
  }
  // "%6d -> '%s'" per token, pieces with special tokens rendered, as llama-tokenize prints.
  const Result result =
      Bitsplit({"tokenize", "--model", model, "--special", "--text", "Hi<end_of_turn>"});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json fixture = Fixture("gemma3");
  std::vector<int32_t> ids = {fixture["bos_id"].get<int32_t>()};
  ids.push_back(fixture["eot_id"]);  // <end_of_turn>
  const std::vector<std::string> lines = {absl::StrFormat("%6d -> '<bos>'", ids[0]),
                                          absl::StrFormat("%6d -> '<end_of_turn>'", ids[1])};
  EXPECT_THAT(result.out, HasSubstr(lines[0] + "\n"));
  EXPECT_THAT(result.out, ::testing::EndsWith(lines[1] + "\n"));
  EXPECT_EQ(std::count(result.out.begin(), result.out.end(), '\n'), 3) << result.out;  // + "Hi"
}

TEST(TokenizeCommandTest, SplitBaseFileUsesTheEmbeddedVocabulary) {
  const std::string source = testing::ModelPath(testing::kSmolLm2File);
  if (!std::filesystem::exists(source)) {
    GTEST_SKIP() << source << " is missing (scripts/setup.sh --models)";
  }
  // The cheapest split model: a base-only q8_0 quantization (about a second).
  const std::string prefix = (testing::TestTempDir() / "smollm2_q8").string();
  const Result quantize =
      Bitsplit({"quantize", source, "-o", prefix, "--base-bits", "8", "--base-format", "sym",
                "--group", "32", "--residual-bits", "0", "--no-rotate", "--threads", "2"});
  ASSERT_EQ(quantize.exit_code, 0) << quantize.err;
  const std::string base = prefix + ".base.bsplit";
  const nlohmann::json fixture = Fixture("smollm2");
  for (const nlohmann::json* c : OnePerCategory(fixture)) {
    const std::string text = (*c)["text"];
    const Result from_base = Bitsplit({"tokenize", "-m", base, "--json", "--special"}, text);
    EXPECT_EQ(from_base.exit_code, 0) << from_base.err;
    EXPECT_EQ(from_base.out, JsonIds((*c)["ids_special_added"])) << nlohmann::json(text).dump();
  }
}

TEST(TokenizeCommandTest, BadInputIsOneLineAndExitStatus2) {
  ExpectOneLineBadInput(Bitsplit({"tokenize", "--model", "/nonexistent/x.gguf", "--text", "a"}),
                        "/nonexistent/x.gguf");
  ExpectOneLineBadInput(Bitsplit({"tokenize", "--text", "a"}), "--model");
  ExpectOneLineBadInput(Bitsplit({"tokenize", "-m", "x.gguf", "--no-such-flag"}), "--no-such-flag");
  const std::string not_gguf = (testing::TestTempDir() / "not.gguf").string();
  std::ofstream(not_gguf) << "plain text, not a model\n";
  ExpectOneLineBadInput(Bitsplit({"tokenize", "-m", not_gguf, "--text", "a"}), not_gguf);

  // A GGUF whose tokenizer model is not supported: the error names it and what is.
  testing::GgufBuilder builder;
  builder.AddString("general.architecture", "bert");
  builder.AddString("tokenizer.ggml.model", "bert");
  builder.AddStringArray("tokenizer.ggml.tokens", {"[UNK]", "a"});
  const std::string bert = (testing::TestTempDir() / "bert.gguf").string();
  ASSERT_TRUE(testing::WriteFileBytes(bert, builder.Build()));
  const Result unsupported = Bitsplit({"tokenize", "-m", bert, "--text", "a"});
  ExpectOneLineBadInput(unsupported, "'bert'");
  EXPECT_THAT(unsupported.err, HasSubstr("'gpt2'"));
  EXPECT_THAT(unsupported.err, HasSubstr("'llama'"));

  // And one with no tokenizer at all.
  testing::GgufBuilder bare;
  bare.AddString("general.architecture", "llama");
  const std::string no_vocab = (testing::TestTempDir() / "no_vocab.gguf").string();
  ASSERT_TRUE(testing::WriteFileBytes(no_vocab, bare.Build()));
  ExpectOneLineBadInput(Bitsplit({"tokenize", "-m", no_vocab, "--text", "a"}),
                        "tokenizer.ggml.model");
}

}  // namespace
}  // namespace bitsplit
