#include "common/cuda/cuda_session.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/util/elapsed.h"
#include "common/util/status_macros.h"

namespace bitsplit::cuda {
namespace {

using Clock = std::chrono::steady_clock;
using model::Batch;
using model::ForwardMode;

}  // namespace

absl::StatusOr<std::unique_ptr<CudaSpeculativeSession>> CudaSpeculativeSession::Create(
    CudaModel& model, const Options& options) {
  if (options.prefill_chunk < 1) {
    return absl::InvalidArgumentError("the prefill chunk must be at least 1 token");
  }
  const int64_t planned = model.options().context;
  const int64_t capacity = options.capacity == 0 ? planned : options.capacity;
  if (capacity < 1 || capacity > planned) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "context %d is outside [1, %d] (the tokens every session holds in the VRAM plan)", capacity,
        planned));
  }
  BITSPLIT_ASSIGN_OR_RETURN(std::unique_ptr<DeviceKvCache> cache, model.NewKvCache());
  return std::unique_ptr<CudaSpeculativeSession>(
      new CudaSpeculativeSession(model, options, std::move(cache), capacity));
}

absl::Status CudaSpeculativeSession::Prefill(std::span<const int32_t> tokens) {
  const Clock::time_point start = Clock::now();
  const int64_t start_length = cache_->committed_length();
  BITSPLIT_RETURN_IF_ERROR(
      model::ValidatePrefill(tokens, model_.config().vocab_size, start_length, capacity()));
  pending_tokens_.clear();
  pending_parents_.clear();
  const absl::Status status = model::ForEachPrefillChunk(
      tokens, std::min(options_.prefill_chunk, model_.options().max_batch_rows), start_length,
      [&](const Batch& batch) {
        BITSPLIT_RETURN_IF_ERROR(model_.Forward(batch, *cache_, ForwardMode::kVerify));
        return cache_->Commit(batch.size());
      });
  if (!status.ok()) {
    BITSPLIT_CHECK(cache_->Truncate(start_length).ok());
    return status;
  }
  committed_tokens_.insert(committed_tokens_.end(), tokens.begin(), tokens.end());
  timings_.prefill_ns = NanosSince(start);
  return absl::OkStatus();
}

absl::StatusOr<model::DraftTree> CudaSpeculativeSession::Draft(int32_t root,
                                                               const model::TreeShape& shape) {
  const Clock::time_point start = Clock::now();
  const int64_t vocab = model_.config().vocab_size;
  BITSPLIT_RETURN_IF_ERROR(model::ValidateDraftRequest(
      root, shape, vocab, std::min(capacity(), model_.options().max_batch_rows),
      cache_->committed_length(), capacity()));
  pending_tokens_.clear();
  pending_parents_.clear();
  // The children are picked on the device; only their ids and logits come back.
  auto forward = [&](const Batch& batch, int32_t k) -> absl::StatusOr<model::DraftRowChoices> {
    BITSPLIT_RETURN_IF_ERROR(model_.Forward(batch, *cache_, ForwardMode::kDraft));
    return model_.TopK(static_cast<int32_t>(std::min<int64_t>({k, 64, vocab})));
  };
  absl::StatusOr<model::DraftTree> tree =
      model::GrowDraftTree(root, shape, cache_->committed_length(), forward);
  cache_->DiscardPending();
  timings_.draft_ns = NanosSince(start);
  return tree;
}

