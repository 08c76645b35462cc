// bitsplit-drafter: the gpu-drafter service (services/gpu-drafter/README.md).
//
//   bitsplit-drafter MODEL.base.bsplit [--residual-socket unix:PATH | --residual-file RESIDUAL]
//                    [--socket PATH | --tcp HOST:PORT] [--backend auto|cpu|cuda] [--threads N]
//                    [--vram-budget BYTES|auto] [--ram-budget BYTES|auto] [--kv-type f16|q8_0|f32]
//                    [--max-sessions N|auto] [--max-context 2048]
//                    [--max-tree-nodes 129] [--prefill-rows 64] [--max-batch-rows 256]
//                    [--max-batch-generations 0]
//                    [--residual-timeout-ms 5000] [--shutdown-grace-ms 200] [--verbose]
//
// Exit status: 0 after a graceful shutdown, 1 when it cannot start (files, cpu-residual, no CUDA
// device, a VRAM plan that does not fit), 2 for a bad command line.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/model/kv_cache.h"
#include "common/model/remote_residual.h"
#include "common/model/split_backend.h"
#include "common/model/split_model.h"
#include "common/model/vram_plan.h"
#include "common/rpc/server_runner.h"
#include "common/util/meminfo.h"
#include "common/util/status_macros.h"
#include "services/gpu-drafter/cpu_engine.h"
#include "services/gpu-drafter/drafter_service.h"
#include "services/gpu-drafter/residual_link.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

#ifdef BITSPLIT_HAVE_CUDA
#include "common/cuda/device_info.h"
#include "services/gpu-drafter/cuda_engine.h"
#endif

namespace bitsplit::drafter {
namespace {

constexpr char kName[] = "bitsplit-drafter";
constexpr int kMaxTreeNodesLimit = 256;  // cpu-residual's largest request (--max-rows)

int Fail(const absl::Status& status, int exit_code = 1) {
  std::fprintf(stderr, "%s: error: %.*s\n", kName, static_cast<int>(status.message().size()),
               status.message().data());
  return exit_code;
}
int UsageError(const std::string& message) { return Fail(absl::InvalidArgumentError(message), 2); }

// --vram-budget and --ram-budget: "auto" (0: the default) or bytes, with an optional KiB, MiB or
// GiB suffix.
absl::StatusOr<uint64_t> ParseBudget(const std::string& flag, const std::string& text) {
  if (text == "auto") return 0;
  absl::StatusOr<uint64_t> bytes = model::ParseBytes(text);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, " \"", text, "\" is neither auto nor a positive size (BYTES, or N KiB/MiB/GiB)"));
  }
  return *bytes;
}

// Whether the cuda backend can run here: built with it and a device visible.
bool CudaDeviceVisible() {
#ifdef BITSPLIT_HAVE_CUDA
  return cuda::CountDevices() > 0;
#else
  return false;
#endif
}

// For the no-device message: the variable that most often hides a GPU, an empty value quoted.
std::string CudaVisibleDevices() {
  const char* value = std::getenv("CUDA_VISIBLE_DEVICES");
  if (value == nullptr) return "CUDA_VISIBLE_DEVICES unset";
  return absl::StrCat("CUDA_VISIBLE_DEVICES=", *value == '\0' ? "\"\"" : value);
}

struct Flags {
  std::string base_path;
  std::string residual_socket = "unix:/run/bitsplit/residual.sock";
  std::string residual_file;
  std::string socket_path = "/run/bitsplit/drafter.sock";
  std::string tcp;
  std::string backend_name = "auto";
  std::string vram_budget_text = "auto";
  std::string ram_budget_text = "auto";
  std::string max_sessions_text = "auto";
  std::string kv_type_text = "f16";
  int threads = 0;
  int residual_timeout_ms = 5000;
  int shutdown_grace_ms = 200;
  bool verbose = false;
  DrafterServiceOptions service_options;
};

