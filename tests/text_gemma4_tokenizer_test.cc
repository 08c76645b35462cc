// Gemma 4's tokenizer (tokenizer.ggml.model "gemma4") against llama.cpp's own test vectors: the
// vocabulary models/ggml-vocab-gemma-4.gguf with its .inp strings and the .out ids that
// llama.cpp's tests/test-tokenizer-0 expects of them (add_special and parse_special off), as
// scripts/setup.sh extracts them from the pinned llama-cpp-python sdist. Skipped, naming the
// file, when the vocabulary is absent.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/io/gguf.h"
#include "common/text/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/paths.h"

namespace bitsplit::text {
namespace {

using ::testing::ElementsAre;

constexpr char kVocabFile[] = "ggml-vocab-gemma-4.gguf";
// The number of test strings in the pinned llama.cpp's .inp/.out pair: a short read fails.
constexpr size_t kTestStrings = 46;

std::string Quoted(const std::string& text) { return nlohmann::json(text).dump(); }

struct TestVector {
  std::string text;
  std::vector<int32_t> ids;
};

struct Gemma4Vocabulary {
  std::string skip_reason;  // non-empty: the vocabulary is missing
  std::unique_ptr<gguf::File> file;
  std::unique_ptr<Tokenizer> tokenizer;
  std::vector<TestVector> vectors;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot read " << path;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// test-tokenizer-0's reading: the strings are separated by "\n__ggml_vocab_test__\n", the
// expected ids are one line per string, space-separated, surrounding whitespace ignored.
std::vector<TestVector> ReadTestVectors(const std::string& inp_path, const std::string& out_path) {
  const std::string inp = ReadAll(inp_path);
  const std::string separator = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (size_t pos = 0; pos < inp.size();) {
    const size_t next = inp.find(separator, pos);
    if (next == std::string::npos) {
      texts.push_back(inp.substr(pos));
      break;
    }
    texts.push_back(inp.substr(pos, next - pos));
    pos = next + separator.size();
  }
  std::vector<std::vector<int32_t>> ids;
  std::istringstream out(ReadAll(out_path));
  for (std::string line; std::getline(out, line);) {
    std::istringstream fields(line);
    std::vector<int32_t>& line_ids = ids.emplace_back();
    for (int32_t id; fields >> id;) line_ids.push_back(id);
    EXPECT_TRUE(fields.eof()) << "not a list of ids: " << Quoted(line);
  }
  EXPECT_EQ(texts.size(), ids.size()) << inp_path << " and " << out_path;
  std::vector<TestVector> vectors;
  for (size_t i = 0; i < texts.size() && i < ids.size(); ++i) {
    vectors.push_back({std::move(texts[i]), std::move(ids[i])});
  }
  return vectors;
}

const Gemma4Vocabulary& Vocabulary() {
  static const Gemma4Vocabulary* const loaded = [] {
    auto* vocabulary = new Gemma4Vocabulary();
    const std::string path = bitsplit::testing::ModelPath(kVocabFile);
    for (const std::string& needed : {path, path + ".inp", path + ".out"}) {
      if (!std::filesystem::exists(needed)) {
        vocabulary->skip_reason = absl::StrCat(needed, " is missing (scripts/setup.sh --models)");
        return vocabulary;
      }
    }
    auto file = gguf::File::Open(path);
    EXPECT_TRUE(file.ok()) << file.status();
    if (!file.ok()) return vocabulary;
    vocabulary->file = std::move(*file);
    auto tokenizer = Tokenizer::FromGguf(*vocabulary->file);
    EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
    if (tokenizer.ok()) vocabulary->tokenizer = std::move(*tokenizer);
    vocabulary->vectors = ReadTestVectors(path + ".inp", path + ".out");
    return vocabulary;
  }();
  return *loaded;
}

class Gemma4TokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    vocabulary_ = &Vocabulary();
    if (!vocabulary_->skip_reason.empty()) GTEST_SKIP() << vocabulary_->skip_reason;
    ASSERT_NE(vocabulary_->tokenizer, nullptr);
  }
  const Tokenizer& tokenizer() const { return *vocabulary_->tokenizer; }
  const std::vector<TestVector>& vectors() const { return vocabulary_->vectors; }

