// Gemma 4's chat format against its own template rendered by jinja2
// (tests/oracle/gen_chat_template_fixtures.py renders google-gemma-4-31B-it.jinja of the pinned
// llama.cpp tree for the project's chats): detection from the template source, and every
// rendered prompt byte for byte.
#include <fstream>
#include <string>
#include <vector>

#include "common/io/gguf.h"
#include "common/text/chat_template.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/gguf_builder.h"
#include "tests/testing/paths.h"

namespace bitsplit::text {
namespace {

nlohmann::json Fixture() {
  std::ifstream in(testing::SourcePath("tests/fixtures/chat/gemma4_template.json"));
  EXPECT_TRUE(in.good());
  return in.good() ? nlohmann::json::parse(in) : nlohmann::json();
}

TEST(ChatTemplateTest, Gemma4RendersAsItsJinjaTemplate) {
  const nlohmann::json fixture = Fixture();
  ASSERT_FALSE(fixture.is_null());
  auto chat_template = ChatTemplate::FromSource(fixture["chat_template"].get<std::string>());
  ASSERT_TRUE(chat_template.ok()) << chat_template.status();
  EXPECT_EQ(chat_template->kind(), ChatTemplate::Kind::kGemma4);
  ASSERT_GE(fixture["cases"].size(), 15u);
  for (const auto& c : fixture["cases"]) {
    std::vector<ChatMessage> messages;
    for (const auto& m : c["messages"]) {
      messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
    EXPECT_EQ(chat_template->Render(messages, c["add_generation_prompt"].get<bool>()),
              c["prompt"].get<std::string>())
        << c["messages"].dump();
  }
}

// A gemma4 GGUF without a template gets the gemma4 format, saying so.
TEST(ChatTemplateTest, Gemma4ArchitectureWithoutTemplate) {
  testing::GgufBuilder builder;
  builder.AddString("general.architecture", "gemma4");
  const std::vector<uint8_t> image = builder.Build();
  auto file = gguf::File::Parse(image.data(), image.size(), "gemma4.gguf");
  ASSERT_TRUE(file.ok()) << file.status();
  auto choice = ChatTemplate::FromGgufOrArchitecture(**file);
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_EQ(choice->chat_template.kind(), ChatTemplate::Kind::kGemma4);
  EXPECT_TRUE(choice->from_architecture);
  EXPECT_NE(choice->note.find("gemma4 turn format"), std::string::npos) << choice->note;
}

}  // namespace
}  // namespace bitsplit::text