absl::StatusOr<std::vector<model::TargetChoice>> CudaSpeculativeSession::Verify(
    std::span<const int32_t> tokens, std::span<const int32_t> parents,
    const model::SamplingParams& sampling, int32_t top_logprobs, bool with_logprobs) {
  const Clock::time_point start = Clock::now();
  const int64_t vocab = model_.config().vocab_size;
  const int64_t length = cache_->committed_length();
  BITSPLIT_RETURN_IF_ERROR(model::ValidateVerifyRequest(
      tokens, parents, sampling, top_logprobs, vocab,
      std::min(capacity(), model_.options().max_batch_rows), length, capacity()));
  pending_tokens_.clear();
  pending_parents_.clear();
  BITSPLIT_ASSIGN_OR_RETURN(Batch batch,
                            Batch::Tree(tokens, parents, static_cast<int32_t>(length)));
  BITSPLIT_RETURN_IF_ERROR(model_.Forward(batch, *cache_, ForwardMode::kVerify));
  verify_forward_timings_ = model_.last_timings();
  std::vector<int64_t> next_indices(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    next_indices[i] = static_cast<int64_t>(batch.positions[i]) + 1;
  }
  BITSPLIT_ASSIGN_OR_RETURN(const std::vector<int32_t> targets,
                            model_.ChooseTargets(sampling, next_indices));
  std::vector<model::TargetChoice> choices(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) choices[i].token = targets[i];
  if (with_logprobs || top_logprobs > 0) {
    logits_.resize(tokens.size() * static_cast<size_t>(vocab));
    BITSPLIT_RETURN_IF_ERROR(model_.CopyLogits(logits_));
    model::FillLogprobs(logits_, vocab, sampling, top_logprobs, sampler_, choices);
  }
  pending_tokens_.assign(tokens.begin(), tokens.end());
  pending_parents_.assign(parents.begin(), parents.end());
  timings_.verify_ns = NanosSince(start);
  return choices;
}

absl::Status CudaSpeculativeSession::Commit(std::span<const int32_t> path) {
  BITSPLIT_RETURN_IF_ERROR(model::ValidateCommitPath(path, pending_parents_));
  BITSPLIT_RETURN_IF_ERROR(cache_->CommitSlots(path));
  for (int32_t node : path) committed_tokens_.push_back(pending_tokens_[static_cast<size_t>(node)]);
  pending_tokens_.clear();
  pending_parents_.clear();
  return absl::OkStatus();
}

// RunBatchedStep over CudaSpeculativeSessions of one CudaModel; the draft's children and the
// target's choices are picked on the device, per sequence, from the shared forward's logits.
class CudaBatchedStep final : public model::BatchedStepModel {
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
  void ClearPendingTree(size_t i) override {
    sessions_[i]->pending_tokens_.clear();
    sessions_[i]->pending_parents_.clear();
  }
  absl::Status PrepareDraft(size_t, const model::SessionStep&) override {
    return absl::OkStatus();  // the draft reads the verifier's KV
  }
  absl::Status DraftForward(std::span<const Sequence> sequences,
                            std::vector<model::DraftRowChoices>* children) override {
    BITSPLIT_RETURN_IF_ERROR(Forward(sequences, ForwardMode::kDraft));
    children->clear();
    int64_t at = 0;
    for (const Sequence& sequence : sequences) {
      const int64_t rows = sequence.batch->num_logit_rows();
      BITSPLIT_ASSIGN_OR_RETURN(
          model::DraftRowChoices top,
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
  absl::StatusOr<std::vector<model::TargetChoice>> Targets(
      size_t index, const model::SessionStep& step) override {
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
    std::vector<model::TargetChoice> choices(rows);
    for (size_t i = 0; i < rows; ++i) choices[i].token = targets[i];
    if (step.with_logprobs || step.top_logprobs > 0) {
      session.logits_.resize(rows * static_cast<size_t>(vocab_));
      BITSPLIT_RETURN_IF_ERROR(
          model_.CopyLogits(logit_offsets_[index], static_cast<int64_t>(rows), session.logits_));
      model::FillLogprobs(session.logits_, vocab_, step.sampling, step.top_logprobs,
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
                                      std::span<model::SessionStep> steps) {
  BITSPLIT_CHECK(sessions.size() == steps.size());
  if (sessions.empty()) return;
  CudaBatchedStep model(sessions);
  model::RunBatchedStep(model, steps);
}

}  // namespace bitsplit::cuda
