// The Generate stream of DrafterService and its scheduler (drafter_service.h): continuous
// batching of every active generation, one iteration at a time.
#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <tuple>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model/sampler.h"
#include "common/model/speculation.h"
#include "common/model/speculation_policy.h"
#include "common/util/status_macros.h"
#include "services/gpu-drafter/drafter_service.h"
#include "spdlog/spdlog.h"

namespace bitsplit::drafter {
namespace v1 = bitsplit::internal::v1;
namespace {

// The write side of one Generate call, shared by its reactor (gRPC's threads) and its generation
// (the scheduler thread): events queue here and go out one write at a time; the call finishes
// once the queue is drained after End, or at once when the client is gone. StartWrite and
// Finish are called without the lock held (gRPC may run a reaction inline).
//
// Thread safety: every method may be called concurrently.
class GenerateStream {
 public:
  explicit GenerateStream(grpc::ServerWriteReactor<v1::GenerateEvent>* reactor)
      : reactor_(reactor) {}

  // Queues an event; false once the client is gone (the event is dropped).
  bool Send(v1::GenerateEvent event) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (cancelled_ || ending_) return false;
      outbox_.push_back(std::move(event));
    }
    Pump();
    return true;
  }
  // Ends the call with `status` once the queued events are written (the first End counts).
  void End(const absl::Status& status) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (ending_) return;
      ending_ = true;
      if (!cancelled_) status_ = ToGrpcStatus(status);
    }
    Pump();
  }
  bool cancelled() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return cancelled_;
  }

  // The reactor's callbacks.
  void WriteDone(bool ok) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      writing_ = false;
      outbox_.pop_front();
      if (!ok) CancelLocked();
    }
    Pump();
  }
  void Cancel() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      CancelLocked();
    }
    Pump();
  }

 private:
  void CancelLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    cancelled_ = true;
    status_ = grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the generation");
  }
  // Starts the next write, or finishes the call when nothing is left to write.
  void Pump() {
    const v1::GenerateEvent* next = nullptr;
    grpc::Status status;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (writing_ || finished_) return;
      if (!outbox_.empty() && !cancelled_) {
        writing_ = true;
        next = &outbox_.front();  // a deque keeps it in place while more are queued
      } else if (ending_ || cancelled_) {
        finished_ = true;
        status = status_;
      } else {
        return;
      }
    }
    // The reactor lives until OnDone, which comes only after Finish and the last write.
    if (next != nullptr) {
      reactor_->StartWrite(next);
    } else {
      reactor_->Finish(status);
    }
  }

  grpc::ServerWriteReactor<v1::GenerateEvent>* const reactor_;
  mutable std::mutex mutex_;
  std::deque<v1::GenerateEvent> outbox_ ABSL_GUARDED_BY(mutex_);
  bool writing_ ABSL_GUARDED_BY(mutex_) = false;
  bool ending_ ABSL_GUARDED_BY(mutex_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mutex_) = false;
  bool finished_ ABSL_GUARDED_BY(mutex_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace

// Owned by gRPC: deleted in OnDone, after Finish.
class DrafterService::GenerateReactor final : public grpc::ServerWriteReactor<v1::GenerateEvent> {
 public:
  GenerateReactor() : stream_(std::make_shared<GenerateStream>(this)) {}
  const std::shared_ptr<GenerateStream>& stream() const { return stream_; }

  void OnWriteDone(bool ok) override { stream_->WriteDone(ok); }
  void OnCancel() override { stream_->Cancel(); }
  void OnDone() override { delete this; }

 private:
  std::shared_ptr<GenerateStream> stream_;
};

// One generation: what was asked, and where it stands. The scheduler thread owns it; only
// `stream` is shared (with the reactor).
struct DrafterService::Generation {
  std::shared_ptr<GenerateStream> stream;
  std::vector<int32_t> prompt;
  int32_t context = 0;
  model::SamplingParams sampling;
  int32_t logprobs = 0;
  int32_t max_tokens = 0;
  std::unordered_set<int32_t> end_tokens;
  model::TreeShape shape;  // bounds when adaptive
  bool adaptive = false;

  uint64_t session_id = 0;  // 0 until the scheduler opened the session
  std::shared_ptr<model::SpeculativeSession> session;
  size_t prefilled = 0;   // prompt tokens committed: all but the last before the first step
  int32_t root = 0;       // the next step's root (the token after the committed ones)
  int32_t generated = 0;  // emitted tokens outside end_tokens
  model::AdaptivePolicy* policy = nullptr;  // adaptive: shared, or own_policy
  std::unique_ptr<model::AdaptivePolicy> own_policy;
  int64_t last_rows = 0;     // verifier rows it had in the last iteration
  double last_tokens = 0.0;  // tokens it emitted in the last iteration
  bool finished = false;
  // How its stream ends: once its session is closed, so a client that saw the end finds the
  // session gone.
  absl::Status end_status;

  size_t prefill_target() const { return prompt.size() - 1; }
};

// The adaptive policies of the generations, by tree bounds: costs are the machine's and
// acceptance the model's, so what one generation measured serves the next with the same bounds.
// Scheduler thread only.
struct DrafterService::AdaptivePolicies {
  static constexpr size_t kMaxShared = 8;  // more distinct bounds get a policy each
  std::map<std::tuple<int32_t, int32_t, int32_t>, model::AdaptivePolicy> by_bounds;
  // The last iteration's verifier rows and emitted tokens, all generations': what the others
  // add to a generation's next iteration (model::BatchContext).
  int64_t last_rows = 0;
  double last_tokens = 0.0;

  model::BatchContext ContextFor(const Generation& g) const {
    return {.other_rows = static_cast<int32_t>(std::max<int64_t>(0, last_rows - g.last_rows)),
            .other_tokens = std::max(0.0, last_tokens - g.last_tokens)};
  }
};

// Here rather than in drafter_service.cc: the members Generation and AdaptivePolicies are
// complete only in this file.
DrafterService::DrafterService(DrafterEngine& backend, ResidualLink* residual_link,
                               const DrafterServiceOptions& options)
    : engine_(backend),
      residual_link_(residual_link),
      options_(options),
      vocab_size_(backend.info().config.vocab_size),
      sessions_(options.max_sessions),
      policies_(std::make_unique<AdaptivePolicies>()) {
  if (residual_link_ != nullptr) {
    residual_health_ = std::make_unique<rpc::HealthProbe>(residual_link_->target());
  }
  for (int i = 0; i < options_.workers; ++i) workers_.emplace_back([this] { WorkerLoop(); });
  reaper_ = std::thread([this] { ReaperLoop(); });
  scheduler_ = std::thread([this] { SchedulerLoop(); });
}

DrafterService::~DrafterService() { StopWorkers(); }

absl::StatusOr<std::unique_ptr<DrafterService::Generation>> DrafterService::PlanGeneration(
    const v1::GenerateRequest& request) {
  auto generation = std::make_unique<Generation>();
  Generation& g = *generation;
  if (request.prompt().empty()) {
    return absl::InvalidArgumentError("the prompt needs at least one token");
  }
  for (int i = 0; i < request.prompt_size(); ++i) {
    BITSPLIT_RETURN_IF_ERROR(CheckToken(request.prompt(i), absl::StrCat("prompt token ", i)));
  }
  g.prompt.assign(request.prompt().begin(), request.prompt().end());
  if (request.context() < 0 || request.context() > options_.max_context) {
    return absl::InvalidArgumentError(absl::StrCat("context ", request.context(),
                                                   " is outside [0, ", options_.max_context,
                                                   "] (0: the maximum, --max-context)"));
  }
  g.context = request.context() == 0 ? options_.max_context : request.context();
  if (static_cast<int64_t>(g.prompt.size()) > g.context) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d prompt tokens do not fit a context of %d", g.prompt.size(), g.context));
  }
  BITSPLIT_ASSIGN_OR_RETURN(g.sampling, CheckSampling(request.sampling(), request.logprobs()));
  g.logprobs = request.logprobs();
  if (request.max_tokens() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens must be at least 1, got ", request.max_tokens()));
  }
  g.max_tokens = request.max_tokens();
  for (int32_t token : request.end_token_ids()) {
    BITSPLIT_RETURN_IF_ERROR(CheckToken(token, "end token"));
    g.end_tokens.insert(token);
  }
  g.shape = {.nodes = request.nodes(),
             .expansions = request.expansions(),
             .max_depth = request.max_depth()};
  BITSPLIT_RETURN_IF_ERROR(model::ValidateTreeShape(g.shape, options_.max_tree_nodes - 1));
  g.adaptive = request.adaptive() && g.shape.nodes > 0;
  if (g.adaptive) {
    absl::StatusOr<model::AdaptivePolicy> policy = model::MakeAdaptivePolicy(g.shape);
    if (!policy.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("adaptive: ", policy.status().message()));
    }
  }
  g.root = g.prompt.back();
  return generation;
}

