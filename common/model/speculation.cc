#include "common/model/speculation.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <queue>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/util/elapsed.h"
#include "common/util/status_macros.h"

namespace bitsplit::model {
namespace {

using Clock = std::chrono::steady_clock;

// log Σ exp(logits): the normalizer of the draft's log-probabilities (temperature 1).
double LogSumExp(std::span<const float> logits) {
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float logit : logits) sum += std::exp(static_cast<double>(logit - max_logit));
  return max_logit + std::log(sum);
}

// The choices of one verified tree from its logits [tree size][vocab].
std::vector<TargetChoice> ChooseTargets(std::span<const float> logits, const Batch& batch,
                                        int64_t vocab, const SamplingParams& sampling,
                                        int32_t top_logprobs, bool with_logprobs,
                                        Sampler& sampler) {
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

std::vector<int32_t> TargetTokens(std::span<const TargetChoice> choices) {
  std::vector<int32_t> tokens;
  for (const TargetChoice& choice : choices) tokens.push_back(choice.token);
  return tokens;
}

}  // namespace

std::vector<int32_t> TopTokenIds(std::span<const float> logits, int32_t count) {
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  const size_t keep = std::min(ids.size(), static_cast<size_t>(std::max(count, 0)));
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(keep), ids.end(),
                    [&](int32_t a, int32_t b) {
                      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
                    });
  ids.resize(keep);
  return ids;
}

DraftRowChoices TopDraftChoices(std::span<const float> logits, int64_t rows, int64_t vocab,
                                int32_t k) {
  DraftRowChoices choices;
  choices.k = static_cast<int32_t>(std::min<int64_t>(k, vocab));
  for (int64_t r = 0; r < rows; ++r) {
    const std::span<const float> row =
        logits.subspan(static_cast<size_t>(r * vocab), static_cast<size_t>(vocab));
    choices.log_normalizers.push_back(LogSumExp(row));
    for (int32_t id : TopTokenIds(row, choices.k)) {
      choices.ids.push_back(id);
      choices.logits.push_back(row[static_cast<size_t>(id)]);
    }
  }
  return choices;
}

DraftTreeGrower::DraftTreeGrower(int32_t root, const TreeShape& shape, int64_t committed_length)
    : shape_(shape), committed_length_(committed_length) {
  tree_.tokens = {root};
  tree_.parents = {-1};
  tree_.logprobs = {0.0f};
  done_ = shape.nodes == 0;
  if (!done_) MakeBatch();
}

bool DraftTreeGrower::Candidate::operator<(const Candidate& other) const {
  // Max-heap on log-probability; ties go to the earlier parent, then the lower token.
  if (logprob != other.logprob) return logprob < other.logprob;
  if (parent != other.parent) return parent > other.parent;
  return token > other.token;
}

void DraftTreeGrower::MakeBatch() {
  // Nodes [forwarded_, size) are in the tree but not yet run: the next draft forward runs them.
  const int32_t first = forwarded_;
  const int32_t count = tree_.size() - first;
  batch_ = Batch();
  batch_.pending_prefix = first;
  batch_.tokens.assign(tree_.tokens.begin() + first, tree_.tokens.end());
  batch_.positions.resize(static_cast<size_t>(count));
  const int32_t width = first + count;
  batch_.attention_mask.assign(static_cast<size_t>(count * width), 0);
  for (int32_t r = 0; r < count; ++r) {
    const int32_t node = first + r;
    batch_.positions[static_cast<size_t>(r)] =
        static_cast<int32_t>(committed_length_) + depths_[static_cast<size_t>(node)];
    // Slot j of the pending region holds node j's draft K/V; a node sees its ancestors.
    for (int32_t a = node; a >= 0; a = tree_.parents[static_cast<size_t>(a)]) {
      batch_.attention_mask[static_cast<size_t>(r * width + a)] = 1;
    }
  }
}

