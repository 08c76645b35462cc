#include "common/speculation/cpu_session.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/util/status_macros.h"

namespace bitsplit::speculation {
namespace {

// The choices of one verified tree from its logits [tree size][vocab], each row masked by its
// node's mask where there is one (into `masked`, the constrained rows).
std::vector<TargetChoice> ChooseTargets(std::span<const float> logits, const model::Batch& batch,
                                        int64_t vocab, const model::SamplingParams& sampling,
                                        int32_t top_logprobs, bool with_logprobs,
                                        std::span<const std::vector<uint64_t>> node_masks,
                                        std::vector<float>& masked, model::Sampler& sampler) {
  if (!node_masks.empty()) {
    masked.assign(logits.begin(), logits.end());
    for (size_t i = 0; i < node_masks.size(); ++i) {
      if (node_masks[i].empty()) continue;
      model::MaskLogits(std::span<float>(masked).subspan(i * static_cast<size_t>(vocab),
                                                         static_cast<size_t>(vocab)),
                        node_masks[i]);
    }
    logits = masked;
  }
  std::vector<TargetChoice> choices(static_cast<size_t>(batch.size()));
  for (size_t i = 0; i < choices.size(); ++i) {
    const std::span<const float> row =
        logits.subspan(i * static_cast<size_t>(vocab), static_cast<size_t>(vocab));
    // The token after node i occupies sequence index (its position) + 1.
    choices[i].token = sampler.Choose(row, sampling, static_cast<int64_t>(batch.positions[i]) + 1);
  }
  if (with_logprobs || top_logprobs > 0) {
    FillLogprobs(logits, vocab, sampling, top_logprobs, sampler, choices);
  }
  return choices;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuSpeculativeSession>> CpuSpeculativeSession::Create(
    model::LlamaModel& target, model::ForwardMode target_mode, model::LlamaModel& draft,
    model::ForwardMode draft_mode, const Options& options) {
  if (!target.SupportsMode(target_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the target model cannot run in ",
                     std::string(model::ForwardModeName(target_mode)), " mode"));
  }
  if (!draft.SupportsMode(draft_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the draft model cannot run in ",
                     std::string(model::ForwardModeName(draft_mode)), " mode"));
  }
  const model::ModelConfig& t = target.config();
  const model::ModelConfig& d = draft.config();
  if (t.vocab_size != d.vocab_size) {
    return absl::FailedPreconditionError(
        absl::StrFormat("the draft model's vocabulary (%d) differs from the target's (%d)",
                        d.vocab_size, t.vocab_size));
  }
  if (options.draft_kv == DraftKv::kShared &&
      model::KvCache::LayerKvDims(t) != model::KvCache::LayerKvDims(d)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the draft model (%d layers x %d KV dims) cannot read the target's KV cache (%d x %d)",
        d.num_layers, d.KvDim(0), t.num_layers, t.KvDim(0)));
  }
  if (options.own_kv_chunk < 1) {
    return absl::InvalidArgumentError("the own KV's catch-up chunk must be at least 1 token");
  }
  if (options.capacity > t.context_length && t.context_length > 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a session of %d tokens exceeds the model's context length of %d",
                        options.capacity, t.context_length));
  }
  BITSPLIT_ASSIGN_OR_RETURN(model::KvCache cache,
                            target.NewKvCache(options.capacity, options.kv_type));
  std::unique_ptr<CpuSpeculativeSession> session(
      new CpuSpeculativeSession(target, target_mode, draft, draft_mode, options, std::move(cache)));
  if (options.draft_kv == DraftKv::kOwn) {
    BITSPLIT_ASSIGN_OR_RETURN(model::KvCache own,
                              draft.NewKvCache(options.capacity, options.kv_type));
    session->draft_cache_ = std::make_unique<model::KvCache>(std::move(own));
  }
  return session;
}

CpuSpeculativeSession::CpuSpeculativeSession(model::LlamaModel& target,
                                             model::ForwardMode target_mode,
                                             model::LlamaModel& draft,
                                             model::ForwardMode draft_mode, const Options& options,
                                             model::KvCache target_cache)
    : target_(target),
      target_mode_(target_mode),
      draft_(draft),
      draft_mode_(draft_mode),
      options_(options),
      target_cache_(std::move(target_cache)),
      capacity_(target_cache_.capacity()) {}

