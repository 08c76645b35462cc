// bitsplit-coordinator: the public Generation service (services/coordinator/README.md).
//
//   bitsplit-coordinator --model MODEL.base.bsplit [--drafter unix:/run/bitsplit/drafter.sock]
//       [--listen localhost:50051 | --socket PATH] [--max-active 0] [--max-queue 16]
//       [--speculation adaptive|tree|off] [--nodes 16] [--expansions 4] [--max-depth 8]
//       [--adaptive-max-nodes 128] [--adaptive-max-depth 16]
//       [--max-tokens-limit 4096] [--default-max-tokens 512] [--max-request-bytes 4194304]
//       [--drafter-timeout-ms 120000] [--connect-timeout-ms 30000] [--shutdown-grace-ms 200]
//       [--http HOST:PORT] [--api-key-file PATH] [--served-model-name NAME] [--http-threads 0]
//       [--verbose]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/io/gguf.h"
#include "common/model/split_model.h"
#include "common/rpc/drafter_client.h"
#include "common/rpc/server_runner.h"
#include "common/speculation/tree.h"
#include "common/text/chat_template.h"
#include "common/text/tokenizer.h"
#include "common/text/tool_calls.h"
#include "common/util/status_macros.h"
#include "services/coordinator/drafter_stream.h"
#include "services/coordinator/generation_service.h"
#include "services/coordinator/http_api.h"
#include "services/coordinator/metrics.h"
#include "services/coordinator/openai_api.h"
#include "services/coordinator/request_queue.h"
#include "services/coordinator/request_validation.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace bitsplit::coordinator {
namespace {

constexpr char kName[] = "bitsplit-coordinator";
// On SIGTERM: how long running streams get to stop (one step each) and send their last frames,
// then how long their clients get to read them before the connections close.
constexpr auto kStreamDrainTimeout = std::chrono::seconds(5);
constexpr auto kFinalStatusLinger = std::chrono::milliseconds(200);

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "%s: error: %.*s\n", kName, static_cast<int>(status.message().size()),
               status.message().data());
  return 1;
}

struct Flags {
  std::string model_path;
  std::string drafter = "unix:/run/bitsplit/drafter.sock";
  std::string listen = "localhost:50051";
  std::string socket_path;
  int max_active = 0;  // 0: the drafter's session count
  int max_queue = 16;
  std::string speculation = "adaptive";
  speculation::TreeShape shape;
  int adaptive_max_nodes = 128;
  int adaptive_max_depth = 16;
  int max_tokens_limit = 4096;
  int default_max_tokens = 512;
  int max_request_bytes = 4 << 20;
  int drafter_timeout_ms = 120000;
  int connect_timeout_ms = 30000;
  int shutdown_grace_ms = 200;
  std::string http;  // "": no HTTP listener
  std::string api_key_file;
  std::string served_model_name;   // "": the base file's name without .base.bsplit
  std::string chat_template_file;  // "": the model file's template
  int http_threads = 0;            // 0: --max-active + --max-queue + 16
  bool verbose = false;
};

std::string ModelName(const model::SplitModelFiles& files) {
  if (files.gguf_metadata().Find("general.name") != nullptr) {
    auto name = files.gguf_metadata().GetString("general.name");
    if (name.ok() && !name->empty()) return *name;
  }
  return files.base().name();
}

