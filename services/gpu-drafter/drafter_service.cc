#include "services/gpu-drafter/drafter_service.h"

#include <algorithm>
#include <chrono>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/model/sampler.h"
#include "common/model/speculation.h"
#include "common/rpc/server_runner.h"
#include "common/util/elapsed.h"
#include "common/util/status_macros.h"
#include "spdlog/spdlog.h"

namespace bitsplit::drafter {
namespace v1 = bitsplit::internal::v1;
namespace {

using Clock = std::chrono::steady_clock;

template <typename T>
std::span<const T> Span(const google::protobuf::RepeatedField<T>& field) {
  return std::span<const T>(field.data(), static_cast<size_t>(field.size()));
}

}  // namespace

v1::NodeChoice ToNodeChoice(const model::TargetChoice& choice) {
  v1::NodeChoice out;
  out.set_token(choice.token);
  out.set_logprob(choice.logprob);
  out.mutable_top_ids()->Add(choice.top_ids.begin(), choice.top_ids.end());
  out.mutable_top_logprobs()->Add(choice.top_logprobs.begin(), choice.top_logprobs.end());
  return out;
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

void DrafterService::StopWorkers() {
  StopScheduler();
  {
    std::lock_guard<std::mutex> lock(reaper_mutex_);
    reaper_stopping_ = true;
  }
  reaper_wake_.notify_all();
  if (reaper_.joinable()) reaper_.join();
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    stopping_ = true;
  }
  queue_changed_.notify_all();
  for (std::thread& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
}

void DrafterService::WorkerLoop() {
  while (true) {
    std::function<void()> work;
    {
      std::unique_lock<std::mutex> lock(queue_mutex_);
      queue_changed_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued is done
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    work();
  }
}

grpc::ServerUnaryReactor* DrafterService::Defer(grpc::CallbackServerContext* context,
                                                std::function<absl::Status()> work) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto task = [context, reactor, work = std::move(work)] {
    // A client that is gone (or past its deadline) does not get a forward run for it.
    if (context->IsCancelled()) {
      reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled"));
      return;
    }
    reactor->Finish(ToGrpcStatus(work()));
  };
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    if (!stopping_) {
      queue_.push_back(std::move(task));
      queue_changed_.notify_one();
      return reactor;
    }
  }
  reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the drafter is shutting down"));
  return reactor;
}

void DrafterService::ReaperLoop() {
  // A tenth of the timeout, at most a second: a session is closed within 1.1 timeouts.
  const auto period = std::min<std::chrono::milliseconds>(
      std::chrono::seconds(1),
      std::max<std::chrono::milliseconds>(std::chrono::milliseconds(10),
                                          options_.session_idle_timeout / 10));
  std::unique_lock<std::mutex> lock(reaper_mutex_);
  while (!reaper_wake_.wait_for(lock, period, [this] { return reaper_stopping_; })) {
    const int closed = sessions_.RemoveIdle(options_.session_idle_timeout);
    if (closed > 0) {
      spdlog::warn("closed {} session(s) unused for {} s (--session-idle-timeout)", closed,
                   options_.session_idle_timeout.count());
    }
  }
}

// ---- Leases --------------------------------------------------------------------------------

// One owner's Lease stream: one grant written, then open until the client goes away (OnCancel)
// or the server ends it (EndLeases). Owned by gRPC: deleted in OnDone. Finish is called once, by
// whoever removed the lease from leases_ (EndLease's caller or EndLeases).
class DrafterService::LeaseReactor final
    : public grpc::ServerWriteReactor<internal::v1::LeaseGrant> {
 public:
  LeaseReactor(DrafterService* service, uint64_t owner_id) : service_(service) {
    grant_.set_owner_id(owner_id);
  }
  uint64_t owner_id() const { return grant_.owner_id(); }
  void Begin() { StartWrite(&grant_); }

  void OnWriteDone(bool ok) override {
    if (!ok) End();
  }
  void OnCancel() override { End(); }
  void OnDone() override { delete this; }

 private:
  void End() {
    if (service_->EndLease(owner_id())) Finish(grpc::Status::CANCELLED);
  }

  DrafterService* const service_;
  internal::v1::LeaseGrant grant_;
};

bool DrafterService::EndLease(uint64_t owner_id) {
  std::lock_guard<std::mutex> lock(lease_mutex_);
  if (leases_.erase(owner_id) == 0) return false;
  const int closed = sessions_.RemoveOwnedBy(owner_id);
  spdlog::info("lease {} ended: closed its {} session(s)", owner_id, closed);
  return true;
}

void DrafterService::EndLeases() {
  StopScheduler();  // every Generate stream ends (UNAVAILABLE)
  std::map<uint64_t, LeaseReactor*> ending;
  {
    std::lock_guard<std::mutex> lock(lease_mutex_);
    ending.swap(leases_);
    for (const auto& [owner_id, reactor] : ending) sessions_.RemoveOwnedBy(owner_id);
  }
  for (const auto& [owner_id, reactor] : ending) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the drafter is shutting down"));
  }
}

