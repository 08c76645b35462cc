// Tokenizer, streaming detokenizer and chat template. The reference is llama.cpp: the fixture
// tests/fixtures/tokenizer/smollm2_tokens.json holds its token ids for every string of
// tests/oracle/tokenizer_strings.json (regenerate with tests/oracle/gen_tokenizer_fixtures.py).
#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/io/gguf.h"
#include "common/text/chat_template.h"
#include "common/text/streaming_detokenizer.h"
#include "common/text/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/gguf_builder.h"
#include "tests/testing/paths.h"

namespace bitsplit::text {
namespace {

using ::bitsplit::testing::GgufBuilder;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::SizeIs;

constexpr char kFixture[] = "tests/fixtures/tokenizer/smollm2_tokens.json";

// Printable form of a corpus string for failure messages.
std::string Quoted(const std::string& text) {
  nlohmann::json quoted = text;
  return quoted.dump();
}

class SmolLm2TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto file = gguf::File::Open(bitsplit::testing::ModelPath(bitsplit::testing::kSmolLm2File));
    ASSERT_TRUE(file.ok()) << file.status();
    file_ = std::move(*file).release();
    auto tokenizer = Tokenizer::FromGguf(*file_);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = std::move(*tokenizer).release();
    std::ifstream in(bitsplit::testing::SourcePath(kFixture));
    ASSERT_TRUE(in) << "missing fixture " << kFixture;
    fixture_ = new nlohmann::json(nlohmann::json::parse(in));
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete file_;
    delete fixture_;
    tokenizer_ = nullptr;
    file_ = nullptr;
    fixture_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(tokenizer_, nullptr); }

  static const Tokenizer& tokenizer() { return *tokenizer_; }
  static const nlohmann::json& cases() { return (*fixture_)["cases"]; }

  static gguf::File* file_;
  static Tokenizer* tokenizer_;
  static nlohmann::json* fixture_;
};
gguf::File* SmolLm2TokenizerTest::file_ = nullptr;
Tokenizer* SmolLm2TokenizerTest::tokenizer_ = nullptr;
nlohmann::json* SmolLm2TokenizerTest::fixture_ = nullptr;

TEST_F(SmolLm2TokenizerTest, FixtureCoversTheCorpus) {
  EXPECT_GE(cases().size(), 220u);
  EXPECT_EQ((*fixture_)["model"], bitsplit::testing::kSmolLm2File);
}

TEST_F(SmolLm2TokenizerTest, MatchesLlamaCppWithoutSpecialParsing) {
  int mismatches = 0;
  for (const auto& c : cases()) {
    const std::string text = c["text"];
    const std::vector<int32_t> expected = c["ids_plain"];
    const std::vector<int32_t> actual = tokenizer().Encode(text, /*parse_special=*/false);
    if (actual != expected) ++mismatches;
    EXPECT_EQ(actual, expected) << c["category"] << " " << Quoted(text);
  }
  EXPECT_EQ(mismatches, 0) << "of " << cases().size() << " strings";
}

TEST_F(SmolLm2TokenizerTest, MatchesLlamaCppWithSpecialParsing) {
  int mismatches = 0;
  for (const auto& c : cases()) {
    const std::string text = c["text"];
    const std::vector<int32_t> expected = c["ids_special"];
    const std::vector<int32_t> actual = tokenizer().Encode(text, /*parse_special=*/true);
    if (actual != expected) ++mismatches;
    EXPECT_EQ(actual, expected) << c["category"] << " " << Quoted(text);
  }
  EXPECT_EQ(mismatches, 0) << "of " << cases().size() << " strings";
}

TEST_F(SmolLm2TokenizerTest, DecodeMatchesLlamaCppPieces) {
  for (const auto& c : cases()) {
    for (const char* mode : {"plain", "special"}) {
      const std::vector<int32_t> ids = c[absl::StrCat("ids_", mode)];
      const auto hidden = tokenizer().Decode(ids, /*render_special=*/false);
      const auto rendered = tokenizer().Decode(ids, /*render_special=*/true);
      ASSERT_TRUE(hidden.ok()) << hidden.status();
      ASSERT_TRUE(rendered.ok()) << rendered.status();
      EXPECT_EQ(*hidden, c[absl::StrCat("decoded_", mode, "_hidden")].get<std::string>())
          << Quoted(c["text"]);
      EXPECT_EQ(*rendered, c[absl::StrCat("decoded_", mode, "_rendered")].get<std::string>())
          << Quoted(c["text"]);
    }
  }
}

// Independent of the oracle: byte-level BPE must be lossless.
TEST_F(SmolLm2TokenizerTest, DecodeOfEncodeIsIdentity) {
  for (const auto& c : cases()) {
    const std::string text = c["text"];
    const auto plain = tokenizer().Decode(tokenizer().Encode(text, false), false);
    ASSERT_TRUE(plain.ok()) << plain.status();
    EXPECT_EQ(*plain, text);
    const auto special = tokenizer().Decode(tokenizer().Encode(text, true), true);
    ASSERT_TRUE(special.ok()) << special.status();
    EXPECT_EQ(*special, text);
  }
}

TEST_F(SmolLm2TokenizerTest, InvalidUtf8BecomesReplacementCharacters) {
  // llama.cpp replaces each undecodable byte by U+FFFD before BPE.
  EXPECT_EQ(tokenizer().Encode("a\xFF"
                               "b",
                               false),
            tokenizer().Encode("a\uFFFD"
                               "b",
                               false));
  EXPECT_EQ(tokenizer().Encode("\xE4\xBD", false), tokenizer().Encode("\uFFFD\uFFFD", false));
  EXPECT_EQ(tokenizer().Encode("\xF4\x90\x80\x80", false),
            tokenizer().Encode("\uFFFD\uFFFD\uFFFD\uFFFD", false));
}

