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

absl::StatusOr<DraftTree> GrowDraftTree(int32_t root, const TreeShape& shape,
                                        int64_t committed_length, DraftForwardFn forward) {
  DraftTree tree;
  tree.tokens = {root};
  tree.parents = {-1};
  tree.logprobs = {0.0f};
  if (shape.nodes == 0) return tree;

  struct Candidate {
    double logprob;  // cumulative
    int32_t token;
    int32_t parent;
    int32_t depth;
    bool operator<(const Candidate& other) const {
      // Max-heap on log-probability; ties go to the earlier parent, then the lower token.
      if (logprob != other.logprob) return logprob < other.logprob;
      if (parent != other.parent) return parent > other.parent;
      return token > other.token;
    }
  };
  std::priority_queue<Candidate> frontier;
  std::vector<int32_t> depths = {0};

  // Nodes [forwarded, size) are in the tree but not yet run: the next draft forward runs them.
  int32_t forwarded = 0;
  while (true) {
    const int32_t first = forwarded;
    const int32_t count = tree.size() - first;
    Batch batch;
    batch.pending_prefix = first;
    batch.tokens.assign(tree.tokens.begin() + first, tree.tokens.end());
    batch.positions.resize(static_cast<size_t>(count));
    const int32_t width = first + count;
    batch.attention_mask.assign(static_cast<size_t>(count * width), 0);
    for (int32_t r = 0; r < count; ++r) {
      const int32_t node = first + r;
      batch.positions[static_cast<size_t>(r)] =
          static_cast<int32_t>(committed_length) + depths[static_cast<size_t>(node)];
      // Slot j of the pending region holds node j's draft K/V; a node sees its ancestors.
      for (int32_t a = node; a >= 0; a = tree.parents[static_cast<size_t>(a)]) {
        batch.attention_mask[static_cast<size_t>(r * width + a)] = 1;
      }
    }
    BITSPLIT_ASSIGN_OR_RETURN(const DraftRowChoices children, forward(batch, shape.expansions));
    ++tree.draft_forwards;
    forwarded = tree.size();
    for (int32_t r = 0; r < count; ++r) {
      const int32_t node = first + r;
      const int32_t child_depth = depths[static_cast<size_t>(node)] + 1;
      if (child_depth > shape.max_depth) continue;
      const double normalizer = children.log_normalizers[static_cast<size_t>(r)];
      for (int32_t j = 0; j < children.k; ++j) {
        const size_t at = static_cast<size_t>(r * children.k + j);
        frontier.push(
            {tree.logprobs[static_cast<size_t>(node)] + (children.logits[at] - normalizer),
             children.ids[at], node, child_depth});
      }
    }
    // The next round: the most probable candidates join the tree.
    const int32_t budget = shape.nodes + 1 - tree.size();
    for (int32_t taken = 0; taken < std::min(budget, shape.expansions) && !frontier.empty();
         ++taken) {
      const Candidate best = frontier.top();
      frontier.pop();
      tree.tokens.push_back(best.token);
      tree.parents.push_back(best.parent);
      tree.logprobs.push_back(static_cast<float>(best.logprob));
      depths.push_back(best.depth);
    }
    // Nodes that joined in the last round never run: their children could not join. Nor does a
    // round of depth-capped nodes when nothing else is left to expand.
    if (tree.size() == shape.nodes + 1 || tree.size() == forwarded) break;
    bool expandable = false;
    for (int32_t node = forwarded; node < tree.size(); ++node) {
      expandable = expandable || depths[static_cast<size_t>(node)] < shape.max_depth;
    }
    if (!expandable && frontier.empty()) break;
  }
  return tree;
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

absl::Status ValidateVerifyRequest(std::span<const int32_t> tokens,
                                   std::span<const int32_t> parents, const SamplingParams& sampling,
                                   int32_t top_logprobs, int64_t vocab_size, int64_t max_nodes,
                                   int64_t length, int64_t capacity) {
  BITSPLIT_RETURN_IF_ERROR(ValidateSamplingParams(sampling));
  BITSPLIT_RETURN_IF_ERROR(ValidateTree(tokens, parents, vocab_size, max_nodes));
  if (top_logprobs < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("top log-probabilities per node must be >= 0, got ", top_logprobs));
  }
  if (length + static_cast<int64_t>(tokens.size()) > capacity) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("a tree of %d nodes does not fit: the session holds %d of %d tokens",
                        tokens.size(), length, capacity));
  }
  return absl::OkStatus();
}

