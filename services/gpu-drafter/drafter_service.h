#pragma once
// The Drafter gRPC service (proto bitsplit/internal/v1/drafter.proto) over a DrafterEngine:
// sessions and their limits, request validation, the residual link, timings.
//
// Generate streams are run by one scheduler thread (continuous batching, docs/design.md §3):
// each iteration it takes every active generation's next piece of work (a prefill chunk within
// the iteration's prefill row budget, or one speculation step with the shape its policy picks),
// runs them all through DrafterEngine::Step (one batched draft forward per draft round, one
// verifier forward) and streams each generation's emitted tokens. Generations join and leave
// between iterations.
//
// The engine runs one forward at a time: every backend call holds engine_mutex_ (the
// scheduler's iterations and the per-step RPCs alike). The per-step RPCs' handlers hand their
// work to a small pool of worker threads (gRPC's callback threads never block on a forward);
// GetInfo and CloseSession answer inline.
//
// Sessions belong to an owner's lease (a Lease stream held open by the coordinator): when the
// stream ends, because the owner cancelled it or its process died and its connection closed,
// the owner's sessions are closed at once. A reaper thread also closes any session that no RPC
// has used for session_idle_timeout (an owner that is alive but stuck).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "bitsplit/internal/v1/drafter.grpc.pb.h"
#include "common/rpc/health_probe.h"
#include "services/gpu-drafter/drafter_engine.h"
#include "services/gpu-drafter/residual_link.h"
#include "services/gpu-drafter/session_table.h"

namespace bitsplit::drafter {

inline constexpr char kDrafterServiceName[] = "bitsplit.internal.v1.Drafter";

struct DrafterServiceOptions {
  int max_sessions = 4;
  int32_t max_context = 2048;
  int32_t max_tree_nodes = 129;  // root included: 128 drafted nodes
  int32_t max_logprobs = 20;     // top alternatives per node
  int workers = 8;               // threads running the RPCs' work
  // Prompt rows an iteration prefills, all generations together (the rows of the decoding
  // generations' trees come on top): a long prompt enters in chunks of this size between the
  // other streams' steps instead of stalling them.
  int32_t prefill_rows = 64;
  // Verifier rows of one iteration, all generations together (prefill chunks and trees): the
  // rows one residual request carries (cpu-residual's --max-rows must allow it). At least
  // max_tree_nodes, so that any tree fits.
  int32_t max_batch_rows = 256;
  // Generations one iteration takes at most (0: every active one). 1 serializes them: one
  // generation's step per forward, in turn (the comparison of the concurrency bench).
  int32_t max_batch_generations = 0;
  std::chrono::seconds session_idle_timeout{300};
};

// Maps a status to gRPC (the one place of this service).
grpc::Status ToGrpcStatus(const absl::Status& status);
// The target's choice after a node, as Verify and Generate send it.
internal::v1::NodeChoice ToNodeChoice(const model::TargetChoice& choice);

class DrafterService final : public internal::v1::Drafter::CallbackService {
 public:
  // `backend` and `residual_link` (null: the residual is in process) must outlive the service.
  DrafterService(DrafterEngine& backend, ResidualLink* residual_link,
                 const DrafterServiceOptions& options);
  ~DrafterService() override;

  // Finishes the queued work and stops the workers and the reaper (after the server has shut
  // down).
  void StopWorkers();
  // Ends every lease stream and every Generate stream (UNAVAILABLE: shutting down; the scheduler
  // stops), so that the server's shutdown does not wait on them. Before the server shuts down.
  void EndLeases();
  int open_leases() const;
  // OK when a session can be opened now: one is free and cpu-residual (when remote) reports
  // ready. For the readiness health status.
  absl::Status Readiness() const;

  // The RPCs' work, also callable without gRPC (tests, tools).
  // With `include_residual_stats`, cpu-residual's counters too (an RPC to it).
  absl::Status DoGetInfo(internal::v1::DrafterInfo* response,
                         bool include_residual_stats = false) const;
  absl::Status DoOpenSession(const internal::v1::OpenSessionRequest& request,
                             internal::v1::OpenSessionResponse* response);
  absl::Status DoCloseSession(const internal::v1::CloseSessionRequest& request);
  absl::Status DoPrefill(const internal::v1::PrefillRequest& request,
                         internal::v1::PrefillResponse* response);
  absl::Status DoDraft(const internal::v1::DraftRequest& request,
                       internal::v1::DraftResponse* response);
  absl::Status DoVerify(const internal::v1::VerifyRequest& request,
                        internal::v1::VerifyResponse* response);
  absl::Status DoCommit(const internal::v1::CommitRequest& request,
                        internal::v1::CommitResponse* response);