  const Gemma4Vocabulary* vocabulary_ = nullptr;
};

TEST_F(Gemma4TokenizerTest, ReadsEveryTestVector) {
  EXPECT_EQ(vectors().size(), kTestStrings);
  EXPECT_EQ(tokenizer().vocab_size(), 262144);
}

TEST_F(Gemma4TokenizerTest, IdsMatchLlamaCppTestVectors) {
  size_t agree = 0;
  for (const TestVector& vector : vectors()) {
    const std::vector<int32_t> ids = tokenizer().Encode(vector.text, /*parse_special=*/false);
    if (ids == vector.ids) ++agree;
    EXPECT_EQ(ids, vector.ids) << Quoted(vector.text);
  }
  EXPECT_EQ(agree, vectors().size());
  std::printf("[ gemma4 ] %zu / %zu of llama.cpp's test strings agree\n", agree, vectors().size());
}

// Every test string is valid UTF-8 that the vocabulary spells without unknown tokens, so the
// pieces give it back byte for byte.
TEST_F(Gemma4TokenizerTest, DecodeOfEncodeIsIdentity) {
  for (const TestVector& vector : vectors()) {
    const auto decoded = tokenizer().Decode(tokenizer().Encode(vector.text, false));
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, vector.text) << Quoted(vector.text);
    const auto expected = tokenizer().Decode(vector.ids);
    ASSERT_TRUE(expected.ok()) << expected.status();
    EXPECT_EQ(*expected, vector.text) << Quoted(vector.text);
  }
}

TEST_F(Gemma4TokenizerTest, AddsBosLikeLlamaCpp) {
  EXPECT_EQ(tokenizer().model(), TokenizerModel::kBytePairEncoding);
  EXPECT_EQ(tokenizer().pre_tokenizer_name(), "gemma4");
  EXPECT_TRUE(tokenizer().add_bos());
  EXPECT_FALSE(tokenizer().add_eos());
  EXPECT_FALSE(tokenizer().add_space_prefix());
  EXPECT_EQ(tokenizer().bos_id(), tokenizer().FindToken("<bos>"));
  EXPECT_EQ(tokenizer().eos_id(), tokenizer().FindToken("<eos>"));
  EXPECT_EQ(tokenizer().unk_id(), tokenizer().FindToken("<unk>"));
  for (const TestVector& vector : vectors()) {
    std::vector<int32_t> expected = {tokenizer().bos_id()};
    expected.insert(expected.end(), vector.ids.begin(), vector.ids.end());
    EXPECT_EQ(tokenizer().Tokenize(vector.text, /*add_special=*/true, false), expected)
        << Quoted(vector.text);
  }
}

TEST_F(Gemma4TokenizerTest, EndOfGenerationTokensAsLlamaCpp) {
  const int32_t eos = tokenizer().FindToken("<eos>");
  const int32_t end_of_turn = tokenizer().FindToken("<turn|>");
  const int32_t tool_response = tokenizer().FindToken("<|tool_response>");
  const int32_t plain_s = tokenizer().FindToken("</s>");
  for (int32_t id : {eos, end_of_turn, tool_response, plain_s}) ASSERT_NE(id, Tokenizer::kNoToken);
  EXPECT_THAT(tokenizer().end_of_generation_ids(), ElementsAre(eos, tool_response, end_of_turn));
  // Gemma 4's "</s>" is ordinary text.
  EXPECT_FALSE(tokenizer().IsEndOfGeneration(plain_s));
  EXPECT_EQ(*tokenizer().TokenToPiece(plain_s), "</s>");
}

// Inputs beyond the test vectors, with the ids llama.cpp (llama-cpp-python 0.3.36) gives them.
TEST_F(Gemma4TokenizerTest, OddInputsAsLlamaCpp) {
  // Turn markers are control tokens: single ids with parse_special, text without.
  EXPECT_THAT(tokenizer().Encode("<|turn>user\nHi<turn|>", true),
              ElementsAre(105, 2364, 107, 10979, 106));
  EXPECT_THAT(tokenizer().Encode("<|turn>user\nHi<turn|>", false),
              ElementsAre(236820, 236909, 887, 236813, 2364, 107, 10979, 236820, 887, 111038));
  // Invalid UTF-8: U+FFFD per bad byte, then merged like any text.
  EXPECT_THAT(tokenizer().Encode("a\xFF"
                                 "b\xE2\x96",
                                 false),
              ElementsAre(236746, 238479, 236763, 38914));
  // Newlines are words of their own: a run is its token where the vocabulary has one (up to
  // 31 newlines), else merged.
  EXPECT_THAT(tokenizer().Encode("x" + std::string(31, '\n'), false), ElementsAre(236781, 137));
  EXPECT_THAT(tokenizer().Encode(std::string(40, '\n'), false), ElementsAre(137, 115));
  EXPECT_THAT(tokenizer().Encode(std::string(32, '\t'), false), ElementsAre(255998, 255968));
  // A character without a token: its UTF-8 bytes as <0xNN> tokens.
  const std::string private_use = "\xF3\xB0\x80\x80";  // U+F0000
  EXPECT_THAT(tokenizer().Encode(private_use, false), ElementsAre(481, 414, 366, 366));
  EXPECT_EQ(*tokenizer().GetTokenText(481), "<0xF3>");
  EXPECT_EQ(*tokenizer().Decode(tokenizer().Encode(private_use, false)), private_use);
}

}  // namespace
}  // namespace bitsplit::text
