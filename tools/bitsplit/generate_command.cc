// `bitsplit generate`: local streamed generation from a GGUF model (reference mode) or a split
// model (draft mode: base only; verify mode: base + residual); with --server, the same request
// served by a running bitsplit-coordinator (client_command.cc).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/io/split_file.h"
#include "common/model/llama_model.h"
#include "common/model/sampler.h"
#include "common/text/chat_template.h"
#include "common/text/streaming_detokenizer.h"
#include "common/text/tokenizer.h"
#include "tools/bitsplit/commands.h"

namespace bitsplit::cli {
namespace {

struct GenerateOptions {
  std::string model_path;
  std::optional<std::string> residual_path;
  std::optional<std::string> mode;  // default: the model's (verify when a residual is given)
  std::optional<std::string> prompt;
  std::optional<std::string> chat;
  int max_tokens = 128;
  model::SamplingParams sampling;
  int threads = 0;
  int prefill_chunk = 256;
  // --server and the options that only it takes.
  RemoteGenerateOptions remote;
};

int Fail(int code, std::string_view message) { return ReportError("generate", code, message); }

using Clock = std::chrono::steady_clock;
double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Whether `path` starts with the split container's magic (else it is taken for a GGUF file).
absl::StatusOr<bool> IsSplitFile(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return absl::NotFoundError(absl::StrFormat("cannot open %s", path));
  char magic[sizeof(kSplitFileMagic)] = {};
  const size_t read = std::fread(magic, 1, sizeof(magic), file);
  std::fclose(file);
  return read == sizeof(magic) && std::memcmp(magic, kSplitFileMagic, sizeof(magic)) == 0;
}

int RunGenerate(const GenerateOptions& options) {
  if (auto status = model::ValidateSamplingParams(options.sampling); !status.ok()) {
    return Fail(kExitBadInput, std::string(status.message()));
  }
  if (options.max_tokens < 1) return Fail(kExitBadInput, "-n must be at least 1");
  const Clock::time_point load_start = Clock::now();
  auto split = IsSplitFile(options.model_path);
  if (!split.ok()) return Fail(kExitBadInput, std::string(split.status().message()));
  if (!*split && options.residual_path) {
    return Fail(kExitBadInput, absl::StrFormat("--residual needs a split model, but %s is not a "
                                               "split base file (.bsplit)",
                                               options.model_path));
  }
  auto model = *split ? model::LlamaModel::LoadSplit(
                            options.model_path, options.residual_path.value_or(""), options.threads)
                      : model::LlamaModel::Load(options.model_path, options.threads);
  if (!model.ok()) return Fail(kExitBadInput, std::string(model.status().message()));
  model::ForwardMode mode = (*model)->default_mode();
  if (options.mode) {
    auto parsed = model::ParseForwardMode(*options.mode);
    if (!parsed.ok()) return Fail(kExitBadInput, std::string(parsed.status().message()));
    mode = *parsed;
  }
  if (!(*model)->SupportsMode(mode)) {
    const std::string_view name = model::ForwardModeName(mode);
    return Fail(kExitBadInput, absl::StrFormat("--mode %s needs %s", name,
                                               mode == model::ForwardMode::kVerify
                                                   ? "a split model with its --residual file"
                                               : mode == model::ForwardMode::kDraft
                                                   ? "a split model (--model PREFIX.base.bsplit)"
                                                   : "a GGUF model"));
  }
  const model::ModelConfig& config = (*model)->config();
  auto tokenizer = text::Tokenizer::FromGguf((*model)->gguf_metadata());
  if (!tokenizer.ok()) return Fail(kExitBadInput, std::string(tokenizer.status().message()));

  std::string prompt_text;
  if (options.chat) {
    auto chat_template =
        text::ChatTemplate::FromGgufOrArchitecture((*model)->gguf_metadata(), **tokenizer);
    if (!chat_template.ok()) {
      return Fail(kExitBadInput, std::string(chat_template.status().message()));
    }
    if (chat_template->from_architecture) std::fprintf(stderr, "%s\n", chat_template->note.c_str());
    std::vector<text::ChatMessage> messages = {{"user", *options.chat}};
    auto rendered = chat_template->chat_template.Render(messages, /*add_generation_prompt=*/true);
    if (!rendered.ok()) return Fail(kExitBadInput, std::string(rendered.status().message()));
    prompt_text = *std::move(rendered);
  } else {
    prompt_text = *options.prompt;
  }
  // Chat prompts carry control tokens of the template; raw prompts are plain text.
  std::vector<int32_t> tokens = (*tokenizer)->Encode(prompt_text, options.chat.has_value());
  if ((*tokenizer)->add_bos() && (*tokenizer)->bos_id() >= 0) {
    tokens.insert(tokens.begin(), (*tokenizer)->bos_id());
  }
  if (tokens.empty()) return Fail(kExitBadInput, "the prompt is empty");

  const int64_t capacity = static_cast<int64_t>(tokens.size()) + options.max_tokens;
  if (capacity > config.context_length) {
    return Fail(kExitBadInput,
                absl::StrFormat("prompt (%d tokens) + -n %d exceeds the model's context of %d",
                                tokens.size(), options.max_tokens, config.context_length));
  }
  auto cache = (*model)->NewKvCache(capacity);
  if (!cache.ok()) return Fail(kExitFailure, std::string(cache.status().message()));
  spdlog::debug("model loaded in {:.2f} s, {} threads", SecondsSince(load_start),
                (*model)->num_threads());

  std::vector<float> logits(static_cast<size_t>(config.vocab_size));
  const Clock::time_point prefill_start = Clock::now();
  for (size_t begin = 0; begin < tokens.size(); begin += options.prefill_chunk) {
    const size_t end = std::min(tokens.size(), begin + options.prefill_chunk);
    std::span<const int32_t> chunk(tokens.data() + begin, end - begin);
    model::Batch batch = model::Batch::Causal(chunk, static_cast<int32_t>(begin));
    batch.logit_rows = {static_cast<int32_t>(chunk.size() - 1)};
    if (auto status = (*model)->Forward(batch, *cache, logits.data(), mode); !status.ok()) {
      return Fail(kExitFailure, std::string(status.message()));
    }
    if (auto status = cache->Commit(static_cast<int64_t>(chunk.size())); !status.ok()) {
      return Fail(kExitFailure, std::string(status.message()));
    }
  }
  const double prefill_seconds = SecondsSince(prefill_start);

  model::Sampler sampler;
  text::StreamingDetokenizer detokenizer(**tokenizer);
  const Clock::time_point decode_start = Clock::now();
  int generated = 0;
  int64_t position = static_cast<int64_t>(tokens.size());
  while (generated < options.max_tokens) {
    const int32_t next = sampler.Choose(logits, options.sampling, position);
    // The end-of-generation token is not part of the answer: not counted, as the server does.
    if ((*tokenizer)->IsEndOfGeneration(next)) break;
    ++generated;
    auto piece = detokenizer.Push(next);
    if (!piece.ok()) return Fail(kExitFailure, std::string(piece.status().message()));
    std::fwrite(piece->data(), 1, piece->size(), stdout);
    std::fflush(stdout);
    if (generated == options.max_tokens) break;
    const int32_t single[1] = {next};
    model::Batch batch = model::Batch::Causal(single, static_cast<int32_t>(position));
    if (auto status = (*model)->Forward(batch, *cache, logits.data(), mode); !status.ok()) {
      return Fail(kExitFailure, std::string(status.message()));
    }
    if (auto status = cache->Commit(1); !status.ok()) {
      return Fail(kExitFailure, std::string(status.message()));
    }
    ++position;
  }
  const std::string tail = detokenizer.Finish();
  std::fwrite(tail.data(), 1, tail.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  const double decode_seconds = SecondsSince(decode_start);
  std::fprintf(stderr,
               "[prompt %zu tokens, %.1f tok/s | generated %d tokens, %.1f tok/s | %d threads | "
               "%s mode]\n",
               tokens.size(), tokens.size() / std::max(prefill_seconds, 1e-9), generated,
               generated / std::max(decode_seconds, 1e-9), (*model)->num_threads(),
               std::string(model::ForwardModeName(mode)).c_str());
  return kExitOk;
}

}  // namespace

Command AddGenerateCommand(CLI::App& app) {
  auto options = std::make_shared<GenerateOptions>();
  CLI::App* sub = app.add_subcommand("generate", "stream a completion from a GGUF or split model");
  // A repeated option takes its last value, so wrappers (scripts/run.sh) can set defaults that
  // the user's own flags override.
  sub->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  sub->add_option("--model,-m", options->model_path,
                  "GGUF model file, or the base file of a split model (PREFIX.base.bsplit)")
      ->check(CLI::ExistingFile);
  auto* server = sub->add_option(
      "--server,-s", options->remote.server,
      "generate on a running bitsplit-coordinator (HOST:PORT or unix:/path) instead of locally");
  sub->add_option("--residual", options->residual_path,
                  "residual file of the split model (PREFIX.residual.bsplit); enables verify mode")
      ->check(CLI::ExistingFile);
  sub->add_option("--mode", options->mode,
                  "reference (GGUF), draft (split: base only) or verify (split: base + residual); "
                  "default: verify when --residual is given, else draft or reference")
      ->check(CLI::IsMember({"reference", "draft", "verify"}));
  auto* prompt = sub->add_option("--prompt,-p", options->prompt, "raw prompt text");
  auto* chat = sub->add_option("--chat,-c", options->chat,
                               "a user message, wrapped in the model's chat template");
  prompt->excludes(chat);
  chat->excludes(prompt);
  sub->add_option("-n,--max-tokens", options->max_tokens, "tokens to generate")
      ->capture_default_str();
  AddSamplingOptions(sub, options->sampling);
  sub->add_option("--threads,-t", options->threads, "worker threads (0 = all cores)")
      ->capture_default_str();
  AddRemoteSpeculationOptions(sub, options->remote);
  sub->callback([sub, prompt, chat, server] {
    if (prompt->count() == 0 && chat->count() == 0) {
      throw CLI::RequiredError("one of --prompt or --chat");
    }
    const bool remote = server->count() > 0;
    if (!remote && sub->count("--model") == 0) throw CLI::RequiredError("--model (or --server)");
    // The local engine decodes without speculation or stop strings; the server's model is fixed.
    for (const char* local_only : {"--model", "--residual", "--mode", "--threads"}) {
      if (remote && sub->count(local_only) > 0) {
        throw CLI::ValidationError(local_only, "is for local generation; not with --server");
      }
    }
    for (const char* remote_only :
         {"--speculation", "--nodes", "--expansions", "--max-depth", "--stop"}) {
      if (!remote && sub->count(remote_only) > 0) {
        throw CLI::ValidationError(remote_only, "needs --server (a running bitsplit-coordinator)");
      }
    }
  });
  return {sub, [options] {
            if (options->remote.server.empty()) return RunGenerate(*options);
            RemoteGenerateOptions remote = options->remote;
            remote.prompt = options->prompt;
            remote.chat = options->chat;
            remote.max_tokens = options->max_tokens;
            remote.sampling = options->sampling;
            return RunRemoteGenerate("generate", remote);
          }};
}

}  // namespace bitsplit::cli