absl::Status CpuSpeculativeSession::Reuse(int64_t length, int64_t capacity) {
  BITSPLIT_RETURN_IF_ERROR(
      ValidateReuse(length, capacity, committed_length(), target_.config().context_length));
  BITSPLIT_RETURN_IF_ERROR(target_cache_.Truncate(length));
  BITSPLIT_RETURN_IF_ERROR(target_cache_.Grow(capacity));
  if (draft_cache_ != nullptr) {
    BITSPLIT_RETURN_IF_ERROR(
        draft_cache_->Truncate(std::min(length, draft_cache_->committed_length())));
    BITSPLIT_RETURN_IF_ERROR(draft_cache_->Grow(capacity));
  }
  committed_tokens_.resize(static_cast<size_t>(length));
  capacity_ = capacity;
  return absl::OkStatus();
}

absl::Status CpuSpeculativeSession::CatchUpDraftCache() {
  model::KvCache& cache = *draft_cache_;
  const int64_t begin = cache.committed_length();
  logits_.resize(static_cast<size_t>(draft_.config().vocab_size));
  return ForEachPrefillChunk(
      std::span<const int32_t>(committed_tokens_).subspan(static_cast<size_t>(begin)),
      options_.own_kv_chunk, begin, [&](const model::Batch& batch) {
        BITSPLIT_RETURN_IF_ERROR(draft_.Forward(batch, cache, logits_, draft_mode_));
        return cache.Commit(batch.size());
      });
}

// RunBatchedStep over CpuSpeculativeSessions of one target and draft model.
class CpuBatchedStep final : public BatchedStepModel {
 public:
  explicit CpuBatchedStep(std::span<CpuSpeculativeSession* const> sessions)
      : sessions_(sessions),
        target_(sessions[0]->target_),
        draft_(sessions[0]->draft_),
        target_mode_(sessions[0]->target_mode_),
        draft_mode_(sessions[0]->draft_mode_),
        vocab_(target_.config().vocab_size) {
    for (const CpuSpeculativeSession* session : sessions) {
      BITSPLIT_CHECK(&session->target_ == &target_ && &session->draft_ == &draft_ &&
                     session->target_mode_ == target_mode_ && session->draft_mode_ == draft_mode_);
    }
  }

  int64_t vocab_size() const override { return vocab_; }
  int64_t committed_length(size_t i) const override { return sessions_[i]->committed_length(); }
  int64_t capacity(size_t i) const override { return sessions_[i]->capacity(); }
  int64_t max_draft_nodes(size_t i) const override { return sessions_[i]->capacity(); }
  absl::Status PrepareDraft(size_t i, const SessionStep& step) override {
    // The own-KV ablation catches up one session at a time.
    if (sessions_[i]->draft_cache_ == nullptr || step.shape.nodes == 0) return absl::OkStatus();
    return sessions_[i]->CatchUpDraftCache();
  }
  absl::Status DraftForward(std::span<const Sequence> sequences,
                            std::vector<DraftRowChoices>* children) override {
    BITSPLIT_RETURN_IF_ERROR(Forward(draft_, draft_mode_, sequences, /*draft=*/true));
    children->clear();
    int64_t at = 0;
    for (const Sequence& sequence : sequences) {
      const int64_t rows = sequence.batch->num_logit_rows();  // every row of a draft batch
      std::span<const float> logits = RowsOfLogits(at, rows);
      if (!sequence.row_masks.empty()) {
        masked_logits_.assign(logits.begin(), logits.end());
        for (size_t r = 0; r < sequence.row_masks.size() && r < static_cast<size_t>(rows); ++r) {
          const std::vector<uint64_t>& mask = sequence.row_masks[r];
          // A row whose path the constraint refuses or ends is left as it is: its children are
          // never accepted either way.
          if (mask.empty()) continue;
          model::MaskLogits(
              std::span<float>(masked_logits_)
                  .subspan(r * static_cast<size_t>(vocab_), static_cast<size_t>(vocab_)),
              mask);
        }
        logits = masked_logits_;
      }
      children->push_back(TopDraftChoices(logits, rows, vocab_, sequence.top_k));
      at += rows;
    }
    return absl::OkStatus();
  }
  void DiscardDraft(size_t i) override { DraftCache(i).DiscardPending(); }
  absl::Status VerifyForward(std::span<const Sequence> sequences) override {
    logit_offsets_.clear();
    int64_t at = 0;
    for (const Sequence& sequence : sequences) {
      logit_offsets_.push_back(at);
      at += sequence.batch->num_logit_rows();
    }
    verified_.assign(sequences.begin(), sequences.end());
    return Forward(target_, target_mode_, sequences, /*draft=*/false);
  }
  absl::StatusOr<std::vector<TargetChoice>> Targets(
      size_t index, const SessionStep& step,
      std::span<const std::vector<uint64_t>> node_masks) override {
    const Sequence& sequence = verified_[index];
    CpuSpeculativeSession& session = *sessions_[sequence.session];
    return ChooseTargets(RowsOfLogits(logit_offsets_[index], sequence.batch->num_logit_rows()),
                         *sequence.batch, vocab_, step.sampling, step.top_logprobs,
                         step.with_logprobs, node_masks, masked_logits_, session.sampler_);
  }
  void DiscardVerify(size_t i) override { sessions_[i]->target_cache_.DiscardPending(); }
  absl::Status CommitPrefill(size_t i, std::span<const int32_t> tokens) override {
    CpuSpeculativeSession& session = *sessions_[i];
    BITSPLIT_RETURN_IF_ERROR(session.target_cache_.Commit(static_cast<int64_t>(tokens.size())));
    session.committed_tokens_.insert(session.committed_tokens_.end(), tokens.begin(), tokens.end());
    return absl::OkStatus();
  }
  absl::Status CommitPath(size_t i, std::span<const int32_t> path,
                          std::span<const int32_t> tree_tokens) override {
    CpuSpeculativeSession& session = *sessions_[i];
    BITSPLIT_RETURN_IF_ERROR(session.target_cache_.CommitSlots(path));
    for (int32_t node : path) {
      session.committed_tokens_.push_back(tree_tokens[static_cast<size_t>(node)]);
    }
    return absl::OkStatus();
  }

