#pragma once
// The common life cycle of the bitsplit service processes (cpu-residual, gpu-drafter,
// coordinator): listen on a unix socket (owner/group only) or TCP, health + reflection, one
// "serving" line on stderr, graceful shutdown on SIGTERM/SIGINT.
//
// Health (grpc.health.v1.Health), as Kubernetes' gRPC probes and load balancers read it:
//   ""            liveness: SERVING while the process serves, NOT_SERVING once it shuts down;
//   "liveness"    the same;
//   "readiness"   and every name in health_services: SERVING only while the readiness probe
//                 says the service can take a request now (its peers reachable, capacity left).
// Reflection, v1alpha (gRPC's plugin) and v1 (common/rpc/reflection_v1.h), describes every
// service, the health service included. health_services must name every service registered.
//
//   int main(int argc, char** argv) {
//     ... parse flags ...
//     BlockTerminationSignals();          // before any thread exists
//     ... load, build the services ...
//     grpc::Service* services[] = {&service};
//     absl::Status status = RunServer(options, services, "model.base.bsplit (...)", {});
//   }
#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/util/thread_pool.h"
#include "grpcpp/grpcpp.h"

namespace bitsplit::rpc {

struct ServerOptions {
  std::string name;                          // "bitsplit-drafter": prefix of messages
  std::string socket_path;                   // unix socket (mode 0660) unless tcp_address is set
  std::string tcp_address;                   // "host:port"; port 0 picks one (printed)
  std::vector<std::string> health_services;  // fully-qualified names that report readiness
  int shutdown_grace_ms = 200;
  int max_receive_message_bytes = 256 << 20;  // larger requests: RESOURCE_EXHAUSTED
  // Ready to take a request now? On failure, the reason (logged when readiness changes). Called
  // every readiness_period on a thread of RunServer's; empty: ready whenever serving.
  std::function<absl::Status()> readiness;
  std::chrono::milliseconds readiness_period{500};
};

inline constexpr char kLivenessService[] = "liveness";
inline constexpr char kReadinessService[] = "readiness";

// Faults in a service's mapped weights before it serves (PrefaultPages), printing
// "NAME: loading WHAT: P% (x of y GiB, t s)" lines to stderr as it goes, where the "serving"
// line goes, so that a long start shows where it stands.
void PrefaultWithProgress(const std::string& name, const std::string& what, const uint8_t* data,
                          uint64_t size, ThreadPool& pool);

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