absl::Status DrafterService::Readiness() const {
  BITSPLIT_RETURN_IF_ERROR(sessions_.CheckRoom());
  if (residual_health_ != nullptr) {
    if (absl::Status status =
            residual_health_->Check(rpc::kReadinessService, std::chrono::milliseconds(1000));
        !status.ok()) {
      return absl::UnavailableError(
          absl::StrCat("cpu-residual at ", residual_link_->target(), ": ", status.message()));
    }
  }
  return absl::OkStatus();
}

int DrafterService::open_leases() const {
  std::lock_guard<std::mutex> lock(lease_mutex_);
  return static_cast<int>(leases_.size());
}

grpc::ServerWriteReactor<internal::v1::LeaseGrant>* DrafterService::Lease(
    grpc::CallbackServerContext* /*context*/, const internal::v1::LeaseRequest* /*request*/) {
  LeaseReactor* reactor = nullptr;
  {
    std::lock_guard<std::mutex> lock(lease_mutex_);
    reactor = new LeaseReactor(this, next_owner_id_++);
    leases_.emplace(reactor->owner_id(), reactor);
  }
  spdlog::debug("lease {} granted", reactor->owner_id());
  reactor->Begin();
  return reactor;
}

// ---- Work ----------------------------------------------------------------------------------

