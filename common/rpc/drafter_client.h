#pragma once
// Client of the gpu-drafter service (services/gpu-drafter, proto
// bitsplit/internal/v1/drafter.proto) for the coordinator, tools and tests:
//
//   auto client = DrafterClient::Connect("unix:/run/bitsplit/drafter.sock", 5s, 30s);
//   auto session = (*client)->OpenSession(/*context=*/2048);
//   (*client)->Prefill(request);  ...  Draft / Verify / Commit  ...
//   (*client)->CloseSession(session->session_id());
//
// or, the drafter running every step (what the coordinator does):
//
//   auto call = (*client)->Generate(request);
//   while (call->Read(&event)) ...;  call->Finish();
//
// Every RPC carries the client's rpc_timeout as its deadline; a gRPC error comes back as the
// absl::Status of the same code, its message prefixed with "drafter: ".
//
// The client holds a lease (the Drafter.Lease stream) and opens every session under it, so that
// the drafter closes this process's sessions the moment the process dies. A lease that ended
// (the drafter restarted) is replaced by the next OpenSession.
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bitsplit/internal/v1/drafter.grpc.pb.h"

namespace bitsplit::rpc {

// Thread safety: every method may be called concurrently.
class DrafterClient {
 public:
  // `target` is a gRPC target ("unix:/path", "localhost:port"). Waits up to `connect_timeout`
  // for the connection: UNAVAILABLE when the service does not answer. Every later RPC has the
  // deadline `rpc_timeout` (DEADLINE_EXCEEDED past it).
  static absl::StatusOr<std::unique_ptr<DrafterClient>> Connect(
      const std::string& target, std::chrono::milliseconds connect_timeout,
      std::chrono::milliseconds rpc_timeout);

  absl::StatusOr<internal::v1::DrafterInfo> GetInfo();
  // With its own deadline (readiness probes); `include_residual_stats` asks the drafter for
  // cpu-residual's counters too (metrics scrapes).
  absl::StatusOr<internal::v1::DrafterInfo> GetInfo(std::chrono::milliseconds timeout,
                                                    bool include_residual_stats = false);
  // context 0: the server's max_context. Takes a lease first when none is live.
  absl::StatusOr<internal::v1::OpenSessionResponse> OpenSession(int32_t context);
  absl::Status CloseSession(uint64_t session_id);
  absl::StatusOr<internal::v1::PrefillResponse> Prefill(
      const internal::v1::PrefillRequest& request);
  absl::StatusOr<internal::v1::DraftResponse> Draft(const internal::v1::DraftRequest& request);
  absl::StatusOr<internal::v1::VerifyResponse> Verify(const internal::v1::VerifyRequest& request);
  absl::StatusOr<internal::v1::CommitResponse> Commit(const internal::v1::CommitRequest& request);

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
  class Lease;
  DrafterClient() = default;
  std::unique_ptr<grpc::ClientContext> Context() const;
  // The owner id of a live lease, taking a new one when there is none.
  absl::StatusOr<uint64_t> LiveLease();
  void DropLease(uint64_t owner_id);

  std::string target_;
  std::chrono::milliseconds rpc_timeout_{0};
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<internal::v1::Drafter::Stub> stub_;

  std::mutex lease_mutex_;
  std::unique_ptr<Lease> lease_ ABSL_GUARDED_BY(lease_mutex_);
};

}  // namespace bitsplit::rpc
