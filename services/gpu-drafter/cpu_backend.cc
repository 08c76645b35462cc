#include "services/gpu-drafter/cpu_backend.h"

#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/model/split_model.h"
#include "common/util/status_macros.h"

namespace bitsplit::drafter {
namespace {

class CpuSession final : public BackendSession {
 public:
  explicit CpuSession(std::unique_ptr<model::SpeculativeSession> session)
      : session_(std::move(session)) {}

  absl::Status Prefill(std::span<const int32_t> tokens) override {
    return session_->Prefill(tokens);
  }
  absl::StatusOr<model::DraftTree> Draft(int32_t root, const model::TreeShape& shape) override {
    return session_->Draft(root, shape);
  }
  absl::StatusOr<std::vector<model::TargetChoice>> Verify(std::span<const int32_t> tokens,
                                                          std::span<const int32_t> parents,
                                                          const model::SamplingParams& sampling,
                                                          int32_t top_logprobs,
                                                          bool with_logprobs) override {
    return session_->Verify(tokens, parents, sampling, top_logprobs, with_logprobs);
  }
  absl::Status Commit(std::span<const int32_t> path) override { return session_->Commit(path); }
  int64_t committed_length() const override { return session_->committed_length(); }
  int64_t capacity() const override { return session_->capacity(); }

 private:
  std::unique_ptr<model::SpeculativeSession> session_;
};

uint64_t FileBytes(const std::string& path) {
  std::error_code error;
  const uintmax_t size = std::filesystem::file_size(path, error);
  return error ? 0 : static_cast<uint64_t>(size);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(const CpuBackendOptions& options) {
  std::unique_ptr<CpuBackend> backend(new CpuBackend());
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
  BackendInfo& info = backend->info_;
  info.name = "cpu";
  auto general_name = target.gguf_metadata().GetString("general.name");
  info.model_name = general_name.ok()
                        ? *general_name
                        : std::filesystem::path(options.base_path).filename().string();
  info.config = target.config();
  info.base_format = model::SplitQuantizationString(files.quantization());
  info.fingerprint = files.base().fingerprint_hex();
  info.draft_model = options.draft_model_path.empty() ? "base" : options.draft_model_path;
  info.draft_kv = options.draft_kv;
  info.threads = target.num_threads();
  info.base_bytes = FileBytes(options.base_path);
  if (!options.residual_path.empty()) {
    info.residual_in_process = true;
    info.residual_format = info.base_format;
    info.residual_bytes = FileBytes(options.residual_path);
  }
  // A first session proves that the draft model fits the target (vocabulary, KV shape) now
  // rather than at the first request. Verify mode may still be missing (remote residual).
  if (backend->separate_draft_ != nullptr) {
    auto probe = model::SpeculativeSession::Create(
        *backend->target_, model::ForwardMode::kDraft, *backend->separate_draft_,
        model::ForwardMode::kReference, {.capacity = 8, .draft_kv = options.draft_kv});
    if (!probe.ok()) {
      return absl::Status(probe.status().code(),
                          absl::StrCat(options.draft_model_path, ": ", probe.status().message()));
    }
  }
  return backend;
}

absl::Status CpuBackend::SetResidualSource(model::ResidualSource* source) {
  if (info_.residual_in_process) {
    return absl::FailedPreconditionError("the residual is computed in process (--residual-file)");
  }
  return target_->SetResidualSource(source);
}

absl::StatusOr<std::unique_ptr<BackendSession>> CpuBackend::NewSession(int64_t context) {
  model::LlamaModel& draft = separate_draft_ != nullptr ? *separate_draft_ : *target_;
  const model::ForwardMode draft_mode =
      separate_draft_ != nullptr ? model::ForwardMode::kReference : model::ForwardMode::kDraft;
  BITSPLIT_ASSIGN_OR_RETURN(
      std::unique_ptr<model::SpeculativeSession> session,
      model::SpeculativeSession::Create(*target_, model::ForwardMode::kVerify, draft, draft_mode,
                                        {.capacity = context,
                                         .prefill_chunk = options_.prefill_chunk,
                                         .draft_kv = options_.draft_kv}));
  return std::make_unique<CpuSession>(std::move(session));
}

}  // namespace bitsplit::drafter
