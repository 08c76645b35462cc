#include "common/cuda/cuda_session.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "common/util/status_macros.h"

namespace bitsplit::cuda {

using model::ForwardMode;

absl::StatusOr<std::unique_ptr<CudaSpeculativeSession>> CudaSpeculativeSession::Create(
    CudaModel& model, const Options& options) {
  const int64_t planned = model.options().context;
  const int64_t capacity = options.capacity == 0 ? planned : options.capacity;
  if (capacity < 1 || capacity > planned) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "context %d is outside [1, %d] (the tokens every session holds in the VRAM plan)", capacity,
        planned));
  }
  BITSPLIT_ASSIGN_OR_RETURN(std::unique_ptr<DeviceKvCache> cache, model.NewKvCache());
  return std::unique_ptr<CudaSpeculativeSession>(
      new CudaSpeculativeSession(model, std::move(cache), capacity));
}

absl::Status CudaSpeculativeSession::Reuse(int64_t length, int64_t capacity) {
  BITSPLIT_RETURN_IF_ERROR(speculation::ValidateReuse(length, capacity, committed_length(),
                                                      model_.config().context_length));
  if (capacity > cache_->capacity()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("context %d is beyond the %d tokens of the session's planned KV cache",
                        capacity, cache_->capacity()));
  }
  BITSPLIT_RETURN_IF_ERROR(cache_->Truncate(length));
  committed_tokens_.resize(static_cast<size_t>(length));
  capacity_ = capacity;
  return absl::OkStatus();
}

// RunBatchedStep over CudaSpeculativeSessions of one CudaModel; the draft's children and the
// target's choices are picked on the device, per sequence, from the shared forward's logits.
class CudaBatchedStep final : public speculation::BatchedStepModel {
 public:
  explicit CudaBatchedStep(std::span<CudaSpeculativeSession* const> sessions)
      : sessions_(sessions), model_(sessions[0]->model_), vocab_(model_.config().vocab_size) {
    for (const CudaSpeculativeSession* session : sessions) {
      BITSPLIT_CHECK(&session->model_ == &model_);
    }
  }