void AddFlags(CLI::App& app, Flags& flags) {
  DrafterServiceOptions& service_options = flags.service_options;
  SchedulerOptions& scheduling = service_options.scheduling;
  app.add_option("base", flags.base_path, "the base split file (MODEL.base.bsplit)")->required();
  auto* socket_option =
      app.add_option(
             "--residual-socket", flags.residual_socket,
             "cpu-residual's gRPC target (unix:PATH); the residual comes over shared memory")
          ->capture_default_str();
  app.add_option("--residual-file", flags.residual_file,
                 "compute the residual in process from this file instead (tests, tools)")
      ->excludes(socket_option);
  app.add_option("--socket", flags.socket_path, "unix socket to listen on (mode 0660)")
      ->capture_default_str();
  app.add_option("--tcp", flags.tcp, "listen on TCP HOST:PORT instead of the unix socket");
  app.add_option("--backend", flags.backend_name,
                 "auto (cuda when built with it and a device is visible, else cpu), cpu or cuda")
      ->capture_default_str();
  app.add_option("--vram-budget", flags.vram_budget_text,
                 "cuda: device memory the plan may use, BYTES (or N KiB/MiB/GiB) or auto (free "
                 "memory minus max(512 MiB, 5%))")
      ->capture_default_str();
  app.add_option("--threads", flags.threads, "forward threads (0: every hardware thread)")
      ->capture_default_str();
  app.add_option("--ram-budget", flags.ram_budget_text,
                 "cpu: host memory the sessions' KV caches may use, BYTES (or N KiB/MiB/GiB) or "
                 "auto (half of MemAvailable at start less the unlocked weights: the base on "
                 "cpu and the residual unless cpu-residual locked it)")
      ->capture_default_str();
  app.add_option("--kv-type", flags.kv_type_text,
                 "the KV cache's element type: f16, q8_0 (heads a multiple of 32 wide) or f32 "
                 "(cpu only)")
      ->capture_default_str();
  app.add_option("--max-sessions", flags.max_sessions_text,
                 "sessions open at once, or auto: as many KV caches of --max-context tokens as "
                 "the budget holds (VRAM plan on cuda, --ram-budget on cpu), at most "
                 "--max-batch-rows")
      ->capture_default_str();
  app.add_option("--max-context", service_options.max_context, "largest context of a session")
      ->capture_default_str();
  app.add_option("--max-tree-nodes", service_options.max_tree_nodes,
                 "largest draft tree (root included) a request may ask for")
      ->capture_default_str();
  app.add_flag("--prefix-cache,!--no-prefix-cache", scheduling.prefix_cache,
               "keep finished sessions in the session slots no request uses, so that a request "
               "whose prompt begins with a kept session's tokens (the conversation's previous "
               "turn, a shared system prompt) prefills only the rest")
      ->capture_default_str();
  app.add_option("--prefill-rows", scheduling.prefill_rows,
                 "prompt rows one scheduler iteration prefills, all requests together (a long "
                 "prompt enters in chunks between the other streams' steps)")
      ->capture_default_str();
  app.add_option("--max-batch-rows", scheduling.max_batch_rows,
                 "verifier rows of one scheduler iteration, every request's trees and prefill "
                 "chunks together (cpu-residual's --max-rows must allow it)")
      ->capture_default_str();
  app.add_option("--max-batch-generations", scheduling.max_batch_generations,
                 "requests one scheduler iteration batches at most (0: all; 1: one request's "
                 "step per forward, in turn)")
      ->capture_default_str();
  app.add_option("--residual-timeout-ms", flags.residual_timeout_ms,
                 "bound of one (re)attach to cpu-residual and of one residual round trip")
      ->capture_default_str();
  app.add_option("--shutdown-grace-ms", flags.shutdown_grace_ms,
                 "on SIGTERM, report NOT_SERVING this long before stopping")
      ->capture_default_str();
  app.add_flag("--verbose", flags.verbose, "log details to stderr");
}

// What the command line means beyond the flags' own values.
struct Settings {
  uint64_t vram_budget = 0;           // 0: the planner's default
  uint64_t ram_budget = 0;            // 0: model::DefaultKvRamBudget
  bool sessions_from_budget = false;  // --max-sessions auto
  model::KvType kv_type = model::KvType::kF16;
};

// Checks the command line (an error is a usage error, exit status 2). Turns a bare
// --residual-socket path into a unix: target.
absl::StatusOr<Settings> CheckFlags(Flags& flags) {
  const std::string& backend_name = flags.backend_name;
  DrafterServiceOptions& service_options = flags.service_options;
  SchedulerOptions& scheduling = service_options.scheduling;
  if (backend_name != "auto" && backend_name != "cpu" && backend_name != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown --backend \"", backend_name, "\" (expected auto, cpu or cuda)"));
  }
