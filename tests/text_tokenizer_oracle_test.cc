// The tokenizers against llama.cpp, one committed fixture per vocabulary
// (tests/fixtures/tokenizer/<vocabulary>_tokens.json, written by
// tests/oracle/gen_tokenizer_fixtures.py from tests/oracle/tokenizer_strings.json):
//   smollm2              byte-level BPE, pre-tokenizer "smollm"
//   gemma3               SentencePiece, 262144 tokens, no space prefix
//   gemma3_space_prefix  the gemma3 vocabulary with tokenizer.ggml.add_space_prefix = true
//   qwen2                byte-level BPE, pre-tokenizer "deepseek-r1-qwen" (a metadata-only GGUF)
//   qwen2_gpt4o          the same vocabulary with pre-tokenizer "gpt-4o" (gpt-oss's, Llama 4's),
//                        the shared corpus plus words whose splits depend on letter case
//   gemma4               Gemma 4's BPE (tokenizer model "gemma4"), llama.cpp's own vocabulary
//                        file (tests/text_gemma4_tokenizer_test.cc has llama.cpp's test vectors)
// Every string's ids with parse_special off and on, with and without BOS/EOS, the pieces and
// llama_detokenize's text of those ids, and the vocabulary's special ids and token attributes
// must match exactly. A vocabulary whose model file is absent is skipped, saying which file and
// how to get it.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/io/gguf.h"
#include "common/text/chat_template.h"
#include "common/text/streaming_detokenizer.h"
#include "common/text/tokenizer.h"
#include "common/util/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/paths.h"

