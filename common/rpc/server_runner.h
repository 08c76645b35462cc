#pragma once
// The common life cycle of the bitsplit service processes (cpu-residual, gpu-drafter,
// coordinator): listen on a unix socket (owner/group only) or TCP, health + reflection, one
// "serving" line on stderr, graceful shutdown on SIGTERM/SIGINT.
//
//   int main(int argc, char** argv) {
//     ... parse flags ...
//     BlockTerminationSignals();          // before any thread exists
//     ... load, build the services ...
//     grpc::Service* services[] = {&service};
//     absl::Status status = RunServer(options, services, "model.base.bsplit (...)", {});
//   }
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"

namespace bitsplit::rpc {

struct ServerOptions {
  std::string name;                          // "bitsplit-drafter": prefix of messages
  std::string socket_path;                   // unix socket (mode 0660) unless tcp_address is set
  std::string tcp_address;                   // "host:port"; port 0 picks one (printed)
  std::vector<std::string> health_services;  // fully-qualified names set SERVING
  int shutdown_grace_ms = 200;
};

// Blocks SIGTERM/SIGINT in the calling thread, so that threads created later inherit the mask
// and RunServer's sigwait takes them. Call first thing in main, before threads exist.
void BlockTerminationSignals();

// Prepares a unix socket path: creates a missing parent directory (mode 0770) and removes a
// stale socket of an earlier run. FAILED_PRECONDITION when the path exists and is not a socket
// or the directory cannot be made.
absl::Status PrepareSocketPath(const std::string& path);

// Builds the server (health + reflection + `services`), prints "<name>: serving <description> on
// <address>" to stderr, waits for SIGTERM/SIGINT, flips health to NOT_SERVING, waits the grace
// period, calls `before_shutdown` (may be empty: e.g. cancel streams), shuts the server down
// with a deadline (in-flight RPCs get 5 s), removes the socket and prints "<name>: stopped".
// Errors (nothing served): the socket path cannot be prepared, or the address cannot be bound
// (UNAVAILABLE).
absl::Status RunServer(const ServerOptions& options, std::span<grpc::Service* const> services,
                       const std::string& description,
                       const std::function<void()>& before_shutdown);

}  // namespace bitsplit::rpc