void DraftTreeGrower::Absorb(const DraftRowChoices& children) {
  BITSPLIT_CHECK(!done_ && static_cast<int64_t>(children.log_normalizers.size()) == batch_.size());
  const int32_t first = forwarded_;
  const int32_t count = static_cast<int32_t>(batch_.size());
  ++tree_.draft_forwards;
  forwarded_ = tree_.size();
  for (int32_t r = 0; r < count; ++r) {
    const int32_t node = first + r;
    const int32_t child_depth = depths_[static_cast<size_t>(node)] + 1;
    if (child_depth > shape_.max_depth) continue;
    const double normalizer = children.log_normalizers[static_cast<size_t>(r)];
    for (int32_t j = 0; j < children.k; ++j) {
      const size_t at = static_cast<size_t>(r * children.k + j);
      frontier_.push(
          {tree_.logprobs[static_cast<size_t>(node)] + (children.logits[at] - normalizer),
           children.ids[at], node, child_depth});
    }
  }
  // The next round: the most probable candidates join the tree.
  const int32_t budget = shape_.nodes + 1 - tree_.size();
  for (int32_t taken = 0; taken < std::min(budget, shape_.expansions) && !frontier_.empty();
       ++taken) {
    const Candidate best = frontier_.top();
    frontier_.pop();
    tree_.tokens.push_back(best.token);
    tree_.parents.push_back(best.parent);
    tree_.logprobs.push_back(static_cast<float>(best.logprob));
    depths_.push_back(best.depth);
  }
  // Nodes that joined in the last round never run: their children could not join. Nor does a
  // round of depth-capped nodes when nothing else is left to expand.
  if (tree_.size() == shape_.nodes + 1 || tree_.size() == forwarded_) {
    done_ = true;
    return;
  }
  bool expandable = false;
  for (int32_t node = forwarded_; node < tree_.size(); ++node) {
    expandable = expandable || depths_[static_cast<size_t>(node)] < shape_.max_depth;
  }
  if (!expandable && frontier_.empty()) {
    done_ = true;
    return;
  }
  MakeBatch();
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

absl::Status ValidateTargetSampling(const SamplingParams& sampling, int32_t top_logprobs) {
  BITSPLIT_RETURN_IF_ERROR(ValidateSamplingParams(sampling));
  if (top_logprobs < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("top log-probabilities per node must be >= 0, got ", top_logprobs));
  }
  return absl::OkStatus();
}

absl::Status ForEachPrefillChunk(std::span<const int32_t> tokens, int64_t chunk,
                                 int64_t first_position,
                                 absl::FunctionRef<absl::Status(const Batch&)> forward_and_commit) {
  for (size_t begin = 0; begin < tokens.size(); begin += static_cast<size_t>(chunk)) {
    const size_t end = std::min(tokens.size(), begin + static_cast<size_t>(chunk));
    const std::span<const int32_t> part = tokens.subspan(begin, end - begin);
    Batch batch = Batch::Causal(part, static_cast<int32_t>(first_position + begin));
    batch.logit_rows = {static_cast<int32_t>(part.size() - 1)};
    BITSPLIT_RETURN_IF_ERROR(forward_and_commit(batch));
  }
  return absl::OkStatus();
}

void FillLogprobs(std::span<const float> logits, int64_t vocab_size, const SamplingParams& sampling,
                  int32_t top_logprobs, Sampler& sampler, std::span<TargetChoice> choices) {
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

absl::Status ValidateTreeShape(const TreeShape& shape, int32_t max_nodes) {
  if (shape.nodes < 0 || shape.nodes > max_nodes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("draft tree nodes must be in [0, %d], got %d", max_nodes, shape.nodes));
  }
  if (shape.nodes == 0) return absl::OkStatus();
  if (shape.expansions < 1 || shape.expansions > 64) {
    return absl::InvalidArgumentError(
        absl::StrFormat("expansions per draft step must be in [1, 64], got %d", shape.expansions));
  }
  if (shape.max_depth < 1 || shape.max_depth > 64) {
    return absl::InvalidArgumentError(
        absl::StrFormat("draft tree depth cap must be in [1, 64], got %d", shape.max_depth));
  }
  return absl::OkStatus();
}

