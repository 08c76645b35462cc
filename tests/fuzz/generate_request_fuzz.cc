// Bytes -> bitsplit.v1.GenerateRequest -> coordinator::ValidateRequest with the real SmolLM2
// tokenizer and chat template (the public API's whole validation: prompt tokenization, sampling,
// stops, speculation settings), then the invariants a valid plan promises the speculation loop.
//
// The model file: $BITSPLIT_FUZZ_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf of the
// checkout. Only its metadata is read.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "common/io/gguf.h"
#include "common/text/chat_template.h"
#include "common/text/tokenizer.h"
#include "services/coordinator/request_validation.h"

namespace {

using namespace bitsplit;

struct Model {
  std::unique_ptr<gguf::File> file;
  std::unique_ptr<text::Tokenizer> tokenizer;
  std::optional<text::ChatTemplate> chat_template;
  coordinator::ServerLimits limits;
};
Model* loaded = nullptr;

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "generate_request_fuzz: %s\n", message.c_str());
  std::exit(2);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  const char* path = std::getenv("BITSPLIT_FUZZ_MODEL");
  const std::string model_path =
      path != nullptr && *path != '\0'
          ? std::string(path)
          : std::string(BITSPLIT_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  loaded = new Model();
  auto file = gguf::File::Open(model_path);
  if (!file.ok()) Die(std::string(file.status().message()));
  loaded->file = std::move(*file);
  auto tokenizer = text::Tokenizer::FromGguf(*loaded->file);
  if (!tokenizer.ok()) Die(std::string(tokenizer.status().message()));
  loaded->tokenizer = std::move(*tokenizer);
  if (auto chat = text::ChatTemplate::FromGgufOrArchitecture(*loaded->file, *loaded->tokenizer);
      chat.ok()) {
    loaded->chat_template = chat->chat_template;
  }
  // As the coordinator sets them for SmolLM2 behind a drafter of 2048 slots and 64 tree nodes.
  coordinator::ServerLimits& limits = loaded->limits;
  limits.context_length = 2048;
  limits.vocab_size = loaded->tokenizer->vocab_size();
  limits.max_tokens_limit = 4096;
  limits.max_tree_nodes = 63;
  limits.max_logprobs = 20;
  limits.default_mode = coordinator::SpeculationMode::kAdaptive;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  v1::GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  const text::ChatTemplate* chat_template =
      loaded->chat_template ? &*loaded->chat_template : nullptr;
  auto plan =
      coordinator::ValidateRequest(request, *loaded->tokenizer, chat_template, loaded->limits);
  if (!plan.ok()) {
    if (plan.status().code() != absl::StatusCode::kInvalidArgument &&
        plan.status().code() != absl::StatusCode::kFailedPrecondition) {
      std::fprintf(stderr, "unexpected status %s\n", plan.status().ToString().c_str());
      __builtin_trap();
    }
    return 0;
  }
  // What the speculation loop relies on without checking again.
  const coordinator::GenerationPlan& p = *plan;
  const int64_t context = loaded->limits.context_length;
  if (p.prompt_tokens.empty() || p.max_tokens < 1 ||
      static_cast<int64_t>(p.prompt_tokens.size()) + p.max_tokens > context) {
    __builtin_trap();
  }
  for (int32_t id : p.prompt_tokens) {
    if (id < 0 || id >= loaded->limits.vocab_size) __builtin_trap();
  }
  for (int32_t id : p.stop_token_ids) {
    if (id < 0 || id >= loaded->limits.vocab_size) __builtin_trap();
  }
  if (p.logprobs < 0 || p.logprobs > loaded->limits.max_logprobs) __builtin_trap();
  return 0;
}
