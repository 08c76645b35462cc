#include "services/gpu-drafter/cpu_engine.h"

#include <filesystem>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/kv_cache.h"
#include "common/model/split_model.h"
#include "common/util/status_macros.h"

namespace bitsplit::drafter {
absl::StatusOr<std::unique_ptr<CpuEngine>> CpuEngine::Create(const CpuEngineOptions& options) {
  std::unique_ptr<CpuEngine> backend(new CpuEngine());
  backend->options_ = options;
  BITSPLIT_ASSIGN_OR_RETURN(
      backend->target_,
      model::LlamaModel::LoadSplit(options.base_path, options.residual_path, options.threads));
  if (!options.draft_model_path.empty()) {
    BITSPLIT_ASSIGN_OR_RETURN(backend->separate_draft_,
                              model::LlamaModel::Load(options.draft_model_path, options.threads));
  }
  const model::LlamaModel& target = *backend->target_;
  const model::SplitModelFiles& files = *target.split_files();
  EngineInfo& info = backend->info_;
  info = SplitModelInfo(files, options.base_path, options.residual_path);
  info.name = "cpu";
  info.draft_model = options.draft_model_path.empty() ? "base" : options.draft_model_path;
  info.draft_kv = options.draft_kv;
  info.threads = target.num_threads();
  // A first session proves that the draft model fits the target (vocabulary, KV shape) now
  // rather than at the first request. Verify mode may still be missing (remote residual).
  if (backend->separate_draft_ != nullptr) {
    auto probe = model::CpuSpeculativeSession::Create(
        *backend->target_, model::ForwardMode::kDraft, *backend->separate_draft_,
        model::ForwardMode::kReference, {.capacity = 8, .draft_kv = options.draft_kv});
    if (!probe.ok()) {
      return absl::Status(probe.status().code(),
                          absl::StrCat(options.draft_model_path, ": ", probe.status().message()));
    }
  }
  return backend;
}

absl::Status CpuEngine::SetResidualSource(model::ResidualSource* source) {
  if (info_.residual_in_process) {
    return absl::FailedPreconditionError("the residual is computed in process (--residual-file)");
  }
  return target_->SetResidualSource(source);
}

absl::StatusOr<std::unique_ptr<model::SpeculativeSession>> CpuEngine::NewSession(int64_t context) {
  model::LlamaModel& draft = separate_draft_ != nullptr ? *separate_draft_ : *target_;
  const model::ForwardMode draft_mode =
      separate_draft_ != nullptr ? model::ForwardMode::kReference : model::ForwardMode::kDraft;
  BITSPLIT_ASSIGN_OR_RETURN(
      std::unique_ptr<model::CpuSpeculativeSession> session,
      model::CpuSpeculativeSession::Create(*target_, model::ForwardMode::kVerify, draft, draft_mode,
                                           {.capacity = context,
                                            .prefill_chunk = options_.prefill_chunk,
                                            .draft_kv = options_.draft_kv}));
  return session;
}

uint64_t CpuEngine::SessionHostBytes(int64_t context) const {
  uint64_t bytes = model::KvCacheBytes(target_->config(), context);
  if (options_.draft_kv == model::DraftKv::kOwn) {
    const model::LlamaModel& draft = separate_draft_ != nullptr ? *separate_draft_ : *target_;
    bytes += model::KvCacheBytes(draft.config(), context);
  }
  return bytes;
}

void CpuEngine::Step(std::span<model::SpeculativeSession* const> sessions,
                     std::span<model::SessionStep> steps) {
  model::CpuSpeculativeSession::StepMany(OwnSessions<model::CpuSpeculativeSession>(sessions),
                                         steps);
}

}  // namespace bitsplit::drafter
