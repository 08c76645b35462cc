#include "common/speculation/tree.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_format.h"
#include "common/util/status_macros.h"

namespace bitsplit::speculation {
namespace {

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
  batch_ = model::Batch();
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

}  // namespace bitsplit::speculation