namespace bitsplit::text {
namespace {

using ::testing::HasSubstr;

constexpr char kQwen2VocabFile[] = "DeepSeek-R1-Distill-Qwen-7B.vocab.gguf";
constexpr size_t kMinCorpusStrings = 300;

// llama_token_attr bits (llama.h).
constexpr uint32_t kLlamaAttrUnknown = 1u << 0;
constexpr uint32_t kLlamaAttrUnused = 1u << 1;
constexpr uint32_t kLlamaAttrControl = 1u << 3;
constexpr uint32_t kLlamaAttrUserDefined = 1u << 4;
constexpr uint32_t kLlamaAttrByte = 1u << 5;

std::string Quoted(const std::string& text) { return nlohmann::json(text).dump(); }

struct VocabularySpec {
  const char* name;
  const char* model_file;
  bool space_prefix_variant;  // patch add_space_prefix to true in a metadata-only copy
  // Non-null: rewrite tokenizer.ggml.pre to this in a metadata-only copy.
  const char* pre_tokenizer = nullptr;
};

// gtest prints parameters in failure messages and test lists.
void PrintTo(const VocabularySpec& spec, std::ostream* os) { *os << spec.name; }

const VocabularySpec kVocabularies[] = {
    {"smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", false},
    {"gemma3", "gemma-3-270m-q4_k_m.gguf", false},
    {"gemma3_space_prefix", "gemma-3-270m-q4_k_m.gguf", true},
    {"qwen2", kQwen2VocabFile, false},
    {"qwen2_gpt4o", kQwen2VocabFile, false, "gpt-4o"},
    {"gemma4", "ggml-vocab-gemma-4.gguf", false},
};

struct Vocabulary {
  std::string skip_reason;  // non-empty: the model file is missing
  std::unique_ptr<gguf::File> source;
  std::vector<uint8_t> variant_image;  // the patched metadata-only copy, when a variant
  std::unique_ptr<gguf::File> file;    // what the tokenizer reads
  std::unique_ptr<Tokenizer> tokenizer;
  nlohmann::json fixture;
};

// `source`'s metadata as a tensor-less GGUF image and the offset of `key`'s value type (0 when
// the key is not there exactly once): what gen_tokenizer_fixtures.py's metadata_only gives.
std::pair<std::vector<uint8_t>, size_t> MetadataOnly(const gguf::File& source,
                                                     const std::string& key) {
  const uint8_t* begin = source.image_data();
  std::vector<uint8_t> image(begin, begin + source.metadata_end_offset());
  const uint64_t zero_tensors = 0;
  std::memcpy(image.data() + 8, &zero_tensors, sizeof(zero_tensors));
  std::string needle(sizeof(uint64_t), '\0');
  const uint64_t length = key.size();
  std::memcpy(needle.data(), &length, sizeof(length));
  needle += key;
  const std::string_view haystack(reinterpret_cast<const char*>(image.data()), image.size());
  const size_t at = haystack.find(needle);
  EXPECT_NE(at, std::string_view::npos) << "no " << key << " key";
  if (at == std::string_view::npos) return {std::move(image), 0};
  EXPECT_EQ(haystack.find(needle, at + 1), std::string_view::npos) << key << " twice";
  return {std::move(image), at + needle.size()};
}

// The gemma3 metadata with add_space_prefix flipped to true: the same bytes
// gen_tokenizer_fixtures.py writes (the fixture records their sha256).
std::vector<uint8_t> SpacePrefixVariant(const gguf::File& source) {
  auto [image, type_at] = MetadataOnly(source, "tokenizer.ggml.add_space_prefix");
  if (type_at == 0) return {};
  const size_t value_at = type_at + sizeof(uint32_t);
  EXPECT_EQ(image[type_at], 7);  // bool
  EXPECT_EQ(image[value_at], 0) << "expected add_space_prefix = false in the source";
  image[value_at] = 1;
  return image;
}

// The metadata with tokenizer.ggml.pre rewritten to `pre`: the same bytes
// gen_tokenizer_fixtures.py writes (the fixture records their sha256).
std::vector<uint8_t> PreTokenizerVariant(const gguf::File& source, std::string_view pre) {
  auto [image, type_at] = MetadataOnly(source, "tokenizer.ggml.pre");
  if (type_at == 0) return {};
  EXPECT_EQ(image[type_at], 8);  // string
  uint64_t old_length = 0;
  std::memcpy(&old_length, image.data() + type_at + 4, sizeof(old_length));
  const size_t value_at = type_at + 4 + sizeof(uint64_t);
  std::vector<uint8_t> replacement(sizeof(uint64_t));
  const uint64_t new_length = pre.size();
  std::memcpy(replacement.data(), &new_length, sizeof(new_length));
  replacement.insert(replacement.end(), pre.begin(), pre.end());
  image.erase(image.begin() + static_cast<ptrdiff_t>(type_at + 4),
              image.begin() + static_cast<ptrdiff_t>(value_at + old_length));
  image.insert(image.begin() + static_cast<ptrdiff_t>(type_at + 4), replacement.begin(),
               replacement.end());
  return image;
}

const Vocabulary& GetVocabulary(const VocabularySpec& spec) {
  static auto* const loaded = new std::map<std::string, std::unique_ptr<Vocabulary>>();
  auto& slot = (*loaded)[spec.name];
  if (slot != nullptr) return *slot;
  slot = std::make_unique<Vocabulary>();
  Vocabulary& vocabulary = *slot;
  const std::string path = bitsplit::testing::ModelPath(spec.model_file);
  if (!std::filesystem::exists(path)) {
    vocabulary.skip_reason = absl::StrCat(path, " is missing (scripts/setup.sh --models)");
    return vocabulary;
  }
  auto source = gguf::File::Open(path);
  EXPECT_TRUE(source.ok()) << source.status();
  if (!source.ok()) return vocabulary;
  vocabulary.source = std::move(*source);
  if (spec.space_prefix_variant || spec.pre_tokenizer != nullptr) {
    vocabulary.variant_image = spec.space_prefix_variant
                                   ? SpacePrefixVariant(*vocabulary.source)
                                   : PreTokenizerVariant(*vocabulary.source, spec.pre_tokenizer);
    auto file = gguf::File::Parse(vocabulary.variant_image.data(), vocabulary.variant_image.size(),
                                  absl::StrCat(spec.name, "_variant.gguf"));
    EXPECT_TRUE(file.ok()) << file.status();
    if (!file.ok()) return vocabulary;
    vocabulary.file = std::move(*file);
  }
  const gguf::File& file = vocabulary.file ? *vocabulary.file : *vocabulary.source;
  auto tokenizer = Tokenizer::FromGguf(file);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  if (tokenizer.ok()) vocabulary.tokenizer = std::move(*tokenizer);
  const std::string fixture_path = bitsplit::testing::SourcePath(
      absl::StrCat("tests/fixtures/tokenizer/", spec.name, "_tokens.json"));
  std::ifstream in(fixture_path);
  EXPECT_TRUE(in) << "missing fixture " << fixture_path;
  if (in) vocabulary.fixture = nlohmann::json::parse(in);
  return vocabulary;
}

class TokenizerOracleTest : public ::testing::TestWithParam<VocabularySpec> {
 protected:
  void SetUp() override {
    vocabulary_ = &GetVocabulary(GetParam());
    if (!vocabulary_->skip_reason.empty()) GTEST_SKIP() << vocabulary_->skip_reason;
    ASSERT_NE(vocabulary_->tokenizer, nullptr);
    ASSERT_TRUE(vocabulary_->fixture.is_object());
  }
  const Tokenizer& tokenizer() const { return *vocabulary_->tokenizer; }
  const nlohmann::json& fixture() const { return vocabulary_->fixture; }
  const nlohmann::json& cases() const { return vocabulary_->fixture["cases"]; }