  int64_t vocab_size() const override { return vocab_; }
  int64_t committed_length(size_t i) const override { return sessions_[i]->committed_length(); }
  int64_t capacity(size_t i) const override { return sessions_[i]->capacity(); }
  int64_t max_draft_nodes(size_t i) const override {
    return std::min(sessions_[i]->capacity(), model_.options().max_batch_rows);
  }
  absl::Status PrepareDraft(size_t, const speculation::SessionStep&) override {
    return absl::OkStatus();  // the draft reads the verifier's KV
  }
  absl::Status DraftForward(std::span<const Sequence> sequences,
                            std::vector<speculation::DraftRowChoices>* children) override {
    BITSPLIT_RETURN_IF_ERROR(Forward(sequences, ForwardMode::kDraft));
    children->clear();
    int64_t at = 0;
    for (const Sequence& sequence : sequences) {
      const int64_t rows = sequence.batch->num_logit_rows();
      BITSPLIT_ASSIGN_OR_RETURN(
          speculation::DraftRowChoices top,
          model_.TopK(static_cast<int32_t>(std::min<int64_t>({sequence.top_k, 64, vocab_})), at,
                      rows));
      children->push_back(std::move(top));
      at += rows;
    }
    return absl::OkStatus();
  }
  void DiscardDraft(size_t i) override { sessions_[i]->cache_->DiscardPending(); }
  absl::Status VerifyForward(std::span<const Sequence> sequences) override {
    verified_.assign(sequences.begin(), sequences.end());
    logit_offsets_.clear();
    int64_t at = 0;
    for (const Sequence& sequence : sequences) {
      logit_offsets_.push_back(at);
      at += sequence.batch->num_logit_rows();
    }
    BITSPLIT_RETURN_IF_ERROR(Forward(sequences, ForwardMode::kVerify));
    const ForwardTimings& timings = model_.last_timings();
    for (const Sequence& sequence : sequences) {
      sessions_[sequence.session]->verify_forward_timings_ = timings;
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<speculation::TargetChoice>> Targets(
      size_t index, const speculation::SessionStep& step,
      std::span<const std::vector<uint64_t>> node_masks) override {
    if (!node_masks.empty()) {
      return absl::FailedPreconditionError(
          "constrained decoding runs on the cpu backend only: the cuda backend samples on the "
          "device, without token masks");
    }
    const Sequence& sequence = verified_[index];
    CudaSpeculativeSession& session = *sessions_[sequence.session];
    const model::Batch& batch = *sequence.batch;
    const size_t rows = static_cast<size_t>(batch.size());
    std::vector<int64_t> next_indices(rows);
    for (size_t i = 0; i < rows; ++i) {
      next_indices[i] = static_cast<int64_t>(batch.positions[i]) + 1;
    }
    BITSPLIT_ASSIGN_OR_RETURN(
        const std::vector<int32_t> targets,
        model_.ChooseTargets(step.sampling, next_indices, logit_offsets_[index]));
    std::vector<speculation::TargetChoice> choices(rows);
    for (size_t i = 0; i < rows; ++i) choices[i].token = targets[i];
    if (step.with_logprobs || step.top_logprobs > 0) {
      session.logits_.resize(rows * static_cast<size_t>(vocab_));
      BITSPLIT_RETURN_IF_ERROR(
          model_.CopyLogits(logit_offsets_[index], static_cast<int64_t>(rows), session.logits_));
      speculation::FillLogprobs(session.logits_, vocab_, step.sampling, step.top_logprobs,
                                session.sampler_, choices);
    }
    return choices;
  }
  void DiscardVerify(size_t i) override { sessions_[i]->cache_->DiscardPending(); }
  absl::Status CommitPrefill(size_t i, std::span<const int32_t> tokens) override {
    CudaSpeculativeSession& session = *sessions_[i];
    BITSPLIT_RETURN_IF_ERROR(session.cache_->Commit(static_cast<int64_t>(tokens.size())));
    session.committed_tokens_.insert(session.committed_tokens_.end(), tokens.begin(), tokens.end());
    return absl::OkStatus();
  }
  absl::Status CommitPath(size_t i, std::span<const int32_t> path,
                          std::span<const int32_t> tree_tokens) override {
    CudaSpeculativeSession& session = *sessions_[i];
    BITSPLIT_RETURN_IF_ERROR(session.cache_->CommitSlots(path));
    for (int32_t node : path) {
      session.committed_tokens_.push_back(tree_tokens[static_cast<size_t>(node)]);
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Forward(std::span<const Sequence> sequences, ForwardMode mode) {
    std::vector<DeviceSequence> device;
    device.reserve(sequences.size());
    for (const Sequence& sequence : sequences) {
      device.push_back({sequence.batch, sessions_[sequence.session]->cache_.get()});
    }
    return model_.ForwardSequences(device, mode);
  }

  std::span<CudaSpeculativeSession* const> sessions_;
  CudaModel& model_;
  const int64_t vocab_;
  std::vector<Sequence> verified_;      // the last VerifyForward's sequences
  std::vector<int64_t> logit_offsets_;  // their first logit row
};

void CudaSpeculativeSession::StepMany(std::span<CudaSpeculativeSession* const> sessions,
                                      std::span<speculation::SessionStep> steps) {
  BITSPLIT_CHECK(sessions.size() == steps.size());
  if (sessions.empty()) return;
  CudaBatchedStep model(sessions);
  speculation::RunBatchedStep(model, steps);
}

absl::Status CudaSpeculativeSession::Step(speculation::SessionStep& step) {
  CudaSpeculativeSession* const self[] = {this};
  StepMany(self, std::span<speculation::SessionStep>(&step, 1));
  return step.status;
}

}  // namespace bitsplit::cuda
