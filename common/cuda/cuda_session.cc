#include "common/cuda/cuda_session.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <queue>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/util/status_macros.h"

namespace bitsplit::cuda {
namespace {

using Clock = std::chrono::steady_clock;
using model::Batch;
using model::ForwardMode;

int64_t NanosSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
}

// speculation.cc's TopIds: the `count` largest logits' ids, lower id first among equals.
std::vector<int32_t> TopIds(std::span<const float> logits, int32_t count) {
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

}  // namespace

absl::StatusOr<std::unique_ptr<CudaSpeculativeSession>> CudaSpeculativeSession::Create(
    CudaModel& model, const Options& options) {
  if (options.prefill_chunk < 1) {
    return absl::InvalidArgumentError("the prefill chunk must be at least 1 token");
  }
  BITSPLIT_ASSIGN_OR_RETURN(std::unique_ptr<DeviceKvCache> cache, model.NewKvCache());
  return std::unique_ptr<CudaSpeculativeSession>(
      new CudaSpeculativeSession(model, options, std::move(cache)));
}

absl::Status CudaSpeculativeSession::Prefill(std::span<const int32_t> tokens) {
  const Clock::time_point start = Clock::now();
  const int64_t vocab = model_.config().vocab_size;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "prompt token %d is %d, outside the vocabulary [0, %d)", i, tokens[i], vocab));
    }
  }
  const int64_t start_length = cache_->committed_length();
  if (static_cast<int64_t>(tokens.size()) > cache_->capacity() - start_length) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%d prompt tokens do not fit: the session holds %d of %d tokens",
                        tokens.size(), start_length, cache_->capacity()));
  }
  pending_tokens_.clear();
  pending_parents_.clear();
  const size_t chunk_size =
      static_cast<size_t>(std::min(options_.prefill_chunk, model_.options().max_batch_rows));
  for (size_t begin = 0; begin < tokens.size(); begin += chunk_size) {
    const size_t end = std::min(tokens.size(), begin + chunk_size);
    const std::span<const int32_t> chunk = tokens.subspan(begin, end - begin);
    Batch batch = Batch::Causal(chunk, static_cast<int32_t>(cache_->committed_length()));
    batch.logit_rows = {static_cast<int32_t>(chunk.size() - 1)};
    absl::Status status = model_.Forward(batch, *cache_, ForwardMode::kVerify);
    if (status.ok()) status = cache_->Commit(static_cast<int64_t>(chunk.size()));
    if (!status.ok()) {
      BITSPLIT_CHECK(cache_->Truncate(start_length).ok());
      return status;
    }
  }
  committed_tokens_.insert(committed_tokens_.end(), tokens.begin(), tokens.end());
  timings_.prefill_ns = NanosSince(start);
  return absl::OkStatus();
}

