#pragma once
// The Drafter gRPC service (proto bitsplit/internal/v1/drafter.proto) over a DrafterEngine:
// GetInfo, and Generate, whose requests are checked here and run by the Scheduler (continuous
// batching, scheduler.h). A generation's session lives as long as its Generate stream: it is
// closed when the generation ends, when the client cancels, or when the client's connection
// closes (a killed coordinator), before the stream's status goes out.
//
// Thread safety: the gRPC handlers run on gRPC's threads and never block: Generate hands its
// request to the scheduler thread; GetInfo answers inline, or when cpu-residual's counters are
// asked for, from the callback of an asynchronous call to it.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bitsplit/internal/v1/drafter.grpc.pb.h"
#include "bitsplit/internal/v1/residual.grpc.pb.h"
#include "common/rpc/health_probe.h"
#include "services/gpu-drafter/drafter_engine.h"
#include "services/gpu-drafter/json_token_constraint.h"
#include "services/gpu-drafter/residual_link.h"
#include "services/gpu-drafter/scheduler.h"

namespace bitsplit::drafter {

inline constexpr char kDrafterServiceName[] = "bitsplit.internal.v1.Drafter";

struct DrafterServiceOptions {
  int32_t max_context = 2048;
  int32_t max_tree_nodes = 129;  // root included: 128 drafted nodes
  int32_t max_logprobs = 20;     // top alternatives per token
  SchedulerOptions scheduling;
  // The model's vocabulary for structured output (ConstraintVocabulary); null: requests with a
  // response schema are refused.
  std::shared_ptr<const text::TokenVocabulary> vocabulary;
};

class DrafterService final : public internal::v1::Drafter::CallbackService {
 public:
  // `engine` and `residual_link` (null: the residual is in process) must outlive the service.
  DrafterService(DrafterEngine& engine, ResidualLink* residual_link,
                 const DrafterServiceOptions& options);

  // Ends every Generate stream (UNAVAILABLE: shutting down) and stops the scheduler, so that the
  // server's shutdown does not wait on them.
  void EndStreams() { scheduler_.Stop(); }
  // OK when a generation can start now: a session is free and cpu-residual (when remote) reports
  // ready. For the readiness health status.
  absl::Status Readiness() const;

  // INVALID_ARGUMENT naming the field; the checked request otherwise.
  absl::StatusOr<GenerationRequest> CheckRequest(
      const internal::v1::GenerateRequest& request) const;
  // Everything but cpu-residual's counters.
  void FillInfo(internal::v1::DrafterInfo* response) const;

  // gRPC handlers.
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const internal::v1::DrafterInfoRequest* request,
                                    internal::v1::DrafterInfo* response) override;
  grpc::ServerWriteReactor<internal::v1::GenerateEvent>* Generate(
      grpc::CallbackServerContext* context, const internal::v1::GenerateRequest* request) override;

 private:
  absl::Status CheckToken(int32_t token, const std::string& what) const;

  DrafterEngine& engine_;
  ResidualLink* const residual_link_;
  const DrafterServiceOptions options_;
  const int64_t vocab_size_;
  std::unique_ptr<rpc::HealthProbe> residual_health_;  // null when the residual is in process
  // cpu-residual's Info for GetInfo(include_residual_stats), called asynchronously on a
  // connection of its own (the link's belongs to the scheduler thread).
  std::unique_ptr<internal::v1::Residual::Stub> residual_stats_stub_;
  Scheduler scheduler_;
};

}  // namespace bitsplit::drafter
