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

}  // namespace bitsplit::cuda
