#include "common/speculation/session.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/util/elapsed.h"
#include "common/util/status_macros.h"

namespace bitsplit::speculation {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<int32_t> TargetTokens(std::span<const TargetChoice> choices) {
  std::vector<int32_t> tokens;
  for (const TargetChoice& choice : choices) tokens.push_back(choice.token);
  return tokens;
}

}  // namespace

absl::Status ValidateReuse(int64_t length, int64_t capacity, int64_t committed_length,
                           int64_t context_length) {
  if (length < 0 || length > committed_length) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot keep %d tokens of a session holding %d", length, committed_length));
  }
  if (capacity <= length) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a capacity of %d tokens leaves no room after the %d kept", capacity, length));
  }
  if (context_length > 0 && capacity > context_length) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a session of %d tokens exceeds the model's context length of %d", capacity,
                        context_length));
  }
  return absl::OkStatus();
}

absl::Status ValidatePrefill(std::span<const int32_t> tokens, int64_t vocab_size, int64_t length,
                             int64_t capacity) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "prompt token %d is %d, outside the vocabulary [0, %d)", i, tokens[i], vocab_size));
    }
  }
  if (static_cast<int64_t>(tokens.size()) > capacity - length) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%d prompt tokens do not fit: the session holds %d of %d tokens",
                        tokens.size(), length, capacity));
  }
  return absl::OkStatus();
}

absl::Status ValidateDraftRequest(int32_t root, const TreeShape& shape, int64_t vocab_size,
                                  int64_t max_nodes, int64_t length, int64_t capacity) {
  if (root < 0 || root >= vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("root token %d is outside the vocabulary [0, %d)", root, vocab_size));
  }
  BITSPLIT_RETURN_IF_ERROR(
      ValidateTreeShape(shape, static_cast<int32_t>(std::min<int64_t>(max_nodes - 1, INT32_MAX))));
  // The whole tree must fit in the pending region for the draft forwards and for Verify.
  if (shape.nodes > 0 && length + shape.nodes + 1 > capacity) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("a tree of %d nodes does not fit: the session holds %d of %d tokens",
                        shape.nodes + 1, length, capacity));
  }
  return absl::OkStatus();
}

absl::Status ValidateTargetSampling(const model::SamplingParams& sampling, int32_t top_logprobs) {
  BITSPLIT_RETURN_IF_ERROR(model::ValidateSamplingParams(sampling));
  if (top_logprobs < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("top log-probabilities per node must be >= 0, got ", top_logprobs));
  }
  return absl::OkStatus();
}

absl::Status ForEachPrefillChunk(
    std::span<const int32_t> tokens, int64_t chunk, int64_t first_position,
    absl::FunctionRef<absl::Status(const model::Batch&)> forward_and_commit) {
  for (size_t begin = 0; begin < tokens.size(); begin += static_cast<size_t>(chunk)) {
    const size_t end = std::min(tokens.size(), begin + static_cast<size_t>(chunk));
    const std::span<const int32_t> part = tokens.subspan(begin, end - begin);
    model::Batch batch = model::Batch::Causal(part, static_cast<int32_t>(first_position + begin));
    batch.logit_rows = {static_cast<int32_t>(part.size() - 1)};
    BITSPLIT_RETURN_IF_ERROR(forward_and_commit(batch));
  }
  return absl::OkStatus();
}

std::vector<std::vector<uint64_t>> NodeMasks(const TokenConstraint& at_root,
                                             std::span<const int32_t> tokens,
                                             std::span<const int32_t> parents) {
  NodeMaskTracker tracker(at_root);
  tracker.Extend(tokens, parents);
  return tracker.TakeMasks();
}