void AddFlags(CLI::App& app, Flags& flags) {
  app.add_option("--model", flags.model_path, "the split model's base file (MODEL.base.bsplit)")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--drafter", flags.drafter, "gRPC target of bitsplit-drafter")
      ->capture_default_str();
  auto* listen = app.add_option("--listen", flags.listen, "TCP HOST:PORT to serve on (port 0: any)")
                     ->capture_default_str();
  auto* socket = app.add_option("--socket", flags.socket_path,
                                "serve on this unix socket (mode 0660) instead of TCP");
  socket->excludes(listen);
  app.add_option("--max-active", flags.max_active,
                 "requests generating at once, batched by the drafter (0: the drafter's sessions)")
      ->capture_default_str()
      ->check(CLI::Range(0, 64));
  app.add_option("--max-queue", flags.max_queue,
                 "requests waiting beyond --max-active (more: RESOURCE_EXHAUSTED)")
      ->capture_default_str()
      ->check(CLI::Range(0, 4096));
  app.add_option("--speculation", flags.speculation, "default speculation mode of a request")
      ->capture_default_str()
      ->check(CLI::IsMember({"adaptive", "tree", "off"}));
  app.add_option("--nodes", flags.shape.nodes,
                 "draft tree nodes beyond the root (tree mode; adaptive mode's largest tree)")
      ->capture_default_str();
  app.add_option("--expansions", flags.shape.expansions,
                 "frontier nodes expanded per draft forward (1: a chain)")
      ->capture_default_str();
  app.add_option("--max-depth", flags.shape.max_depth, "draft tree depth cap")
      ->capture_default_str();
  app.add_option("--adaptive-max-nodes", flags.adaptive_max_nodes,
                 "adaptive mode: the largest tree the policy may pick (capped by the drafter's "
                 "--max-tree-nodes)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--adaptive-max-depth", flags.adaptive_max_depth,
                 "adaptive mode: the deepest tree the policy may pick")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--max-tokens-limit", flags.max_tokens_limit, "largest max_tokens of a request")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--default-max-tokens", flags.default_max_tokens,
                 "max_tokens of a request that leaves it unset (cut to what fits the context)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--max-request-bytes", flags.max_request_bytes,
                 "largest request message on the public port (larger: RESOURCE_EXHAUSTED)")
      ->capture_default_str()
      ->check(CLI::Range(1 << 10, 1 << 30));
  app.add_option("--drafter-timeout-ms", flags.drafter_timeout_ms,
                 "deadline of every drafter RPC (a hung drafter fails the request)")
      ->capture_default_str()
      ->check(CLI::Range(100, 3600 * 1000));
  app.add_option("--connect-timeout-ms", flags.connect_timeout_ms,
                 "how long to wait for the drafter at start")
      ->capture_default_str()
      ->check(CLI::Range(0, 3600 * 1000));
  app.add_option("--shutdown-grace-ms", flags.shutdown_grace_ms,
                 "on SIGTERM, report NOT_SERVING this long before stopping")
      ->capture_default_str();
  app.add_option("--http", flags.http,
                 "also serve the OpenAI-compatible HTTP API, /health, /ready and /metrics on "
                 "HOST:PORT (port 0: any; e.g. localhost:8080)");
  app.add_option("--api-key-file", flags.api_key_file,
                 "HTTP: require \"Authorization: Bearer KEY\" with the key in this file (all "
                 "routes but /health and /ready)")
      ->check(CLI::ExistingFile);
  app.add_option("--chat-template-file", flags.chat_template_file,
                 "a Jinja chat template to use instead of the model file's "
                 "tokenizer.chat_template (refused at start when it cannot render a one-message "
                 "chat)")
      ->check(CLI::ExistingFile);
  app.add_option("--served-model-name", flags.served_model_name,
                 "HTTP: the model id of /v1/models and requests (default: the base file's name "
                 "without .base.bsplit)");
  app.add_option("--http-threads", flags.http_threads,
                 "HTTP connections served at once (0: --max-active + --max-queue + 16)")
      ->capture_default_str()
      ->check(CLI::Range(0, 4096));
  app.add_flag("--verbose", flags.verbose, "log details to stderr");
}

// The split model's files with the tokenizer and chat template of its GGUF metadata.
struct LoadedModel {
  std::unique_ptr<model::SplitModelFiles> files;
  std::unique_ptr<text::Tokenizer> tokenizer;
  std::optional<text::ChatTemplate> chat_template;       // none: chat requests are refused
  std::string chat_template_source;                      // the template in use ("" without one)
  std::optional<text::ToolCallFormat> tool_call_format;  // none: requests with tools are refused
  std::vector<int32_t> tool_marker_ids;                  // its markers that are control tokens
};

