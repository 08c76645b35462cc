#include "services/gpu-drafter/cuda_backend.h"

#include <algorithm>
#include <filesystem>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cuda/cuda_session.h"
#include "common/model/speculation.h"
#include "common/model/vram_plan.h"
#include "common/util/status_macros.h"

namespace bitsplit::drafter {
namespace {

// A device session holds the planned context; this one accepts what its OpenSession asked for,
// with the cpu backend's checks and messages (SpeculativeSession), so a session behaves the same
// on either backend.
class CudaSession final : public BackendSession {
 public:
  CudaSession(std::unique_ptr<cuda::CudaSpeculativeSession> session, int64_t context,
              int64_t vocab_size, std::mutex& cache_mutex)
      : session_(std::move(session)),
        context_(context),
        vocab_size_(vocab_size),
        cache_mutex_(cache_mutex) {}
  ~CudaSession() override {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    session_.reset();
  }

  absl::Status Prefill(std::span<const int32_t> tokens) override {
    const int64_t length = session_->committed_length();
    if (static_cast<int64_t>(tokens.size()) > context_ - length) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("%d prompt tokens do not fit: the session holds %d of %d tokens",
                          tokens.size(), length, context_));
    }
    return session_->Prefill(tokens);
  }
  absl::StatusOr<model::DraftTree> Draft(int32_t root, const model::TreeShape& shape) override {
    BITSPLIT_RETURN_IF_ERROR(model::ValidateTreeShape(shape, static_cast<int32_t>(context_)));
    const int64_t length = session_->committed_length();
    if (shape.nodes > 0 && length + shape.nodes + 1 > context_) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("a tree of %d nodes does not fit: the session holds %d of %d tokens",
                          shape.nodes + 1, length, context_));
    }
    return session_->Draft(root, shape);
  }
  absl::StatusOr<std::vector<model::TargetChoice>> Verify(std::span<const int32_t> tokens,
                                                          std::span<const int32_t> parents,
                                                          const model::SamplingParams& sampling,
                                                          int32_t top_logprobs,
                                                          bool with_logprobs) override {
    BITSPLIT_RETURN_IF_ERROR(model::ValidateSamplingParams(sampling));
    BITSPLIT_RETURN_IF_ERROR(model::ValidateTree(tokens, parents, vocab_size_, context_));
    const int64_t length = session_->committed_length();
    if (length + static_cast<int64_t>(tokens.size()) > context_) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("a tree of %d nodes does not fit: the session holds %d of %d tokens",
                          tokens.size(), length, context_));
    }
    return session_->Verify(tokens, parents, sampling, top_logprobs, with_logprobs);
  }
  absl::Status Commit(std::span<const int32_t> path) override { return session_->Commit(path); }
  int64_t committed_length() const override { return session_->committed_length(); }
  int64_t capacity() const override { return context_; }

 private:
  std::unique_ptr<cuda::CudaSpeculativeSession> session_;
  const int64_t context_;
  const int64_t vocab_size_;
  std::mutex& cache_mutex_;
};

uint64_t FileBytes(const std::string& path) {
  std::error_code error;
  const uintmax_t size = std::filesystem::file_size(path, error);
  return error ? 0 : static_cast<uint64_t>(size);
}

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

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    const CudaBackendOptions& options) {
  std::unique_ptr<CudaBackend> backend(new CudaBackend());
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
                  .max_batch_rows = std::max(options.max_tree_nodes + 1, options.prefill_chunk),
                  .vram_budget = options.vram_budget,
                  .host_threads = options.threads}));
  if (files.residual_linear() != nullptr) {
    backend->in_process_residual_ =
        std::make_unique<model::InProcessResidual>(*files.residual_linear());
    backend->model_->SetResidualSource(backend->in_process_residual_.get());
  }

  BackendInfo& info = backend->info_;
  info.name = "cuda";
  auto general_name = files.gguf_metadata().GetString("general.name");
  info.model_name = general_name.ok()
                        ? *general_name
                        : std::filesystem::path(options.base_path).filename().string();
  info.config = config;
  info.base_format = model::SplitQuantizationString(files.quantization());
  info.fingerprint = files.base().fingerprint_hex();
  info.draft_model = "base";
  info.draft_kv = model::DraftKv::kShared;
  info.threads = options.threads > 0
                     ? options.threads
                     : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  info.base_bytes = FileBytes(options.base_path);
  if (!options.residual_path.empty()) {
    info.residual_in_process = true;
    info.residual_format = info.base_format;
    info.residual_bytes = FileBytes(options.residual_path);
  }
  const model::VramPlan& plan = backend->model_->plan();
  info.device = backend->model_->device_name();
  info.vram_plan = PlanLines(plan);
  info.vram_summary = plan.ToString();
  info.vram_budget_bytes = plan.budget_bytes;
  return backend;
}

absl::Status CudaBackend::SetResidualSource(model::ResidualSource* source) {
  if (info_.residual_in_process) {
    return absl::FailedPreconditionError("the residual is computed in process (--residual-file)");
  }
  model_->SetResidualSource(source);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<BackendSession>> CudaBackend::NewSession(int64_t context) {
  const int64_t planned = model_->options().context;
  if (context < 1 || context > planned) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "context %d is outside [1, %d] (the tokens every session holds in the VRAM plan)", context,
        planned));
  }
  std::lock_guard<std::mutex> lock(cache_mutex_);
  BITSPLIT_ASSIGN_OR_RETURN(
      std::unique_ptr<cuda::CudaSpeculativeSession> session,
      cuda::CudaSpeculativeSession::Create(*model_, {.prefill_chunk = options_.prefill_chunk}));
  return std::make_unique<CudaSession>(std::move(session), context, info_.config.vocab_size,
                                       cache_mutex_);
}

}  // namespace bitsplit::drafter