absl::Status DrafterService::CheckToken(int32_t token, const std::string& what) const {
  if (token < 0 || token >= vocab_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " (", token, ") is outside the vocabulary [0, ", vocab_size_, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<model::SamplingParams> DrafterService::CheckSampling(const v1::SamplingParams& proto,
                                                                    int32_t logprobs) const {
  model::SamplingParams sampling;
  sampling.temperature = proto.temperature();
  sampling.top_k = proto.top_k();
  // proto3 cannot tell an unset top_p from 0, which is no valid nucleus: unset means off.
  sampling.top_p = proto.top_p() == 0.0f ? 1.0f : proto.top_p();
  sampling.seed = proto.seed();
  BITSPLIT_RETURN_IF_ERROR(model::ValidateSamplingParams(sampling));
  if (logprobs < 0 || logprobs > options_.max_logprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("logprobs ", logprobs, " is outside [0, ", options_.max_logprobs, "]"));
  }
  return sampling;
}

absl::Status DrafterService::EnsureResidualLocked() {
  if (residual_link_ == nullptr) return absl::OkStatus();
  BITSPLIT_RETURN_IF_ERROR(residual_link_->Ensure());
  std::lock_guard<std::mutex> lock(info_mutex_);
  residual_format_ = residual_link_->residual_format();
  residual_bytes_ = residual_link_->residual_bytes();
  return absl::OkStatus();
}

absl::Status DrafterService::ForwardErrorLocked(const absl::Status& status) {
  if (residual_link_ == nullptr) return status;
  return residual_link_->OnForwardError(status);
}

absl::StatusOr<v1::ResidualStats> DrafterService::ResidualStatsNow() const {
  if (residual_link_ == nullptr) return absl::FailedPreconditionError("the residual is in-process");
  std::lock_guard<std::mutex> lock(residual_stats_mutex_);
  constexpr std::chrono::milliseconds kStatsTimeout(1000);
  if (residual_stats_client_ == nullptr) {
    rpc::ResidualClientOptions options;
    options.rpc_timeout = kStatsTimeout;
    BITSPLIT_ASSIGN_OR_RETURN(residual_stats_client_,
                              rpc::ResidualClient::Connect(residual_link_->target(), options,
                                                           kStatsTimeout, /*fail_fast=*/true));
  }
  absl::StatusOr<v1::InfoResponse> info = residual_stats_client_->Info();
  if (!info.ok()) {
    residual_stats_client_.reset();
    return info.status();
  }
  v1::ResidualStats stats;
  stats.set_requests_served(info->requests_served());
  stats.set_rows_served(info->rows_served());
  stats.set_weight_bytes_read(info->weight_bytes_read());
  stats.set_compute_ns(info->compute_ns());
  stats.set_attached_clients(info->attached_clients());
  stats.set_weight_bytes(info->weight_bytes());
  return stats;
}

absl::Status DrafterService::DoGetInfo(v1::DrafterInfo* response,
                                       bool include_residual_stats) const {
  const EngineInfo& info = engine_.info();
  response->set_name(info.model_name);
  response->set_architecture(info.config.architecture);
  response->set_layers(static_cast<int32_t>(info.config.num_layers));
  response->set_d_model(static_cast<int32_t>(info.config.d_model));
  response->set_vocab_size(static_cast<int32_t>(info.config.vocab_size));
  response->set_max_context(options_.max_context);
  response->set_base_format(info.base_format);
  response->set_fingerprint(info.fingerprint);
  response->set_backend(info.name);
  response->set_max_sessions(options_.max_sessions);
  response->set_open_sessions(sessions_.size());
  response->set_draft_model(info.draft_model);
  response->set_draft_kv(std::string(model::DraftKvName(info.draft_kv)));
  response->set_max_tree_nodes(options_.max_tree_nodes);
  response->set_base_bytes(info.base_bytes);
  response->set_vram_plan(info.vram_plan);
  response->set_vram_budget_bytes(info.vram_budget_bytes);
  response->set_open_leases(open_leases());
  response->set_session_idle_timeout_s(static_cast<int32_t>(options_.session_idle_timeout.count()));
  response->set_scheduler_iterations(scheduler_iterations());
  response->set_scheduler_steps(scheduler_steps());
  response->set_prefill_rows(options_.prefill_rows);
  response->set_draft_ns_total(forward_totals_.draft_ns.load());
  response->set_verify_ns_total(forward_totals_.verify_ns.load());
  response->set_verify_forwards(forward_totals_.verify_forwards.load());
  response->set_verify_rows(forward_totals_.verify_rows.load());
  if (include_residual_stats && residual_link_ != nullptr) {
    absl::StatusOr<v1::ResidualStats> stats = ResidualStatsNow();
    if (stats.ok()) {
      *response->mutable_residual_stats() = *std::move(stats);
    } else {
      spdlog::debug("cpu-residual's counters: {}", stats.status().ToString());
    }
  }
  if (residual_link_ == nullptr) {
    response->set_residual("in-process");
    response->set_residual_format(info.residual_format);
    response->set_residual_bytes(info.residual_bytes);
  } else {
    response->set_residual("shm " + residual_link_->target());
    std::lock_guard<std::mutex> lock(info_mutex_);
    response->set_residual_format(residual_format_);
    response->set_residual_bytes(residual_bytes_);
  }
  return absl::OkStatus();
}

absl::Status DrafterService::DoOpenSession(const v1::OpenSessionRequest& request,
                                           v1::OpenSessionResponse* response) {
  if (request.context() < 0 || request.context() > options_.max_context) {
    return absl::InvalidArgumentError(absl::StrCat("context ", request.context(),
                                                   " is outside [0, ", options_.max_context,
                                                   "] (0: the maximum, --max-context)"));
  }
  const int32_t context = request.context() == 0 ? options_.max_context : request.context();
  BITSPLIT_RETURN_IF_ERROR(sessions_.CheckRoom());
  std::shared_ptr<model::SpeculativeSession> session;
  {
    std::lock_guard<std::mutex> lock(engine_mutex_);
    BITSPLIT_RETURN_IF_ERROR(EnsureResidualLocked());
    BITSPLIT_ASSIGN_OR_RETURN(session, engine_.NewSession(context));
  }
  uint64_t id = 0;
  {
    // Under the lease lock: a lease that ends after this check finds the session and closes it.
    std::lock_guard<std::mutex> lock(lease_mutex_);
    if (request.owner_id() != 0 && !leases_.contains(request.owner_id())) {
      return absl::NotFoundError(
          absl::StrCat("owner ", request.owner_id(), " holds no lease (it has ended)"));
    }
    BITSPLIT_ASSIGN_OR_RETURN(id, sessions_.Add(std::move(session), request.owner_id()));
  }
  spdlog::debug("session {} opened (context {}, owner {})", id, context, request.owner_id());
  response->set_session_id(id);
  response->set_context(context);
  return absl::OkStatus();
}

absl::Status DrafterService::DoCloseSession(const v1::CloseSessionRequest& request) {
  BITSPLIT_RETURN_IF_ERROR(sessions_.Remove(request.session_id()));
  spdlog::debug("session {} closed", request.session_id());
  return absl::OkStatus();
}

absl::Status DrafterService::DoPrefill(const v1::PrefillRequest& request,
                                       v1::PrefillResponse* response) {
  BITSPLIT_ASSIGN_OR_RETURN(std::shared_ptr<model::SpeculativeSession> session,
                            sessions_.Find(request.session_id()));
  if (request.tokens().empty()) {
    return absl::InvalidArgumentError("prefill needs at least one token");
  }
  for (int i = 0; i < request.tokens_size(); ++i) {
    BITSPLIT_RETURN_IF_ERROR(CheckToken(request.tokens(i), absl::StrCat("prompt token ", i)));
  }
  std::lock_guard<std::mutex> lock(engine_mutex_);
  const Clock::time_point start = Clock::now();
  BITSPLIT_RETURN_IF_ERROR(EnsureResidualLocked());
  if (absl::Status status = session->Prefill(Span(request.tokens())); !status.ok()) {
    return ForwardErrorLocked(status);
  }
  response->set_committed_length(static_cast<int32_t>(session->committed_length()));
  response->set_elapsed_ns(NanosSince(start));
  return absl::OkStatus();
}

absl::Status DrafterService::DoDraft(const v1::DraftRequest& request, v1::DraftResponse* response) {
  BITSPLIT_ASSIGN_OR_RETURN(std::shared_ptr<model::SpeculativeSession> session,
                            sessions_.Find(request.session_id()));
  BITSPLIT_RETURN_IF_ERROR(CheckToken(request.root_token(), "root_token"));
  const model::TreeShape shape{.nodes = request.nodes(),
                               .expansions = request.expansions(),
                               .max_depth = request.max_depth()};
  BITSPLIT_RETURN_IF_ERROR(model::ValidateTreeShape(shape, options_.max_tree_nodes - 1));
  std::lock_guard<std::mutex> lock(engine_mutex_);
  const Clock::time_point start = Clock::now();
  BITSPLIT_ASSIGN_OR_RETURN(model::DraftTree tree, session->Draft(request.root_token(), shape));
  response->mutable_tokens()->Add(tree.tokens.begin(), tree.tokens.end());
  response->mutable_parents()->Add(tree.parents.begin(), tree.parents.end());
  response->mutable_logprobs()->Add(tree.logprobs.begin(), tree.logprobs.end());
  response->set_draft_forwards(tree.draft_forwards);
  response->set_elapsed_ns(NanosSince(start));
  return absl::OkStatus();
}

absl::Status DrafterService::DoVerify(const v1::VerifyRequest& request,
                                      v1::VerifyResponse* response) {
  BITSPLIT_ASSIGN_OR_RETURN(std::shared_ptr<model::SpeculativeSession> session,
                            sessions_.Find(request.session_id()));
  BITSPLIT_RETURN_IF_ERROR(model::ValidateTree(Span(request.tokens()), Span(request.parents()),
                                               vocab_size_, options_.max_tree_nodes));
  BITSPLIT_ASSIGN_OR_RETURN(const model::SamplingParams sampling,
                            CheckSampling(request.sampling(), request.logprobs()));
  std::lock_guard<std::mutex> lock(engine_mutex_);
  const Clock::time_point start = Clock::now();
  BITSPLIT_RETURN_IF_ERROR(EnsureResidualLocked());
  const uint64_t residual_before = residual_link_ != nullptr ? residual_link_->wait_ns() : 0;
  auto choices = session->Verify(Span(request.tokens()), Span(request.parents()), sampling,
                                 request.logprobs(), request.logprobs() > 0);
  if (!choices.ok()) return ForwardErrorLocked(choices.status());
  const uint64_t residual_after = residual_link_ != nullptr ? residual_link_->wait_ns() : 0;
  for (const model::TargetChoice& choice : *choices)
    *response->add_choices() = ToNodeChoice(choice);
  response->set_elapsed_ns(NanosSince(start));
  response->set_residual_wait_ns(static_cast<int64_t>(residual_after - residual_before));
  return absl::OkStatus();
}

absl::Status DrafterService::DoCommit(const v1::CommitRequest& request,
                                      v1::CommitResponse* response) {
  BITSPLIT_ASSIGN_OR_RETURN(std::shared_ptr<model::SpeculativeSession> session,
                            sessions_.Find(request.session_id()));
  std::lock_guard<std::mutex> lock(engine_mutex_);
  BITSPLIT_RETURN_IF_ERROR(session->Commit(Span(request.nodes())));
  response->set_committed_length(static_cast<int32_t>(session->committed_length()));
  return absl::OkStatus();
}

// ---- gRPC handlers -------------------------------------------------------------------------

grpc::ServerUnaryReactor* DrafterService::GetInfo(grpc::CallbackServerContext* context,
                                                  const v1::DrafterInfoRequest* request,
                                                  v1::DrafterInfo* response) {
  if (request->include_residual_stats()) {  // an RPC to cpu-residual: not on gRPC's thread
    return Defer(context, [this, response] { return DoGetInfo(response, true); });
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(DoGetInfo(response)));
  return reactor;
}

grpc::ServerUnaryReactor* DrafterService::OpenSession(grpc::CallbackServerContext* context,
                                                      const v1::OpenSessionRequest* request,
                                                      v1::OpenSessionResponse* response) {
  return Defer(context, [this, request, response] { return DoOpenSession(*request, response); });
}

grpc::ServerUnaryReactor* DrafterService::CloseSession(grpc::CallbackServerContext* context,
                                                       const v1::CloseSessionRequest* request,
                                                       v1::CloseSessionResponse* /*response*/) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(DoCloseSession(*request)));
  return reactor;
}

grpc::ServerUnaryReactor* DrafterService::Prefill(grpc::CallbackServerContext* context,
                                                  const v1::PrefillRequest* request,
                                                  v1::PrefillResponse* response) {
  return Defer(context, [this, request, response] { return DoPrefill(*request, response); });
}

grpc::ServerUnaryReactor* DrafterService::Draft(grpc::CallbackServerContext* context,
                                                const v1::DraftRequest* request,
                                                v1::DraftResponse* response) {
  return Defer(context, [this, request, response] { return DoDraft(*request, response); });
}

grpc::ServerUnaryReactor* DrafterService::Verify(grpc::CallbackServerContext* context,
                                                 const v1::VerifyRequest* request,
                                                 v1::VerifyResponse* response) {
  return Defer(context, [this, request, response] { return DoVerify(*request, response); });
}

grpc::ServerUnaryReactor* DrafterService::Commit(grpc::CallbackServerContext* context,
                                                 const v1::CommitRequest* request,
                                                 v1::CommitResponse* response) {
  return Defer(context, [this, request, response] { return DoCommit(*request, response); });
}

}  // namespace bitsplit::drafter