std::vector<int32_t> TreeDepths(std::span<const int32_t> parents) {
  std::vector<int32_t> depths(parents.size(), 0);
  for (size_t i = 0; i < parents.size(); ++i) {
    if (parents[i] >= 0) depths[i] = depths[static_cast<size_t>(parents[i])] + 1;
  }
  return depths;
}

WalkResult WalkTree(std::span<const int32_t> tokens, std::span<const int32_t> parents,
                    std::span<const int32_t> target_tokens) {
  BITSPLIT_CHECK(tokens.size() == parents.size() && tokens.size() == target_tokens.size() &&
                 !tokens.empty());
  WalkResult walk;
  int32_t node = 0;
  while (true) {
    walk.path.push_back(node);
    const int32_t choice = target_tokens[static_cast<size_t>(node)];
    walk.tokens.push_back(choice);
    int32_t next = -1;
    // Children follow their parent in topological order; several children may not carry the
    // same token in a tree the drafter grew, but take the first in any case.
    for (size_t i = static_cast<size_t>(node) + 1; i < tokens.size(); ++i) {
      if (parents[i] == node && tokens[i] == choice) {
        next = static_cast<int32_t>(i);
        break;
      }
    }
    if (next < 0) break;
    node = next;
  }
  return walk;
}

std::string_view DraftKvName(DraftKv kv) { return kv == DraftKv::kShared ? "shared" : "own"; }

absl::StatusOr<DraftKv> ParseDraftKv(std::string_view name) {
  if (name == "shared") return DraftKv::kShared;
  if (name == "own") return DraftKv::kOwn;
  return absl::InvalidArgumentError(absl::StrCat("unknown draft KV mode \"",
                                                 absl::string_view(name.data(), name.size()),
                                                 "\" (expected shared or own)"));
}

absl::StatusOr<std::unique_ptr<CpuSpeculativeSession>> CpuSpeculativeSession::Create(
    LlamaModel& target, ForwardMode target_mode, LlamaModel& draft, ForwardMode draft_mode,
    const Options& options) {
  if (!target.SupportsMode(target_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the target model cannot run in ", std::string(ForwardModeName(target_mode)), " mode"));
  }
  if (!draft.SupportsMode(draft_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the draft model cannot run in ", std::string(ForwardModeName(draft_mode)), " mode"));
  }
  const ModelConfig& t = target.config();
  const ModelConfig& d = draft.config();
  if (t.vocab_size != d.vocab_size) {
    return absl::FailedPreconditionError(
        absl::StrFormat("the draft model's vocabulary (%d) differs from the target's (%d)",
                        d.vocab_size, t.vocab_size));
  }
  if (options.draft_kv == DraftKv::kShared &&
      (t.num_layers != d.num_layers || t.kv_dim() != d.kv_dim())) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the draft model (%d layers x %d KV dims) cannot read the target's KV cache (%d x %d)",
        d.num_layers, d.kv_dim(), t.num_layers, t.kv_dim()));
  }
  if (options.own_kv_chunk < 1) {
    return absl::InvalidArgumentError("the own KV's catch-up chunk must be at least 1 token");
  }
  if (options.capacity > t.context_length && t.context_length > 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a session of %d tokens exceeds the model's context length of %d",
                        options.capacity, t.context_length));
  }
  BITSPLIT_ASSIGN_OR_RETURN(KvCache cache, target.NewKvCache(options.capacity));
  std::unique_ptr<CpuSpeculativeSession> session(
      new CpuSpeculativeSession(target, target_mode, draft, draft_mode, options, std::move(cache)));
  if (options.draft_kv == DraftKv::kOwn) {
    BITSPLIT_ASSIGN_OR_RETURN(KvCache own, draft.NewKvCache(options.capacity));
    session->draft_cache_ = std::make_unique<KvCache>(std::move(own));
  }
  return session;
}