TEST_F(SmolLm2TokenizerTest, SpecialTokenIds) {
  EXPECT_EQ(tokenizer().vocab_size(), (*fixture_)["vocab_size"].get<int32_t>());
  EXPECT_EQ(tokenizer().vocab_size(), 49152);
  EXPECT_EQ(tokenizer().bos_id(), (*fixture_)["bos_id"].get<int32_t>());
  EXPECT_EQ(tokenizer().eos_id(), (*fixture_)["eos_id"].get<int32_t>());
  EXPECT_EQ(tokenizer().eot_id(), (*fixture_)["eot_id"].get<int32_t>());
  EXPECT_FALSE(tokenizer().add_bos());
  EXPECT_EQ(tokenizer().pre_tokenizer_name(), "smollm");
  EXPECT_EQ(tokenizer().FindToken("<|im_end|>"), 2);
  EXPECT_EQ(tokenizer().FindToken("Ġthe"), tokenizer().Encode(" the", false).at(0));
  EXPECT_EQ(tokenizer().FindToken("no such token"), Tokenizer::kNoToken);
}

TEST_F(SmolLm2TokenizerTest, EndOfGenerationAndControlMatchLlamaCpp) {
  const std::vector<int32_t> eog = (*fixture_)["eog_ids"];
  const std::vector<int32_t> control = (*fixture_)["control_ids"];
  EXPECT_EQ(tokenizer().end_of_generation_ids(), eog);
  EXPECT_TRUE(tokenizer().IsEndOfGeneration(tokenizer().eos_id()));
  EXPECT_TRUE(tokenizer().IsEndOfGeneration(tokenizer().FindToken("<|im_end|>")));
  std::vector<int32_t> actual_eog, actual_control;
  for (int32_t id = 0; id < tokenizer().vocab_size(); ++id) {
    if (tokenizer().IsEndOfGeneration(id)) actual_eog.push_back(id);
    if (tokenizer().IsControl(id)) actual_control.push_back(id);
  }
  EXPECT_EQ(actual_eog, eog);
  EXPECT_EQ(actual_control, control);
  EXPECT_FALSE(tokenizer().IsEndOfGeneration(-1));
  EXPECT_FALSE(tokenizer().IsEndOfGeneration(tokenizer().vocab_size()));
}

TEST_F(SmolLm2TokenizerTest, OutOfRangeIdsAreErrors) {
  for (int32_t bad : {-1, tokenizer().vocab_size(), INT32_MAX}) {
    const auto piece = tokenizer().TokenToPiece(bad);
    EXPECT_EQ(piece.status().code(), absl::StatusCode::kOutOfRange);
    EXPECT_THAT(piece.status().message(), HasSubstr(std::to_string(bad)));
    EXPECT_EQ(tokenizer().GetTokenText(bad).status().code(), absl::StatusCode::kOutOfRange);
    EXPECT_EQ(tokenizer().GetTokenType(bad).status().code(), absl::StatusCode::kOutOfRange);
  }
  const std::vector<int32_t> ids = {1, 2, 49152};
  const auto decoded = tokenizer().Decode(ids);
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(decoded.status().message(), HasSubstr("position 2"));
}

TEST_F(SmolLm2TokenizerTest, ControlTokensAreHiddenUnlessRendered) {
  EXPECT_EQ(*tokenizer().TokenToPiece(2), "");
  EXPECT_EQ(*tokenizer().TokenToPiece(2, /*render_special=*/true), "<|im_end|>");
  EXPECT_EQ(*tokenizer().GetTokenType(2), TokenType::kControl);
  const int32_t the = tokenizer().FindToken("Ġthe");
  EXPECT_EQ(*tokenizer().TokenToPiece(the), " the");
  EXPECT_EQ(*tokenizer().GetTokenType(the), TokenType::kNormal);
}

TEST_F(SmolLm2TokenizerTest, ConcurrentEncodeAgreesWithSerial) {
  // Encode shares a word cache between threads; results must not depend on interleaving.
  std::vector<std::vector<int32_t>> serial;
  for (const auto& c : cases()) serial.push_back(c["ids_special"]);
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        for (size_t i = t; i < cases().size(); i += (round == 1 ? 1 : 2)) {
          const std::string text = cases()[i]["text"];
          if (tokenizer().Encode(text, true) != serial[i]) ++mismatches[t];
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_THAT(mismatches, ElementsAre(0, 0, 0, 0));
}

// ---- Streaming detokenizer --------------------------------------------------------------------

TEST(Utf8Test, ReplacesMaximalInvalidSubparts) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("\u00e9\u4e2d\U0001F355\U0010FFFF"));
  EXPECT_FALSE(IsValidUtf8("\xC0\x80"));          // overlong
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xE4\xBD"));          // truncated
  // Same results as Python's bytes.decode("utf-8", "replace").
  EXPECT_EQ(ReplaceInvalidUtf8("a\xFF"
                               "b"),
            "a\uFFFD"
            "b");
  EXPECT_EQ(ReplaceInvalidUtf8("\xE4\xBD"), "\uFFFD");
  EXPECT_EQ(ReplaceInvalidUtf8("\xE4\xBD"
                               "a"),
            "\uFFFD"
            "a");
  EXPECT_EQ(ReplaceInvalidUtf8("\xED\xA0\x80"), "\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(ReplaceInvalidUtf8("\xF0\x9F\x8D"
                               "x\x80"),
            "\uFFFD"
            "x\uFFFD");
  EXPECT_EQ(ReplaceInvalidUtf8("\xC0\xAF"), "\uFFFD\uFFFD");
  EXPECT_EQ(ReplaceInvalidUtf8("\U0001F355"), "\U0001F355");
}

TEST_F(SmolLm2TokenizerTest, StreamingHoldsBackPartialCharacters) {
  // A pizza emoji is several byte-level tokens; nothing may come out until it is complete.
  const std::vector<int32_t> ids = tokenizer().Encode("\U0001F355", false);
  ASSERT_GT(ids.size(), 1u);
  StreamingDetokenizer stream(tokenizer());
  for (size_t i = 0; i + 1 < ids.size(); ++i) {
    const auto text = stream.Push(ids[i]);
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(*text, "");
    EXPECT_GT(stream.pending_bytes(), 0u);
  }
  EXPECT_EQ(*stream.Push(ids.back()), "\U0001F355");
  EXPECT_EQ(stream.pending_bytes(), 0u);
  EXPECT_EQ(stream.Finish(), "");

  // An unfinished character at the end of the stream becomes U+FFFD.
  ASSERT_TRUE(stream.Push(ids[0]).ok());
  EXPECT_EQ(stream.Finish(), "\uFFFD");
  EXPECT_EQ(stream.pending_bytes(), 0u);
}

