// bitsplit-drafter: the gpu-drafter service (services/gpu-drafter/README.md).
//
//   bitsplit-drafter MODEL.base.bsplit [--residual-socket unix:PATH | --residual-file RESIDUAL]
//                    [--socket PATH | --tcp HOST:PORT] [--backend auto|cpu|cuda] [--threads N]
//                    [--max-sessions 4] [--max-context 2048] [--max-tree-nodes 64]
//                    [--draft-model DRAFT.gguf] [--draft-kv shared|own]
//                    [--residual-timeout-ms 5000] [--shutdown-grace-ms 200] [--verbose]
//
// Exit status: 0 after a graceful shutdown, 1 when it cannot start (files, cpu-residual), 2 for
// a bad command line.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model/remote_residual.h"
#include "common/model/speculation.h"
#include "common/rpc/server_runner.h"
#include "services/gpu-drafter/cpu_backend.h"
#include "services/gpu-drafter/drafter_service.h"
#include "services/gpu-drafter/residual_link.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace bitsplit::drafter {
namespace {

constexpr char kName[] = "bitsplit-drafter";
constexpr int kMaxTreeNodesLimit = 256;  // cpu-residual's largest request (--max-rows)
constexpr int64_t kPrefillChunk = 64;

int Fail(const absl::Status& status, int exit_code = 1) {
  std::fprintf(stderr, "%s: error: %.*s\n", kName, static_cast<int>(status.message().size()),
               status.message().data());
  return exit_code;
}
int UsageError(const std::string& message) { return Fail(absl::InvalidArgumentError(message), 2); }

int Run(int argc, char** argv) {
  CLI::App app{
      "bitsplit-drafter: sessions, draft trees and verifier forwards over the base "
      "weights (+ cpu-residual)"};
  std::string base_path;
  std::string residual_socket = "unix:/run/bitsplit/residual.sock";
  std::string residual_file;
  std::string socket_path = "/run/bitsplit/drafter.sock";
  std::string tcp;
  std::string backend_name = "auto";
  std::string draft_model;
  std::string draft_kv_name = "shared";
  int threads = 0;
  int residual_timeout_ms = 5000;
  int shutdown_grace_ms = 200;
  bool verbose = false;
  DrafterServiceOptions service_options;
  app.add_option("base", base_path, "the base split file (MODEL.base.bsplit)")->required();
  auto* socket_option =
      app.add_option(
             "--residual-socket", residual_socket,
             "cpu-residual's gRPC target (unix:PATH); the residual comes over shared memory")
          ->capture_default_str();
  app.add_option("--residual-file", residual_file,
                 "compute the residual in process from this file instead (tests, tools)")
      ->excludes(socket_option);
  app.add_option("--socket", socket_path, "unix socket to listen on (mode 0660)")
      ->capture_default_str();
  app.add_option("--tcp", tcp, "listen on TCP HOST:PORT instead of the unix socket");
  app.add_option("--backend", backend_name, "auto, cpu or cuda")->capture_default_str();
  app.add_option("--threads", threads, "forward threads (0: every hardware thread)")
      ->capture_default_str();
  app.add_option("--max-sessions", service_options.max_sessions, "sessions open at once")
      ->capture_default_str();
  app.add_option("--max-context", service_options.max_context, "largest context of a session")
      ->capture_default_str();
  app.add_option("--max-tree-nodes", service_options.max_tree_nodes,
                 "largest tree (root included) Verify accepts")
      ->capture_default_str();
  app.add_option("--draft-model", draft_model,
                 "draft with this GGUF instead of the base weights (ablation)");
  app.add_option("--draft-kv", draft_kv_name,
                 "shared: the draft reads the verifier's KV; own: the draft model's own KV")
      ->capture_default_str();
  app.add_option("--residual-timeout-ms", residual_timeout_ms,
                 "bound of one (re)attach to cpu-residual and of one residual round trip")
      ->capture_default_str();
  app.add_option("--shutdown-grace-ms", shutdown_grace_ms,
                 "on SIGTERM, report NOT_SERVING this long before stopping")
      ->capture_default_str();
  app.add_flag("--verbose", verbose, "log details to stderr");
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
  spdlog::set_level(verbose ? spdlog::level::debug : spdlog::level::warn);

  if (backend_name == "cuda") {
    return UsageError(
        "this build has no CUDA backend yet (the cuda backend is the next issue); "
        "use --backend cpu or auto");
  }
  if (backend_name != "auto" && backend_name != "cpu") {
    return UsageError(
        absl::StrCat("unknown --backend \"", backend_name, "\" (expected auto, cpu or cuda)"));
  }
  auto draft_kv = model::ParseDraftKv(draft_kv_name);
  if (!draft_kv.ok()) return Fail(draft_kv.status(), 2);
  if (service_options.max_sessions < 1) {
    return UsageError(
        absl::StrCat("--max-sessions ", service_options.max_sessions, " must be at least 1"));
  }
  if (service_options.max_context < 1) {
    return UsageError(
        absl::StrCat("--max-context ", service_options.max_context, " must be at least 1"));
  }
  if (service_options.max_tree_nodes < 1 || service_options.max_tree_nodes > kMaxTreeNodesLimit) {
    return UsageError(absl::StrCat("--max-tree-nodes ", service_options.max_tree_nodes,
                                   " is outside [1, ", kMaxTreeNodesLimit, "]"));
  }
  if (residual_timeout_ms < 1) {
    return UsageError(
        absl::StrCat("--residual-timeout-ms ", residual_timeout_ms, " must be positive"));
  }
  if (residual_file.empty() && residual_socket.rfind("unix:", 0) != 0 &&
      residual_socket.rfind('/', 0) == 0) {
    residual_socket = "unix:" + residual_socket;  // a bare socket path
  }

  // SIGTERM/SIGINT are taken by RunServer; block them before the engine's threads exist.
  rpc::BlockTerminationSignals();

  auto backend = CpuBackend::Create({.base_path = base_path,
                                     .residual_path = residual_file,
                                     .draft_model_path = draft_model,
                                     .draft_kv = *draft_kv,
                                     .threads = threads,
                                     .prefill_chunk = kPrefillChunk});
  if (!backend.ok()) return Fail(backend.status());
  const BackendInfo& info = (*backend)->info();
  if (service_options.max_context > info.config.context_length) {
    return UsageError(absl::StrCat("--max-context ", service_options.max_context,
                                   " exceeds the model's context length ",
                                   info.config.context_length));
  }

  std::unique_ptr<ResidualLink> residual_link;
  if (residual_file.empty()) {
    residual_link = std::make_unique<ResidualLink>(
        **backend, ResidualLinkOptions{.target = residual_socket,
                                       .fingerprint = info.fingerprint,
                                       .shapes = model::ResidualShapes::FromConfig(info.config),
                                       .max_rows = static_cast<int>(std::max<int64_t>(
                                           kPrefillChunk, service_options.max_tree_nodes)),
                                       .timeout = std::chrono::milliseconds(residual_timeout_ms)});
    if (absl::Status status = residual_link->Ensure(); !status.ok()) return Fail(status);
  }
  DrafterService service(**backend, residual_link.get(), service_options);

  rpc::ServerOptions server_options{.name = kName,
                                    .socket_path = socket_path,
                                    .tcp_address = tcp,
                                    .health_services = {kDrafterServiceName},
                                    .shutdown_grace_ms = shutdown_grace_ms};
  const std::string description = absl::StrFormat(
      "%s (fingerprint %s, backend %s, %d threads, residual %s, draft %s/%s KV, %d sessions x "
      "%d tokens)",
      info.model_name, info.fingerprint, info.name, info.threads,
      residual_link != nullptr ? "shm " + residual_socket : std::string("in-process"),
      info.draft_model, model::DraftKvName(info.draft_kv), service_options.max_sessions,
      service_options.max_context);
  grpc::Service* services[] = {&service};
  const absl::Status status = rpc::RunServer(server_options, services, description, {});
  service.StopWorkers();
  if (!status.ok()) return Fail(status);
  return 0;
}

}  // namespace
}  // namespace bitsplit::drafter

int main(int argc, char** argv) { return bitsplit::drafter::Run(argc, argv); }
