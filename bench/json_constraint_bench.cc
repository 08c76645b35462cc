// The cost of structured output's token mask: JsonConstraintState::Allowed over a model's whole
// vocabulary at document positions of different kinds (inside a string, expecting a key, inside
// a number, ...), for a strict-mode schema and for json_object mode.
//
//   build/bench/json_constraint_bench --model models/SmolLM2-135M-Instruct.Q4_1.gguf
//   build/bench/json_constraint_bench --model models/gemma-3-270m-q4_k_m.gguf [--reps 200]
//
// Prints the vocabulary's build time, then per position the mean and best milliseconds of one
// Allowed call and how many tokens it allows. Pieces are the tokenizer's TokenToPiece bytes;
// control, unknown and unused tokens get an empty piece (never allowed), end-of-generation
// tokens are the tokenizer's.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/io/gguf.h"
#include "common/text/json_constraint.h"
#include "common/text/tokenizer.h"
#include "nlohmann/json.hpp"

namespace bitsplit {
namespace {

using Clock = std::chrono::steady_clock;

double Milliseconds(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

struct Position {
  const char* label;
  const text::JsonConstraint* constraint;
  std::string prefix;  // the document so far
};

int Run(const std::string& model_path, int reps) {
  auto file = gguf::File::Open(model_path);
  if (!file.ok()) {
    std::fprintf(stderr, "%s\n", file.status().ToString().c_str());
    return 1;
  }
  auto tokenizer = text::Tokenizer::FromGguf(**file);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "%s\n", tokenizer.status().ToString().c_str());
    return 1;
  }
  std::vector<std::string> pieces;
  int32_t blanked = 0;
  for (int32_t id = 0; id < (*tokenizer)->vocab_size(); ++id) {
    auto type = (*tokenizer)->GetTokenType(id);
    auto piece = (*tokenizer)->TokenToPiece(id);
    const bool usable = type.ok() && piece.ok() && *type != text::TokenType::kControl &&
                        *type != text::TokenType::kUnknown && *type != text::TokenType::kUnused;
    pieces.emplace_back(usable ? std::string(*piece) : std::string());
    blanked += usable ? 0 : 1;
  }
  const auto build_start = Clock::now();
  auto vocabulary =
      text::TokenVocabulary::Create(std::move(pieces), (*tokenizer)->end_of_generation_ids());
  const double build_ms = Milliseconds(Clock::now() - build_start);
  if (!vocabulary.ok()) {
    std::fprintf(stderr, "%s\n", vocabulary.status().ToString().c_str());
    return 1;
  }
  std::printf("model %s: %d tokens (%d never allowed), vocabulary built in %.1f ms\n",
              model_path.c_str(), vocabulary->size(), blanked, build_ms);

  auto strict = text::JsonConstraint::FromSchema(nlohmann::ordered_json::parse(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string"},
      "age": {"type": "integer"},
      "email": {"type": ["string", "null"]},
      "tags": {"type": "array", "items": {"type": "string"}},
      "kind": {"enum": ["person", "company", "robot"]},
      "score": {"type": "number"}
    },
    "required": ["name", "age", "email", "tags", "kind", "score"],
    "additionalProperties": false})"));
  if (!strict.ok()) {
    std::fprintf(stderr, "%s\n", strict.status().ToString().c_str());
    return 1;
  }
  const text::JsonConstraint any = text::JsonConstraint::AnyJsonObject();
  const std::vector<Position> positions = {
      {"schema: document start", &*strict, ""},
      {"schema: expecting the first key", &*strict, "{"},
      {"schema: inside a key", &*strict, R"({"na)"},
      {"schema: expecting a string value", &*strict, R"({"name": )"},
      {"schema: inside a string", &*strict, R"({"name": "Zoë Ün)"},
      {"schema: inside a number", &*strict, R"({"name": "Zoë", "age": 123)"},
      {"schema: expecting a key after ','", &*strict, R"({"name": "Zoë", "age": 12,)"},
      {"schema: inside an array's string", &*strict,
       R"({"name": "Zoë", "age": 12, "email": null, "tags": ["alp)"},
      {"schema: inside an enum value", &*strict,
       R"({"name": "Zoë", "age": 12, "email": null, "tags": [], "kind": "ro)"},
      {"json_object: expecting a key", &any, "{"},
      {"json_object: inside a key", &any, R"({"ke)"},
      {"json_object: expecting a value", &any, R"({"key": )"},
      {"json_object: inside a string", &any, R"({"key": "some text)"},
      {"json_object: inside a number", &any, R"({"key": -12.5)"},
      {"json_object: complete", &any, R"({"key": [1, {"a": null}]})"},
  };

  std::vector<uint64_t> mask;
  std::printf("%-40s %10s %10s %10s\n", "position", "mean ms", "best ms", "allowed");
  for (const Position& position : positions) {
    text::JsonConstraintState state = position.constraint->Start();
    if (!state.Advance(position.prefix)) {
      std::fprintf(stderr, "prefix rejected: %s\n", position.prefix.c_str());
      return 1;
    }
    state.Allowed(*vocabulary, mask);  // warm-up
    double total = 0, best = 1e30;
    for (int rep = 0; rep < reps; ++rep) {
      const auto start = Clock::now();
      state.Allowed(*vocabulary, mask);
      const double ms = Milliseconds(Clock::now() - start);
      total += ms;
      best = std::min(best, ms);
    }
    size_t allowed = 0;
    for (uint64_t word : mask) allowed += static_cast<size_t>(__builtin_popcountll(word));
    std::printf("%-40s %10.4f %10.4f %10zu\n", position.label, total / reps, best, allowed);
  }

  // Draft trees copy a state per node and advance it by one token.
  text::JsonConstraintState state = strict->Start();
  state.Advance(R"({"name": "Zoë", "age": 12, "email": null, "tags": ["alp)");
  const int copies = 1000000;
  const auto copy_start = Clock::now();
  size_t sink = 0;
  for (int i = 0; i < copies; ++i) {
    text::JsonConstraintState copy = state;
    sink += copy.Advance("ha") ? 1 : 0;
  }
  std::printf("copy + Advance(2 bytes): %.1f ns (sizeof state %zu bytes, %zu ok)\n",
              Milliseconds(Clock::now() - copy_start) * 1e6 / copies,
              sizeof(text::JsonConstraintState), sink);
  return 0;
}

}  // namespace
}  // namespace bitsplit

int main(int argc, char** argv) {
  std::string model;
  int reps = 200;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--model" && i + 1 < argc) {
      model = argv[++i];
    } else if (arg == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s --model FILE.gguf [--reps N]\n", argv[0]);
      return 2;
    }
  }
  if (model.empty()) {
    std::fprintf(stderr, "usage: %s --model FILE.gguf [--reps N]\n", argv[0]);
    return 2;
  }
  return bitsplit::Run(model, reps);
}
