#include "services/gpu-drafter/scheduler.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/speculation/policy.h"
#include "services/gpu-drafter/iteration_plan.h"
#include "spdlog/spdlog.h"

namespace bitsplit::drafter {
namespace v1 = bitsplit::internal::v1;
namespace {

v1::NodeChoice ToNodeChoice(const speculation::TargetChoice& choice) {
  v1::NodeChoice out;
  out.set_token(choice.token);
  out.set_logprob(choice.logprob);
  out.mutable_top_ids()->Add(choice.top_ids.begin(), choice.top_ids.end());
  out.mutable_top_logprobs()->Add(choice.top_logprobs.begin(), choice.top_logprobs.end());
  return out;
}

}  // namespace

// One generation: what was asked, and where it stands. Scheduler thread only, but for `stream`
// (shared with the reactor).
struct Scheduler::Generation {
  std::shared_ptr<GenerateStream> stream;
  GenerationRequest request;

  std::unique_ptr<speculation::SpeculativeSession> session;  // null until admitted
  size_t prefilled = 0;   // prompt tokens committed: all but the last before the first step
  int32_t root = 0;       // the next step's root (the token after the committed ones)
  int32_t generated = 0;  // emitted tokens outside end_tokens
  // Structured output: the request's constraint advanced past every emitted token.
  std::unique_ptr<speculation::TokenConstraint> constraint;
  speculation::AdaptivePolicy* policy = nullptr;  // adaptive: shared, or own_policy
  std::unique_ptr<speculation::AdaptivePolicy> own_policy;
  int64_t last_rows = 0;     // verifier rows it had in the last iteration
  double last_tokens = 0.0;  // tokens it emitted in the last iteration
  bool finished = false;
  absl::Status end_status;  // how its stream ends, once its session is closed

  size_t prefill_target() const { return request.prompt.size() - 1; }
  void End(const absl::Status& status) {
    if (finished) return;  // the first reason stands
    end_status = status;
    finished = true;
  }
};

// The adaptive policies of the generations, by tree bounds: costs are the machine's and
// acceptance the model's, so what one generation measured serves the next with the same bounds.
struct Scheduler::AdaptivePolicies {
  static constexpr size_t kMaxShared = 8;  // more distinct bounds get a policy each
  std::map<std::tuple<int32_t, int32_t, int32_t>, speculation::AdaptivePolicy> by_bounds;
  // The last iteration's verifier rows and emitted tokens, all generations': what the others
  // add to a generation's next iteration (speculation::BatchContext).
  int64_t last_rows = 0;
  double last_tokens = 0.0;
  // The verifier's experts (E, k; 0 for a dense model): the policies' verify cost model.
  int32_t num_experts = 0;
  int32_t experts_used = 0;