CpuSpeculativeSession::CpuSpeculativeSession(LlamaModel& target, ForwardMode target_mode,
                                             LlamaModel& draft, ForwardMode draft_mode,
                                             const Options& options, KvCache target_cache)
    : target_(target),
      target_mode_(target_mode),
      draft_(draft),
      draft_mode_(draft_mode),
      options_(options),
      target_cache_(std::move(target_cache)) {}

absl::Status CpuSpeculativeSession::CatchUpDraftCache() {
  KvCache& cache = *draft_cache_;
  const int64_t begin = cache.committed_length();
  logits_.resize(static_cast<size_t>(draft_.config().vocab_size));
  return ForEachPrefillChunk(
      std::span<const int32_t>(committed_tokens_).subspan(static_cast<size_t>(begin)),
      options_.own_kv_chunk, begin, [&](const Batch& batch) {
        BITSPLIT_RETURN_IF_ERROR(draft_.Forward(batch, cache, logits_, draft_mode_));
        return cache.Commit(batch.size());
      });
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
  std::vector<DraftRowChoices> children;
  while (true) {
    std::vector<size_t> round;  // indices into decoding / growers
    std::vector<Sequence> sequences;
    for (size_t g = 0; g < growers.size(); ++g) {
      if (!growers[g].done() && steps[decoding[g]].status.ok()) {
        round.push_back(g);
        sequences.push_back({.session = decoding[g],
                             .batch = &growers[g].batch(),
                             .top_k = growers[g].expansions()});
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
  std::vector<Batch> batches;
  std::vector<Sequence> sequences;
  for (size_t i : prefilling) {
    Batch batch = Batch::Causal(steps[i].prefill, static_cast<int32_t>(model.committed_length(i)));
    batch.logit_rows = {static_cast<int32_t>(batch.size() - 1)};
    batches.push_back(std::move(batch));
    sequences.push_back({.session = i});
  }
  for (size_t i : decoding) {
    if (!steps[i].status.ok()) continue;
    absl::StatusOr<Batch> batch = Batch::Tree(steps[i].tree.tokens, steps[i].tree.parents,
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
    absl::StatusOr<std::vector<TargetChoice>> choices = model.Targets(v, step);
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
      children->push_back(TopDraftChoices(RowsOfLogits(at, rows), rows, vocab_, sequence.top_k));
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
  absl::StatusOr<std::vector<TargetChoice>> Targets(size_t index,
                                                    const SessionStep& step) override {
    const Sequence& sequence = verified_[index];
    CpuSpeculativeSession& session = *sessions_[sequence.session];
    return ChooseTargets(RowsOfLogits(logit_offsets_[index], sequence.batch->num_logit_rows()),
                         *sequence.batch, vocab_, step.sampling, step.top_logprobs,
                         step.with_logprobs, session.sampler_);
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
  KvCache& DraftCache(size_t i) {
    return sessions_[i]->draft_cache_ != nullptr ? *sessions_[i]->draft_cache_
                                                 : sessions_[i]->target_cache_;
  }
  std::span<const float> RowsOfLogits(int64_t first_row, int64_t rows) const {
    return std::span<const float>(logits_).subspan(static_cast<size_t>(first_row * vocab_),
                                                   static_cast<size_t>(rows * vocab_));
  }
  // ForwardSequences over `sequences`, the logit rows one after another in logits_.
  absl::Status Forward(LlamaModel& model, ForwardMode mode, std::span<const Sequence> sequences,
                       bool draft) {
    int64_t logit_rows = 0;
    for (const Sequence& sequence : sequences) logit_rows += sequence.batch->num_logit_rows();
    logits_.resize(static_cast<size_t>(logit_rows * vocab_));
    std::vector<SequenceForward> forwards;
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
  LlamaModel& target_;
  LlamaModel& draft_;
  const ForwardMode target_mode_;
  const ForwardMode draft_mode_;
  const int64_t vocab_;
  std::vector<float> logits_;
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

}  // namespace bitsplit::model