 private:
  model::KvCache& DraftCache(size_t i) {
    return sessions_[i]->draft_cache_ != nullptr ? *sessions_[i]->draft_cache_
                                                 : sessions_[i]->target_cache_;
  }
  std::span<const float> RowsOfLogits(int64_t first_row, int64_t rows) const {
    return std::span<const float>(logits_).subspan(static_cast<size_t>(first_row * vocab_),
                                                   static_cast<size_t>(rows * vocab_));
  }
  // ForwardSequences over `sequences`, the logit rows one after another in logits_.
  absl::Status Forward(model::LlamaModel& model, model::ForwardMode mode,
                       std::span<const Sequence> sequences, bool draft) {
    int64_t logit_rows = 0;
    for (const Sequence& sequence : sequences) logit_rows += sequence.batch->num_logit_rows();
    logits_.resize(static_cast<size_t>(logit_rows * vocab_));
    std::vector<model::SequenceForward> forwards;
    int64_t at = 0;
    for (const Sequence& sequence : sequences) {
      const int64_t rows = sequence.batch->num_logit_rows();
      forwards.push_back(
          {.batch = sequence.batch,
           .cache =
               draft ? &DraftCache(sequence.session) : &sessions_[sequence.session]->target_cache_,
           .logits = std::span<float>(logits_).subspan(static_cast<size_t>(at * vocab_),
                                                       static_cast<size_t>(rows * vocab_))});
      at += rows;
    }
    return model.ForwardSequences(forwards, mode);
  }

  std::span<CpuSpeculativeSession* const> sessions_;
  model::LlamaModel& target_;
  model::LlamaModel& draft_;
  const model::ForwardMode target_mode_;
  const model::ForwardMode draft_mode_;
  const int64_t vocab_;
  std::vector<float> logits_;
  std::vector<float> masked_logits_;    // constrained rows of one tree
  std::vector<Sequence> verified_;      // the last VerifyForward's sequences
  std::vector<int64_t> logit_offsets_;  // their first logit row in logits_
};

void CpuSpeculativeSession::StepMany(std::span<CpuSpeculativeSession* const> sessions,
                                     std::span<SessionStep> steps) {
  BITSPLIT_CHECK(sessions.size() == steps.size());
  if (sessions.empty()) return;
  CpuBatchedStep model(sessions);
  RunBatchedStep(model, steps);
}

absl::Status CpuSpeculativeSession::Step(SessionStep& step) {
  CpuSpeculativeSession* const self[] = {this};
  StepMany(self, std::span<SessionStep>(&step, 1));
  return step.status;
}

}  // namespace bitsplit::speculation