  // gRPC handlers.
  grpc::ServerWriteReactor<internal::v1::LeaseGrant>* Lease(
      grpc::CallbackServerContext* context, const internal::v1::LeaseRequest* request) override;
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const internal::v1::DrafterInfoRequest* request,
                                    internal::v1::DrafterInfo* response) override;
  grpc::ServerUnaryReactor* OpenSession(grpc::CallbackServerContext* context,
                                        const internal::v1::OpenSessionRequest* request,
                                        internal::v1::OpenSessionResponse* response) override;
  grpc::ServerUnaryReactor* CloseSession(grpc::CallbackServerContext* context,
                                         const internal::v1::CloseSessionRequest* request,
                                         internal::v1::CloseSessionResponse* response) override;
  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* context,
                                    const internal::v1::PrefillRequest* request,
                                    internal::v1::PrefillResponse* response) override;
  grpc::ServerUnaryReactor* Draft(grpc::CallbackServerContext* context,
                                  const internal::v1::DraftRequest* request,
                                  internal::v1::DraftResponse* response) override;
  grpc::ServerUnaryReactor* Verify(grpc::CallbackServerContext* context,
                                   const internal::v1::VerifyRequest* request,
                                   internal::v1::VerifyResponse* response) override;
  grpc::ServerUnaryReactor* Commit(grpc::CallbackServerContext* context,
                                   const internal::v1::CommitRequest* request,
                                   internal::v1::CommitResponse* response) override;
  grpc::ServerWriteReactor<internal::v1::GenerateEvent>* Generate(
      grpc::CallbackServerContext* context, const internal::v1::GenerateRequest* request) override;

  // Iterations the scheduler ran, and generation steps in them (GetInfo).
  int64_t scheduler_iterations() const { return scheduler_iterations_.load(); }
  int64_t scheduler_steps() const { return scheduler_steps_.load(); }

 private:
  class LeaseReactor;
  class GenerateReactor;
  struct Generation;
  struct AdaptivePolicies;
  // INVALID_ARGUMENT naming the field; the plan of a valid request.
  absl::StatusOr<std::unique_ptr<Generation>> PlanGeneration(
      const internal::v1::GenerateRequest& request);
  void SchedulerLoop();
  // Under engine_mutex_, on the scheduler thread: opens the sessions of newly arrived
  // generations, ends cancelled ones, then runs one iteration over the rest; marks the ones
  // that ended `finished`.
  void RunIteration(std::vector<std::unique_ptr<Generation>>& active);
  void StopScheduler();
  // A lease stream ended: closes its owner's sessions. False when it had ended already.
  bool EndLease(uint64_t owner_id);
  void ReaperLoop();
  // Runs `work` on a worker and finishes the call with its status.
  grpc::ServerUnaryReactor* Defer(grpc::CallbackServerContext* context,
                                  std::function<absl::Status()> work);
  void WorkerLoop();
  // Under engine_mutex_: attaches the residual when it is remote and not attached.
  absl::Status EnsureResidualLocked();
  // Under engine_mutex_: the status to report for a failed verifier forward.
  absl::Status ForwardErrorLocked(const absl::Status& status);
  absl::Status CheckToken(int32_t token, const std::string& what) const;
  // The sampling of a Verify or Generate request (an unset top_p means off) and its logprobs
  // within [0, max_logprobs]; INVALID_ARGUMENT naming the field.
  absl::StatusOr<model::SamplingParams> CheckSampling(const internal::v1::SamplingParams& sampling,
                                                      int32_t logprobs) const;

  DrafterEngine& engine_;
  ResidualLink* const residual_link_;
  std::unique_ptr<rpc::HealthProbe> residual_health_;  // null when the residual is in process
  const DrafterServiceOptions options_;
  const int64_t vocab_size_;
  SessionTable sessions_;
  std::mutex engine_mutex_;  // every backend call and the residual link

  // What GetInfo reports of the residual service (from its last attach), without the engine lock.
  mutable std::mutex info_mutex_;
  std::string residual_format_;
  uint64_t residual_bytes_ = 0;
  // cpu-residual's counters for GetInfo(include_residual_stats): a control connection of its own
  // (the link's belongs to the engine lock), made on first use and dropped when a call fails.
  absl::StatusOr<internal::v1::ResidualStats> ResidualStatsNow() const;
  mutable std::mutex residual_stats_mutex_;
  mutable std::unique_ptr<rpc::ResidualClient> residual_stats_client_
      ABSL_GUARDED_BY(residual_stats_mutex_);

  std::mutex queue_mutex_;
  std::condition_variable queue_changed_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;

  // Live leases by owner id. Lock order: lease_mutex_ before the session table's.
  mutable std::mutex lease_mutex_;
  std::map<uint64_t, LeaseReactor*> leases_;
  uint64_t next_owner_id_ = 1;

  // Generations waiting for the scheduler to take them, and the scheduler thread.
  std::mutex scheduler_mutex_;
  std::condition_variable scheduler_wake_;
  std::vector<std::unique_ptr<Generation>> arriving_ ABSL_GUARDED_BY(scheduler_mutex_);
  bool scheduler_stopping_ ABSL_GUARDED_BY(scheduler_mutex_) = false;
  std::atomic<int64_t> scheduler_iterations_{0};
  std::atomic<int64_t> scheduler_steps_{0};
  // The scheduler's batched forwards (GetInfo): time, verifier forwards and their rows.
  struct ForwardTotals {
    std::atomic<int64_t> draft_ns{0};
    std::atomic<int64_t> verify_ns{0};
    std::atomic<int64_t> verify_forwards{0};
    std::atomic<int64_t> verify_rows{0};
  } forward_totals_;
  std::unique_ptr<AdaptivePolicies> policies_;  // scheduler thread only
  std::thread scheduler_;

  std::mutex reaper_mutex_;
  std::condition_variable reaper_wake_;
  bool reaper_stopping_ = false;
  std::thread reaper_;
};

}  // namespace bitsplit::drafter