// The template of --chat-template-file, else the model file's (or its family's).
absl::StatusOr<text::ChatTemplate> LoadChatTemplate(const std::string& template_file,
                                                    const gguf::File& metadata,
                                                    const text::Tokenizer& tokenizer) {
  if (template_file.empty()) {
    BITSPLIT_ASSIGN_OR_RETURN(text::ChatTemplate::Choice choice,
                              text::ChatTemplate::FromGgufOrArchitecture(metadata, tokenizer));
    if (choice.from_architecture) spdlog::info("{}", choice.note);
    return std::move(choice.chat_template);
  }
  std::ifstream in(template_file, std::ios::binary);
  std::stringstream source;
  source << in.rdbuf();
  if (!in.good() && !in.eof()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read ", template_file));
  }
  absl::StatusOr<text::ChatTemplate> parsed =
      text::ChatTemplate::FromSourceFor(source.str(), tokenizer);
  if (!parsed.ok()) {
    return absl::Status(parsed.status().code(),
                        absl::StrCat(template_file, ": ", parsed.status().message()));
  }
  spdlog::info("chat template from {}", template_file);
  return parsed;
}

absl::StatusOr<LoadedModel> LoadModel(const std::string& model_path,
                                      const std::string& template_file) {
  LoadedModel loaded;
  BITSPLIT_ASSIGN_OR_RETURN(loaded.files, model::SplitModelFiles::Open(model_path, ""));
  const gguf::File& metadata = loaded.files->gguf_metadata();
  BITSPLIT_ASSIGN_OR_RETURN(loaded.tokenizer, text::Tokenizer::FromGguf(metadata));
  absl::StatusOr<text::ChatTemplate> chat_template =
      LoadChatTemplate(template_file, metadata, *loaded.tokenizer);
  if (!chat_template.ok() && !template_file.empty()) return chat_template.status();
  if (chat_template.ok()) {
    loaded.chat_template = *std::move(chat_template);
    if (const auto& missing = loaded.chat_template->unimplemented_names(); !missing.empty()) {
      spdlog::warn(
          "the chat template names what the Jinja engine does not implement ({}); a conversation "
          "that reaches it is refused",
          absl::StrJoin(missing, ", "));
    }
    loaded.chat_template_source = loaded.chat_template->source();
    if (auto format = text::DetectToolCallFormat(loaded.chat_template->source()); format.ok()) {
      loaded.tool_call_format = *format;
      loaded.tool_marker_ids = openai::ControlMarkerIds(*loaded.tokenizer, *format);
      spdlog::info("tool calls: the chat template's {} syntax", text::ToolCallFormatName(*format));
    } else {
      spdlog::info("requests with tools are refused: {}", format.status().ToString());
    }
  } else {
    spdlog::warn("chat requests are refused: {}", chat_template.status().ToString());
  }
  return loaded;
}

// The drafter at --drafter and its GetInfo answer.
struct Drafter {
  std::unique_ptr<rpc::DrafterClient> client;
  internal::v1::DrafterInfo info;
};

// Fails unless the drafter answers and serves the model of `fingerprint`.
absl::StatusOr<Drafter> ConnectDrafter(const Flags& flags, const std::string& fingerprint) {
  auto client = rpc::DrafterClient::Connect(flags.drafter,
                                            std::chrono::milliseconds(flags.connect_timeout_ms),
                                            std::chrono::milliseconds(flags.drafter_timeout_ms));
  if (!client.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot reach the drafter at ", flags.drafter, ": ",
                                               client.status().message()));
  }
  Drafter drafter;
  drafter.client = std::move(*client);
  BITSPLIT_ASSIGN_OR_RETURN(drafter.info, drafter.client->GetInfo());
  if (drafter.info.fingerprint() != fingerprint) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the drafter at %s serves model fingerprint %s but %s has %s; start both from the same "
        "`bitsplit quantize` run",
        flags.drafter, drafter.info.fingerprint(), flags.model_path, fingerprint));
  }
  return drafter;
}