TEST_F(SmolLm2TokenizerTest, StreamingOfCorpusEqualsDecode) {
  for (const auto& c : cases()) {
    for (bool render : {false, true}) {
      const std::vector<int32_t> ids = c["ids_special"];
      StreamingDetokenizer stream(tokenizer(), render);
      std::string streamed;
      for (int32_t id : ids) {
        const auto text = stream.Push(id);
        ASSERT_TRUE(text.ok()) << text.status();
        EXPECT_TRUE(IsValidUtf8(*text)) << Quoted(c["text"]);
        streamed += *text;
      }
      const std::string rest = stream.Finish();
      EXPECT_TRUE(IsValidUtf8(rest));
      streamed += rest;
      EXPECT_EQ(streamed, *tokenizer().Decode(ids, render)) << Quoted(c["text"]);
    }
  }
}

TEST_F(SmolLm2TokenizerTest, StreamingOfRandomIdsIsValidUtf8) {
  // Random ids often split characters in ways no real text does; the output must still be
  // valid UTF-8 and equal to the batch decode with bad sequences replaced.
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> any_id(0, tokenizer().vocab_size() - 1);
  // Single-byte tokens of the upper half (0x80..0xFF) are the risky ones: favour them.
  std::vector<int32_t> byte_ids;
  for (int32_t id = 0; id < tokenizer().vocab_size(); ++id) {
    const auto piece = tokenizer().TokenToPiece(id);
    if (piece->size() == 1 && static_cast<uint8_t>((*piece)[0]) >= 0x80) byte_ids.push_back(id);
  }
  ASSERT_FALSE(byte_ids.empty());
  std::uniform_int_distribution<size_t> any_byte(0, byte_ids.size() - 1);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int32_t> ids(1 + trial % 40);
    for (int32_t& id : ids) id = rng() % 2 ? byte_ids[any_byte(rng)] : any_id(rng);
    StreamingDetokenizer stream(tokenizer(), /*render_special=*/true);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string text = *stream.Push(id);
      ASSERT_TRUE(IsValidUtf8(text));
      streamed += text;
    }
    streamed += stream.Finish();
    EXPECT_EQ(streamed, ReplaceInvalidUtf8(*tokenizer().Decode(ids, true)));
  }
}

