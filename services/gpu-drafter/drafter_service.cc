#include "services/gpu-drafter/drafter_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/rpc/channel_options.h"
#include "common/rpc/server_runner.h"
#include "common/speculation/policy.h"
#include "common/util/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "spdlog/spdlog.h"

namespace bitsplit::drafter {
namespace v1 = bitsplit::internal::v1;
namespace {

// A metrics scrape waits at most this long for cpu-residual's counters.
constexpr std::chrono::milliseconds kResidualStatsTimeout(1000);

v1::ResidualStats ToResidualStats(const v1::InfoResponse& info) {
  v1::ResidualStats stats;
  stats.set_requests_served(info.requests_served());
  stats.set_rows_served(info.rows_served());
  stats.set_weight_bytes_read(info.weight_bytes_read());
  stats.set_compute_ns(info.compute_ns());
  stats.set_attached_clients(info.attached_clients());
  stats.set_weight_bytes(info.weight_bytes());
  return stats;
}

}  // namespace

DrafterService::DrafterService(DrafterEngine& engine, ResidualLink* residual_link,
                               const DrafterServiceOptions& options)
    : engine_(engine),
      residual_link_(residual_link),
      options_(options),
      vocab_size_(engine.info().config.vocab_size),
      scheduler_(engine, residual_link, options.scheduling) {
  if (residual_link_ != nullptr) {
    residual_health_ = std::make_unique<rpc::HealthProbe>(residual_link_->target());
    residual_stats_stub_ = v1::Residual::NewStub(
        grpc::CreateCustomChannel(residual_link_->target(), grpc::InsecureChannelCredentials(),
                                  rpc::PeerChannelArguments(4 << 20)));
  }
}

absl::Status DrafterService::Readiness() const {
  if (scheduler_.open_sessions() >= scheduler_.max_sessions()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("all ", scheduler_.max_sessions(), " sessions are in use"));
  }
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

absl::Status DrafterService::CheckToken(int32_t token, const std::string& what) const {
  if (token < 0 || token >= vocab_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " (", token, ") is outside the vocabulary [0, ", vocab_size_, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<GenerationRequest> DrafterService::CheckRequest(
    const v1::GenerateRequest& request) const {
  GenerationRequest g;
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
  const v1::SamplingParams& sampling = request.sampling();
  g.sampling.temperature = sampling.temperature();
  g.sampling.top_k = sampling.top_k();
  // proto3 cannot tell an unset top_p from 0, which is no valid nucleus: unset means off.
  g.sampling.top_p = sampling.top_p() == 0.0f ? 1.0f : sampling.top_p();
  g.sampling.seed = sampling.seed();
  BITSPLIT_RETURN_IF_ERROR(model::ValidateSamplingParams(g.sampling));
  if (request.logprobs() < 0 || request.logprobs() > options_.max_logprobs) {
    return absl::InvalidArgumentError(absl::StrCat("logprobs ", request.logprobs(),
                                                   " is outside [0, ", options_.max_logprobs, "]"));
  }
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
  BITSPLIT_RETURN_IF_ERROR(speculation::ValidateTreeShape(g.shape, options_.max_tree_nodes - 1));
  g.adaptive = request.adaptive() && g.shape.nodes > 0;
  if (g.adaptive) {
    absl::StatusOr<speculation::AdaptivePolicy> policy = speculation::MakeAdaptivePolicy(g.shape);
    if (!policy.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("adaptive: ", policy.status().message()));
    }
  }
  g.skip_prefix_cache = request.skip_prefix_cache();
  if (request.json_object() || !request.response_schema().empty()) {
    if (request.json_object() && !request.response_schema().empty()) {
      return absl::InvalidArgumentError("json_object and response_schema exclude each other");
    }
    if (engine_.name() != "cpu" || options_.vocabulary == nullptr) {
      return absl::FailedPreconditionError(
          "structured output (constrained decoding) runs on the cpu backend only");
    }
    std::shared_ptr<const text::JsonConstraint> constraint;
    if (request.json_object()) {
      constraint =
          std::make_shared<const text::JsonConstraint>(text::JsonConstraint::AnyJsonObject());
    } else {
      const nlohmann::ordered_json schema =
          nlohmann::ordered_json::parse(request.response_schema(), nullptr, false);
      if (schema.is_discarded()) {
        return absl::InvalidArgumentError("response_schema is not valid JSON");
      }
      absl::StatusOr<text::JsonConstraint> compiled = text::JsonConstraint::FromSchema(schema);
      if (!compiled.ok()) {
        return absl::Status(compiled.status().code(),
                            absl::StrCat("response_schema: ", compiled.status().message()));
      }
      constraint = std::make_shared<const text::JsonConstraint>(*std::move(compiled));
    }
    std::vector<int32_t> prefix(request.response_prefix_tokens().begin(),
                                request.response_prefix_tokens().end());
    std::vector<int32_t> suffix(request.response_suffix_tokens().begin(),
                                request.response_suffix_tokens().end());
    for (const std::vector<int32_t>* frame : {&prefix, &suffix}) {
      for (int32_t token : *frame) {
        BITSPLIT_RETURN_IF_ERROR(CheckToken(token, "response prefix/suffix token"));
      }
    }
    g.constraint = std::make_shared<const JsonTokenConstraint>(
        constraint, options_.vocabulary, std::move(prefix), std::move(suffix));
  } else if (request.response_prefix_tokens_size() > 0 ||
             request.response_suffix_tokens_size() > 0) {
    return absl::InvalidArgumentError(
        "response prefix/suffix tokens frame a constrained document: they need response_schema "
        "or json_object");
  }
  return g;
}

void DrafterService::FillInfo(v1::DrafterInfo* response) const {
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
  response->set_max_sessions(scheduler_.max_sessions());
  response->set_open_sessions(scheduler_.open_sessions());
  response->set_max_tree_nodes(options_.max_tree_nodes);
  response->set_base_bytes(info.base_bytes);
  response->set_vram_plan(info.vram_plan);
  response->set_vram_budget_bytes(info.vram_budget_bytes);
  const SchedulerCounters counters = scheduler_.counters();
  response->set_scheduler_iterations(counters.iterations);
  response->set_scheduler_steps(counters.steps);
  response->set_prefill_rows(options_.scheduling.prefill_rows);
  response->set_draft_ns_total(counters.draft_ns);
  response->set_verify_ns_total(counters.verify_ns);
  response->set_verify_forwards(counters.verify_forwards);
  response->set_verify_rows(counters.verify_rows);
  response->set_prefix_cache(options_.scheduling.prefix_cache);
  response->set_cached_sessions(scheduler_.cached_sessions());
  response->set_prefix_lookups(counters.prefix_lookups);
  response->set_prefix_hits(counters.prefix_hits);
  response->set_prefix_cached_tokens(counters.prefix_cached_tokens);
  response->set_prefix_evictions(counters.prefix_evictions);
  if (residual_link_ == nullptr) {
    response->set_residual("in-process");
    response->set_residual_format(info.residual_format);
    response->set_residual_bytes(info.residual_bytes);
  } else {
    response->set_residual("shm " + residual_link_->target());
    response->set_residual_format(scheduler_.residual_format());
    response->set_residual_bytes(scheduler_.residual_bytes());
  }
}

grpc::ServerUnaryReactor* DrafterService::GetInfo(grpc::CallbackServerContext* context,
                                                  const v1::DrafterInfoRequest* request,
                                                  v1::DrafterInfo* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  FillInfo(response);
  if (!request->include_residual_stats() || residual_stats_stub_ == nullptr) {
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  // The info is complete without the counters: a failed call only leaves them out.
  struct Call {
    grpc::ClientContext context;
    v1::InfoResponse info;
  };
  auto call = std::make_shared<Call>();
  call->context.set_deadline(std::chrono::system_clock::now() + kResidualStatsTimeout);
  residual_stats_stub_->async()->Info(
      &call->context, &v1::InfoRequest::default_instance(), &call->info,
      [call, reactor, response](grpc::Status status) {
        if (status.ok()) {
          *response->mutable_residual_stats() = ToResidualStats(call->info);
        } else {
          spdlog::debug("cpu-residual's counters: {}", status.error_message());
        }
        reactor->Finish(grpc::Status::OK);
      });
  return reactor;
}

grpc::ServerWriteReactor<v1::GenerateEvent>* DrafterService::Generate(
    grpc::CallbackServerContext* /*context*/, const v1::GenerateRequest* request) {
  auto* reactor = new GenerateReactor();
  absl::StatusOr<GenerationRequest> checked = CheckRequest(*request);
  if (!checked.ok()) {
    reactor->stream()->End(checked.status());
  } else {
    scheduler_.Submit(reactor->stream(), *std::move(checked));
  }
  return reactor;
}

}  // namespace bitsplit::drafter