grpc::ServerWriteReactor<v1::GenerateEvent>* DrafterService::Generate(
    grpc::CallbackServerContext* /*context*/, const v1::GenerateRequest* request) {
  auto* reactor = new GenerateReactor();
  absl::StatusOr<std::unique_ptr<Generation>> planned = PlanGeneration(*request);
  if (!planned.ok()) {
    reactor->stream()->End(planned.status());
    return reactor;
  }
  (*planned)->stream = reactor->stream();
  {
    std::lock_guard<std::mutex> lock(scheduler_mutex_);
    if (!scheduler_stopping_) {
      arriving_.push_back(*std::move(planned));
      scheduler_wake_.notify_one();
      return reactor;
    }
  }
  reactor->stream()->End(absl::UnavailableError("the drafter is shutting down"));
  return reactor;
}

void DrafterService::StopScheduler() {
  {
    std::lock_guard<std::mutex> lock(scheduler_mutex_);
    scheduler_stopping_ = true;
  }
  scheduler_wake_.notify_all();
  if (scheduler_.joinable()) scheduler_.join();
}

void DrafterService::SchedulerLoop() {
  std::vector<std::unique_ptr<Generation>> active;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(scheduler_mutex_);
      scheduler_wake_.wait(
          lock, [&] { return scheduler_stopping_ || !arriving_.empty() || !active.empty(); });
      for (auto& generation : arriving_) active.push_back(std::move(generation));
      arriving_.clear();
      if (scheduler_stopping_) break;
    }
    {
      std::lock_guard<std::mutex> lock(engine_mutex_);
      RunIteration(active);
    }
    for (auto& generation : active) {
      if (!generation->finished) continue;
      if (generation->session_id != 0) (void)sessions_.Remove(generation->session_id);
      generation->stream->End(generation->end_status);
      generation.reset();
    }
    std::erase(active, nullptr);
  }
  for (auto& generation : active) {
    if (generation->session_id != 0) (void)sessions_.Remove(generation->session_id);
    generation->stream->End(absl::UnavailableError("the drafter is shutting down"));
  }
}

