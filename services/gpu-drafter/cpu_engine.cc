#include "services/gpu-drafter/cpu_engine.h"

#include <chrono>
#include <utility>
#include <vector>

#include "common/model/kv_cache.h"
#include "common/model/split_model.h"
#include "common/rpc/server_runner.h"
#include "common/util/status_macros.h"
#include "common/util/thread_pool.h"

namespace bitsplit::drafter {

absl::StatusOr<std::unique_ptr<CpuEngine>> CpuEngine::Create(const CpuEngineOptions& options) {
  std::unique_ptr<CpuEngine> engine(new CpuEngine());
  engine->options_ = options;
  BITSPLIT_ASSIGN_OR_RETURN(
      engine->model_,
      model::LlamaModel::LoadSplit(options.base_path, options.residual_path, options.threads));
  const model::LlamaModel& model = *engine->model_;
  EngineInfo& info = engine->info_;
  info = SplitModelInfo(*model.split_files(), options.base_path, options.residual_path);
  info.name = "cpu";
  info.kv_type = std::string(model::KvTypeName(options.kv_type));
  // A q8_0 cache needs whole blocks per head: refuse at start, not at the first request.
  BITSPLIT_RETURN_IF_ERROR(
      model::KvCache::Create(model.config(), /*capacity=*/1, options.kv_type).status());
  info.threads = model.num_threads();
  // Every forward reads all of the base (and the in-process residual): fault them in now, so
  // that the first request runs as fast as the second.
  const model::SplitModelFiles& files = *model.split_files();
  ThreadPool pool(model.num_threads(), std::chrono::nanoseconds(0));
  rpc::PrefaultWithProgress("bitsplit-drafter", options.base_path, files.base().image_data(),
                            files.base().image_size(), pool);
  if (files.residual() != nullptr) {
    rpc::PrefaultWithProgress("bitsplit-drafter", options.residual_path,
                              files.residual()->image_data(), files.residual()->image_size(), pool);
  }
  return engine;
}

absl::Status CpuEngine::SetResidualSource(model::ResidualSource* source) {
  if (info_.residual_in_process) {
    return absl::FailedPreconditionError("the residual is computed in process (--residual-file)");
  }
  return model_->SetResidualSource(source);
}

absl::StatusOr<std::unique_ptr<speculation::SpeculativeSession>> CpuEngine::NewSession(
    int64_t context) {
  BITSPLIT_ASSIGN_OR_RETURN(
      std::unique_ptr<speculation::CpuSpeculativeSession> session,
      speculation::CpuSpeculativeSession::Create(
          *model_, model::ForwardMode::kVerify, *model_, model::ForwardMode::kDraft,
          {.capacity = context, .kv_type = options_.kv_type}));
  return session;
}

uint64_t CpuEngine::SessionHostBytes(int64_t context) const {
  return model::KvCacheBytes(model_->config(), context, options_.kv_type);
}

void CpuEngine::Step(std::span<speculation::SpeculativeSession* const> sessions,
                     std::span<speculation::SessionStep> steps) {
  speculation::CpuSpeculativeSession::StepMany(
      OwnSessions<speculation::CpuSpeculativeSession>(sessions), steps);
}

}  // namespace bitsplit::drafter
