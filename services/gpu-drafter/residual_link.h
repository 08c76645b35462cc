#pragma once
// The drafter's attachment to cpu-residual: a shared-memory channel whose RemoteResidual the
// backend's verifier forwards use. When the service goes away the link breaks (the forward
// returns UNAVAILABLE, or the next Ensure sees the service's process gone); the next Ensure()
// reattaches over a fresh gRPC channel, so that once cpu-residual is back (systemd restarts it)
// the next request succeeds. While it is down the connection is refused at once, and so is the
// request (UNAVAILABLE in milliseconds, not after the timeout).
//
// Errors name no socket, flag or fingerprint: they reach the public client through the
// coordinator. The detail goes to the log (warn).
//
// Thread safety: none; the drafter calls it under its engine lock, like the backend. (The
// session's watcher thread removes a dead service's segment on its own: residual_client.h.)
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/model/remote_residual.h"
#include "common/rpc/residual_client.h"
#include "services/gpu-drafter/drafter_engine.h"

namespace bitsplit::drafter {

struct ResidualLinkOptions {
  std::string target;       // gRPC target of cpu-residual ("unix:/run/bitsplit/residual.sock")
  std::string fingerprint;  // the base file's (hex)
  model::ResidualShapes shapes;
  // Forward rows of one residual request: the link asks for max_rows, or the service's maximum
  // when that is smaller, and refuses a service that cannot carry min_rows.
  int max_rows = 256;
  int min_rows = 64;
  // Request rows per forward row: a mixture-of-experts layer sends each row to this many experts
  // (num_experts_used), so its expert requests carry that many rows per forward row.
  int request_rows_per_row = 1;
  std::chrono::milliseconds timeout{5000};  // one (re)attach; one residual round trip
};

class ResidualLink {
 public:
  // `backend` must outlive the link; the link sets and clears its residual source.
  ResidualLink(DrafterEngine& backend, ResidualLinkOptions options)
      : engine_(backend), options_(std::move(options)) {}
  ~ResidualLink();

  // Attaches unless attached and healthy. UNAVAILABLE when the service is down or does not
  // answer in time; FAILED_PRECONDITION when it holds the residual of another model;
  // RESOURCE_EXHAUSTED when it has no channel to spare; INTERNAL when it refuses otherwise.
  // The first call (no gRPC channel yet: startup) waits up to the timeout for the service to
  // come up; later ones fail at once while it is down.
  absl::Status Ensure();
  // After a verifier forward failed with `status`: when the residual caused it, drops the
  // attachment (the next Ensure reattaches) and returns UNAVAILABLE; otherwise returns
  // `status`.
  absl::Status OnForwardError(const absl::Status& status);

  bool attached() const { return session_ != nullptr; }
  // Time the forwards spent waiting on cpu-residual by the current attachment (cumulative; the
  // part of each round trip that the base matmul did not hide).
  uint64_t wait_ns() const;
  const std::string& target() const { return options_.target; }
  // From the service's Info at the last attach (the residual file's size, like base_bytes).
  const std::string& residual_format() const { return residual_format_; }
  uint64_t residual_bytes() const { return residual_bytes_; }
  bool residual_mlocked() const { return residual_mlocked_; }
  // Forward rows one forward may carry on the current attachment (0 when detached).
  int attached_rows() const { return attached_rows_; }

 private:
  void DropSession();
  absl::Status Unavailable(const absl::Status& cause) const;
  absl::Status Refused(const absl::Status& cause) const;

  DrafterEngine& engine_;
  const ResidualLinkOptions options_;
  bool tried_ = false;  // an attach was attempted (startup is over)
  std::unique_ptr<rpc::ResidualClient> client_;
  std::unique_ptr<rpc::ResidualChannel> session_;
  std::string residual_format_;
  uint64_t residual_bytes_ = 0;
  bool residual_mlocked_ = false;
  int attached_rows_ = 0;
};

}  // namespace bitsplit::drafter