#ifndef BITSPLIT_HAVE_CUDA
  if (backend_name == "cuda") {
    return absl::InvalidArgumentError(
        "this build has no CUDA backend (configured without nvcc or with -DBITSPLIT_CUDA=OFF); "
        "use --backend cpu or auto");
  }
#endif
  Settings settings;
  BITSPLIT_ASSIGN_OR_RETURN(settings.vram_budget,
                            ParseBudget("--vram-budget", flags.vram_budget_text));
  BITSPLIT_ASSIGN_OR_RETURN(settings.ram_budget,
                            ParseBudget("--ram-budget", flags.ram_budget_text));
  absl::StatusOr<model::KvType> kv_type = model::ParseKvType(flags.kv_type_text);
  if (!kv_type.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--kv-type: ", kv_type.status().message()));
  }
  settings.kv_type = *kv_type;
  settings.sessions_from_budget = flags.max_sessions_text == "auto";
  if (!settings.sessions_from_budget &&
      (!absl::SimpleAtoi(flags.max_sessions_text, &scheduling.max_sessions) ||
       scheduling.max_sessions < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("--max-sessions \"", flags.max_sessions_text,
                                                   "\" is neither auto nor at least 1"));
  }
  if (service_options.max_context < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-context ", service_options.max_context, " must be at least 1"));
  }
  if (service_options.max_tree_nodes < 1 || service_options.max_tree_nodes > kMaxTreeNodesLimit) {
    return absl::InvalidArgumentError(absl::StrCat("--max-tree-nodes ",
                                                   service_options.max_tree_nodes,
                                                   " is outside [1, ", kMaxTreeNodesLimit, "]"));
  }
  if (scheduling.prefill_rows < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prefill-rows ", scheduling.prefill_rows, " must be at least 1"));
  }
  if (scheduling.max_batch_rows < service_options.max_tree_nodes ||
      scheduling.max_batch_rows > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("--max-batch-rows ", scheduling.max_batch_rows,
                                                   " is outside [--max-tree-nodes ",
                                                   service_options.max_tree_nodes, ", 4096]"));
  }
  if (scheduling.max_batch_generations < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--max-batch-generations ",
                                                   scheduling.max_batch_generations,
                                                   " must be >= 0 (0: no limit)"));
  }
  if (flags.residual_timeout_ms < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--residual-timeout-ms ", flags.residual_timeout_ms, " must be positive"));
  }
  if (flags.residual_file.empty() && flags.residual_socket.rfind("unix:", 0) != 0 &&
      flags.residual_socket.rfind('/', 0) == 0) {
    flags.residual_socket = "unix:" + flags.residual_socket;  // a bare socket path
  }
  return settings;
}

// --backend cuda needs a visible device; auto takes it when there is one.
absl::StatusOr<bool> UseCuda(const Flags& flags) {
  if (flags.backend_name == "cuda") {
    if (!CudaDeviceVisible()) {
      return absl::FailedPreconditionError(
          absl::StrCat("--backend cuda: no CUDA device is visible (", CudaVisibleDevices(), ")"));
    }
    return true;
  }
  if (flags.backend_name == "auto") return CudaDeviceVisible();
  return false;
}

absl::StatusOr<std::unique_ptr<DrafterEngine>> CreateBackend(const Flags& flags,
                                                             const Settings& settings,
                                                             bool use_cuda) {
  const DrafterServiceOptions& service_options = flags.service_options;
  const SchedulerOptions& scheduling = service_options.scheduling;
  if (use_cuda && settings.kv_type == model::KvType::kF32) {
    return absl::InvalidArgumentError("--kv-type f32: the cuda backend's KV cache is f16 or q8_0");
  }
  if (use_cuda) {
#ifdef BITSPLIT_HAVE_CUDA
    auto cuda_engine =
        CudaEngine::Create({.base_path = flags.base_path,
                            .residual_path = flags.residual_file,
                            .threads = flags.threads,
                            .context = service_options.max_context,
                            .sessions = settings.sessions_from_budget ? 0 : scheduling.max_sessions,
                            .max_sessions = scheduling.max_batch_rows,
                            .max_tree_nodes = service_options.max_tree_nodes,
                            .max_batch_rows = scheduling.max_batch_rows,
                            .vram_budget = settings.vram_budget,
                            .kv_type = settings.kv_type});
    if (cuda_engine.ok()) return std::unique_ptr<DrafterEngine>(*std::move(cuda_engine));
    if (flags.backend_name != "auto" || !absl::IsUnimplemented(cuda_engine.status())) {
      return cuda_engine.status();
    }
    // A model family the device forward does not implement runs on the CPU backend.
    spdlog::warn("{}; using the cpu backend", std::string(cuda_engine.status().message()));
#endif
  }
  auto cpu_engine = CpuEngine::Create({.base_path = flags.base_path,
                                       .residual_path = flags.residual_file,
                                       .threads = flags.threads,
                                       .kv_type = settings.kv_type});
  if (!cpu_engine.ok()) return cpu_engine.status();
  return std::unique_ptr<DrafterEngine>(*std::move(cpu_engine));
}

