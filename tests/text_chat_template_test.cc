// Chat templates through the Jinja engine, against jinja2's renderings of the same templates
// (tests/oracle/gen_chat_template_fixtures.py): Gemma 4's and the gemma family's compiled-in
// default, byte for byte, refusals included; the BOS/EOS rule; load-time refusals; the family
// fallback. text_jinja_test checks the engine itself on llama.cpp's 70 templates.
#include <fstream>
#include <string>
#include <vector>

#include "common/io/gguf.h"
#include "common/text/chat_template.h"
#include "common/text/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/gguf_builder.h"
#include "tests/testing/paths.h"

namespace bitsplit::text {
namespace {

using ::testing::HasSubstr;

nlohmann::json Fixture(const std::string& name) {
  std::ifstream in(testing::SourcePath("tests/fixtures/chat/" + name + "_template.json"));
  EXPECT_TRUE(in.good()) << name;
  return in.good() ? nlohmann::json::parse(in) : nlohmann::json();
}

// Every case of a fixture rendered with the fixture's BOS text, which the tokenizer is said to
// add: the expected prompt is jinja2's without its leading BOS; a conversation jinja2 refused is
// refused with jinja2's message.
void ExpectFixtureRenders(const nlohmann::json& fixture, const ChatTemplate& chat_template) {
  const std::string bos = fixture["bos_token"];
  for (const auto& c : fixture["cases"]) {
    std::vector<ChatMessage> messages;
    for (const auto& m : c["messages"]) {
      messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
    const absl::StatusOr<std::string> rendered =
        chat_template.Render(messages, c["add_generation_prompt"].get<bool>());
    if (c.contains("error")) {
      EXPECT_EQ(rendered.status().code(), absl::StatusCode::kInvalidArgument) << c.dump();
      EXPECT_THAT(rendered.status().message(), HasSubstr(c["error"].get<std::string>()));
      continue;
    }
    std::string expected = c["prompt"];
    if (expected.starts_with(bos)) expected.erase(0, bos.size());
    ASSERT_TRUE(rendered.ok()) << rendered.status() << " " << c.dump();
    EXPECT_EQ(*rendered, expected) << c["messages"].dump();
  }
}

ChatTemplate::SpecialTokens BosAddedByTokenizer(const nlohmann::json& fixture) {
  return {.bos_token = fixture["bos_token"], .eos_token = "", .tokenizer_adds_bos = true};
}

TEST(ChatTemplateTest, Gemma4RendersAsJinja2) {
  const nlohmann::json fixture = Fixture("gemma4");
  ASSERT_FALSE(fixture.is_null());
  ASSERT_GE(fixture["cases"].size(), 15u);
  auto chat_template = ChatTemplate::FromSource(fixture["chat_template"].get<std::string>(),
                                                BosAddedByTokenizer(fixture));
  ASSERT_TRUE(chat_template.ok()) << chat_template.status();
  ExpectFixtureRenders(fixture, *chat_template);
}

TEST(ChatTemplateTest, GemmaDefaultRendersAsJinja2) {
  const nlohmann::json fixture = Fixture("gemma_default");
  ASSERT_FALSE(fixture.is_null());
  // The compiled-in source is the file the fixture rendered.
  EXPECT_EQ(fixture["chat_template"].get<std::string>(), GemmaDefaultTemplate());
  int refused = 0;
  for (const auto& c : fixture["cases"]) refused += c.contains("error");
  EXPECT_GE(refused, 3);  // roles out of order, no messages
  auto chat_template =
      ChatTemplate::FromSource(GemmaDefaultTemplate(), BosAddedByTokenizer(fixture));
  ASSERT_TRUE(chat_template.ok()) << chat_template.status();
  ExpectFixtureRenders(fixture, *chat_template);
}

TEST(ChatTemplateTest, BosAndEosGoOnlyWhereTheTokenizerDoesNotAddThem) {
  constexpr char kSource[] = "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}";
  const std::vector<ChatMessage> hi = {{"user", "hi"}};
  struct Case {
    bool adds_bos, adds_eos;
    std::string expected;
  };
  for (const Case& c : {Case{false, false, "<s>hi</s>"}, Case{true, false, "hi</s>"},
                        Case{false, true, "<s>hi"}, Case{true, true, "hi"}}) {
    auto chat_template = ChatTemplate::FromSource(kSource, {.bos_token = "<s>",
                                                            .eos_token = "</s>",
                                                            .tokenizer_adds_bos = c.adds_bos,
                                                            .tokenizer_adds_eos = c.adds_eos});
    ASSERT_TRUE(chat_template.ok()) << chat_template.status();
    EXPECT_EQ(*chat_template->Render(hi, false), c.expected);
  }
  // Only a leading BOS goes: one in the message stays.
  auto chat_template = ChatTemplate::FromSource("{{ messages[0].content }}",
                                                {.bos_token = "<s>", .tokenizer_adds_bos = true});
  ASSERT_TRUE(chat_template.ok());
  const std::vector<ChatMessage> spelled = {{"user", "a<s>"}};
  EXPECT_EQ(*chat_template->Render(spelled, false), "a<s>");
}

TEST(ChatTemplateTest, AnyTemplateTheEngineRendersIsServed) {
  // A Llama-2-style template, far from ChatML.
  auto llama2 = ChatTemplate::FromSource(
      "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
      "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}{{ message['content'] }}"
      "{% endif %}{% endfor %}",
      {.bos_token = "<s>"});
  ASSERT_TRUE(llama2.ok()) << llama2.status();
  const std::vector<ChatMessage> turns = {{"user", "2+2?"}, {"assistant", "4"}, {"user", "3+3?"}};
  EXPECT_EQ(*llama2->Render(turns, true), "<s>[INST] 2+2? [/INST]4[INST] 3+3? [/INST]");
}

TEST(ChatTemplateTest, TemplatesTheEngineCannotRenderAreRefusedAtLoad) {
  const auto syntax = ChatTemplate::FromSource("{{ 'unterminated", {});
  EXPECT_EQ(syntax.status().code(), absl::StatusCode::kInvalidArgument);
  const auto unsupported_tag = ChatTemplate::FromSource("{% call f() %}x{% endcall %}", {});
  EXPECT_EQ(unsupported_tag.status().code(), absl::StatusCode::kInvalidArgument);
  // A filter the engine lacks fails, as in jinja2, where rendering reaches it: at load when a
  // one-message conversation does, else for the conversations that do.
  const auto filter_always = ChatTemplate::FromSource("{{ messages|from_json }}", {});
  EXPECT_EQ(filter_always.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(filter_always.status().message(), HasSubstr("from_json"));
  const auto filter = ChatTemplate::FromSource(
      "{% if messages|length > 2 %}{{ messages|from_json }}{% endif %}{{ messages[0].content }}",
      {});
  ASSERT_TRUE(filter.ok()) << filter.status();
  EXPECT_THAT(filter->unimplemented_names(), ::testing::ElementsAre("filter 'from_json'"));
  const std::vector<ChatMessage> short_chat = {{"user", "a"}, {"assistant", "b"}};
  EXPECT_EQ(*filter->Render(short_chat, false), "a");
  const std::vector<ChatMessage> long_chat = {{"user", "a"}, {"assistant", "b"}, {"user", "c"}};
  const auto refused = filter->Render(long_chat, false);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("from_json"));
  // A template that fails on a single user message would fail every request.
  const auto always_fails =
      ChatTemplate::FromSource("{{ messages[0].content.no_such_method() }}", {});
  EXPECT_EQ(always_fails.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(always_fails.status().message(), HasSubstr("one-message conversation"));
}

TEST(ChatTemplateTest, RaiseExceptionRefusesTheConversationWithTheTemplatesMessage) {
  auto chat_template = ChatTemplate::FromSource(
      "{% for m in messages %}{% if m.role == 'system' %}"
      "{{ raise_exception('System role not supported') }}{% endif %}{{ m.content }}{% endfor %}",
      {});
  ASSERT_TRUE(chat_template.ok()) << chat_template.status();
  const std::vector<ChatMessage> with_system = {{"system", "s"}, {"user", "u"}};
  const auto rendered = chat_template->Render(with_system, true);
  EXPECT_EQ(rendered.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rendered.status().message(), HasSubstr("System role not supported"));
}

// A vocabulary of three tokens: enough for the special-token texts the templates see.
std::vector<uint8_t> TinyVocabulary(testing::GgufBuilder& builder) {
  builder.AddString("tokenizer.ggml.model", "gpt2");
  builder.AddStringArray("tokenizer.ggml.tokens", {"<s>", "</s>", "a"});
  builder.AddInt32Array("tokenizer.ggml.token_type", {3, 3, 1});
  builder.AddStringArray("tokenizer.ggml.merges", {});
  builder.AddUint32("tokenizer.ggml.bos_token_id", 0);
  builder.AddUint32("tokenizer.ggml.eos_token_id", 1);
  builder.AddBool("tokenizer.ggml.add_bos_token", true);
  return builder.Build();
}

struct LoadedFile {
  std::vector<uint8_t> image;
  std::unique_ptr<gguf::File> file;
  std::unique_ptr<Tokenizer> tokenizer;
};

LoadedFile Load(testing::GgufBuilder builder, const std::string& name) {
  LoadedFile loaded;
  loaded.image = TinyVocabulary(builder);
  auto file = gguf::File::Parse(loaded.image.data(), loaded.image.size(), name);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return loaded;
  loaded.file = std::move(*file);
  auto tokenizer = Tokenizer::FromGguf(*loaded.file);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  if (tokenizer.ok()) loaded.tokenizer = std::move(*tokenizer);
  return loaded;
}

TEST(ChatTemplateTest, FromGgufSeesTheTokenizersSpecialTokens) {
  testing::GgufBuilder builder;
  builder.AddString("general.architecture", "llama");
  builder.AddString("tokenizer.chat_template",
                    "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}");
  const LoadedFile loaded = Load(std::move(builder), "model.gguf");
  ASSERT_NE(loaded.tokenizer, nullptr);
  auto chat_template = ChatTemplate::FromGguf(*loaded.file, *loaded.tokenizer);
  ASSERT_TRUE(chat_template.ok()) << chat_template.status();
  EXPECT_EQ(chat_template->special_tokens().bos_token, "<s>");
  EXPECT_EQ(chat_template->special_tokens().eos_token, "</s>");
  const std::vector<ChatMessage> hi = {{"user", "hi"}};
  EXPECT_EQ(*chat_template->Render(hi, false), "hi</s>");  // the tokenizer adds BOS
}

TEST(ChatTemplateTest, BadTemplateInTheFileIsAnErrorNamingTheFile) {
  testing::GgufBuilder builder;
  builder.AddString("tokenizer.chat_template", "{% for %}");
  const LoadedFile loaded = Load(std::move(builder), "broken.gguf");
  ASSERT_NE(loaded.tokenizer, nullptr);
  const auto chat_template = ChatTemplate::FromGgufOrArchitecture(*loaded.file, *loaded.tokenizer);
  EXPECT_EQ(chat_template.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(chat_template.status().message(), HasSubstr("broken.gguf"));
}

TEST(ChatTemplateTest, FamilyFallbackWhenTheFileHasNoTemplate) {
  for (const std::string architecture : {"gemma", "gemma2", "gemma3", "gemma3n"}) {
    testing::GgufBuilder builder;
    builder.AddString("general.architecture", architecture);
    const LoadedFile loaded = Load(std::move(builder), "pretrained.gguf");
    ASSERT_NE(loaded.tokenizer, nullptr);
    const auto choice = ChatTemplate::FromGgufOrArchitecture(*loaded.file, *loaded.tokenizer);
    ASSERT_TRUE(choice.ok()) << choice.status();
    EXPECT_TRUE(choice->from_architecture);
    EXPECT_EQ(choice->chat_template.source(), GemmaDefaultTemplate());
    EXPECT_THAT(choice->note, HasSubstr("pretrained.gguf"));
    EXPECT_THAT(choice->note, HasSubstr("'" + architecture + "'"));
    EXPECT_EQ(ChatTemplate::FromGguf(*loaded.file, *loaded.tokenizer).status().code(),
              absl::StatusCode::kNotFound);
  }
  {  // A template in the file wins, and no note is made.
    testing::GgufBuilder builder;
    builder.AddString("general.architecture", "gemma3");
    builder.AddString("tokenizer.chat_template", "{{ messages[0].content }}");
    const LoadedFile loaded = Load(std::move(builder), "own.gguf");
    ASSERT_NE(loaded.tokenizer, nullptr);
    const auto choice = ChatTemplate::FromGgufOrArchitecture(*loaded.file, *loaded.tokenizer);
    ASSERT_TRUE(choice.ok()) << choice.status();
    EXPECT_FALSE(choice->from_architecture);
    EXPECT_EQ(choice->chat_template.source(), "{{ messages[0].content }}");
    EXPECT_EQ(choice->note, "");
  }
  // Other families without a template, gemma4 among them (its GGUFs carry their template):
  // NOT_FOUND, naming the file and the architecture.
  for (const std::string architecture : {"llama", "gemma4"}) {
    testing::GgufBuilder builder;
    builder.AddString("general.architecture", architecture);
    const LoadedFile loaded = Load(std::move(builder), "plain.gguf");
    ASSERT_NE(loaded.tokenizer, nullptr);
    const auto choice = ChatTemplate::FromGgufOrArchitecture(*loaded.file, *loaded.tokenizer);
    EXPECT_EQ(choice.status().code(), absl::StatusCode::kNotFound);
    EXPECT_THAT(choice.status().message(), HasSubstr("plain.gguf"));
    EXPECT_THAT(choice.status().message(), HasSubstr("'" + architecture + "'"));
  }
}

}  // namespace
}  // namespace bitsplit::text
