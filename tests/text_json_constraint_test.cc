// The JSON Schema constraint against independent expectations:
//   * tests/fixtures/json_constraint/cases.json (tests/oracle/json_constraint_fixtures.py):
//     documents valid by construction and by the jsonschema package must be accepted byte by
//     byte, and invalid or out-of-policy ones rejected at some byte (or left incomplete);
//   * the trie walk's mask equals, bit for bit, "copy the state and advance over the piece" on
//     a synthetic vocabulary of awkward byte pieces, and on SmolLM2's real one when present;
//   * copies are independent; unsupported and malformed schemas fail clearly.
#include <chrono>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/io/gguf.h"
#include "common/text/json_constraint.h"
#include "common/text/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/paths.h"

namespace bitsplit::text {
namespace {

using OrderedJson = nlohmann::ordered_json;

const OrderedJson& Fixture() {
  static const OrderedJson* const fixture = [] {
    std::ifstream in(testing::SourcePath("tests/fixtures/json_constraint/cases.json"));
    EXPECT_TRUE(in.good()) << "missing fixture: run tests/oracle/json_constraint_fixtures.py";
    return new OrderedJson(in.good() ? OrderedJson::parse(in) : OrderedJson());
  }();
  return *fixture;
}

// Feeds `text` byte by byte. Returns the index of the first rejected byte, or -1 if none.
int FirstRejectedByte(JsonConstraintState& state, std::string_view text) {
  for (size_t i = 0; i < text.size(); ++i) {
    if (!state.Advance(text.substr(i, 1))) return static_cast<int>(i);
  }
  return -1;
}

// Whether `text` is accepted as a whole document.
bool Accepts(const JsonConstraint& constraint, std::string_view text) {
  JsonConstraintState state = constraint.Start();
  return FirstRejectedByte(state, text) < 0 && state.IsComplete();
}

JsonConstraint Compile(const OrderedJson& schema) {
  auto constraint = JsonConstraint::FromSchema(schema);
  EXPECT_TRUE(constraint.ok()) << constraint.status() << " for " << schema.dump();
  return constraint.ok() ? *std::move(constraint) : JsonConstraint::AnyJsonObject();
}

void CheckDocuments(const JsonConstraint& constraint, const OrderedJson& documents,
                    const std::string& name) {
  int accepts = 0, rejects = 0;
  for (const auto& document : documents) {
    const std::string text = document["text"].get<std::string>();
    const bool expect_accept = document["expect"] == "accept";
    JsonConstraintState state = constraint.Start();
    const int rejected_at = FirstRejectedByte(state, text);
    if (expect_accept) {
      ++accepts;
      EXPECT_EQ(rejected_at, -1) << name << ": rejected byte " << rejected_at << " of " << text;
      EXPECT_TRUE(rejected_at >= 0 || state.IsComplete()) << name << ": incomplete: " << text;
    } else {
      ++rejects;
      EXPECT_TRUE(rejected_at >= 0 || !state.IsComplete())
          << name << ": accepted (" << document["reason"] << "): " << text;
    }
  }
  EXPECT_GT(accepts, 0) << name;
  EXPECT_GT(rejects, 0) << name;
}

TEST(JsonConstraintTest, FixtureDocumentsAcceptedAndRejectedAsTheOracleSays) {
  const OrderedJson& fixture = Fixture();
  ASSERT_TRUE(fixture.contains("cases"));
  ASSERT_GE(fixture["cases"].size(), 15u);
  for (const auto& c : fixture["cases"]) {
    const std::string name = c["name"].get<std::string>();
    CheckDocuments(Compile(c["schema"]), c["documents"], name);
  }
}

TEST(JsonConstraintTest, JsonObjectModeAcceptsObjectsOnly) {
  const OrderedJson& fixture = Fixture();
  ASSERT_GE(fixture["json_object"].size(), 100u);
  CheckDocuments(JsonConstraint::AnyJsonObject(), fixture["json_object"], "json_object");
}

TEST(JsonConstraintTest, WhitespaceRunsAreBounded) {
  const JsonConstraint any = JsonConstraint::AnyJsonObject();
  EXPECT_TRUE(Accepts(any, "{\n" + std::string(20, ' ') + "\"a\":1}"));
  EXPECT_TRUE(Accepts(any, "{\n\n" + std::string(20, '\t') + "\"a\":1}"));
  EXPECT_FALSE(Accepts(any, "{\n" + std::string(21, ' ') + "\"a\":1}"));
  EXPECT_FALSE(Accepts(any, "{  \"a\":1}"));
  EXPECT_FALSE(Accepts(any, "{\t\"a\":1}"));
  EXPECT_FALSE(Accepts(any, "{\n\n\n\"a\":1}"));
  EXPECT_FALSE(Accepts(any, "{\n \n\"a\":1}"));
  EXPECT_TRUE(Accepts(any, "{ \"a\" : 1 , \"b\" : [ 1 , 2 ] }"));
  EXPECT_FALSE(Accepts(any, " {}"));
  EXPECT_FALSE(Accepts(any, "{} "));
}

TEST(JsonConstraintTest, StringsValidateUtf8AcrossPieces) {
  const JsonConstraint string = Compile({{"type", "string"}});
  JsonConstraintState state = string.Start();
  // "é€😀" with each character cut between pieces.
  for (std::string_view piece : {"\"\xc3", "\xa9\xe2", "\x82", "\xac\xf0\x9f", "\x98\x80\""}) {
    ASSERT_TRUE(state.Advance(piece)) << "piece of " << piece.size() << " bytes";
  }
  EXPECT_TRUE(state.IsComplete());
  for (std::string_view bad :
       {"\"\xc0\x80\"", "\"\xc1\xbf\"", "\"\xe0\x80\x80\"", "\"\xed\xa0\x80\"",
        "\"\xf0\x80\x80\x80\"", "\"\xf4\x90\x80\x80\"", "\"\xf5\x80\x80\x80\"", "\"\x80\"",
        "\"\xff\"", "\"\xc3\"", "\"\xe2\x82\"", "\"a\nb\"", "\"\x1f\"", "\"\\x\"", "\"\\u12g4\"",
        "\"\\u123\""}) {
    EXPECT_FALSE(Accepts(string, bad)) << "accepted " << bad;
  }
  for (std::string_view good : {"\"\xf4\x8f\xbf\xbf\"", "\"\xed\x9f\xbf\"", "\"\\u00e9\\n\"",
                                "\"\x7f\"", "\"\\/\"", "\"\\uD83D\\uDE00\""}) {
    EXPECT_TRUE(Accepts(string, good)) << "rejected " << good;
  }
}

TEST(JsonConstraintTest, NumbersFollowJsonGrammarAndLimits) {
  const JsonConstraint number = Compile({{"type", "number"}});
  const JsonConstraint integer = Compile({{"type", "integer"}});
  for (const char* good : {"0", "-0", "1.5", "-12e+3", "1E-3", "0.0", "1e0"}) {
    EXPECT_TRUE(Accepts(number, good)) << good;
  }
  for (const char* bad : {"01", "-", "1.", ".5", "+1", "1e", "1e+", "--1", "1.e3", "0x1"}) {
    EXPECT_FALSE(Accepts(number, bad)) << bad;
  }
  EXPECT_TRUE(Accepts(integer, "-123"));
  EXPECT_FALSE(Accepts(integer, "1.0"));
  EXPECT_FALSE(Accepts(integer, "1e3"));
  EXPECT_TRUE(Accepts(number, std::string(20, '7')));
  EXPECT_FALSE(Accepts(number, std::string(21, '7')));
  EXPECT_TRUE(Accepts(number, "1." + std::string(20, '5')));
  EXPECT_FALSE(Accepts(number, "1." + std::string(21, '5')));
  EXPECT_TRUE(Accepts(number, "1e308"));
  EXPECT_FALSE(Accepts(number, "1e3080"));
}

TEST(JsonConstraintTest, OptionalPropertiesKeepSchemaOrder) {
  const JsonConstraint constraint = Compile(OrderedJson::parse(R"({
    "type": "object",
    "properties": {"z": {"type": "integer"}, "a": {"type": "integer"}, "m": {"type": "integer"}},
    "required": ["a"], "additionalProperties": false})"));
  EXPECT_TRUE(Accepts(constraint, R"({"a":1})"));
  EXPECT_TRUE(Accepts(constraint, R"({"z":1,"a":2,"m":3})"));
  EXPECT_TRUE(Accepts(constraint, R"({"a":2,"m":3})"));
  EXPECT_FALSE(Accepts(constraint, R"({"m":3})"));
  EXPECT_FALSE(Accepts(constraint, R"({"a":2,"z":1})"));
  EXPECT_FALSE(Accepts(constraint, R"({"a":2,"a":1})"));
  EXPECT_FALSE(Accepts(constraint, R"({})"));
  // nlohmann::json sorts keys: the order is then by name.
  auto sorted = JsonConstraint::FromSchema(nlohmann::json::parse(R"({
    "type": "object", "properties": {"z": {"type": "integer"}, "a": {"type": "integer"}},
    "required": ["a", "z"]})"));
  ASSERT_TRUE(sorted.ok()) << sorted.status();
  EXPECT_TRUE(Accepts(*sorted, R"({"a":1,"z":2})"));
  EXPECT_FALSE(Accepts(*sorted, R"({"z":2,"a":1})"));
}

TEST(JsonConstraintTest, CopiesAreIndependent) {
  const JsonConstraint constraint = Compile(OrderedJson::parse(R"({
    "type": "object", "properties": {"s": {"type": "string"}, "n": {"type": "number"}},
    "required": ["s", "n"], "additionalProperties": false})"));
  JsonConstraintState parent = constraint.Start();
  ASSERT_TRUE(parent.Advance(R"({"s":"ab)"));
  JsonConstraintState left = parent;
  JsonConstraintState right = parent;
  ASSERT_TRUE(left.Advance(R"(c","n":1})"));
  ASSERT_TRUE(right.Advance(R"(\"","n":)"));
  EXPECT_TRUE(left.IsComplete());
  EXPECT_FALSE(right.IsComplete());
  EXPECT_FALSE(parent.IsComplete());
  // The parent is still inside the string, unaffected by either child.
  JsonConstraintState again = parent;
  EXPECT_TRUE(again.Advance(R"(","n":2.5})"));
  EXPECT_TRUE(again.IsComplete());
  EXPECT_TRUE(right.Advance("-3}"));
  EXPECT_TRUE(right.IsComplete());
  // A failed advance leaves the state as it was.
  JsonConstraintState failed = parent;
  EXPECT_FALSE(failed.Advance("x\x01"));
  EXPECT_TRUE(failed.Advance(R"(","n":0})"));
  EXPECT_TRUE(failed.IsComplete());
}

absl::Status SchemaError(const std::string& schema) {
  auto constraint = JsonConstraint::FromSchema(OrderedJson::parse(schema));
  return constraint.ok() ? absl::OkStatus() : constraint.status();
}

void ExpectError(const std::string& schema, absl::StatusCode code,
                 std::vector<std::string> fragments) {
  const absl::Status status = SchemaError(schema);
  EXPECT_EQ(status.code(), code) << schema << ": " << status;
  for (const std::string& fragment : fragments) {
    EXPECT_NE(status.message().find(fragment), std::string_view::npos)
        << schema << ": \"" << status.message() << "\" lacks \"" << fragment << "\"";
  }
}

TEST(JsonConstraintTest, UnsupportedKeywordsAreRefusedByName) {
  const auto kUnimplemented = absl::StatusCode::kUnimplemented;
  ExpectError(R"({"type":"object","properties":{"name":{"type":"string","pattern":"^a"}}})",
              kUnimplemented, {"\"pattern\"", "/properties/name/pattern"});
  ExpectError(R"({"type":"string","format":"date-time"})", kUnimplemented,
              {"\"format\"", "/format"});
  ExpectError(R"({"type":"string","minLength":1})", kUnimplemented, {"\"minLength\""});
  ExpectError(R"({"type":"string","maxLength":1})", kUnimplemented, {"\"maxLength\""});
  ExpectError(R"({"type":"integer","minimum":0})", kUnimplemented, {"\"minimum\""});
  ExpectError(R"({"oneOf":[{"type":"string"}]})", kUnimplemented, {"\"oneOf\""});
  ExpectError(R"({"allOf":[{"type":"string"},{"type":"number"}]})", kUnimplemented,
              {"allOf", "/allOf"});
  ExpectError(R"({"type":"array","items":[{"type":"string"}]})", kUnimplemented,
              {"items", "/items"});
  ExpectError(R"({"type":"array","uniqueItems":true})", kUnimplemented, {"\"uniqueItems\""});
  ExpectError(R"({"type":"object","properties":{"a":{}},"additionalProperties":true})",
              kUnimplemented, {"additionalProperties", "/additionalProperties"});
  ExpectError(R"({"type":"string","anyOf":[{"type":"string"}]})", kUnimplemented,
              {"\"type\" beside \"anyOf\""});
  ExpectError(R"({"$ref":"other.json#/a"})", kUnimplemented, {"$ref", "/$ref"});
  ExpectError(R"({"items":{"items":{"patternProperties":{}}}})", kUnimplemented,
              {"/items/items/patternProperties"});
}

TEST(JsonConstraintTest, MalformedSchemasAreInvalid) {
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  ExpectError(R"({"type":"strin"})", kInvalid, {"unknown type \"strin\"", "/type"});
  ExpectError(R"({"type":[]})", kInvalid, {"/type"});
  ExpectError(R"({"typo":"string"})", kInvalid, {"unknown keyword \"typo\""});
  ExpectError(R"({"type":"object","properties":[]})", kInvalid, {"/properties"});
  ExpectError(R"({"type":"object","properties":{"a":{}},"required":"a"})", kInvalid, {"/required"});
  ExpectError(R"({"type":"object","properties":{"a":{}},"required":["b"]})", kInvalid,
              {"\"b\"", "/required"});
  ExpectError(R"({"$ref":"#/$defs/missing"})", kInvalid, {"points to nothing", "/$ref"});
  ExpectError(R"({"$ref":"#bad"})", kInvalid, {"not a JSON pointer"});
  ExpectError(R"({"type":"array","minItems":3,"maxItems":2})", kInvalid, {"minItems"});
  ExpectError(R"({"type":"array","minItems":-1})", kInvalid, {"/minItems"});
  ExpectError(R"({"enum":[]})", kInvalid, {"/enum"});
  ExpectError(R"({"type":"string","enum":[1,2]})", kInvalid, {"enum"});
  ExpectError(R"({"properties":{"a":false},"required":["a"]})", kInvalid,
              {"/properties/a", "false"});
  ExpectError(R"({"anyOf":[{"$ref":"#"}]})", kInvalid, {"cycle"});
  ExpectError(R"("string")", kInvalid, {"object or a boolean"});
  // Every document would be infinite: an object that requires itself.
  ExpectError(R"({"type":"object","properties":{"self":{"$ref":"#"}},"required":["self"]})",
              kInvalid, {"no finite document"});
  // The enum value survives the type filter only when it has the type.
  EXPECT_TRUE(SchemaError(R"({"type":"integer","enum":[1.0, "a"]})").ok());
}

TEST(JsonConstraintTest, NestingDepthIsLimited) {
  // A chain of required objects one deeper than the limit cannot be written at all.
  auto chain = [](int depth) {
    OrderedJson schema = {{"type", "integer"}};
    for (int i = 0; i < depth; ++i) {
      schema = {{"type", "object"},
                {"properties", {{"x", schema}}},
                {"required", {"x"}},
                {"additionalProperties", false}};
    }
    return schema;
  };
  EXPECT_TRUE(JsonConstraint::FromSchema(chain(kMaxNestingDepth)).ok());
  const auto too_deep = JsonConstraint::FromSchema(chain(kMaxNestingDepth + 1));
  EXPECT_EQ(too_deep.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_deep.status().message().find("limit of 32"), std::string_view::npos)
      << too_deep.status();
  // The schema document's own nesting.
  OrderedJson deep_items = {{"type", "integer"}};
  for (int i = 0; i < 200; ++i) deep_items = {{"items", deep_items}};
  EXPECT_EQ(JsonConstraint::FromSchema(deep_items).status().code(),
            absl::StatusCode::kInvalidArgument);

  // Free-form JSON: 32 containers open, the 33rd is refused, and closing still works.
  const JsonConstraint any = JsonConstraint::AnyJsonObject();
  JsonConstraintState state = any.Start();
  ASSERT_TRUE(state.Advance("{\"a\":" + std::string(kMaxNestingDepth - 1, '[')));
  JsonConstraintState deeper = state;
  EXPECT_FALSE(deeper.Advance("["));
  EXPECT_FALSE(deeper.Advance("{"));
  EXPECT_TRUE(state.Advance("1" + std::string(kMaxNestingDepth - 1, ']') + "}"));
  EXPECT_TRUE(state.IsComplete());

  // A recursive schema near the limit offers no key whose value cannot fit.
  const JsonConstraint tree = Compile(OrderedJson::parse(R"({
    "$defs": {"node": {"type": "object",
      "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"},
                              "minItems": 1},
                     "leaf": {"type": "integer"}},
      "additionalProperties": false}},
    "$ref": "#/$defs/node"})"));
  JsonConstraintState nested = tree.Start();
  std::string prefix;
  for (int i = 0; i < kMaxNestingDepth / 2 - 1; ++i) prefix += "{\"kids\":[";
  ASSERT_TRUE(nested.Advance(prefix));
  // 30 containers are open: {"kids":[ needs two more plus a node inside: no "kids".
  JsonConstraintState at_limit = nested;
  ASSERT_TRUE(at_limit.Advance("{"));
  EXPECT_FALSE(JsonConstraintState(at_limit).Advance("\"k"));
  EXPECT_TRUE(at_limit.Advance("\"leaf\":1}"));
}

// ---------------------------------------------------------------------------------------------
// Mask identity.

std::vector<bool> BruteForceMask(const JsonConstraintState& state,
                                 const TokenVocabulary& vocabulary) {
  std::vector<bool> allowed(static_cast<size_t>(vocabulary.size()));
  for (int32_t id = 0; id < vocabulary.size(); ++id) {
    JsonConstraintState copy = state;
    allowed[static_cast<size_t>(id)] = copy.Advance(vocabulary, id);
  }
  return allowed;
}

// Compares the walk with the brute force at every byte position of `text`. Returns the number
// of positions compared (stops at the first mismatch, or where `text` is rejected).
int CompareMasksAlong(const JsonConstraint& constraint, const TokenVocabulary& vocabulary,
                      std::string_view text, const std::string& label) {
  JsonConstraintState state = constraint.Start();
  std::vector<uint64_t> mask;
  for (size_t position = 0; position <= text.size(); ++position) {
    state.Allowed(vocabulary, mask);
    const std::vector<bool> expected = BruteForceMask(state, vocabulary);
    for (int32_t id = 0; id < vocabulary.size(); ++id) {
      const bool walked = (mask[static_cast<size_t>(id) / 64] >> (id % 64)) & 1;
      if (walked != expected[static_cast<size_t>(id)]) {
        ADD_FAILURE() << label << " at byte " << position << " of " << text << ": token " << id
                      << " (\"" << vocabulary.piece(id) << "\") walked " << walked
                      << ", brute force " << expected[static_cast<size_t>(id)];
        return static_cast<int>(position);
      }
    }
    for (size_t i = static_cast<size_t>(vocabulary.size()); i < mask.size() * 64; ++i) {
      EXPECT_EQ((mask[i / 64] >> (i % 64)) & 1, 0u) << "bit past the vocabulary";
    }
    if (position == text.size() || !state.Advance(text.substr(position, 1))) {
      return static_cast<int>(position);
    }
  }
  return static_cast<int>(text.size());
}

TokenVocabulary SyntheticVocabulary(uint32_t seed) {
  // Fragments a tokenizer produces around JSON: structure, literals, digits, escapes, words,
  // whitespace runs, and UTF-8 characters cut anywhere (including invalid bytes).
  const std::vector<std::string> atoms = {
      "{",     "}",        "[",    "]",        ":",        ",",     "\"",       "\\",
      "\\u",   "\\n",      "\\\"", "a",        "b",        "k",     "x",        "y",
      "e",     "E",        "0",    "1",        "9",        "-",     "+",        ".",
      "t",     "r",        "u",    "n",        "l",        "f",     "s",        "true",
      "false", "null",     "name", "age",      "kind",     "value", "children", " ",
      "  ",    "\n",       "\n  ", "\t",       "\r",       "\x01",  "\x7f",     "\xc3",
      "\xa9",  "\xe2\x82", "\xac", "\xf0\x9f", "\x98\x80", "\xff",  "\xed\xa0", "\xc0",
      "é",     "€",        "😀",    "中文",     "\":",      "\":\"", "\",\"",    "{\"",
      "\"}",   "],",       "123",  "0.5",      "e+",       "1e",    "red",      "circle",
      "grün",  "ab",       "ull"};
  std::mt19937 rng(seed);
  std::vector<std::string> pieces;
  for (const std::string& atom : atoms) pieces.push_back(atom);  // every atom alone
  std::uniform_int_distribution<size_t> pick(0, atoms.size() - 1);
  std::uniform_int_distribution<int> length(1, 4);
  while (pieces.size() < 3000) {
    std::string piece;
    for (int i = length(rng); i > 0; --i) piece += atoms[pick(rng)];
    pieces.push_back(piece);
  }
  pieces.push_back(pieces[40]);  // duplicate pieces under distinct ids
  pieces.push_back("");          // a special token
  pieces.push_back("<|end|>");   // an end token with a visible piece
  pieces.push_back("");          // an end token without one
  const int32_t size = static_cast<int32_t>(pieces.size());
  auto vocabulary = TokenVocabulary::Create(std::move(pieces), {size - 2, size - 1});
  EXPECT_TRUE(vocabulary.ok()) << vocabulary.status();
  return *std::move(vocabulary);
}

TEST(JsonConstraintTest, TrieMaskEqualsBruteForceOnSyntheticVocabulary) {
  const TokenVocabulary vocabulary = SyntheticVocabulary(7);
  const OrderedJson& fixture = Fixture();
  int positions = 0;
  for (const auto& c : fixture["cases"]) {
    const JsonConstraint constraint = Compile(c["schema"]);
    int documents = 0;
    for (const auto& document : c["documents"]) {
      // Accepted documents walk every reachable position; a few rejected ones end early.
      const bool accept = document["expect"] == "accept";
      if (documents >= (accept ? 3 : 5)) continue;
      if (!accept && documents < 3) continue;
      ++documents;
      positions += CompareMasksAlong(constraint, vocabulary, document["text"].get<std::string>(),
                                     c["name"].get<std::string>());
    }
  }
  int json_object_documents = 0;
  for (const auto& document : fixture["json_object"]) {
    if (json_object_documents++ >= 6) break;
    positions += CompareMasksAlong(JsonConstraint::AnyJsonObject(), vocabulary,
                                   document["text"].get<std::string>(), "json_object");
  }
  EXPECT_GT(positions, 2000);
}

TEST(JsonConstraintTest, EndTokensExactlyWhenComplete) {
  const TokenVocabulary vocabulary = SyntheticVocabulary(11);
  const int32_t end_visible = vocabulary.size() - 2;
  const int32_t end_empty = vocabulary.size() - 1;
  const int32_t special = vocabulary.size() - 3;
  auto bit = [](const std::vector<uint64_t>& mask, int32_t id) {
    return ((mask[static_cast<size_t>(id) / 64] >> (id % 64)) & 1) != 0;
  };
  const JsonConstraint any = JsonConstraint::AnyJsonObject();
  JsonConstraintState state = any.Start();
  std::vector<uint64_t> mask;
  state.Allowed(vocabulary, mask);
  EXPECT_FALSE(bit(mask, end_visible));
  EXPECT_FALSE(bit(mask, special));
  EXPECT_FALSE(state.Advance(vocabulary, end_empty));
  EXPECT_FALSE(state.Advance(vocabulary, special));
  ASSERT_TRUE(state.Advance("{}"));
  state.Allowed(vocabulary, mask);
  EXPECT_TRUE(bit(mask, end_visible));
  EXPECT_TRUE(bit(mask, end_empty));
  EXPECT_FALSE(bit(mask, special));
  // Nothing but the end once the object closed (no trailing whitespace).
  size_t set_bits = 0;
  for (uint64_t word : mask) set_bits += static_cast<size_t>(__builtin_popcountll(word));
  EXPECT_EQ(set_bits, 2u);
  EXPECT_TRUE(state.Advance(vocabulary, end_visible));
  EXPECT_TRUE(state.IsEnded());
  state.Allowed(vocabulary, mask);
  for (uint64_t word : mask) EXPECT_EQ(word, 0u);
  EXPECT_FALSE(state.Advance(vocabulary, end_visible));

  // A number root is complete and may still grow.
  const JsonConstraint number = Compile({{"type", "number"}});
  JsonConstraintState digits = number.Start();
  ASSERT_TRUE(digits.Advance("12"));
  digits.Allowed(vocabulary, mask);
  EXPECT_TRUE(bit(mask, end_visible));
  EXPECT_TRUE(digits.IsComplete());
  EXPECT_TRUE(JsonConstraintState(digits).Advance("3"));

  EXPECT_FALSE(TokenVocabulary::Create({"a"}, {1}).ok());
}

TEST(JsonConstraintTest, TrieMaskEqualsBruteForceOnSmolLm2Vocabulary) {
  const std::string path = testing::ModelPath(testing::kSmolLm2File);
  auto file = gguf::File::Open(path);
  if (!file.ok()) GTEST_SKIP() << "needs " << path << ": " << file.status();
  auto tokenizer = Tokenizer::FromGguf(**file);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  std::vector<std::string> pieces;
  for (int32_t id = 0; id < (*tokenizer)->vocab_size(); ++id) {
    auto piece = (*tokenizer)->TokenToPiece(id);
    ASSERT_TRUE(piece.ok()) << piece.status();
    pieces.emplace_back(*piece);
  }
  auto vocabulary =
      TokenVocabulary::Create(std::move(pieces), (*tokenizer)->end_of_generation_ids());
  ASSERT_TRUE(vocabulary.ok()) << vocabulary.status();
  const JsonConstraint constraint = Compile(Fixture()["cases"][0]["schema"]);
  const std::string text =
      R"({"name": "Zoë \"Z\" Ünal\n", "age": 42, "email": null, "tags": ["a", "bc"], )"
      R"("active": true, "score": -1.5e3})";
  EXPECT_EQ(CompareMasksAlong(constraint, *vocabulary, text, "SmolLM2"),
            static_cast<int>(text.size()));
}

}  // namespace
}  // namespace bitsplit::text