TEST_F(SmolLm2TokenizerTest, StreamingRejectsBadIdWithoutLosingState) {
  const std::vector<int32_t> ids = tokenizer().Encode("\U0001F355", false);  // >1 token
  ASSERT_GT(ids.size(), 1u);
  StreamingDetokenizer stream(tokenizer());
  ASSERT_TRUE(stream.Push(ids[0]).ok());
  const size_t pending = stream.pending_bytes();
  EXPECT_EQ(stream.Push(-5).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(stream.pending_bytes(), pending);
  std::string rest;
  for (size_t i = 1; i < ids.size(); ++i) rest += *stream.Push(ids[i]);
  EXPECT_EQ(rest, "\U0001F355");
}

// ---- Chat template ----------------------------------------------------------------------------

TEST_F(SmolLm2TokenizerTest, ChatTemplateMatchesHandWrittenPrompts) {
  const ChatTemplate chat = *ChatTemplate::FromGguf(*file_, tokenizer());
  const std::vector<ChatMessage> user_only = {{"user", "Hi there"}};
  EXPECT_EQ(*chat.Render(user_only, true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n");
  const std::vector<ChatMessage> with_system = {
      {"system", "Be brief."}, {"user", "2+2?"}, {"assistant", "4"}, {"user", "3+3?"}};
  EXPECT_EQ(*chat.Render(with_system, true),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\n3+3?<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(*chat.Render(with_system, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\n3+3?<|im_end|>\n");
  EXPECT_EQ(*chat.Render({}, true), "<|im_start|>assistant\n");
}

TEST_F(SmolLm2TokenizerTest, ChatTemplateMatchesJinjaAndLlamaCppTokens) {
  const ChatTemplate chat = *ChatTemplate::FromGguf(*file_, tokenizer());
  const nlohmann::json& chats = (*fixture_)["chats"];
  ASSERT_FALSE(chats.empty());
  for (const auto& conversation : chats) {
    std::vector<ChatMessage> messages;
    for (const auto& m : conversation["messages"]) messages.push_back({m["role"], m["content"]});
    const std::string prompt = *chat.Render(messages, conversation["add_generation_prompt"]);
    EXPECT_EQ(prompt, conversation["prompt"].get<std::string>());
    const std::vector<int32_t> expected = conversation["ids"];
    EXPECT_EQ(tokenizer().Encode(prompt, /*parse_special=*/true), expected) << Quoted(prompt);
  }
}

// ---- Synthetic vocabularies: pre-tokenizer variants and load errors ----------------------------

// GPT-2's byte -> printable character mapping, written out independently of the tokenizer.
std::vector<std::string> ByteLevelAlphabet() {
  std::vector<std::string> alphabet(256);
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const int cp = printable ? b : next++;
    std::string utf8;
    if (cp < 0x80) {
      utf8.push_back(static_cast<char>(cp));
    } else {
      utf8.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      utf8.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    alphabet[b] = utf8;
  }
  return alphabet;
}

// Ids 0..255 are the bytes; then these multi-character tokens.
enum SyntheticId : int32_t {
  kTok12 = 256,
  kTok123,
  kTokSpace1,
  kTokXyz,
  kTokControl,
  kTokUser,
  kTokImEnd,
};

GgufBuilder SyntheticVocab(const std::string& pre) {
  std::vector<std::string> tokens = ByteLevelAlphabet();
  for (const char* extra : {"12", "123",
                            "\xC4\xA0"
                            "1",
                            "xyz", "<|ctl|>", "<usr>", "<|im_end|>"}) {
    tokens.push_back(extra);
  }
  std::vector<int32_t> types(tokens.size(), 1);
  types[kTokControl] = 3;
  types[kTokUser] = 4;
  types[kTokImEnd] = 3;
  GgufBuilder builder;
  builder.AddString("tokenizer.ggml.model", "gpt2");
  if (!pre.empty()) builder.AddString("tokenizer.ggml.pre", pre);
  builder.AddStringArray("tokenizer.ggml.tokens", tokens);
  builder.AddInt32Array("tokenizer.ggml.token_type", types);
  builder.AddStringArray("tokenizer.ggml.merges", {"\xC4\xA0 1", "1 2", "12 3"});
  builder.AddUint32("tokenizer.ggml.eos_token_id", 'e');
  return builder;
}

struct Loaded {
  std::vector<uint8_t> image;
  std::unique_ptr<gguf::File> file;
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer;
};

std::unique_ptr<Loaded> Load(const GgufBuilder& builder) {
  auto loaded = std::make_unique<Loaded>();
  loaded->image = builder.Build();
  auto file = gguf::File::Parse(loaded->image.data(), loaded->image.size(), "synthetic.gguf");
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return loaded;
  loaded->file = std::move(*file);
  loaded->tokenizer = Tokenizer::FromGguf(*loaded->file);
  return loaded;
}

TEST(SyntheticTokenizerTest, PreTokenizersCutWordsDifferently) {
  // " 12" and "1234" under each pre-tokenizer; merges: "Ġ 1" (rank 0), "1 2", "12 3".
  const auto gpt2 = Load(SyntheticVocab("gpt-2"));
  ASSERT_TRUE(gpt2->tokenizer.ok()) << gpt2->tokenizer.status();
  // One word " 12": "Ġ 1" has the best rank and wins over "1 2".
  EXPECT_THAT((*gpt2->tokenizer)->Encode(" 12", false), ElementsAre(kTokSpace1, '2'));
  EXPECT_THAT((*gpt2->tokenizer)->Encode("1234", false), ElementsAre(kTok123, '4'));

  const auto smollm = Load(SyntheticVocab("smollm"));
  ASSERT_TRUE(smollm->tokenizer.ok()) << smollm->tokenizer.status();
  // Every digit is its own word, so no merge applies.
  EXPECT_THAT((*smollm->tokenizer)->Encode(" 12", false), ElementsAre(' ', '1', '2'));
  EXPECT_THAT((*smollm->tokenizer)->Encode("1234", false), ElementsAre('1', '2', '3', '4'));

  const auto llama3 = Load(SyntheticVocab("llama-bpe"));
  ASSERT_TRUE(llama3->tokenizer.ok()) << llama3->tokenizer.status();
  // " " and "12" are separate words; digits group by three.
  EXPECT_THAT((*llama3->tokenizer)->Encode(" 12", false), ElementsAre(' ', kTok12));
  EXPECT_THAT((*llama3->tokenizer)->Encode("1234", false), ElementsAre(kTok123, '4'));
  // A word that is a whole token is taken as is, without merges (llama.cpp's ignore_merges).
  EXPECT_THAT((*llama3->tokenizer)->Encode("xyz", false), ElementsAre(kTokXyz));
  EXPECT_THAT((*gpt2->tokenizer)->Encode("xyz", false), ElementsAre('x', 'y', 'z'));
  EXPECT_TRUE((*llama3->tokenizer)->add_bos());
  EXPECT_FALSE((*gpt2->tokenizer)->add_bos());

  // "default" (also used when tokenizer.ggml.pre is missing): digits in runs of three after
  // the GPT-2 split.
  for (const std::string pre : {"default", ""}) {
    const auto fallback = Load(SyntheticVocab(pre));
    ASSERT_TRUE(fallback->tokenizer.ok()) << fallback->tokenizer.status();
    EXPECT_EQ((*fallback->tokenizer)->pre_tokenizer_name(), "default");
    EXPECT_THAT((*fallback->tokenizer)->Encode(" 1234", false), ElementsAre(' ', kTok123, '4'));
  }
}

TEST(SyntheticTokenizerTest, ControlAndUserDefinedTokens) {
  const auto loaded = Load(SyntheticVocab("gpt2"));
  ASSERT_TRUE(loaded->tokenizer.ok()) << loaded->tokenizer.status();
  const Tokenizer& tokenizer = **loaded->tokenizer;
  // Control tokens only with parse_special; user-defined tokens always.
  EXPECT_THAT(tokenizer.Encode("a<|ctl|>", true), ElementsAre('a', kTokControl));
  EXPECT_THAT(tokenizer.Encode("a<|ctl|>", false), SizeIs(8));
  EXPECT_THAT(tokenizer.Encode("<usr>b", false), ElementsAre(kTokUser, 'b'));
  EXPECT_THAT(tokenizer.Encode("<usr>b", true), ElementsAre(kTokUser, 'b'));
  EXPECT_EQ(*tokenizer.TokenToPiece(kTokUser), "<usr>");  // user-defined: always rendered
  EXPECT_EQ(*tokenizer.TokenToPiece(kTokControl), "");
  // End of generation: the EOS id from the metadata and <|im_end|> by its text.
  EXPECT_EQ(tokenizer.eos_id(), 'e');
  EXPECT_THAT(tokenizer.end_of_generation_ids(), ElementsAre('e', kTokImEnd));
  EXPECT_EQ(tokenizer.eot_id(), kTokImEnd);
}

TEST(SyntheticTokenizerTest, UnknownPreTokenizerIsAnError) {
  const auto loaded = Load(SyntheticVocab("no-such-pre"));
  ASSERT_FALSE(loaded->tokenizer.ok());
  EXPECT_EQ(loaded->tokenizer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(loaded->tokenizer.status().message(), HasSubstr("'no-such-pre'"));
  EXPECT_THAT(loaded->tokenizer.status().message(), HasSubstr("smollm"));
}

TEST(SyntheticTokenizerTest, UnsupportedModelIsAnErrorNamingTheSupportedOnes) {
  GgufBuilder builder = SyntheticVocab("gpt2");
  builder.kvs()[0] =
      GgufBuilder::Kv{"tokenizer.ggml.model", static_cast<uint32_t>(gguf::ValueType::kString),
                      GgufBuilder::EncodeString("bert")};
  const auto loaded = Load(builder);
  ASSERT_FALSE(loaded->tokenizer.ok());
  EXPECT_EQ(loaded->tokenizer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(loaded->tokenizer.status().message(), HasSubstr("'bert'"));
  EXPECT_THAT(loaded->tokenizer.status().message(), HasSubstr("'gpt2'"));
  EXPECT_THAT(loaded->tokenizer.status().message(), HasSubstr("'llama'"));
  EXPECT_THAT(loaded->tokenizer.status().message(), HasSubstr("'gemma4'"));
}

TEST(SyntheticTokenizerTest, Qwen2PreTokenizerSplitsEveryDigit) {
  // Merges "1 2" and "12 3" exist, but qwen2's pattern makes every digit its own word; letters
  // keep Llama-3's rule of one leading non-letter ("Ġxyz" is no token, so x y z stay apart).
  for (const std::string pre : {"qwen2", "deepseek-r1-qwen"}) {
    const auto qwen2 = Load(SyntheticVocab(pre));
    ASSERT_TRUE(qwen2->tokenizer.ok()) << qwen2->tokenizer.status();
    const Tokenizer& tokenizer = **qwen2->tokenizer;
    EXPECT_THAT(tokenizer.Encode("1234", false), ElementsAre('1', '2', '3', '4'));
    EXPECT_THAT(tokenizer.Encode(" 12", false), ElementsAre(' ', '1', '2'));
    EXPECT_THAT(tokenizer.Encode("a12", false), ElementsAre('a', '1', '2'));
    // No ignore_merges (unlike llama3) and no BOS by default.
    EXPECT_THAT(tokenizer.Encode("xyz", false), ElementsAre('x', 'y', 'z'));
    EXPECT_FALSE(tokenizer.add_bos());
    EXPECT_EQ(tokenizer.pre_tokenizer_name(), pre);
  }
  // Llama-3 groups digits by three where qwen2 does not.
  const auto llama3 = Load(SyntheticVocab("llama3"));
  ASSERT_TRUE(llama3->tokenizer.ok()) << llama3->tokenizer.status();
  EXPECT_THAT((*llama3->tokenizer)->Encode("1234", false), ElementsAre(kTok123, '4'));
}

TEST(SyntheticTokenizerTest, DetokenizeCleansSpacesWhereLlamaCppDoes) {
  // llama.cpp's clean_spaces: on for gpt-2 / llama3 / default, off for smollm and qwen2.
  const std::string text = "a , b . c 's d 're e ' f";
  const std::string cleaned = "a, b. c's d're e'f";
  for (const auto& [pre, clean] : std::vector<std::pair<std::string, bool>>{{"gpt-2", true},
                                                                            {"llama3", true},
                                                                            {"default", true},
                                                                            {"smollm", false},
                                                                            {"qwen2", false}}) {
    const auto loaded = Load(SyntheticVocab(pre));
    ASSERT_TRUE(loaded->tokenizer.ok()) << loaded->tokenizer.status();
    const Tokenizer& tokenizer = **loaded->tokenizer;
    const std::vector<int32_t> ids = tokenizer.Encode(text, false);
    EXPECT_EQ(*tokenizer.Decode(ids), text) << pre;
    EXPECT_EQ(*tokenizer.Detokenize(ids, false, false), clean ? cleaned : text) << pre;
  }
}

// ---- Synthetic SentencePiece vocabulary ---------------------------------------------------------

// Ids of the synthetic SentencePiece vocabulary below.
enum SpmId : int32_t {
  kSpmUnk = 0,
  kSpmBos,
  kSpmEos,
  kSpmControl,                  // "<ctl>"
  kSpmUser,                     // "<usr>"
  kSpmByte0,                    // "<0x00>" .. "<0xFF>" follow: kSpmByte0 + byte
  kSpmSpace = kSpmByte0 + 256,  // "▁"
  kSpmA,                        // "a"
  kSpmB,                        // "b"
  kSpmAb,                       // "ab"
  kSpmSpaceA,                   // "▁a"
  kSpmSpaceAb,                  // "▁ab"
  kSpmBa,                       // "ba"
  kSpmEAcute,                   // "é"
  kSpmCount,
};

// Scores decide the merge order: higher first, leftmost on ties.
GgufBuilder SyntheticSpmVocab(std::optional<bool> add_space_prefix, bool with_byte_tokens = true) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>", "<ctl>", "<usr>"};
  std::vector<int32_t> types = {2, 3, 3, 3, 4};
  std::vector<float> scores = {0, 0, 0, 0, 0};
  for (int byte = 0; byte < 256; ++byte) {
    // Without byte tokens, the slots hold unrelated text so that the ids stay the same.
    tokens.push_back(with_byte_tokens ? absl::StrFormat("<0x%02X>", byte)
                                      : absl::StrFormat("filler%d", byte));
    types.push_back(with_byte_tokens ? 6 : 1);
    scores.push_back(0);
  }
  const std::vector<std::pair<std::string, float>> pieces = {{"\xE2\x96\x81", -1},
                                                             {"a", -2},
                                                             {"b", -3},
                                                             {"ab", -4},
                                                             {"\xE2\x96\x81"
                                                              "a",
                                                              -5},
                                                             {"\xE2\x96\x81"
                                                              "ab",
                                                              -6},
                                                             {"ba", -0.5},
                                                             {"\xC3\xA9", -7}};
  for (const auto& [text, score] : pieces) {
    tokens.push_back(text);
    types.push_back(1);
    scores.push_back(score);
  }
  GgufBuilder builder;
  builder.AddString("tokenizer.ggml.model", "llama");
  builder.AddStringArray("tokenizer.ggml.tokens", tokens);
  builder.AddFloat32Array("tokenizer.ggml.scores", scores);
  builder.AddInt32Array("tokenizer.ggml.token_type", types);
  if (add_space_prefix.has_value())
    builder.AddBool("tokenizer.ggml.add_space_prefix", *add_space_prefix);
  return builder;
}

TEST(SyntheticSpmTokenizerTest, MergesByScoreAndDefaultsLikeLlamaCpp) {
  const auto loaded = Load(SyntheticSpmVocab(std::nullopt));
  ASSERT_TRUE(loaded->tokenizer.ok()) << loaded->tokenizer.status();
  const Tokenizer& tokenizer = **loaded->tokenizer;
  EXPECT_EQ(tokenizer.model(), TokenizerModel::kSentencePiece);
  // llama.cpp's SentencePiece defaults: BOS 1, EOS 2, unknown 0, add BOS, space prefix.
  EXPECT_EQ(tokenizer.bos_id(), kSpmBos);
  EXPECT_EQ(tokenizer.eos_id(), kSpmEos);
  EXPECT_EQ(tokenizer.unk_id(), kSpmUnk);
  EXPECT_TRUE(tokenizer.add_bos());
  EXPECT_FALSE(tokenizer.add_eos());
  EXPECT_TRUE(tokenizer.add_space_prefix());
  // "aba" -> "▁aba": "ba" has the best score (-0.5) and merges first, so "▁ab" never forms:
  // "▁" "a" "ba" -> "▁a" "ba".
  EXPECT_THAT(tokenizer.Encode("aba", false), ElementsAre(kSpmSpaceA, kSpmBa));
  // "ab" -> "▁ab": of the pairs ▁+a (-5) and a+b (-4), "ab" merges first, then ▁+ab (-6).
  EXPECT_THAT(tokenizer.Encode("ab", false), ElementsAre(kSpmSpaceAb));
  // Spaces become "▁"; a character that is no token falls back to its UTF-8 bytes.
  EXPECT_THAT(tokenizer.Encode("a b", false), ElementsAre(kSpmSpaceA, kSpmSpace, kSpmB));
  EXPECT_THAT(tokenizer.Encode("\xC3\xA9z", false),
              ElementsAre(kSpmSpace, kSpmEAcute, kSpmByte0 + 'z'));
  EXPECT_THAT(tokenizer.Encode("\xE4\xB8\xAD", false),
              ElementsAre(kSpmSpace, kSpmByte0 + 0xE4, kSpmByte0 + 0xB8, kSpmByte0 + 0xAD));
  // Invalid UTF-8 is not replaced: its bytes go through as byte tokens.
  EXPECT_THAT(tokenizer.Encode("\xFF", false), ElementsAre(kSpmSpace, kSpmByte0 + 0xFF));
  EXPECT_THAT(tokenizer.Encode("", false), ElementsAre());
  // Tokenize adds BOS (and EOS only where the file asks).
  EXPECT_THAT(tokenizer.Tokenize("ab", true, false), ElementsAre(kSpmBos, kSpmSpaceAb));
  EXPECT_THAT(tokenizer.Tokenize("", true, false), ElementsAre(kSpmBos));
}

TEST(SyntheticSpmTokenizerTest, SpacePrefixGoesAtTheStartAndAfterSpecialTokens) {
  const auto loaded = Load(SyntheticSpmVocab(std::nullopt));
  ASSERT_TRUE(loaded->tokenizer.ok()) << loaded->tokenizer.status();
  const Tokenizer& tokenizer = **loaded->tokenizer;
  // llama.cpp prefixes every text fragment that follows a special token (user-defined ones
  // too, which are split out even without parse_special).
  EXPECT_THAT(tokenizer.Encode("a<usr>a", false), ElementsAre(kSpmSpaceA, kSpmUser, kSpmSpaceA));
  EXPECT_THAT(tokenizer.Encode("<ctl>b", true), ElementsAre(kSpmControl, kSpmSpace, kSpmB));
  EXPECT_THAT(tokenizer.Encode("<usr>", false), ElementsAre(kSpmUser));
  // Without parse_special "<ctl>" is text: "▁" "<" "c" "t" "l" ">" as bytes.
  EXPECT_THAT(tokenizer.Encode("<ctl>", false),
              ElementsAre(kSpmSpace, kSpmByte0 + '<', kSpmByte0 + 'c', kSpmByte0 + 't',
                          kSpmByte0 + 'l', kSpmByte0 + '>'));
  // Detokenize removes the one leading space Encode added; Decode keeps it.
  const std::vector<int32_t> ids = tokenizer.Encode("ab b", false);
  EXPECT_EQ(*tokenizer.Decode(ids), " ab b");
  EXPECT_EQ(*tokenizer.Detokenize(ids, false, false), "ab b");
  // After a BOS that remove_special drops, nothing is removed.
  const std::vector<int32_t> with_bos = tokenizer.Tokenize("ab", true, false);
  EXPECT_EQ(*tokenizer.Detokenize(with_bos, true, false), " ab");
  EXPECT_EQ(*tokenizer.Detokenize(with_bos, false, true), "<s> ab");
  EXPECT_EQ(*tokenizer.Detokenize(with_bos, false, false), " ab");
}

TEST(SyntheticSpmTokenizerTest, WithoutSpacePrefix) {
  const auto loaded = Load(SyntheticSpmVocab(false));
  ASSERT_TRUE(loaded->tokenizer.ok()) << loaded->tokenizer.status();
  const Tokenizer& tokenizer = **loaded->tokenizer;
  EXPECT_FALSE(tokenizer.add_space_prefix());
  EXPECT_THAT(tokenizer.Encode("ab", false), ElementsAre(kSpmAb));
  EXPECT_THAT(tokenizer.Encode(" ab", false), ElementsAre(kSpmSpaceAb));
  EXPECT_THAT(tokenizer.Encode("a<usr>a", false), ElementsAre(kSpmA, kSpmUser, kSpmA));
  const std::vector<int32_t> ids = tokenizer.Encode(" ab", false);
  EXPECT_EQ(*tokenizer.Detokenize(ids, false, false), " ab");
}

TEST(SyntheticSpmTokenizerTest, PiecesAndEndOfSentence) {
  GgufBuilder builder = SyntheticSpmVocab(true);
  builder.AddBool("tokenizer.ggml.add_eos_token", true);
  builder.AddUint32("tokenizer.ggml.bos_token_id", kSpmControl);
  const auto loaded = Load(builder);
  ASSERT_TRUE(loaded->tokenizer.ok()) << loaded->tokenizer.status();
  const Tokenizer& tokenizer = **loaded->tokenizer;
  EXPECT_EQ(tokenizer.bos_id(), kSpmControl);
  EXPECT_THAT(tokenizer.Tokenize("b", true, false),
              ElementsAre(kSpmControl, kSpmSpace, kSpmB, kSpmEos));
  // "▁" is a space, byte tokens their byte, control and unknown tokens hidden unless rendered,
  // user-defined tokens always shown.
  EXPECT_EQ(*tokenizer.TokenToPiece(kSpmSpaceAb), " ab");
  EXPECT_EQ(*tokenizer.TokenToPiece(kSpmByte0 + 0xE4), "\xE4");
  EXPECT_EQ(*tokenizer.TokenToPiece(kSpmEos), "");
  EXPECT_EQ(*tokenizer.TokenToPiece(kSpmEos, true), "</s>");
  EXPECT_EQ(*tokenizer.TokenToPiece(kSpmUnk), "");
  EXPECT_EQ(*tokenizer.TokenToPiece(kSpmUnk, true), "<unk>");
  EXPECT_EQ(*tokenizer.TokenToPiece(kSpmUser), "<usr>");
  EXPECT_EQ(*tokenizer.GetTokenType(kSpmByte0 + 7), TokenType::kByte);
  // remove_special drops the leading BOS and the trailing EOS.
  const std::vector<int32_t> ids = tokenizer.Tokenize("b", true, false);
  EXPECT_EQ(*tokenizer.Detokenize(ids, true, true), " b");
  EXPECT_EQ(*tokenizer.Detokenize(ids, false, true), "<ctl> b</s>");
  // </s> is end of generation by its text as well as being EOS.
  EXPECT_TRUE(tokenizer.IsEndOfGeneration(kSpmEos));
}

TEST(SyntheticSpmTokenizerTest, MissingByteTokensFallBackToUnknown) {
  // llama.cpp throws here; the unknown token stands in for each byte instead.
  const auto loaded = Load(SyntheticSpmVocab(false, /*with_byte_tokens=*/false));
  ASSERT_TRUE(loaded->tokenizer.ok()) << loaded->tokenizer.status();
  EXPECT_THAT((*loaded->tokenizer)->Encode("az", false), ElementsAre(kSpmA, kSpmUnk));
}

TEST(SyntheticSpmTokenizerTest, IgnoresThePreTokenizerName) {
  // llama.cpp reads tokenizer.ggml.pre for BPE only.
  GgufBuilder builder = SyntheticSpmVocab(false);
  builder.AddString("tokenizer.ggml.pre", "no-such-pre");
  const auto loaded = Load(builder);
  ASSERT_TRUE(loaded->tokenizer.ok()) << loaded->tokenizer.status();
  EXPECT_EQ((*loaded->tokenizer)->pre_tokenizer_name(), "no-such-pre");
}

TEST(SyntheticSpmTokenizerTest, ShortScoresAreAnError) {
  GgufBuilder builder;
  builder.AddString("tokenizer.ggml.model", "llama");
  builder.AddStringArray("tokenizer.ggml.tokens", {"<unk>", "a", "b"});
  builder.AddFloat32Array("tokenizer.ggml.scores", {0, 0});
  const auto loaded = Load(builder);
  ASSERT_FALSE(loaded->tokenizer.ok());
  EXPECT_THAT(loaded->tokenizer.status().message(), HasSubstr("tokenizer.ggml.scores"));
}

// ---- Synthetic gemma4 vocabulary ---------------------------------------------------------------

// Ids of the synthetic gemma4 vocabulary below.
enum Gemma4Id : int32_t {
  kG4Eos = 1,
  kG4Byte0 = 4,               // "<0x00>" .. "<0xFF>": kG4Byte0 + byte
  kG4Space = kG4Byte0 + 256,  // "▁"
  kG4A,                       // "a"
  kG4B,                       // "b"
  kG4Ab,                      // "ab"
  kG4SpaceAb,                 // "▁ab"
  kG4Newline,                 // "\n"
  kG4TwoNewlines,             // "\n\n"
  kG4EndOfTurn,               // "<turn|>"
};

// No merge joins newlines, so only the newline-word rule can make "\n\n" one token. No special
// ids, tokenizer.ggml.pre names another pre-tokenizer, and add_bos_token is false: llama.cpp
// overrides all three for gemma4. The ids below are llama.cpp's (llama-cpp-python 0.3.36) for
// the same vocabulary.
GgufBuilder SyntheticGemma4Vocab() {
  std::vector<std::string> tokens = {"<pad>", "<eos>", "<bos>", "<unk>"};
  std::vector<int32_t> types = {3, 3, 3, 3};
  for (int byte = 0; byte < 256; ++byte) {
    tokens.push_back(absl::StrFormat("<0x%02X>", byte));
    types.push_back(6);
  }
  for (const char* text : {"\xE2\x96\x81", "a", "b", "ab",
                           "\xE2\x96\x81"
                           "ab",
                           "\n", "\n\n"}) {
    tokens.push_back(text);
    types.push_back(1);
  }
  tokens.push_back("<turn|>");
  types.push_back(3);
  GgufBuilder builder;
  builder.AddString("tokenizer.ggml.model", "gemma4");
  builder.AddString("tokenizer.ggml.pre", "llama-bpe");
  builder.AddStringArray("tokenizer.ggml.tokens", tokens);
  builder.AddInt32Array("tokenizer.ggml.token_type", types);
  builder.AddStringArray("tokenizer.ggml.merges", {"a b",
                                                   "\xE2\x96\x81"
                                                   " ab"});
  builder.AddBool("tokenizer.ggml.add_bos_token", false);
  return builder;
}

TEST(SyntheticGemma4TokenizerTest, EscapesSpacesSplitsLinesAndFallsBackToByteTokens) {
  const auto loaded = Load(SyntheticGemma4Vocab());
  ASSERT_TRUE(loaded->tokenizer.ok()) << loaded->tokenizer.status();
  const Tokenizer& tokenizer = **loaded->tokenizer;
  EXPECT_EQ(tokenizer.model(), TokenizerModel::kBytePairEncoding);
  EXPECT_EQ(tokenizer.pre_tokenizer_name(), "gemma4");
  EXPECT_THAT(tokenizer.Encode(" ab\n\nab", false), ElementsAre(kG4SpaceAb, kG4TwoNewlines, kG4Ab));
  EXPECT_THAT(tokenizer.Encode("\n\n\n", false), ElementsAre(kG4Newline, kG4Newline, kG4Newline));
  EXPECT_THAT(tokenizer.Encode("a b", false), ElementsAre(kG4A, kG4Space, kG4B));
  EXPECT_THAT(tokenizer.Encode("c", false), ElementsAre(kG4Byte0 + 'c'));
  EXPECT_THAT(tokenizer.Encode("\xC3\xA9", false), ElementsAre(kG4Byte0 + 0xC3, kG4Byte0 + 0xA9));
  EXPECT_THAT(tokenizer.Encode("ab a<turn|>", true),
              ElementsAre(kG4Ab, kG4Space, kG4A, kG4EndOfTurn));
  EXPECT_EQ(*tokenizer.TokenToPiece(kG4SpaceAb), " ab");
  EXPECT_EQ(*tokenizer.TokenToPiece(kG4Byte0 + 0xC3), "\xC3");
  // Decode gives the text back; Detokenize cleans spaces, as llama.cpp's does here.
  const std::vector<int32_t> ids = tokenizer.Encode("a , b", false);
  EXPECT_THAT(ids, ElementsAre(kG4A, kG4Space, kG4Byte0 + ',', kG4Space, kG4B));
  EXPECT_EQ(*tokenizer.Decode(ids), "a , b");
  EXPECT_EQ(*tokenizer.Detokenize(ids, false, false), "a, b");
}

TEST(SyntheticGemma4TokenizerTest, SpecialIdsAndBosAsLlamaCpp) {
  const auto loaded = Load(SyntheticGemma4Vocab());
  ASSERT_TRUE(loaded->tokenizer.ok()) << loaded->tokenizer.status();
  const Tokenizer& tokenizer = **loaded->tokenizer;
  // No default ids (unlike gpt2's 11 and SentencePiece's 1/2/0); BOS wanted all the same.
  EXPECT_EQ(tokenizer.bos_id(), Tokenizer::kNoToken);
  EXPECT_EQ(tokenizer.eos_id(), Tokenizer::kNoToken);
  EXPECT_EQ(tokenizer.unk_id(), Tokenizer::kNoToken);
  EXPECT_TRUE(tokenizer.add_bos());
  EXPECT_THAT(tokenizer.end_of_generation_ids(), ElementsAre(kG4Eos, kG4EndOfTurn));
  // With the ids in the metadata, BOS is added.
  GgufBuilder builder = SyntheticGemma4Vocab();
  builder.AddUint32("tokenizer.ggml.bos_token_id", 2);
  builder.AddUint32("tokenizer.ggml.eos_token_id", kG4Eos);
  const auto with_ids = Load(builder);
  ASSERT_TRUE(with_ids->tokenizer.ok()) << with_ids->tokenizer.status();
  EXPECT_THAT((*with_ids->tokenizer)->Tokenize("ab", true, false), ElementsAre(2, kG4Ab));
}

TEST(SyntheticTokenizerTest, MalformedVocabulariesAreErrors) {
  {  // no merges
    GgufBuilder builder;
    builder.AddString("tokenizer.ggml.model", "gpt2");
    builder.AddStringArray("tokenizer.ggml.tokens", {"a", "b"});
    const auto loaded = Load(builder);
    ASSERT_FALSE(loaded->tokenizer.ok());
    EXPECT_THAT(loaded->tokenizer.status().message(), HasSubstr("tokenizer.ggml.merges"));
  }
  {  // no vocabulary
    GgufBuilder builder;
    builder.AddString("tokenizer.ggml.model", "gpt2");
    const auto loaded = Load(builder);
    ASSERT_FALSE(loaded->tokenizer.ok());
    EXPECT_THAT(loaded->tokenizer.status().message(), HasSubstr("tokenizer.ggml.tokens"));
  }
  {  // duplicate token text
    GgufBuilder builder;
    builder.AddString("tokenizer.ggml.model", "gpt2");
    builder.AddStringArray("tokenizer.ggml.tokens", {"a", "b", "a"});
    builder.AddStringArray("tokenizer.ggml.merges", {});
    const auto loaded = Load(builder);
    ASSERT_FALSE(loaded->tokenizer.ok());
    EXPECT_THAT(loaded->tokenizer.status().message(), HasSubstr("ids 0 and 2"));
  }
  {  // token types shorter than the vocabulary
    GgufBuilder builder;
    builder.AddString("tokenizer.ggml.model", "gpt2");
    builder.AddStringArray("tokenizer.ggml.tokens", {"a", "b", "c"});
    builder.AddInt32Array("tokenizer.ggml.token_type", {1, 1});
    builder.AddStringArray("tokenizer.ggml.merges", {});
    const auto loaded = Load(builder);
    ASSERT_FALSE(loaded->tokenizer.ok());
    EXPECT_THAT(loaded->tokenizer.status().message(), HasSubstr("token_type"));
  }
}

}  // namespace
}  // namespace bitsplit::text
