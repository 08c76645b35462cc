#pragma once
// Client of the cpu-residual service (services/cpu-residual, proto
// bitsplit/internal/v1/residual.proto) for the drafter, tools and tests:
//
//   auto client = ResidualClient::Connect("unix:/run/bitsplit/residual.sock", {});
//   auto session = (*client)->Attach(fingerprint_hex, /*max_rows=*/64, &expected_shapes);
//   SplitLinearBackend verify(base, rotation, &(*session)->residual());   // shared memory
//   ...
//   session->reset();  // detaches
//
// GrpcResidual is the same ResidualSource over the MatMul RPC (the slow path).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bitsplit/internal/v1/residual.grpc.pb.h"
#include "common/io/shm_channel.h"
#include "common/model/remote_residual.h"
#include "common/model/split_backend.h"

namespace bitsplit::rpc {

absl::Status FromGrpcStatus(const grpc::Status& status);

// The shapes an Info response announces, checked for consistency (layers, group order, matrix
// counts, positive multiples of 32 for the input widths). INVALID_ARGUMENT otherwise.
absl::StatusOr<model::ResidualShapes> ShapesFromInfo(const internal::v1::InfoResponse& info);

struct ResidualClientOptions {
  std::chrono::milliseconds rpc_timeout{10000};  // every control RPC and MatMul
  shm::ShmClientOptions shm;                     // the shared-memory channel's waits
};

class ResidualChannel;

// Thread safety: the RPC methods may be called concurrently.
class ResidualClient {
 public:
  // `target` is a gRPC target ("unix:/path", "localhost:port"). Waits up to `connect_timeout`
  // for the connection: UNAVAILABLE when the service does not answer. With `fail_fast`,
  // UNAVAILABLE as soon as the first connection attempt fails (nothing listens: a service that
  // is down) instead of retrying until the timeout.
  static absl::StatusOr<std::unique_ptr<ResidualClient>> Connect(
      const std::string& target, const ResidualClientOptions& options,
      std::chrono::milliseconds connect_timeout = std::chrono::milliseconds(5000),
      bool fail_fast = false);

  absl::StatusOr<internal::v1::InfoResponse> Info();
  // Attaches a shared-memory channel for this process. The service refuses a fingerprint other
  // than its residual's (FAILED_PRECONDITION); when `expected` is non-null the service's shapes
  // must equal it (FAILED_PRECONDITION naming the first difference). max_rows 0: the service's.
  absl::StatusOr<std::unique_ptr<ResidualChannel>> Attach(const std::string& fingerprint_hex,
                                                          int max_rows,
                                                          const model::ResidualShapes* expected);
  absl::Status Detach(uint64_t channel_id);
  absl::StatusOr<internal::v1::MatMulResponse> MatMul(const internal::v1::MatMulRequest& request);

  const ResidualClientOptions& options() const { return options_; }

 private:
  ResidualClient() = default;
  std::unique_ptr<grpc::ClientContext> Context() const;

  ResidualClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::shared_ptr<internal::v1::Residual::Stub> stub_;

  friend class ResidualChannel;
};

// An attached channel. Destroying it detaches (best effort: a service that is gone reclaims the
// channel itself). A service killed without detaching leaves its segment in /dev/shm: a watcher
// thread, blocked on the service's pidfd, removes the name as soon as the process has exited
// (only then, and only while the name still names this segment: ShmChannelClient::
// UnlinkIfServiceExited). Thread safety: like RemoteResidual, one request at a time; the watcher
// touches only the channel's immutable state.
class ResidualChannel {
 public:
  ~ResidualChannel();
  model::RemoteResidual& residual() { return *residual_; }
  uint64_t channel_id() const { return channel_id_; }
  const internal::v1::AttachResponse& attach_response() const { return attach_; }
  // Detaches now; later calls (and the destructor) do nothing. OK without a call when the
  // service has exited (its segment's name is removed then).
  absl::Status Detach();
  // Whether the watcher removed the segment of a service that exited.
  bool unlinked_dead_segment() const { return unlinked_dead_segment_.load(); }

 private:
  friend class ResidualClient;
  ResidualChannel() = default;
  void StartWatcher();
  void StopWatcher();

  std::shared_ptr<internal::v1::Residual::Stub> stub_;
  std::chrono::milliseconds rpc_timeout_{0};
  internal::v1::AttachResponse attach_;
  uint64_t channel_id_ = 0;
  bool detached_ = false;
  std::unique_ptr<model::RemoteResidual> residual_;
  int stop_fd_ = -1;  // eventfd that ends the watcher
  std::thread watcher_;
  std::atomic<bool> unlinked_dead_segment_{false};
};

// The residual over the MatMul RPC. Bit-identical to RemoteResidual (same kernels, same add).
class GrpcResidual final : public model::ResidualSource {
 public:
  // `client` must outlive this object.
  GrpcResidual(ResidualClient& client, model::ResidualShapes shapes)
      : client_(client), shapes_(std::move(shapes)) {}
  absl::Status Accumulate(model::LinearGroupId id, const quant::QuantizedActivations& x,
                          std::span<float* const> outputs, ThreadPool& pool) override;

 private:
  ResidualClient& client_;
  model::ResidualShapes shapes_;
  internal::v1::MatMulRequest request_;  // reused
};

}  // namespace bitsplit::rpc