absl::StatusOr<model::DraftTree> CudaSpeculativeSession::Draft(int32_t root,
                                                               const model::TreeShape& shape) {
  const Clock::time_point start = Clock::now();
  const int64_t vocab = model_.config().vocab_size;
  if (root < 0 || root >= vocab) {
    return absl::InvalidArgumentError(
        absl::StrFormat("root token %d is outside the vocabulary [0, %d)", root, vocab));
  }
  const int32_t max_nodes =
      static_cast<int32_t>(std::min(capacity(), model_.options().max_batch_rows) - 1);
  BITSPLIT_RETURN_IF_ERROR(model::ValidateTreeShape(shape, max_nodes));
  pending_tokens_.clear();
  pending_parents_.clear();
  model::DraftTree tree;
  tree.tokens = {root};
  tree.parents = {-1};
  tree.logprobs = {0.0f};
  if (shape.nodes == 0) {
    timings_.draft_ns = NanosSince(start);
    return tree;
  }
  const int64_t length = cache_->committed_length();
  if (length + shape.nodes + 1 > cache_->capacity()) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("a tree of %d nodes does not fit: the session holds %d of %d tokens",
                        shape.nodes + 1, length, cache_->capacity()));
  }

  struct Candidate {
    double logprob;
    int32_t token;
    int32_t parent;
    int32_t depth;
    bool operator<(const Candidate& other) const {
      if (logprob != other.logprob) return logprob < other.logprob;
      if (parent != other.parent) return parent > other.parent;
      return token > other.token;
    }
  };
  std::priority_queue<Candidate> frontier;
  std::vector<int32_t> depths = {0};
  const int32_t children_per_node =
      static_cast<int32_t>(std::min<int64_t>(shape.expansions, std::min<int64_t>(64, vocab)));
  int32_t forwarded = 0;
  while (true) {
    const int32_t first = forwarded;
    const int32_t count = tree.size() - first;
    Batch batch;
    batch.context = first;
    batch.tokens.assign(tree.tokens.begin() + first, tree.tokens.end());
    batch.positions.resize(static_cast<size_t>(count));
    const int32_t width = first + count;
    batch.attention_mask.assign(static_cast<size_t>(count * width), 0);
    for (int32_t r = 0; r < count; ++r) {
      const int32_t node = first + r;
      batch.positions[static_cast<size_t>(r)] =
          static_cast<int32_t>(length) + depths[static_cast<size_t>(node)];
      for (int32_t a = node; a >= 0; a = tree.parents[static_cast<size_t>(a)]) {
        batch.attention_mask[static_cast<size_t>(r * width + a)] = 1;
      }
    }
    BITSPLIT_RETURN_IF_ERROR(model_.Forward(batch, *cache_, ForwardMode::kDraft));
    BITSPLIT_ASSIGN_OR_RETURN(const RowTopK top, model_.TopK(children_per_node));
    ++tree.draft_forwards;
    forwarded = tree.size();
    for (int32_t r = 0; r < count; ++r) {
      const int32_t node = first + r;
      const int32_t child_depth = depths[static_cast<size_t>(node)] + 1;
      if (child_depth > shape.max_depth) continue;
      const double normalizer = top.log_normalizers[static_cast<size_t>(r)];
      for (int32_t j = 0; j < top.k; ++j) {
        const size_t at = static_cast<size_t>(r * top.k + j);
        frontier.push({tree.logprobs[static_cast<size_t>(node)] + (top.logits[at] - normalizer),
                       top.ids[at], node, child_depth});
      }
    }
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
    if (tree.size() == shape.nodes + 1 || tree.size() == forwarded) break;
    bool expandable = false;
    for (int32_t node = forwarded; node < tree.size(); ++node) {
      expandable = expandable || depths[static_cast<size_t>(node)] < shape.max_depth;
    }
    if (!expandable && frontier.empty()) break;
  }
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
  BITSPLIT_RETURN_IF_ERROR(model::ValidateSamplingParams(sampling));
  BITSPLIT_RETURN_IF_ERROR(model::ValidateTree(
      tokens, parents, vocab, std::min(capacity(), model_.options().max_batch_rows)));
  if (top_logprobs < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("top log-probabilities per node must be >= 0, got ", top_logprobs));
  }
  if (length + static_cast<int64_t>(tokens.size()) > capacity()) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("a tree of %d nodes does not fit: the session holds %d of %d tokens",
                        tokens.size(), length, capacity()));
  }
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
    for (size_t i = 0; i < tokens.size(); ++i) {
      const std::span<const float> row(logits_.data() + i * static_cast<size_t>(vocab),
                                       static_cast<size_t>(vocab));
      model::TargetChoice& choice = choices[i];
      choice.logprob = static_cast<float>(sampler_.LogProb(row, sampling, choice.token));
      for (int32_t id : TopIds(row, top_logprobs)) {
        choice.top_ids.push_back(id);
        choice.top_logprobs.push_back(static_cast<float>(sampler_.LogProb(row, sampling, id)));
      }
    }
  }
  pending_tokens_.assign(tokens.begin(), tokens.end());
  pending_parents_.assign(parents.begin(), parents.end());
  timings_.verify_ns = NanosSince(start);
  return choices;
}

absl::Status CudaSpeculativeSession::Commit(std::span<const int32_t> path) {
  if (pending_tokens_.empty()) {
    return absl::FailedPreconditionError("nothing to commit: no Verify since the last Commit");
  }
  if (path.empty() || path[0] != 0) {
    return absl::InvalidArgumentError("the committed path must start at the root (node 0)");
  }
  for (size_t i = 1; i < path.size(); ++i) {
    const int32_t node = path[i];
    if (node <= 0 || node >= static_cast<int32_t>(pending_tokens_.size()) ||
        pending_parents_[static_cast<size_t>(node)] != path[i - 1]) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "committed path entry %d (node %d) is not a child of node %d in the verified tree", i,
          node, path[i - 1]));
    }
  }
  BITSPLIT_RETURN_IF_ERROR(cache_->CommitSlots(path));
  for (int32_t node : path) committed_tokens_.push_back(pending_tokens_[static_cast<size_t>(node)]);
  pending_tokens_.clear();
  pending_parents_.clear();
  return absl::OkStatus();
}

}  // namespace bitsplit::cuda