  speculation::BatchContext ContextFor(const Generation& g) const {
    return {.other_rows = static_cast<int32_t>(std::max<int64_t>(0, last_rows - g.last_rows)),
            .other_tokens = std::max(0.0, last_tokens - g.last_tokens)};
  }
  speculation::AdaptivePolicy* For(Generation& g) {
    const speculation::TreeShape& bounds = g.request.shape;
    const auto key = std::make_tuple(bounds.nodes, bounds.expansions, bounds.max_depth);
    auto found = by_bounds.find(key);
    if (found == by_bounds.end() && by_bounds.size() < kMaxShared) {
      found = by_bounds
                  .emplace(key, *speculation::MakeAdaptivePolicy(bounds, num_experts, experts_used))
                  .first;
    }
    if (found != by_bounds.end()) return &found->second;
    g.own_policy = std::make_unique<speculation::AdaptivePolicy>(
        *speculation::MakeAdaptivePolicy(bounds, num_experts, experts_used));
    return g.own_policy.get();
  }
};

Scheduler::Scheduler(DrafterEngine& engine, ResidualLink* residual_link,
                     const SchedulerOptions& options)
    : engine_(engine),
      residual_link_(residual_link),
      options_(options),
      policies_(std::make_unique<AdaptivePolicies>()) {
  const model::ModelConfig& config = engine_.info().config;
  policies_->num_experts = static_cast<int32_t>(config.num_experts);
  policies_->experts_used = static_cast<int32_t>(config.num_experts_used);
  thread_ = std::thread([this] { Loop(); });
}

Scheduler::~Scheduler() { Stop(); }

void Scheduler::Submit(std::shared_ptr<GenerateStream> stream, GenerationRequest request) {
  auto generation = std::make_unique<Generation>();
  generation->stream = std::move(stream);
  generation->root = request.prompt.back();
  if (request.constraint != nullptr) generation->constraint = request.constraint->Clone();
  generation->request = std::move(request);
  {
    std::lock_guard<std::mutex> lock(arriving_mutex_);
    if (!stopping_) {
      arriving_.push_back(std::move(generation));
      wake_.notify_one();
      return;
    }
  }
  generation->stream->End(absl::UnavailableError("the drafter is shutting down"));
}

void Scheduler::Stop() {
  {
    std::lock_guard<std::mutex> lock(arriving_mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

SchedulerCounters Scheduler::counters() const {
  std::lock_guard<std::mutex> lock(counters_mutex_);
  return counters_;
}

std::string Scheduler::residual_format() const {
  std::lock_guard<std::mutex> lock(counters_mutex_);
  return residual_format_;
}

uint64_t Scheduler::residual_bytes() const {
  std::lock_guard<std::mutex> lock(counters_mutex_);
  return residual_bytes_;
}

void Scheduler::Loop() {
  std::vector<std::unique_ptr<Generation>> active;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(arriving_mutex_);
      wake_.wait(lock, [&] { return stopping_ || !arriving_.empty() || !active.empty(); });
      for (auto& generation : arriving_) active.push_back(std::move(generation));
      arriving_.clear();
      if (stopping_) break;
    }
    RunIteration(active);
    for (auto& generation : active) {
      if (!generation->finished) continue;
      Close(*generation);
      generation->stream->End(generation->end_status);
      generation.reset();
    }
    std::erase(active, nullptr);
  }
  for (auto& generation : active) {
    Close(*generation);
    generation->stream->End(absl::UnavailableError("the drafter is shutting down"));
  }
  prefix_cache_.clear();
  cached_sessions_.store(0);
}

void Scheduler::RunIteration(std::vector<std::unique_ptr<Generation>>& active) {
  for (auto& generation : active) {
    Generation& g = *generation;
    if (g.stream->cancelled()) {
      g.End(absl::CancelledError("the client cancelled the generation"));
    } else if (g.session == nullptr) {
      Admit(g);
    }
  }
  std::vector<Generation*> running;
  std::vector<speculation::SessionStep> steps = TakeWork(active, running);
  if (running.empty()) return;
  if (absl::Status residual = EnsureResidual(); !residual.ok()) {
    for (Generation* g : running) g->End(residual);
    return;
  }
  std::vector<speculation::SpeculativeSession*> sessions;
  for (Generation* g : running) sessions.push_back(g->session.get());
  engine_.Step(sessions, steps);
  for (auto& generation : active) {  // what each took of this iteration, for the policies
    generation->last_rows = 0;
    generation->last_tokens = 0.0;
  }
  Count(running, steps);
  for (size_t i = 0; i < running.size(); ++i) {
    Emit(*running[i], steps[i], static_cast<int32_t>(running.size()));
  }
}

void Scheduler::Admit(Generation& g) {
  if (open_sessions_.load() >= options_.max_sessions) {
    g.End(absl::ResourceExhaustedError(absl::StrCat(
        "all ", options_.max_sessions, " sessions are in use; retry when one finishes")));
    return;
  }
  if (absl::Status residual = EnsureResidual(); !residual.ok()) {
    g.End(residual);
    return;
  }
  int64_t reused = 0;
  if (options_.prefix_cache && !g.request.skip_prefix_cache) {
    g.session = TakeCachedPrefix(g.request.prompt, g.request.context, reused);
    std::lock_guard<std::mutex> lock(counters_mutex_);
    ++counters_.prefix_lookups;
    if (g.session != nullptr) {
      ++counters_.prefix_hits;
      counters_.prefix_cached_tokens += reused;
    }
  }
  if (g.session == nullptr) {
    EvictFor(1);
    absl::StatusOr<std::unique_ptr<speculation::SpeculativeSession>> session =
        engine_.NewSession(g.request.context);
    if (!session.ok()) {
      g.End(session.status());
      return;
    }
    g.session = *std::move(session);
  }
  open_sessions_.fetch_add(1);
  if (g.request.adaptive) g.policy = policies_->For(g);
  if (reused > 0) {
    g.prefilled = static_cast<size_t>(reused);
    v1::GenerateEvent event;
    event.set_prefilled(static_cast<int32_t>(reused));
    event.set_cached(static_cast<int32_t>(reused));
    if (!g.stream->Send(std::move(event))) g.End(absl::CancelledError("the client went away"));
  }
}

void Scheduler::Close(Generation& g) {
  if (g.session == nullptr) return;
  // A session's committed rows are exact whatever ended the generation: a failed forward leaves
  // them unchanged (speculation::RunBatchedStep).
  if (options_.prefix_cache && g.session->committed_length() > 0) {
    prefix_cache_.push_front(std::move(g.session));
    cached_sessions_.fetch_add(1);
  }
  g.session.reset();
  open_sessions_.fetch_sub(1);
}

std::unique_ptr<speculation::SpeculativeSession> Scheduler::TakeCachedPrefix(
    const std::vector<int32_t>& prompt, int64_t context, int64_t& reused) {
  reused = 0;
  // All but the prompt's last token: that one is the first step's root, verified by the step.
  const size_t limit = prompt.size() - 1;
  auto best = prefix_cache_.end();
  size_t best_length = 0;
  for (auto it = prefix_cache_.begin(); it != prefix_cache_.end(); ++it) {
    const std::span<const int32_t> tokens = (*it)->committed_tokens();
    const size_t bound = std::min(limit, tokens.size());
    const size_t length = static_cast<size_t>(
        std::mismatch(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(bound),
                      prompt.begin())
            .first -
        tokens.begin());
    if (length > best_length) {  // strictly longer: ties go to the more recent
      best = it;
      best_length = length;
    }
  }
  if (best == prefix_cache_.end()) return nullptr;
  std::unique_ptr<speculation::SpeculativeSession> session = std::move(*best);
  prefix_cache_.erase(best);
  cached_sessions_.fetch_sub(1);
  if (absl::Status status = session->Reuse(static_cast<int64_t>(best_length), context);
      !status.ok()) {
    spdlog::debug("prefix cache: a kept session cannot serve the request: {}", status.ToString());
    return nullptr;
  }
  reused = static_cast<int64_t>(best_length);
  return session;
}

void Scheduler::EvictFor(int free_slots) {
  int evicted = 0;
  while (!prefix_cache_.empty() &&
         open_sessions_.load() + static_cast<int>(prefix_cache_.size()) + free_slots >
             options_.max_sessions) {
    prefix_cache_.pop_back();
    cached_sessions_.fetch_sub(1);
    ++evicted;
  }
  if (evicted == 0) return;
  std::lock_guard<std::mutex> lock(counters_mutex_);
  counters_.prefix_evictions += evicted;
}

std::vector<speculation::SessionStep> Scheduler::TakeWork(
    std::vector<std::unique_ptr<Generation>>& active, std::vector<Generation*>& running) {
  // The generations that can take work, and what each asks for.
  std::vector<Generation*> ready;
  std::vector<speculation::TreeShape> shapes;
  std::vector<GenerationDemand> demands;
  for (auto& generation : active) {
    Generation& g = *generation;
    if (g.finished || g.session == nullptr) continue;
    const speculation::TreeShape shape =
        g.policy != nullptr ? g.policy->Next(policies_->ContextFor(g)) : g.request.shape;
    ready.push_back(&g);
    shapes.push_back(shape);
    demands.push_back({.prompt_left = static_cast<int64_t>(g.prefill_target() - g.prefilled),
                       .room = g.session->capacity() - g.session->committed_length(),
                       .tree_nodes = shape.nodes});
  }
  // What one residual request carries bounds the iteration too (cpu-residual's --max-rows).
  int64_t rows = options_.max_batch_rows;
  if (residual_link_ != nullptr && residual_link_->attached_rows() > 0) {
    rows = std::min<int64_t>(rows, residual_link_->attached_rows());
  }
  const size_t first =
      ready.empty() ? 0 : static_cast<size_t>(counters().iterations) % ready.size();
  const std::vector<Assignment> plan = PlanIteration(
      demands, {.rows = rows,
                .prefill_rows = options_.prefill_rows,
                .generations = options_.max_batch_generations > 0
                                   ? static_cast<size_t>(options_.max_batch_generations)
                                   : ready.size(),
                .first = first});

  std::vector<speculation::SessionStep> steps;
  for (const Assignment& assignment : plan) {
    Generation& g = *ready[assignment.generation];
    speculation::SessionStep step;
    switch (assignment.kind) {
      case Assignment::Kind::kContextFull: {
        v1::GenerateEvent full;
        full.set_context_full(true);
        g.stream->Send(std::move(full));
        g.End(absl::OkStatus());
        continue;
      }
      case Assignment::Kind::kStep:
        step.root = g.root;
        step.shape = shapes[assignment.generation];
        step.shape.nodes = static_cast<int32_t>(assignment.rows);
        step.sampling = g.request.sampling;
        step.top_logprobs = g.request.logprobs;
        step.with_logprobs = g.request.logprobs > 0;
        step.constraint = g.constraint.get();
        break;
      case Assignment::Kind::kPrefill: {
        const auto begin = g.request.prompt.begin() + static_cast<std::ptrdiff_t>(g.prefilled);
        step.prefill.assign(begin, begin + static_cast<std::ptrdiff_t>(assignment.rows));
        break;
      }
    }
    running.push_back(&g);
    steps.push_back(std::move(step));
  }
  return steps;
}

void Scheduler::Count(std::span<Generation* const> running,
                      std::span<const speculation::SessionStep> steps) {
  policies_->last_rows = 0;
  policies_->last_tokens = 0.0;
  for (size_t i = 0; i < running.size(); ++i) {
    Generation& g = *running[i];
    const speculation::SessionStep& step = steps[i];
    if (!step.status.ok()) continue;
    g.last_rows =
        step.prefill.empty() ? step.tree.size() : static_cast<int64_t>(step.prefill.size());
    g.last_tokens = static_cast<double>(step.walk.tokens.size());
    policies_->last_rows += g.last_rows;
    policies_->last_tokens += g.last_tokens;
  }
  std::lock_guard<std::mutex> lock(counters_mutex_);
  ++counters_.iterations;
  counters_.steps += static_cast<int64_t>(steps.size());
  // Every step of an iteration reports the iteration's shared forwards: count them once.
  for (const speculation::SessionStep& step : steps) {
    if (!step.status.ok()) continue;
    counters_.draft_ns += step.draft_ns;
    counters_.verify_ns += step.verify_ns;
    counters_.verify_forwards += 1;
    counters_.verify_rows += step.batch_rows;
    break;
  }
}

void Scheduler::Emit(Generation& g, const speculation::SessionStep& step,
                     int32_t batch_generations) {
  if (!step.status.ok()) {
    g.End(ForwardError(step.status));
    return;
  }
  v1::GenerateEvent event;
  if (!step.prefill.empty()) {
    g.prefilled += step.prefill.size();
    event.set_prefilled(static_cast<int32_t>(g.session->committed_length()));
    if (!g.stream->Send(std::move(event))) g.End(absl::CancelledError("the client went away"));
    return;
  }
  const std::vector<int32_t> depths = speculation::TreeDepths(step.tree.parents);
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
  report.set_batch_generations(batch_generations);
  report.set_shape(g.policy != nullptr ? g.policy->Describe(policies_->ContextFor(g))
                                       : speculation::DescribeShape(step.shape));
  // Emitted up to the first end token or the max_tokens-th other token.
  bool done = false;
  for (size_t t = 0; t < step.walk.tokens.size() && !done; ++t) {
    const int32_t token = step.walk.tokens[t];
    // The target chose from the constraint's mask: a token it forbids is a bug.
    if (g.constraint != nullptr && !g.constraint->Advance(token)) {
      g.End(absl::InternalError("constrained decoding emitted a token its constraint forbids"));
      return;
    }
    event.add_tokens(token);
    *event.add_choices() = ToNodeChoice(step.choices[static_cast<size_t>(step.walk.path[t])]);
    done = g.request.end_tokens.contains(token) || ++g.generated >= g.request.max_tokens;
  }
  g.root = step.walk.tokens.back();
  if (!g.stream->Send(std::move(event))) {
    g.End(absl::CancelledError("the client went away"));
  } else if (done) {
    g.End(absl::OkStatus());
  }
}

absl::Status Scheduler::EnsureResidual() {
  if (residual_link_ == nullptr) return absl::OkStatus();
  if (absl::Status status = residual_link_->Ensure(); !status.ok()) return status;
  std::lock_guard<std::mutex> lock(counters_mutex_);
  residual_format_ = residual_link_->residual_format();
  residual_bytes_ = residual_link_->residual_bytes();
  return absl::OkStatus();
}

absl::Status Scheduler::ForwardError(const absl::Status& status) {
  if (residual_link_ == nullptr) return status;
  return residual_link_->OnForwardError(status);
}

}  // namespace bitsplit::drafter