void NodeMaskTracker::Extend(std::span<const int32_t> tokens, std::span<const int32_t> parents) {
  for (size_t i = states_.size(); i < tokens.size(); ++i) {
    std::unique_ptr<TokenConstraint> state;
    if (i == 0) {
      state = at_root_.Clone();
    } else if (const auto& parent = states_[static_cast<size_t>(parents[i])]; parent != nullptr) {
      state = parent->Clone();
      if (!state->Advance(tokens[i])) state.reset();
    }
    masks_.emplace_back();
    if (state != nullptr) state->Allowed(masks_.back());
    // A state that allows nothing (the constraint ended: the node is an end token) has no next
    // token to choose; its row is left unmasked, as a forbidden path's is.
    std::vector<uint64_t>& mask = masks_.back();
    if (std::none_of(mask.begin(), mask.end(), [](uint64_t word) { return word != 0; })) {
      mask.clear();
    }
    states_.push_back(std::move(state));
  }
}

void FillLogprobs(std::span<const float> logits, int64_t vocab_size,
                  const model::SamplingParams& sampling, int32_t top_logprobs,
                  model::Sampler& sampler, std::span<TargetChoice> choices) {
  for (size_t i = 0; i < choices.size(); ++i) {
    const std::span<const float> row =
        logits.subspan(i * static_cast<size_t>(vocab_size), static_cast<size_t>(vocab_size));
    TargetChoice& choice = choices[i];
    choice.logprob = static_cast<float>(sampler.LogProb(row, sampling, choice.token));
    for (int32_t id : TopTokenIds(row, top_logprobs)) {
      choice.top_ids.push_back(id);
      choice.top_logprobs.push_back(static_cast<float>(sampler.LogProb(row, sampling, id)));
    }
  }
}