// The request limits: the flags, within what the model and the drafter hold.
absl::StatusOr<ServerLimits> Limits(const Flags& flags, SpeculationMode default_mode,
                                    const LoadedModel& loaded,
                                    const internal::v1::DrafterInfo& info) {
  ServerLimits limits;
  limits.context_length = static_cast<int32_t>(
      std::min<int64_t>(loaded.files->config().context_length, info.max_context()));
  limits.vocab_size = loaded.tokenizer->vocab_size();
  limits.max_tokens_limit = flags.max_tokens_limit;
  limits.default_max_tokens = std::min(flags.default_max_tokens, flags.max_tokens_limit);
  limits.max_token_bytes = MaxTokenBytes(*loaded.tokenizer);
  limits.max_tree_nodes = std::max(0, info.max_tree_nodes() - 1);
  limits.default_mode = default_mode;
  limits.default_shape = flags.shape;
  limits.adaptive_shape = {.nodes = std::min(flags.adaptive_max_nodes, limits.max_tree_nodes),
                           .expansions = 8,
                           .max_depth = flags.adaptive_max_depth};
  if (default_mode != SpeculationMode::kOff) {
    if (absl::Status status = speculation::ValidateTreeShape(flags.shape, limits.max_tree_nodes);
        !status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--nodes/--expansions/--max-depth: ", status.message(),
                       " (the drafter's --max-tree-nodes counts the root too)"));
    }
  }
  return limits;
}

// GetModelInfo's answer.
v1::ModelInfo ModelInfo(const LoadedModel& loaded, const internal::v1::DrafterInfo& info,
                        int32_t context_length) {
  const model::ModelConfig& config = loaded.files->config();
  v1::ModelInfo model_info;
  model_info.set_name(ModelName(*loaded.files));
  model_info.set_architecture(config.architecture);
  model_info.set_layers(static_cast<int32_t>(config.num_layers));
  model_info.set_d_model(static_cast<int32_t>(config.d_model));
  model_info.set_vocab_size(static_cast<int32_t>(config.vocab_size));
  model_info.set_context_length(context_length);
  // From the base file's quantization record, which the residual file must share (the drafter
  // learns the residual's only once it attached).
  const model::SplitQuantization& quantization = loaded.files->quantization();
  model_info.set_base_format(model::SplitBaseString(quantization));
  if (quantization.residual_format) {
    model_info.set_residual_format(model::SplitResidualString(quantization));
  }
  model_info.set_fingerprint(loaded.files->base().fingerprint_hex());
  model_info.set_chat_template(loaded.chat_template_source);
  model_info.set_vram_plan(info.vram_plan());
  return model_info;
}

absl::StatusOr<GenerationServiceOptions> ServiceOptions(const Flags& flags,
                                                        SpeculationMode default_mode,
                                                        const LoadedModel& loaded,
                                                        const internal::v1::DrafterInfo& info) {
  if (flags.max_active > info.max_sessions()) {
    spdlog::warn(
        "--max-active {} exceeds the drafter's {} sessions: requests beyond them fail "
        "with RESOURCE_EXHAUSTED",
        flags.max_active, info.max_sessions());
  }
  GenerationServiceOptions options;
  BITSPLIT_ASSIGN_OR_RETURN(options.limits, Limits(flags, default_mode, loaded, info));
  options.model_info = ModelInfo(loaded, info, options.limits.context_length);
  return options;
}

