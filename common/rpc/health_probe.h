#pragma once
// Asks a bitsplit peer's grpc.health.v1.Health whether it is ready (common/rpc/server_runner.h
// says what each health name means). One channel, kept for the probe's life.
//
// Thread safety: Check may be called concurrently.
#include <chrono>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace bitsplit::rpc {

class HealthProbe {
 public:
  explicit HealthProbe(const std::string& target);

  // OK when `service` reports SERVING within `timeout`; UNAVAILABLE (naming the status or the
  // RPC error) otherwise.
  absl::Status Check(const std::string& service, std::chrono::milliseconds timeout) const;

 private:
  std::unique_ptr<grpc::health::v1::Health::Stub> stub_;
};

}  // namespace bitsplit::rpc