void RunBatchedStep(BatchedStepModel& model, std::span<SessionStep> steps) {
  using Sequence = BatchedStepModel::Sequence;
  const int64_t vocab = model.vocab_size();

  // Who takes part: each session's own checks first.
  std::vector<size_t> prefilling, decoding;
  for (size_t i = 0; i < steps.size(); ++i) {
    SessionStep& step = steps[i];
    const int64_t length = model.committed_length(i);
    const int64_t capacity = model.capacity(i);
    if (!step.prefill.empty()) {
      step.status = ValidatePrefill(step.prefill, vocab, length, capacity);
      if (step.status.ok()) prefilling.push_back(i);
      continue;
    }
    step.status = ValidateDraftRequest(step.root, step.shape, vocab, model.max_draft_nodes(i),
                                       length, capacity);
    if (step.status.ok()) step.status = ValidateTargetSampling(step.sampling, step.top_logprobs);
    if (step.status.ok() && length + 1 > capacity) {
      step.status = absl::ResourceExhaustedError(absl::StrFormat(
          "the session holds %d of %d tokens: no room for the next one", length, capacity));
    }
    if (step.status.ok()) decoding.push_back(i);
  }

  // Draft rounds: every growing tree's next forward in one batch.
  const Clock::time_point draft_start = Clock::now();
  for (size_t i : decoding) steps[i].status = model.PrepareDraft(i, steps[i]);
  std::vector<DraftTreeGrower> growers;
  growers.reserve(decoding.size());
  for (size_t i : decoding) {
    growers.emplace_back(steps[i].root, steps[i].shape, model.committed_length(i));
  }
  // Constrained sessions: their nodes' masks, for the draft rows and then the verifier.
  std::vector<std::optional<NodeMaskTracker>> trackers(decoding.size());
  for (size_t g = 0; g < decoding.size(); ++g) {
    if (steps[decoding[g]].constraint != nullptr)
      trackers[g].emplace(*steps[decoding[g]].constraint);
  }
  std::vector<DraftRowChoices> children;
  while (true) {
    std::vector<size_t> round;  // indices into decoding / growers
    std::vector<Sequence> sequences;
    for (size_t g = 0; g < growers.size(); ++g) {
      if (!growers[g].done() && steps[decoding[g]].status.ok()) {
        round.push_back(g);
        Sequence sequence = {
            .session = decoding[g], .batch = &growers[g].batch(), .top_k = growers[g].expansions()};
        if (trackers[g]) {
          const DraftTree& tree = growers[g].tree();
          trackers[g]->Extend(tree.tokens, tree.parents);
          sequence.row_masks = std::span<const std::vector<uint64_t>>(trackers[g]->masks())
                                   .subspan(static_cast<size_t>(growers[g].batch().pending_prefix));
        }
        sequences.push_back(sequence);
      }
    }
    if (round.empty()) break;
    const absl::Status forwarded = model.DraftForward(sequences, &children);
    for (size_t j = 0; j < round.size(); ++j) {
      if (!forwarded.ok()) {
        steps[decoding[round[j]]].status = forwarded;
        continue;
      }
      growers[round[j]].Absorb(std::move(children[j]));
    }
  }
  for (size_t g = 0; g < decoding.size(); ++g) {
    model.DiscardDraft(decoding[g]);
    if (steps[decoding[g]].status.ok()) steps[decoding[g]].tree = growers[g].Take();
  }
  const int64_t draft_ns = decoding.empty() ? 0 : NanosSince(draft_start);

  // One verifier forward: every prefill chunk (its last row's logits only) and every tree.
  const Clock::time_point verify_start = Clock::now();
  std::vector<model::Batch> batches;
  std::vector<Sequence> sequences;
  for (size_t i : prefilling) {
    model::Batch batch =
        model::Batch::Causal(steps[i].prefill, static_cast<int32_t>(model.committed_length(i)));
    batch.logit_rows = {static_cast<int32_t>(batch.size() - 1)};
    batches.push_back(std::move(batch));
    sequences.push_back({.session = i});
  }
  for (size_t i : decoding) {
    if (!steps[i].status.ok()) continue;
    absl::StatusOr<model::Batch> batch =
        model::Batch::Tree(steps[i].tree.tokens, steps[i].tree.parents,
                           static_cast<int32_t>(model.committed_length(i)));
    BITSPLIT_CHECK(batch.ok());  // the grower's tree is well formed
    batches.push_back(*std::move(batch));
    sequences.push_back({.session = i});
  }
  if (sequences.empty()) return;
  int64_t batch_rows = 0;
  for (size_t v = 0; v < sequences.size(); ++v) {
    sequences[v].batch = &batches[v];
    batch_rows += batches[v].size();
  }
  const absl::Status verified = model.VerifyForward(sequences);
  const int64_t verify_ns = NanosSince(verify_start);
  for (size_t v = 0; v < sequences.size(); ++v) {
    const size_t i = sequences[v].session;
    SessionStep& step = steps[i];
    step.draft_ns = step.prefill.empty() && step.shape.nodes > 0 ? draft_ns : 0;
    step.verify_ns = verify_ns;
    step.batch_rows = static_cast<int32_t>(batch_rows);
    if (!verified.ok()) {
      model.DiscardVerify(i);
      step.status = verified;
      continue;
    }
    if (!step.prefill.empty()) {
      step.status = model.CommitPrefill(i, step.prefill);
      continue;
    }
    std::vector<std::vector<uint64_t>> masks;
    if (step.constraint != nullptr) {
      const auto g = std::find(decoding.begin(), decoding.end(), i) - decoding.begin();
      NodeMaskTracker& tracker = *trackers[static_cast<size_t>(g)];
      tracker.Extend(step.tree.tokens, step.tree.parents);
      masks = tracker.TakeMasks();
    }
    absl::StatusOr<std::vector<TargetChoice>> choices = model.Targets(v, step, masks);
    if (!choices.ok()) {
      model.DiscardVerify(i);
      step.status = choices.status();
      continue;
    }
    step.choices = *std::move(choices);
    step.walk = WalkTree(step.tree.tokens, step.tree.parents, TargetTokens(step.choices));
    step.status = model.CommitPath(i, step.walk.path, step.tree.tokens);
  }
}

}  // namespace bitsplit::speculation