absl::Status ValidateCommitPath(std::span<const int32_t> path, std::span<const int32_t> parents) {
  if (parents.empty()) {
    return absl::FailedPreconditionError("nothing to commit: no Verify since the last Commit");
  }
  if (path.empty() || path[0] != 0) {
    return absl::InvalidArgumentError("the committed path must start at the root (node 0)");
  }
  for (size_t i = 1; i < path.size(); ++i) {
    const int32_t node = path[i];
    if (node <= 0 || node >= static_cast<int32_t>(parents.size()) ||
        parents[static_cast<size_t>(node)] != path[i - 1]) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "committed path entry %d (node %d) is not a child of node %d in the verified tree", i,
          node, path[i - 1]));
    }
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

absl::Status ValidateTree(std::span<const int32_t> tokens, std::span<const int32_t> parents,
                          int64_t vocab_size, int64_t max_nodes) {
  if (tokens.empty()) return absl::InvalidArgumentError("the tree is empty (it needs a root)");
  if (static_cast<int64_t>(tokens.size()) > max_nodes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the tree has %d nodes; at most %d are allowed", tokens.size(), max_nodes));
  }
  if (parents.size() != tokens.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the tree has %d tokens but %d parents", tokens.size(), parents.size()));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tree node %d has token id %d, outside the vocabulary [0, %d)", i,
                          tokens[i], vocab_size));
    }
    const int32_t parent = parents[i];
    if (i == 0 ? parent != -1 : (parent < 0 || parent >= static_cast<int32_t>(i))) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tree node %d has parent %d; the root (node 0) has parent -1 and every other node a "
          "parent that precedes it",
          i, parent));
    }
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
  if (options.prefill_chunk < 1) {
    return absl::InvalidArgumentError("the prefill chunk must be at least 1 token");
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

absl::Status CpuSpeculativeSession::Prefill(std::span<const int32_t> tokens) {
  const Clock::time_point start = Clock::now();
  const int64_t vocab = target_.config().vocab_size;
  const int64_t start_length = target_cache_.committed_length();
  BITSPLIT_RETURN_IF_ERROR(ValidatePrefill(tokens, vocab, start_length, capacity()));
  pending_tokens_.clear();
  pending_parents_.clear();
  logits_.resize(static_cast<size_t>(vocab));
  const absl::Status status =
      ForEachPrefillChunk(tokens, options_.prefill_chunk, start_length, [&](const Batch& batch) {
        BITSPLIT_RETURN_IF_ERROR(target_.Forward(batch, target_cache_, logits_, target_mode_));
        return target_cache_.Commit(batch.size());
      });
  if (!status.ok()) {
    // All or nothing: a half-prefilled prompt would desynchronize the caller.
    BITSPLIT_CHECK(target_cache_.Truncate(start_length).ok());
    return status;
  }
  committed_tokens_.insert(committed_tokens_.end(), tokens.begin(), tokens.end());
  timings_.prefill_ns = NanosSince(start);
  return absl::OkStatus();
}

absl::Status CpuSpeculativeSession::CatchUpDraftCache() {
  KvCache& cache = *draft_cache_;
  const int64_t begin = cache.committed_length();
  logits_.resize(static_cast<size_t>(draft_.config().vocab_size));
  return ForEachPrefillChunk(
      std::span<const int32_t>(committed_tokens_).subspan(static_cast<size_t>(begin)),
      options_.prefill_chunk, begin, [&](const Batch& batch) {
        BITSPLIT_RETURN_IF_ERROR(draft_.Forward(batch, cache, logits_, draft_mode_));
        return cache.Commit(batch.size());
      });
}

absl::StatusOr<DraftTree> CpuSpeculativeSession::Draft(int32_t root, const TreeShape& shape) {
  const Clock::time_point start = Clock::now();
  const int64_t vocab = target_.config().vocab_size;
  KvCache* cache = draft_cache_ != nullptr ? draft_cache_.get() : &target_cache_;
  BITSPLIT_RETURN_IF_ERROR(ValidateDraftRequest(root, shape, vocab, capacity(),
                                                target_cache_.committed_length(), capacity()));
  // Drafting overwrites the pending slots, so an uncommitted Verify is gone.
  pending_tokens_.clear();
  pending_parents_.clear();
  if (draft_cache_ != nullptr && shape.nodes > 0) BITSPLIT_RETURN_IF_ERROR(CatchUpDraftCache());
  std::vector<float> logits;
  auto forward = [&](const Batch& batch, int32_t k) -> absl::StatusOr<DraftRowChoices> {
    logits.resize(static_cast<size_t>(batch.size() * vocab));
    BITSPLIT_RETURN_IF_ERROR(draft_.Forward(batch, *cache, logits, draft_mode_));
    return TopDraftChoices(logits, batch.size(), vocab, k);
  };
  absl::StatusOr<DraftTree> tree = GrowDraftTree(root, shape, cache->committed_length(), forward);
  cache->DiscardPending();
  timings_.draft_ns = NanosSince(start);
  return tree;
}

absl::StatusOr<std::vector<TargetChoice>> CpuSpeculativeSession::Verify(
    std::span<const int32_t> tokens, std::span<const int32_t> parents,
    const SamplingParams& sampling, int32_t top_logprobs, bool with_logprobs) {
  const Clock::time_point start = Clock::now();
  const int64_t vocab = target_.config().vocab_size;
  const int64_t length = target_cache_.committed_length();
  BITSPLIT_RETURN_IF_ERROR(ValidateVerifyRequest(tokens, parents, sampling, top_logprobs, vocab,
                                                 capacity(), length, capacity()));
  pending_tokens_.clear();
  pending_parents_.clear();
  BITSPLIT_ASSIGN_OR_RETURN(Batch batch,
                            Batch::Tree(tokens, parents, static_cast<int32_t>(length)));
  logits_.resize(tokens.size() * static_cast<size_t>(vocab));
  BITSPLIT_RETURN_IF_ERROR(target_.Forward(batch, target_cache_, logits_, target_mode_));

  std::vector<TargetChoice> choices(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::span<const float> row(logits_.data() + i * static_cast<size_t>(vocab),
                                     static_cast<size_t>(vocab));
    // The token after node i occupies sequence index (its position) + 1.
    choices[i].token = sampler_.Choose(row, sampling, static_cast<int64_t>(batch.positions[i]) + 1);
  }
  if (with_logprobs || top_logprobs > 0) {
    FillLogprobs(logits_, vocab, sampling, top_logprobs, sampler_, choices);
  }
  pending_tokens_.assign(tokens.begin(), tokens.end());
  pending_parents_.assign(parents.begin(), parents.end());
  timings_.verify_ns = NanosSince(start);
  return choices;
}

absl::Status CpuSpeculativeSession::Commit(std::span<const int32_t> path) {
  BITSPLIT_RETURN_IF_ERROR(ValidateCommitPath(path, pending_parents_));
  BITSPLIT_RETURN_IF_ERROR(target_cache_.CommitSlots(path));
  for (int32_t node : path) committed_tokens_.push_back(pending_tokens_[static_cast<size_t>(node)]);
  pending_tokens_.clear();
  pending_parents_.clear();
  return absl::OkStatus();
}

}  // namespace bitsplit::model