  const Vocabulary* vocabulary_ = nullptr;
};

TEST_P(TokenizerOracleTest, FixtureIsForThisFileAndCoversTheCorpus) {
  EXPECT_EQ(fixture()["vocabulary"], GetParam().name);
  EXPECT_GE(cases().size(), kMinCorpusStrings);
  if (GetParam().space_prefix_variant || GetParam().pre_tokenizer != nullptr) {
    // The fixture was made from the same patched bytes.
    Sha256 hasher;
    hasher.Update(vocabulary_->variant_image.data(), vocabulary_->variant_image.size());
    EXPECT_EQ(Sha256Hex(hasher.Finish()), fixture()["model_sha256"]);
  } else {
    EXPECT_EQ(fixture()["model"], GetParam().model_file);
  }
  EXPECT_EQ(tokenizer().vocab_size(), fixture()["vocab_size"].get<int32_t>());
}

// Compares one id list per string; reports how many strings agree.
void ExpectAllIdsMatch(const nlohmann::json& cases, const char* field,
                       const std::function<std::vector<int32_t>(const std::string&)>& encode) {
  size_t agree = 0;
  for (const auto& c : cases) {
    const std::string text = c["text"];
    const std::vector<int32_t> expected = c[field];
    const std::vector<int32_t> actual = encode(text);
    if (actual == expected) ++agree;
    EXPECT_EQ(actual, expected) << field << " " << c["category"] << " " << Quoted(text);
  }
  EXPECT_EQ(agree, cases.size()) << field;
  std::printf("[ %s ] %zu / %zu strings agree\n", field, agree, cases.size());
}

TEST_P(TokenizerOracleTest, IdsMatchWithoutSpecialParsing) {
  ExpectAllIdsMatch(cases(), "ids_plain",
                    [&](const std::string& text) { return tokenizer().Encode(text, false); });
}

TEST_P(TokenizerOracleTest, IdsMatchWithSpecialParsing) {
  ExpectAllIdsMatch(cases(), "ids_special",
                    [&](const std::string& text) { return tokenizer().Encode(text, true); });
}

TEST_P(TokenizerOracleTest, IdsMatchWithBosAndEosAdded) {
  ExpectAllIdsMatch(cases(), "ids_plain_added", [&](const std::string& text) {
    return tokenizer().Tokenize(text, /*add_special=*/true, false);
  });
  ExpectAllIdsMatch(cases(), "ids_special_added", [&](const std::string& text) {
    return tokenizer().Tokenize(text, /*add_special=*/true, true);
  });
}

TEST_P(TokenizerOracleTest, PiecesAndDetokenizeMatch) {
  size_t agree = 0;
  size_t checks = 0;
  for (const auto& c : cases()) {
    for (const char* mode : {"plain", "special"}) {
      const std::vector<int32_t> ids = c[absl::StrCat("ids_", mode)];
      const std::vector<int32_t> added = c[absl::StrCat("ids_", mode, "_added")];
      const bool special = std::string(mode) == "special";
      const std::vector<std::pair<std::string, absl::StatusOr<std::string>>> outputs = {
          {absl::StrCat("decoded_", mode, "_hidden"), tokenizer().Decode(ids, false)},
          {absl::StrCat("decoded_", mode, "_rendered"), tokenizer().Decode(ids, true)},
          {absl::StrCat("detokenized_", mode, "_hidden"),
           tokenizer().Detokenize(ids, false, false)},
          {absl::StrCat("detokenized_", mode, "_rendered"),
           tokenizer().Detokenize(ids, false, true)},
          {absl::StrCat("detokenized_", mode, "_added"),
           tokenizer().Detokenize(added, /*remove_special=*/true, special)},
      };
      for (const auto& [field, actual] : outputs) {
        ++checks;
        ASSERT_TRUE(actual.ok()) << actual.status();
        const std::string expected = c[field];
        if (*actual == expected) ++agree;
        EXPECT_EQ(*actual, expected) << field << " " << Quoted(c["text"]);
      }
    }
  }
  EXPECT_EQ(agree, checks);
  std::printf("[ pieces/detokenize ] %zu / %zu agree\n", agree, checks);
}

// Where llama.cpp's llama_detokenize gives the text back, ours must too (this is implied by the
// test above; it is spelled out because it is the property callers rely on).
TEST_P(TokenizerOracleTest, RoundTripsWhereLlamaCppDoes) {
  size_t round_trips = 0;
  for (const auto& c : cases()) {
    const std::string text = c["text"];
    for (bool special : {false, true}) {
      const std::string mode = special ? "special" : "plain";
      if (c["detokenized_" + mode + "_rendered"] != text) continue;
      ++round_trips;
      const auto back = tokenizer().Detokenize(tokenizer().Encode(text, special), false, true);
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(*back, text) << mode << " " << Quoted(text);
    }
  }
  std::printf("[ round trips ] %zu of %zu (string, mode) pairs\n", round_trips, 2 * cases().size());
  EXPECT_GT(round_trips, cases().size());
}

TEST_P(TokenizerOracleTest, SpecialIdsAndAttributesMatch) {
  EXPECT_EQ(tokenizer().bos_id(), fixture()["bos_id"].get<int32_t>());
  EXPECT_EQ(tokenizer().eos_id(), fixture()["eos_id"].get<int32_t>());
  EXPECT_EQ(tokenizer().eot_id(), fixture()["eot_id"].get<int32_t>());
  EXPECT_EQ(tokenizer().add_bos(), fixture()["add_bos"].get<bool>());
  EXPECT_EQ(tokenizer().add_eos(), fixture()["add_eos"].get<bool>());
  const std::vector<int32_t> eog = fixture()["eog_ids"];
  EXPECT_EQ(tokenizer().end_of_generation_ids(), eog);
  std::vector<int32_t> actual_eog, actual_control;
  for (int32_t id = 0; id < tokenizer().vocab_size(); ++id) {
    if (tokenizer().IsEndOfGeneration(id)) actual_eog.push_back(id);
    if (tokenizer().GetTokenType(id).value() == TokenType::kControl) actual_control.push_back(id);
  }
  EXPECT_EQ(actual_eog, eog);
  EXPECT_EQ(actual_control, fixture()["control_ids"].get<std::vector<int32_t>>());
  // Every token's type as llama.cpp's attributes imply it (control wins, as in GetTokenType).
  const nlohmann::json& attrs = fixture()["attrs"];
  int mismatches = 0;
  for (int32_t id = 0; id < tokenizer().vocab_size(); ++id) {
    const auto it = attrs.find(std::to_string(id));
    const uint32_t attr = it == attrs.end() ? 1u << 2 : it->get<uint32_t>();
    TokenType expected = TokenType::kNormal;
    if (attr & kLlamaAttrControl) {
      expected = TokenType::kControl;
    } else if (attr & kLlamaAttrUserDefined) {
      expected = TokenType::kUserDefined;
    } else if (attr & kLlamaAttrUnknown) {
      expected = TokenType::kUnknown;
    } else if (attr & kLlamaAttrByte) {
      expected = TokenType::kByte;
    } else if (attr & kLlamaAttrUnused) {
      expected = TokenType::kUnused;
    } else if (attr == 0) {
      expected = TokenType::kUndefined;
    }
    const TokenType actual = tokenizer().GetTokenType(id).value();
    if (actual != expected && ++mismatches <= 10) {
      ADD_FAILURE() << "token " << id << " " << Quoted(std::string(*tokenizer().GetTokenText(id)))
                    << ": type " << static_cast<int>(actual) << ", llama.cpp attr " << attr;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST_P(TokenizerOracleTest, StreamingOfCorpusIsValidUtf8AndEqualsDecode) {
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
      streamed += stream.Finish();
      EXPECT_EQ(streamed, *tokenizer().Decode(ids, render)) << Quoted(c["text"]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, TokenizerOracleTest, ::testing::ValuesIn(kVocabularies),
                         [](const ::testing::TestParamInfo<VocabularySpec>& info) {
                           return std::string(info.param.name);
                         });

// The vocabularies whose fixture holds chats: SmolLM2 (its GGUF's template, rendered by jinja2:
// the prompts must match) and gemma3 (no template in the file; the prompts rendered by
// llama.cpp's built-in gemma format, of which only the tokenization is compared, since bitsplit
// renders Gemma 3's published template instead: text_chat_template_test checks that).
class ChatOracleTest : public TokenizerOracleTest {};

TEST_P(ChatOracleTest, PromptsAndTheirIdsMatch) {
  const nlohmann::json& chats = fixture()["chats"];
  ASSERT_FALSE(chats.empty());
  const gguf::File& file = vocabulary_->file ? *vocabulary_->file : *vocabulary_->source;
  const auto choice = ChatTemplate::FromGgufOrArchitecture(file, tokenizer());
  ASSERT_TRUE(choice.ok()) << choice.status();
  const bool rendered_by_jinja = fixture()["chat_format"] == "jinja";
  for (const auto& conversation : chats) {
    const std::string prompt = conversation["prompt"];
    if (rendered_by_jinja) {
      std::vector<ChatMessage> messages;
      for (const auto& m : conversation["messages"]) messages.push_back({m["role"], m["content"]});
      const absl::StatusOr<std::string> rendered =
          choice->chat_template.Render(messages, conversation["add_generation_prompt"]);
      ASSERT_TRUE(rendered.ok()) << rendered.status();
      EXPECT_EQ(*rendered, prompt);
    }
    const std::vector<int32_t> expected = conversation["ids"];
    EXPECT_EQ(tokenizer().Encode(prompt, /*parse_special=*/true), expected) << Quoted(prompt);
  }
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, ChatOracleTest,
                         ::testing::Values(kVocabularies[0], kVocabularies[1]),
                         [](const ::testing::TestParamInfo<VocabularySpec>& info) {
                           return std::string(info.param.name);
                         });

// ---- gemma3 specifics -----------------------------------------------------------------------

class Gemma3TokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    vocabulary_ = &GetVocabulary(kVocabularies[1]);
    if (!vocabulary_->skip_reason.empty()) GTEST_SKIP() << vocabulary_->skip_reason;
    ASSERT_NE(vocabulary_->tokenizer, nullptr);
  }
  const Tokenizer& tokenizer() const { return *vocabulary_->tokenizer; }
  const gguf::File& file() const { return *vocabulary_->source; }

  const Vocabulary* vocabulary_ = nullptr;
};

TEST_F(Gemma3TokenizerTest, IsSentencePieceWithTheGgufsSettings) {
  EXPECT_EQ(tokenizer().model(), TokenizerModel::kSentencePiece);
  EXPECT_EQ(tokenizer().vocab_size(), 262144);
  EXPECT_FALSE(tokenizer().add_space_prefix());
  EXPECT_TRUE(tokenizer().add_bos());
  EXPECT_FALSE(tokenizer().add_eos());
  EXPECT_EQ(*tokenizer().GetTokenText(tokenizer().bos_id()), "<bos>");
  EXPECT_EQ(*tokenizer().GetTokenText(tokenizer().eos_id()), "<eos>");
  EXPECT_EQ(*tokenizer().GetTokenText(tokenizer().unk_id()), "<unk>");
  // <end_of_turn> ends a turn: llama.cpp takes it as EOT (by its text) and so as EOG.
  const int32_t end_of_turn = tokenizer().FindToken("<end_of_turn>");
  ASSERT_NE(end_of_turn, Tokenizer::kNoToken);
  EXPECT_EQ(tokenizer().eot_id(), end_of_turn);
  EXPECT_TRUE(tokenizer().IsEndOfGeneration(end_of_turn));
  EXPECT_TRUE(tokenizer().IsEndOfGeneration(tokenizer().eos_id()));
  EXPECT_FALSE(tokenizer().IsEndOfGeneration(tokenizer().FindToken("<start_of_turn>")));
}

TEST_F(Gemma3TokenizerTest, ByteFallbackTokensAndTheirPieces) {
  // A private-use character has no token: its four UTF-8 bytes come out as <0xNN> tokens.
  const std::string text = "\U000F0000";
  const std::vector<int32_t> ids = tokenizer().Encode(text, false);
  ASSERT_EQ(ids.size(), 4u);
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(*tokenizer().GetTokenType(ids[i]), TokenType::kByte);
    EXPECT_EQ(*tokenizer().TokenToPiece(ids[i]), text.substr(i, 1));
  }
  EXPECT_EQ(*tokenizer().GetTokenText(ids[0]), "<0xF3>");
  EXPECT_EQ(*tokenizer().Decode(ids), text);
}

TEST_F(Gemma3TokenizerTest, StreamingHoldsBackByteFallbackCharacters) {
  // Byte tokens spell a character one byte at a time: nothing may come out until it is complete,
  // and a character cut short at the end becomes U+FFFD.
  const std::string text = "a\U000F0000b\U0010FFFD";
  const std::vector<int32_t> ids = tokenizer().Encode(text, false);
  std::vector<int32_t> byte_ids;
  for (int32_t id : ids) {
    if (*tokenizer().GetTokenType(id) == TokenType::kByte) byte_ids.push_back(id);
  }
  ASSERT_EQ(byte_ids.size(), 8u);
  StreamingDetokenizer stream(tokenizer());
  std::string streamed;
  for (int32_t id : ids) {
    const auto chunk = stream.Push(id);
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    EXPECT_TRUE(IsValidUtf8(*chunk));
    if (*tokenizer().GetTokenType(id) == TokenType::kByte && stream.pending_bytes() > 0) {
      EXPECT_EQ(*chunk, "");
    }
    streamed += *chunk;
  }
  streamed += stream.Finish();
  EXPECT_EQ(streamed, text);

  for (size_t i = 0; i < 3; ++i) ASSERT_EQ(*stream.Push(byte_ids[i]), "");
  EXPECT_EQ(stream.pending_bytes(), 3u);
  EXPECT_EQ(*stream.Push(tokenizer().FindToken("a")),
            "\uFFFD"
            "a");
  EXPECT_EQ(stream.Finish(), "");
  for (size_t i = 4; i < 6; ++i) ASSERT_EQ(*stream.Push(byte_ids[i]), "");
  EXPECT_EQ(stream.Finish(), "\uFFFD");
}

TEST_F(Gemma3TokenizerTest, UserDefinedWhitespaceTokensSplitWithoutSpecialParsing) {
  // gemma3 has user-defined tokens for runs of spaces, tabs and newlines (and some HTML tags);
  // like llama.cpp they are cut out before the SentencePiece merges even without parse_special.
  const int32_t two_spaces = tokenizer().FindToken("  ");
  ASSERT_NE(two_spaces, Tokenizer::kNoToken);
  EXPECT_EQ(*tokenizer().GetTokenType(two_spaces), TokenType::kUserDefined);
  const std::vector<int32_t> ids = tokenizer().Encode("a  b", false);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[1], two_spaces);
  EXPECT_EQ(*tokenizer().Decode(ids), "a  b");
}

TEST_F(Gemma3TokenizerTest, ChatFallsBackToGemmaTurnsAndSaysSo) {
  const auto choice = ChatTemplate::FromGgufOrArchitecture(file(), tokenizer());
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_TRUE(choice->from_architecture);
  EXPECT_EQ(choice->chat_template.source(), GemmaDefaultTemplate());
  EXPECT_THAT(choice->note, HasSubstr("gemma3"));
  EXPECT_EQ(ChatTemplate::FromGguf(file(), tokenizer()).status().code(),
            absl::StatusCode::kNotFound);
  // The template writes {{ bos_token }} and the tokenizer adds BOS: the prompt holds it once, then
  // the turn tokens as single ids.
  const std::vector<ChatMessage> messages = {{"user", "Hi"}};
  const absl::StatusOr<std::string> prompt = choice->chat_template.Render(messages, true);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  const std::vector<int32_t> ids = tokenizer().Tokenize(*prompt, true, true);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids[0], tokenizer().bos_id());
  EXPECT_EQ(ids[1], tokenizer().FindToken("<start_of_turn>"));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tokenizer().bos_id()), 1);
}

// ---- qwen2 specifics ------------------------------------------------------------------------

TEST(Qwen2TokenizerTest, ReadsTheMetadataOnlyGguf) {
  const Vocabulary& vocabulary = GetVocabulary(kVocabularies[3]);
  if (!vocabulary.skip_reason.empty()) GTEST_SKIP() << vocabulary.skip_reason;
  ASSERT_NE(vocabulary.tokenizer, nullptr);
  EXPECT_TRUE(vocabulary.source->tensors().empty());
  const Tokenizer& tokenizer = *vocabulary.tokenizer;
  EXPECT_EQ(tokenizer.model(), TokenizerModel::kBytePairEncoding);
  EXPECT_EQ(tokenizer.pre_tokenizer_name(), "deepseek-r1-qwen");
  EXPECT_TRUE(tokenizer.add_bos());
  EXPECT_EQ(*tokenizer.GetTokenText(tokenizer.bos_id()), "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(tokenizer.Encode("<｜begin▁of▁sentence｜>", true),
            std::vector<int32_t>{tokenizer.bos_id()});
  // Digits one by one.
  EXPECT_EQ(tokenizer.Encode("2024", false).size(), 4u);
}

}  // namespace
}  // namespace bitsplit::text
