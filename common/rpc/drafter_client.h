#pragma once
// Client of the gpu-drafter service (services/gpu-drafter, proto
// bitsplit/internal/v1/drafter.proto) for the coordinator and tests:
//
//   auto client = DrafterClient::Connect("unix:/run/bitsplit/drafter.sock", 5s, 30s);
//   auto call = (*client)->Generate(request);    // the drafter runs the whole generation
//   while (call->Read(&event)) ...;  call->Finish();
//
// A gRPC error comes back as the absl::Status of the same code, its message prefixed with
// "drafter: ". The drafter closes a generation's session when its stream ends, also when this
// process dies and its connection closes.
#include <chrono>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bitsplit/internal/v1/drafter.grpc.pb.h"

namespace bitsplit::rpc {

// Thread safety: every method may be called concurrently.
class DrafterClient {
 public:
  // `target` is a gRPC target ("unix:/path", "localhost:port"). Waits up to `connect_timeout`
  // for the connection: UNAVAILABLE when the service does not answer. `rpc_timeout` is GetInfo's
  // deadline and the longest a Generate stream may go without an event (DEADLINE_EXCEEDED).
  static absl::StatusOr<std::unique_ptr<DrafterClient>> Connect(
      const std::string& target, std::chrono::milliseconds connect_timeout,
      std::chrono::milliseconds rpc_timeout);

  absl::StatusOr<internal::v1::DrafterInfo> GetInfo();
  // With its own deadline (readiness probes); `include_residual_stats` asks the drafter for
  // cpu-residual's counters too (metrics scrapes).
  absl::StatusOr<internal::v1::DrafterInfo> GetInfo(std::chrono::milliseconds timeout,
                                                    bool include_residual_stats = false);

  // One Generate stream: the drafter runs the whole generation and sends an event per iteration
  // it took part in. Each event must come within the client's rpc_timeout of the previous one
  // (the stream has no overall deadline: a generation takes as long as it takes); otherwise the
  // stream is cancelled and Finish says DEADLINE_EXCEEDED. Thread safety: Read and Finish on one
  // thread; Cancel from any.
  class GenerateCall {
   public:
    ~GenerateCall();
    // The next event; false at the end of the stream (then Finish).
    bool Read(internal::v1::GenerateEvent* event);
    // How the stream ended, as every RPC's status ("drafter: " prefixed). Once, last.
    absl::Status Finish();
    // Ends the stream early (the drafter closes the session); Read then returns false.
    void Cancel() { context_.TryCancel(); }

   private:
    friend class DrafterClient;
    // Starts the call on the first Read or Finish.
    bool Start();
    // Waits for the one operation in flight: its ok, or false when rpc_timeout passed (the call
    // is then cancelled and the operation collected).
    bool Await();

    std::chrono::milliseconds event_timeout_{0};
    grpc::ClientContext context_;
    grpc::CompletionQueue queue_;
    std::unique_ptr<grpc::ClientAsyncReader<internal::v1::GenerateEvent>> reader_;
    bool started_ = false;
    bool ended_ = false;
    bool timed_out_ = false;
  };
  std::unique_ptr<GenerateCall> Generate(const internal::v1::GenerateRequest& request);

  const std::string& target() const { return target_; }
  std::chrono::milliseconds rpc_timeout() const { return rpc_timeout_; }

  ~DrafterClient();

 private:
  DrafterClient() = default;

  std::string target_;
  std::chrono::milliseconds rpc_timeout_{0};
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<internal::v1::Drafter::Stub> stub_;
};

}  // namespace bitsplit::rpc