// --max-sessions auto: the VRAM plan's sessions on cuda; on cpu the KV caches of --max-context
// tokens that --ram-budget holds. At most --max-batch-rows, so every session can take part in
// each scheduler iteration.
absl::StatusOr<int64_t> SessionsFromBudget(const Flags& flags, const Settings& settings,
                                           const DrafterEngine& engine,
                                           const ResidualLink* residual_link) {
  const EngineInfo& info = engine.info();
  if (info.planned_sessions > 0) return info.planned_sessions;
  const int64_t context = flags.service_options.max_context;
  uint64_t budget = settings.ram_budget;
  std::string budget_source = " (--ram-budget)";
  if (budget == 0) {
    // The weights this machine must keep resident beside the KV caches: the drafter's mapped
    // base and the residual, in process or in cpu-residual (always on this machine: the
    // shared-memory channel) unless that one locked it (locked pages are not in MemAvailable).
    uint64_t weights = info.base_bytes + (info.residual_in_process ? info.residual_bytes : 0);
    if (residual_link != nullptr && !residual_link->residual_mlocked()) {
      weights += residual_link->residual_bytes();
    }
    const uint64_t available = ReadMemInfo().available_bytes;
    budget = model::DefaultKvRamBudget(available, weights);
    budget_source =
        absl::StrCat(" (half of MemAvailable ", model::FormatBytes(available), " less ",
                     model::FormatBytes(weights), " of unlocked weights; see --ram-budget)");
  }
  absl::StatusOr<int64_t> sessions = model::SessionsThatFit(
      budget, engine.SessionHostBytes(context), flags.service_options.scheduling.max_batch_rows,
      absl::StrCat("a session of ", context, " tokens"));
  if (!sessions.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("--max-sessions auto: ", sessions.status().message(), budget_source,
                     "; lower --max-context or set --max-sessions"));
  }
  spdlog::debug(
      "--max-sessions auto: {} sessions of {} tokens ({} of {} KV each) in a RAM budget of {}{}",
      *sessions, context, model::FormatBytes(engine.SessionHostBytes(context)), info.kv_type,
      model::FormatBytes(budget), budget_source);
  return sessions;
}

// The link to cpu-residual, attached once before serving; none with --residual-file.
absl::StatusOr<std::unique_ptr<ResidualLink>> AttachResidual(const Flags& flags,
                                                             DrafterEngine& backend) {
  if (!flags.residual_file.empty()) return std::unique_ptr<ResidualLink>();
  const EngineInfo& info = backend.info();
  auto residual_link = std::make_unique<ResidualLink>(
      backend,
      ResidualLinkOptions{.target = flags.residual_socket,
                          .fingerprint = info.fingerprint,
                          .shapes = model::ResidualShapes::FromConfig(info.config),
                          .max_rows = flags.service_options.scheduling.max_batch_rows,
                          .min_rows = flags.service_options.max_tree_nodes,
                          .request_rows_per_row =
                              static_cast<int>(std::max<int64_t>(1, info.config.num_experts_used)),
                          .timeout = std::chrono::milliseconds(flags.residual_timeout_ms)});
  BITSPLIT_RETURN_IF_ERROR(residual_link->Ensure());
  return residual_link;
}