// Ready: the drafter answers, serves this model, reaches its cpu-residual (when it has a remote
// one), and a request sent now would be taken.
std::function<absl::Status()> Readiness(rpc::DrafterClient& drafter, RequestQueue& queue,
                                        const std::string& fingerprint) {
  return [&drafter, &queue, fingerprint]() -> absl::Status {
    auto now = drafter.GetInfo(std::chrono::milliseconds(1000), /*include_residual_stats=*/true);
    if (!now.ok()) return absl::UnavailableError(now.status().message());
    if (now->fingerprint() != fingerprint) {
      return absl::FailedPreconditionError("the drafter now serves another model");
    }
    if (now->residual() != "in-process" && !now->has_residual_stats()) {
      return absl::UnavailableError("the drafter's cpu-residual does not answer");
    }
    return queue.CheckCapacity(now->open_sessions(), now->max_sessions());
  };
}

// Where the server listens, its message size bound and its readiness probe.
rpc::ServerOptions ServerOptionsFor(const Flags& flags, std::function<absl::Status()> readiness) {
  rpc::ServerOptions server_options;
  server_options.name = kName;
  if (!flags.socket_path.empty()) {
    server_options.socket_path = flags.socket_path;
  } else {
    server_options.tcp_address = flags.listen;
  }
  server_options.health_services = {"bitsplit.v1.Generation"};
  server_options.shutdown_grace_ms = flags.shutdown_grace_ms;
  server_options.max_receive_message_bytes = flags.max_request_bytes;
  server_options.readiness = std::move(readiness);
  return server_options;
}

// Serves until SIGTERM/SIGINT, then lets the running streams finish before the server stops.
absl::Status Serve(const rpc::ServerOptions& server_options, RequestQueue& queue,
                   GenerationServiceImpl& service, HttpApi* http, const std::string& description) {
  grpc::Service* services[] = {&service};
  return rpc::RunServer(server_options, services, description, [&queue, &service, http] {
    // Queued requests end now, running ones at their next step.
    for (GenerationJob* job : queue.Shutdown()) {
      job->Finish(absl::UnavailableError("the coordinator is shutting down"));
    }
    // HTTP connections end as their streams do.
    if (http != nullptr) http->Stop();
    // The server closes a connection as soon as it has no call left on it, and a client that
    // then writes to it (a flow-control update, a ping acknowledgement) fails its stream with
    // "Broken pipe" without reading the last frames and status already sent (1 SIGTERM in 12-16,
    // with both CPUs busy). So the streams finish first, and their clients get time to read.
    if (!service.WaitForStreamsToFinish(std::chrono::steady_clock::now() + kStreamDrainTimeout)) {
      spdlog::warn("streams still open after {} s; stopping anyway", kStreamDrainTimeout.count());
    }
    std::this_thread::sleep_for(kFinalStatusLinger);
  });
}

// The HTTP listener of --http, serving; prints its address to stderr.
absl::StatusOr<std::unique_ptr<HttpApi>> StartHttp(const Flags& flags, HttpApiContext context) {
  HttpApiOptions options;
  options.address = flags.http;
  options.served_model = flags.served_model_name;
  if (options.served_model.empty()) {
    const std::string file = std::filesystem::path(flags.model_path).filename().string();
    absl::string_view name = file;
    absl::ConsumeSuffix(&name, ".base.bsplit");
    options.served_model = std::string(name);
  }
  if (!flags.api_key_file.empty()) {
    std::ifstream file(flags.api_key_file);
    std::stringstream contents;
    contents << file.rdbuf();
    options.api_key = std::string(absl::StripAsciiWhitespace(contents.str()));
    if (!file || options.api_key.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--api-key-file ", flags.api_key_file, ": no key in it"));
    }
  } else if (!flags.http.starts_with("localhost:") && !flags.http.starts_with("127.") &&
             !flags.http.starts_with("[::1]:")) {
    spdlog::warn("--http {} without --api-key-file: anyone who can reach it may generate",
                 flags.http);
  }
  options.max_request_bytes = flags.max_request_bytes;
  options.threads = flags.http_threads > 0
                        ? flags.http_threads
                        : context.queue->max_active() + context.queue->max_queue() + 16;
  auto http = std::make_unique<HttpApi>(std::move(options), std::move(context));
  BITSPLIT_ASSIGN_OR_RETURN(const std::string address, http->Start());
  std::fprintf(stderr,
               "%s: HTTP API on http://%s (/v1/chat/completions, /v1/completions, "
               "/v1/models, /health, /ready, /metrics)\n",
               kName, address.c_str());
  return http;
}

