#include "services/gpu-drafter/cuda_engine.h"

#include <algorithm>
#include <filesystem>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cuda/cuda_session.h"
#include "common/model/vram_plan.h"
#include "common/speculation/session.h"
#include "common/util/status_macros.h"

namespace bitsplit::drafter {
namespace {

// "base weights: 2.19 GiB" per slab, then "total: 6.81 GiB of a 7.50 GiB budget".
std::string PlanLines(const model::VramPlan& plan) {
  std::string lines;
  for (const model::VramItem& item : plan.Items()) {
    absl::StrAppend(&lines, item.name, ": ", model::FormatBytes(item.bytes), "\n");
  }
  absl::StrAppend(&lines, "total: ", model::FormatBytes(plan.total_bytes), " of a ",
                  model::FormatBytes(plan.budget_bytes), " budget");
  return lines;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaEngine>> CudaEngine::Create(const CudaEngineOptions& options) {
  std::unique_ptr<CudaEngine> backend(new CudaEngine());
  backend->options_ = options;
  BITSPLIT_ASSIGN_OR_RETURN(backend->files_,
                            model::SplitModelFiles::Open(options.base_path, options.residual_path));
  const model::SplitModelFiles& files = *backend->files_;
  const model::ModelConfig& config = files.config();
  // The planner rejects a context beyond the model's; the service's flag check says it better.
  const int64_t context = config.context_length > 0
                              ? std::min<int64_t>(options.context, config.context_length)
                              : options.context;
  BITSPLIT_ASSIGN_OR_RETURN(
      backend->model_,
      cuda::CudaModel::Create(
          files, {.device = 0,
                  .context = context,
                  .sessions = options.sessions,
                  .max_sessions = options.max_sessions,
                  .max_batch_rows = std::max(options.max_batch_rows, options.max_tree_nodes + 1),
                  .vram_budget = options.vram_budget,
                  .host_threads = options.threads,
                  .kv_type = options.kv_type}));
  if (files.residual_linear() != nullptr) {
    backend->in_process_residual_ =
        std::make_unique<model::InProcessResidual>(*files.residual_linear());
    backend->model_->SetResidualSource(backend->in_process_residual_.get());
  }

  EngineInfo& info = backend->info_;
  info = SplitModelInfo(files, options.base_path, options.residual_path);
  info.name = "cuda";
  info.kv_type = std::string(model::KvTypeName(options.kv_type));
  info.threads = options.threads > 0
                     ? options.threads
                     : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const model::VramPlan& plan = backend->model_->plan();
  info.device = backend->model_->device_name();
  info.vram_plan = PlanLines(plan);
  info.vram_summary = plan.ToString();
  info.vram_budget_bytes = plan.budget_bytes;
  info.planned_sessions = plan.sessions;
  return backend;
}

absl::Status CudaEngine::SetResidualSource(model::ResidualSource* source) {
  if (info_.residual_in_process) {
    return absl::FailedPreconditionError("the residual is computed in process (--residual-file)");
  }
  model_->SetResidualSource(source);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<speculation::SpeculativeSession>> CudaEngine::NewSession(
    int64_t context) {
  // A session of `context` tokens checks arguments as a CPU session of that capacity would.
  BITSPLIT_ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaSpeculativeSession> session,
                            cuda::CudaSpeculativeSession::Create(*model_, {.capacity = context}));
  return session;
}

void CudaEngine::Step(std::span<speculation::SpeculativeSession* const> sessions,
                      std::span<speculation::SessionStep> steps) {
  cuda::CudaSpeculativeSession::StepMany(OwnSessions<cuda::CudaSpeculativeSession>(sessions),
                                         steps);
}

}  // namespace bitsplit::drafter
