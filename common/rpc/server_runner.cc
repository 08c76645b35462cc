#include "common/rpc/server_runner.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/io/mapped_file.h"
#include "common/rpc/reflection_v1.h"
#include "grpc/health/v1/health.pb.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "spdlog/spdlog.h"

namespace bitsplit::rpc {
namespace {

constexpr auto kShutdownDeadline = std::chrono::seconds(5);

sigset_t TerminationSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  return signals;
}

void SetLiveness(grpc::HealthCheckServiceInterface* health, bool serving) {
  health->SetServingStatus("", serving);
  health->SetServingStatus(kLivenessService, serving);
}

void SetReadiness(grpc::HealthCheckServiceInterface* health, const ServerOptions& options,
                  bool ready) {
  health->SetServingStatus(kReadinessService, ready);
  for (const std::string& service : options.health_services) {
    health->SetServingStatus(service, ready);
  }
}

// Polls options.readiness until `stop` and mirrors it into the health service.
class ReadinessWatcher {
 public:
  ReadinessWatcher(grpc::HealthCheckServiceInterface* health, const ServerOptions& options)
      : health_(health), options_(options) {
    Poll();  // the first answer before the "serving" line
    if (options_.readiness) thread_ = std::thread([this] { Loop(); });
  }
  ~ReadinessWatcher() { Stop(); }
  void Stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Loop() {
    std::unique_lock lock(mutex_);
    while (!wake_.wait_for(lock, options_.readiness_period, [this] { return stopping_; })) {
      lock.unlock();
      Poll();
      lock.lock();
    }
  }
  void Poll() {
    const absl::Status ready = options_.readiness ? options_.readiness() : absl::OkStatus();
    if (first_ || ready.ok() != was_ready_) {
      if (ready.ok()) {
        spdlog::info("ready");
      } else {
        spdlog::warn("not ready: {}", std::string(ready.message()));
      }
    }
    first_ = false;
    was_ready_ = ready.ok();
    SetReadiness(health_, options_, ready.ok());
  }

  grpc::HealthCheckServiceInterface* const health_;
  const ServerOptions& options_;
  bool first_ = true;
  bool was_ready_ = false;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace

void BlockTerminationSignals() {
  const sigset_t signals = TerminationSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

absl::Status PrepareSocketPath(const std::string& path) {
  std::error_code error;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty() && !std::filesystem::exists(parent, error)) {
    std::filesystem::create_directories(parent, error);
    if (error) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create ", parent.string(), ": ", error.message()));
    }
    chmod(parent.c_str(), 0770);
  }
  struct stat st;
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " exists and is not a socket; refusing to replace it"));
    }
    unlink(path.c_str());  // a stale socket of an earlier run
  }
  return absl::OkStatus();
}

absl::Status RunServer(const ServerOptions& options, std::span<grpc::Service* const> services,
                       const std::string& description,
                       const std::function<void()>& before_shutdown) {
  const bool unix_socket = options.tcp_address.empty();
  std::string address;
  if (unix_socket) {
    if (options.socket_path.empty()) {
      return absl::InvalidArgumentError("neither a unix socket path nor a TCP address given");
    }
    if (absl::Status status = PrepareSocketPath(options.socket_path); !status.ok()) return status;
    address = "unix:" + options.socket_path;
  } else {
    address = options.tcp_address;
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  // gRPC's built-in health service carries no protobuf descriptor; linking the generated one puts
  // grpc.health.v1.Health in the pool that reflection answers from.
  (void)grpc::health::v1::HealthCheckRequest::descriptor();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(),
                           unix_socket ? nullptr : &port);
  builder.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  builder.SetMaxSendMessageSize(256 << 20);
  // Clients ping every 10 s (rpc::PeerChannelArguments); the server's default policy would
  // answer pings that frequent with GOAWAY. The server pings too, to find dead peers.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5'000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10'000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5'000);
  for (grpc::Service* service : services) builder.RegisterService(service);
  std::vector<std::string> service_names = options.health_services;
  service_names.insert(service_names.end(),
                       {"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                        "grpc.reflection.v1.ServerReflection"});
  ReflectionV1Service reflection_v1(std::move(service_names));
  builder.RegisterService(&reflection_v1);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || (!unix_socket && port == 0)) {
    if (server != nullptr) server->Shutdown();
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address));
  }
  if (unix_socket) chmod(options.socket_path.c_str(), 0660);
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  SetLiveness(health, true);
  auto readiness = std::make_unique<ReadinessWatcher>(health, options);
  const std::string port_note = unix_socket ? "" : absl::StrCat(" (port ", port, ")");
  std::fprintf(stderr, "%s: serving %s on %s%s\n", options.name.c_str(), description.c_str(),
               address.c_str(), port_note.c_str());
  std::fflush(stderr);

  const sigset_t signals = TerminationSignals();
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  spdlog::warn("signal {}: shutting down", signal_number);
  // Health first, so that clients and supervisors stop sending work; then stop accepting and
  // let in-flight RPCs finish (bounded).
  readiness.reset();
  SetLiveness(health, false);
  SetReadiness(health, options, false);
  std::this_thread::sleep_for(std::chrono::milliseconds(options.shutdown_grace_ms));
  if (before_shutdown) before_shutdown();
  spdlog::debug("stopping the server (in-flight calls get {} s)", kShutdownDeadline.count());
  server->Shutdown(std::chrono::system_clock::now() + kShutdownDeadline);
  server->Wait();
  spdlog::debug("server stopped");
  if (unix_socket) unlink(options.socket_path.c_str());
  std::fprintf(stderr, "%s: stopped\n", options.name.c_str());
  return absl::OkStatus();
}

void PrefaultWithProgress(const std::string& name, const std::string& what, const uint8_t* data,
                          uint64_t size, ThreadPool& pool) {
  const auto start = std::chrono::steady_clock::now();
  int last_percent = -1;
  PrefaultPages(data, size, pool, [&](uint64_t done, uint64_t total) {
    const int percent = total > 0 ? static_cast<int>(100 * done / total) : 100;
    // Every tenth (and the end): a line per twentieth is noise on a small model.
    if (percent / 10 == last_percent / 10 && percent != 100) return;
    last_percent = percent;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "%s: loading %s: %3d%% (%.2f of %.2f GiB, %.1f s)\n", name.c_str(),
                 what.c_str(), percent, done / double(1ull << 30), total / double(1ull << 30),
                 seconds);
  });
}

}  // namespace bitsplit::rpc