void DrafterService::RunIteration(std::vector<std::unique_ptr<Generation>>& active) {
  auto end = [](Generation& g, const absl::Status& status) {
    if (g.finished) return;  // the first reason stands
    g.end_status = status;
    g.finished = true;
  };
  // Newly arrived generations get their session; cancelled ones leave.
  for (auto& generation : active) {
    Generation& g = *generation;
    if (g.stream->cancelled()) {
      end(g, absl::CancelledError("the client cancelled the generation"));
      continue;
    }
    if (g.session != nullptr) continue;
    if (absl::Status room = sessions_.CheckRoom(); !room.ok()) {
      end(g, room);
      continue;
    }
    if (absl::Status residual = EnsureResidualLocked(); !residual.ok()) {
      end(g, residual);
      continue;
    }
    absl::StatusOr<std::unique_ptr<model::SpeculativeSession>> session =
        engine_.NewSession(g.context);
    if (!session.ok()) {
      end(g, session.status());
      continue;
    }
    g.session = std::shared_ptr<model::SpeculativeSession>(*std::move(session));
    absl::StatusOr<uint64_t> id = sessions_.Add(g.session, /*owner_id=*/0);
    if (!id.ok()) {
      g.session.reset();
      end(g, id.status());
      continue;
    }
    g.session_id = *id;
    if (g.adaptive) {
      const auto key = std::make_tuple(g.shape.nodes, g.shape.expansions, g.shape.max_depth);
      auto found = policies_->by_bounds.find(key);
      if (found == policies_->by_bounds.end() &&
          policies_->by_bounds.size() < AdaptivePolicies::kMaxShared) {
        found = policies_->by_bounds.emplace(key, *model::MakeAdaptivePolicy(g.shape)).first;
      }
      if (found != policies_->by_bounds.end()) {
        g.policy = &found->second;
      } else {
        g.own_policy = std::make_unique<model::AdaptivePolicy>(*model::MakeAdaptivePolicy(g.shape));
        g.policy = g.own_policy.get();
      }
    }
  }

  // Each generation's work. Speculation steps first (the streams already running), their trees
  // shrunk to what is left of the iteration's row cap; then prefill chunks from what is left of
  // the prefill budget. Taken round-robin from a rotating start, so that no generation waits
  // behind the same others every iteration when the cap binds.
  std::vector<Generation*> running;
  std::vector<model::SpeculativeSession*> sessions;
  std::vector<model::SessionStep> steps;
  // What one residual request carries bounds the iteration too (cpu-residual's --max-rows).
  int64_t rows_left = options_.max_batch_rows;
  if (residual_link_ != nullptr && residual_link_->attached_rows() > 0) {
    rows_left = std::min<int64_t>(rows_left, residual_link_->attached_rows());
  }
  int64_t prefill_left = options_.prefill_rows;
  const size_t count = active.size();
  const size_t start = count > 0 ? static_cast<size_t>(scheduler_iterations_.load()) % count : 0;
  const size_t limit = options_.max_batch_generations > 0
                           ? static_cast<size_t>(options_.max_batch_generations)
                           : count;
  auto take = [&](Generation& g, model::SessionStep step) {
    running.push_back(&g);
    sessions.push_back(g.session.get());
    steps.push_back(std::move(step));
  };
  for (size_t n = 0; n < count && running.size() < limit; ++n) {
    Generation& g = *active[(start + n) % count];
    if (g.finished || g.prefilled < g.prefill_target()) continue;
    const int64_t room = g.session->capacity() - g.session->committed_length();
    if (room < 1) {
      v1::GenerateEvent full;
      full.set_context_full(true);
      g.stream->Send(std::move(full));
      end(g, absl::OkStatus());
      continue;
    }
    if (rows_left < 1) continue;  // the cap is spent: next iteration
    model::SessionStep step;
    step.root = g.root;
    step.shape = g.policy != nullptr ? g.policy->Next(policies_->ContextFor(g)) : g.shape;
    // The verify batch (root + nodes) must fit behind the committed tokens and in the cap.
    step.shape.nodes =
        static_cast<int32_t>(std::min<int64_t>({step.shape.nodes, room - 1, rows_left - 1}));
    step.sampling = g.sampling;
    step.top_logprobs = g.logprobs;
    step.with_logprobs = g.logprobs > 0;
    rows_left -= step.shape.nodes + 1;
    take(g, std::move(step));
  }
  for (size_t n = 0; n < count && running.size() < limit; ++n) {
    Generation& g = *active[(start + n) % count];
    if (g.finished || g.prefilled >= g.prefill_target()) continue;
    const int64_t rows = std::min<int64_t>(
        {static_cast<int64_t>(g.prefill_target() - g.prefilled), prefill_left, rows_left});
    if (rows < 1) continue;  // the budget is spent: next iteration
    prefill_left -= rows;
    rows_left -= rows;
    model::SessionStep step;
    step.prefill.assign(g.prompt.begin() + static_cast<std::ptrdiff_t>(g.prefilled),
                        g.prompt.begin() + static_cast<std::ptrdiff_t>(g.prefilled + rows));
    take(g, std::move(step));
  }
  if (running.empty()) return;

  if (absl::Status residual = EnsureResidualLocked(); !residual.ok()) {
    for (Generation* g : running) end(*g, residual);
    return;
  }
  engine_.Step(sessions, steps);
  scheduler_iterations_.fetch_add(1);
  policies_->last_rows = 0;
  policies_->last_tokens = 0.0;
  for (auto& generation : active) {
    generation->last_rows = 0;
    generation->last_tokens = 0.0;
  }
  for (size_t i = 0; i < running.size(); ++i) {
    if (!steps[i].status.ok()) continue;
    running[i]->last_rows = steps[i].prefill.empty()
                                ? steps[i].tree.size()
                                : static_cast<int64_t>(steps[i].prefill.size());
    running[i]->last_tokens = static_cast<double>(steps[i].walk.tokens.size());
    policies_->last_rows += running[i]->last_rows;
    policies_->last_tokens += running[i]->last_tokens;
  }
  scheduler_steps_.fetch_add(static_cast<int64_t>(steps.size()));
  // Every step of an iteration reports the iteration's shared forwards: count them once.
  for (const model::SessionStep& step : steps) {
    if (!step.status.ok()) continue;
    forward_totals_.draft_ns.fetch_add(step.draft_ns);
    forward_totals_.verify_ns.fetch_add(step.verify_ns);
    forward_totals_.verify_forwards.fetch_add(1);
    forward_totals_.verify_rows.fetch_add(step.batch_rows);
    break;
  }

  for (size_t i = 0; i < running.size(); ++i) {
    Generation& g = *running[i];
    model::SessionStep& step = steps[i];
    if (!step.status.ok()) {
      end(g, ForwardErrorLocked(step.status));
      continue;
    }
    v1::GenerateEvent event;
    if (!step.prefill.empty()) {
      g.prefilled += step.prefill.size();
      event.set_prefilled(static_cast<int32_t>(g.session->committed_length()));
      if (!g.stream->Send(std::move(event))) end(g, absl::CancelledError("the client went away"));
      continue;
    }
    const std::vector<int32_t> depths = model::TreeDepths(step.tree.parents);
    const int32_t tree_depth = *std::max_element(depths.begin(), depths.end());
    const int32_t accepted_depth = static_cast<int32_t>(step.walk.path.size()) - 1;
    if (g.policy != nullptr) {
      const absl::Status recorded = g.policy->Record({.shape = step.shape,
                                                      .draft_ns = step.draft_ns,
                                                      .draft_forwards = step.tree.draft_forwards,
                                                      .verify_ns = step.verify_ns,
                                                      .verified_nodes = step.tree.size(),
                                                      .tree_depth = tree_depth,
                                                      .accepted_depth = accepted_depth,
                                                      .batch_rows = step.batch_rows});
      if (!recorded.ok()) spdlog::debug("adaptive policy: {}", recorded.ToString());
    }
    v1::StepReport& report = *event.mutable_step();
    report.set_tree_nodes(step.tree.size());
    report.set_tree_depth(tree_depth);
    report.set_accepted_depth(accepted_depth);
    report.set_draft_forwards(step.tree.draft_forwards);
    report.set_draft_ns(step.draft_ns);
    report.set_verify_ns(step.verify_ns);
    report.set_batch_rows(step.batch_rows);
    report.set_batch_generations(static_cast<int32_t>(running.size()));
    report.set_shape(g.policy != nullptr ? g.policy->Describe(policies_->ContextFor(g))
                                         : model::DescribeShape(step.shape));
    // Emitted up to the first end token or the max_tokens-th other token.
    bool done = false;
    for (size_t t = 0; t < step.walk.tokens.size() && !done; ++t) {
      const int32_t token = step.walk.tokens[t];
      event.add_tokens(token);
      *event.add_choices() = ToNodeChoice(step.choices[static_cast<size_t>(step.walk.path[t])]);
      if (g.end_tokens.contains(token)) {
        done = true;
      } else if (++g.generated >= g.max_tokens) {
        done = true;
      }
    }
    g.root = step.walk.tokens.back();
    if (!g.stream->Send(std::move(event))) {
      end(g, absl::CancelledError("the client went away"));
    } else if (done) {
      end(g, absl::OkStatus());
    }
  }
}

}  // namespace bitsplit::drafter
