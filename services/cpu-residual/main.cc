// bitsplit-residual: the cpu-residual service (services/cpu-residual/README.md).
//
//   bitsplit-residual MODEL.residual.bsplit [--socket PATH | --tcp HOST:PORT] [--threads N]
//                     [--pin] [--mlock] [--no-huge-pages] [--no-prefault] [--max-rows T]
//                     [--max-channels N] [--max-channels-per-client N] [--spin-us US]
//                     [--yield-us US] [--shutdown-grace-ms MS] [--verbose]
#include <cstdio>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/rpc/server_runner.h"
#include "grpcpp/grpcpp.h"
#include "services/cpu-residual/channel_manager.h"
#include "services/cpu-residual/residual_service.h"
#include "services/cpu-residual/residual_store.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace bitsplit::residual {
namespace {

constexpr char kServiceName[] = "bitsplit.internal.v1.Residual";

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "bitsplit-residual: error: %.*s\n",
               static_cast<int>(status.message().size()), status.message().data());
  return 1;
}

int Run(int argc, char** argv) {
  CLI::App app{"bitsplit-residual: serves batched residual matmuls over shared memory and gRPC"};
  std::string residual_path;
  std::string socket_path = "/run/bitsplit/residual.sock";
  std::string tcp;
  StoreOptions store_options;
  ChannelOptions channel_options;
  bool no_huge_pages = false, no_prefault = false, verbose = false;
  int spin_us = 50;
  int yield_us = 2000;
  int shutdown_grace_ms = 200;
  uint32_t max_rows = channel_options.max_rows;
  app.add_option("residual", residual_path, "the residual split file (MODEL.residual.bsplit)")
      ->required();
  app.add_option("--socket", socket_path, "unix socket to listen on (mode 0660)")
      ->capture_default_str();
  app.add_option("--tcp", tcp, "listen on TCP HOST:PORT instead of the unix socket");
  app.add_option("--threads", store_options.threads, "kernel threads (0: every allowed CPU)")
      ->capture_default_str();
  app.add_flag("--pin", store_options.pin_threads, "pin kernel thread i to the i-th allowed CPU");
  app.add_flag("--mlock", store_options.mlock, "lock the residual in RAM (RLIMIT_MEMLOCK)");
  app.add_flag("--no-huge-pages", no_huge_pages, "do not madvise(MADV_HUGEPAGE) the mapping");
  app.add_flag("--no-prefault", no_prefault, "do not touch every page at startup");
  app.add_option("--max-rows", max_rows, "largest T of one request")->capture_default_str();
  app.add_option("--max-channels", channel_options.max_channels,
                 "shared-memory channels attached at once, in total")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--max-channels-per-client", channel_options.max_channels_per_client,
                 "shared-memory channels one client process may hold")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--spin-us", spin_us,
                 "busy-wait this long before sleeping (channels; workers where a CPU is left over)")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  app.add_option("--yield-us", yield_us,
                 "workers that cover every CPU: poll between sched_yield calls this long before "
                 "sleeping")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  app.add_option("--shutdown-grace-ms", shutdown_grace_ms,
                 "on SIGTERM, report NOT_SERVING this long before stopping")
      ->capture_default_str();
  app.add_option("--memory-limit-bytes", store_options.memory_total_override,
                 "testing: pretend the machine has this much RAM");
  app.add_flag("--verbose", verbose, "log details to stderr");
  CLI11_PARSE(app, argc, argv);
  // Logs go to stderr: stdout stays free for whoever runs the service.
  spdlog::set_default_logger(spdlog::stderr_color_mt("bitsplit-residual"));
  spdlog::set_level(verbose ? spdlog::level::debug : spdlog::level::warn);
  store_options.huge_pages = !no_huge_pages;
  store_options.prefault = !no_prefault;
  store_options.spin = std::chrono::microseconds(spin_us);
  store_options.yield_spin = std::chrono::microseconds(yield_us);
  channel_options.spin = std::chrono::microseconds(spin_us);
  if (max_rows < 1 || max_rows > 4096) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--max-rows ", max_rows, " is out of range [1, 4096]")));
  }
  channel_options.max_rows = max_rows;

  // SIGTERM/SIGINT are taken by RunServer; block them before any thread exists.
  rpc::BlockTerminationSignals();

  auto store = ResidualStore::Open(residual_path, store_options);
  if (!store.ok()) return Fail(store.status());
  ChannelManager::RemoveStaleSegments();
  ChannelManager channels(**store, channel_options);
  ResidualServiceImpl service(**store, channels);

  const SplitFile& file = (*store)->file();
  // Field by field: the defaults of fields not set here stay (readiness: ready whenever serving;
  // with every channel taken, attached clients are still served and an Attach gets
  // RESOURCE_EXHAUSTED).
  rpc::ServerOptions server_options;
  server_options.name = "bitsplit-residual";
  server_options.socket_path = socket_path;
  server_options.tcp_address = tcp;
  server_options.health_services = {kServiceName};
  server_options.shutdown_grace_ms = shutdown_grace_ms;
  const std::string description =
      absl::StrFormat("%s (fingerprint %s, %d layers, %llu bytes, %d threads, %s kernels%s%s)",
                      file.name(), file.fingerprint_hex(), (*store)->num_layers(),
                      static_cast<unsigned long long>((*store)->weight_bytes()),
                      (*store)->threads(), model::SplitKernelIsaName(),
                      (*store)->mlocked() ? ", mlocked" : "", (*store)->pinned() ? ", pinned" : "");
  grpc::Service* services[] = {&service};
  // The channels close after the server stops (attached clients then get UNAVAILABLE).
  const absl::Status status = rpc::RunServer(server_options, services, description, {});
  channels.Shutdown();
  if (!status.ok()) return Fail(status);
  return 0;
}

}  // namespace
}  // namespace bitsplit::residual

int main(int argc, char** argv) { return bitsplit::residual::Run(argc, argv); }