// The "serving" line's description of the model, backend, residual and sessions.
std::string Description(const Flags& flags, const EngineInfo& info, bool residual_over_shm) {
  const std::string backend_description =
      info.device.empty()
          ? info.name
          : absl::StrCat(info.name, " on ", info.device, " [VRAM ", info.vram_summary, "]");
  return absl::StrFormat(
      "%s (fingerprint %s, backend %s, %d threads, %s CPU kernels, residual %s, "
      "%d sessions x %d tokens)",
      info.model_name, info.fingerprint, backend_description, info.threads,
      model::SplitKernelIsaName(),
      residual_over_shm ? "shm " + flags.residual_socket : std::string("in-process"),
      flags.service_options.scheduling.max_sessions, flags.service_options.max_context);
}

// Serves until SIGTERM/SIGINT, ending the Generate streams before the server stops.
absl::Status Serve(const Flags& flags, DrafterService& service, const std::string& description) {
  rpc::ServerOptions server_options{.name = kName,
                                    .socket_path = flags.socket_path,
                                    .tcp_address = flags.tcp,
                                    .health_services = {kDrafterServiceName},
                                    .shutdown_grace_ms = flags.shutdown_grace_ms,
                                    .readiness = [&service] { return service.Readiness(); }};
  grpc::Service* services[] = {&service};
  return rpc::RunServer(server_options, services, description,
                        [&service] { service.EndStreams(); });
}

int Run(int argc, char** argv) {
  CLI::App app{
      "bitsplit-drafter: sessions, draft trees and verifier forwards over the base "
      "weights (+ cpu-residual)"};
  Flags flags;
  AddFlags(app, flags);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  // Logs go to stderr: stdout stays free for whoever runs the service.
  spdlog::set_default_logger(spdlog::stderr_color_mt("bitsplit-drafter"));
  spdlog::set_level(flags.verbose ? spdlog::level::debug : spdlog::level::warn);
  auto settings = CheckFlags(flags);
  if (!settings.ok()) return Fail(settings.status(), 2);

  // SIGTERM/SIGINT are taken by RunServer; block them before the engine's threads exist.
  rpc::BlockTerminationSignals();

  auto use_cuda = UseCuda(flags);
  if (!use_cuda.ok()) return Fail(use_cuda.status());
  if (!*use_cuda && settings->vram_budget != 0) {
    spdlog::warn("--vram-budget is ignored on the cpu backend");
  }
  if (*use_cuda && settings->ram_budget != 0) {
    spdlog::warn("--ram-budget is ignored on the cuda backend (its KV caches are in VRAM)");
  }
  auto backend = CreateBackend(flags, *settings, *use_cuda);
  if (!backend.ok()) return Fail(backend.status());
  const EngineInfo& info = (*backend)->info();
  spdlog::debug("backend {}{}", info.name,
                info.vram_plan.empty()
                    ? ""
                    : absl::StrCat(" on ", info.device, ", VRAM plan:\n", info.vram_plan));
  if (flags.service_options.max_context > info.config.context_length) {
    return UsageError(absl::StrCat("--max-context ", flags.service_options.max_context,
                                   " exceeds the model's context length ",
                                   info.config.context_length));
  }

  // Attached before the sessions are sized: the residual's size and lock state enter the RAM
  // budget.
  auto residual_link = AttachResidual(flags, **backend);
  if (!residual_link.ok()) return Fail(residual_link.status());
  if (settings->sessions_from_budget) {
    auto sessions = SessionsFromBudget(flags, *settings, **backend, residual_link->get());
    if (!sessions.ok()) return Fail(sessions.status());
    flags.service_options.scheduling.max_sessions = static_cast<int>(*sessions);
  }
  if ((*backend)->name() == "cpu") {
    // Structured output's vocabulary, from the base file's tokenizer metadata.
    auto files = model::SplitModelFiles::Open(flags.base_path, "");
    if (!files.ok()) return Fail(files.status());
    auto vocabulary = ConstraintVocabulary((*files)->gguf_metadata());
    if (!vocabulary.ok()) return Fail(vocabulary.status());
    flags.service_options.vocabulary = *std::move(vocabulary);
  }
  DrafterService service(**backend, residual_link->get(), flags.service_options);
  const absl::Status status =
      Serve(flags, service, Description(flags, info, *residual_link != nullptr));
  if (!status.ok()) return Fail(status);
  return 0;
}

}  // namespace
}  // namespace bitsplit::drafter

int main(int argc, char** argv) { return bitsplit::drafter::Run(argc, argv); }