absl::Status RunCoordinator(const Flags& flags) {
  BITSPLIT_ASSIGN_OR_RETURN(const SpeculationMode default_mode,
                            ParseSpeculationMode(flags.speculation));
  BITSPLIT_ASSIGN_OR_RETURN(const LoadedModel loaded,
                            LoadModel(flags.model_path, flags.chat_template_file));
  const std::string fingerprint = loaded.files->base().fingerprint_hex();
  BITSPLIT_ASSIGN_OR_RETURN(const Drafter drafter, ConnectDrafter(flags, fingerprint));
  BITSPLIT_ASSIGN_OR_RETURN(const GenerationServiceOptions options,
                            ServiceOptions(flags, default_mode, loaded, drafter.info));
  const text::ChatTemplate* chat_template = loaded.chat_template ? &*loaded.chat_template : nullptr;
  const int max_active = flags.max_active > 0 ? flags.max_active : drafter.info.max_sessions();
  CoordinatorMetrics metrics;
  RequestQueue queue(max_active, flags.max_queue,
                     GenerationEnvironment{.drafter = drafter.client.get(),
                                           .tokenizer = loaded.tokenizer.get(),
                                           .context_length = options.limits.context_length},
                     metrics);
  GenerationServiceImpl service(options, queue, metrics, *loaded.tokenizer, chat_template);
  std::function<absl::Status()> readiness = Readiness(*drafter.client, queue, fingerprint);
  std::unique_ptr<HttpApi> http;
  if (!flags.http.empty()) {
    BITSPLIT_ASSIGN_OR_RETURN(
        http, StartHttp(flags, HttpApiContext{.queue = &queue,
                                              .metrics = &metrics,
                                              .drafter = drafter.client.get(),
                                              .tokenizer = loaded.tokenizer.get(),
                                              .chat_template = chat_template,
                                              .tool_call_format = loaded.tool_call_format,
                                              .tool_marker_ids = loaded.tool_marker_ids,
                                              .limits = &options.limits,
                                              .model_info = &options.model_info,
                                              .readiness = readiness}));
  }
  const std::string description = absl::StrFormat(
      "%s (fingerprint %.12s, drafter %s: %s, speculation %s, max-active %d, max-queue %d)",
      options.model_info.name(), fingerprint, flags.drafter, drafter.info.backend(),
      flags.speculation, max_active, flags.max_queue);
  return Serve(ServerOptionsFor(flags, std::move(readiness)), queue, service, http.get(),
               description);
}

int Run(int argc, char** argv) {
  CLI::App app{
      "bitsplit-coordinator: the public generation service (tokenizer, speculation "
      "loop, streaming)"};
  Flags flags;
  AddFlags(app, flags);
  CLI11_PARSE(app, argc, argv);
  // Logs belong with the "serving"/"error" lines on stderr (stdout stays empty).
  spdlog::set_default_logger(spdlog::stderr_color_mt("bitsplit-coordinator"));
  spdlog::set_level(flags.verbose ? spdlog::level::debug : spdlog::level::warn);
  rpc::BlockTerminationSignals();
  if (absl::Status status = RunCoordinator(flags); !status.ok()) return Fail(status);
  return 0;
}

}  // namespace
}  // namespace bitsplit::coordinator

int main(int argc, char** argv) { return bitsplit::coordinator::Run(argc, argv); }
