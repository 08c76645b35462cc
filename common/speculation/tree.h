#pragma once
// Draft trees (docs/design.md §3): their shape, best-first growth from the draft's top-k
// children (DraftTreeGrower, a state machine so that several sessions' rounds share a draft
// forward), and the walk that keeps the path the verifier's choices agree with.
#include <cstdint>
#include <queue>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "common/model/llama_model.h"

namespace bitsplit::speculation {

// Shape of a draft tree. `nodes` counts drafted tokens beyond the root (the verify batch is
// nodes + 1); expansions = 1 gives a chain.
struct TreeShape {
  int32_t nodes = 16;
  int32_t expansions = 4;  // k: frontier nodes expanded per draft forward (and children kept)
  int32_t max_depth = 8;   // the root has depth 0
};
// INVALID_ARGUMENT unless 0 <= nodes <= max_nodes, 1 <= expansions <= 64, 1 <= max_depth <= 64
// (depth is irrelevant when nodes is 0).
absl::Status ValidateTreeShape(const TreeShape& shape, int32_t max_nodes);

// A tree in topological order: node 0 is the root, parents[i] < i (parents[0] = -1).
struct DraftTree {
  std::vector<int32_t> tokens;
  std::vector<int32_t> parents;
  std::vector<float> logprobs;  // cumulative draft log-probability (root 0)
  int32_t draft_forwards = 0;

  int32_t size() const { return static_cast<int32_t>(tokens.size()); }
};
// Depth of every node (root 0).
std::vector<int32_t> TreeDepths(std::span<const int32_t> parents);

// The walk of docs/design.md §3: from the root, descend while the target's choice at the current
// node is one of its children. `path` are the accepted node indices (path[0] = 0) and `tokens` the
// emitted tokens: the target's choice at each node of the path (the last is the bonus token).
struct WalkResult {
  std::vector<int32_t> path;
  std::vector<int32_t> tokens;
};
WalkResult WalkTree(std::span<const int32_t> tokens, std::span<const int32_t> parents,
                    std::span<const int32_t> target_tokens);

// The `count` largest logits' ids, most likely first (lower id first among equals).
std::vector<int32_t> TopTokenIds(std::span<const float> logits, int32_t count);

// The k most likely next tokens of every row of one draft forward.
struct DraftRowChoices {
  int32_t k = 0;
  std::vector<int32_t> ids;             // [rows][k], most likely first
  std::vector<float> logits;            // [rows][k]
  std::vector<double> log_normalizers;  // [rows]: log Σ exp(row logits), the softmax normalizer
};
// Of `rows` rows of `vocab` logits, on the CPU.
DraftRowChoices TopDraftChoices(std::span<const float> logits, int64_t rows, int64_t vocab,
                                int32_t k);

// Best-first growth of a draft tree from `root` as a state machine, so that the draft forwards of
// several sessions run as one batch: while !done(), run batch() (after the committed prefix, node
// i's K/V in pending slot i) and Absorb its rows' k = expansions() best children. The first
// forward runs the root; each later one the nodes that joined in the previous round. Every node
// that runs offers its k most probable children, scored by cumulative draft log-probability, to
// one frontier; each round the k best frontier candidates (within max_depth) join, until
// shape.nodes nodes beyond the root have joined; shape.nodes = 0 is the root alone. The caller
// validated root and shape (ValidateDraftRequest) and drops the pending slots afterwards.
// Thread safety: none (one owner).
class DraftTreeGrower {
 public:
  DraftTreeGrower(int32_t root, const TreeShape& shape, int64_t committed_length);
  bool done() const { return done_; }
  const model::Batch& batch() const { return batch_; }
  // The tree so far; batch() runs its nodes [batch().pending_prefix, size).
  const DraftTree& tree() const { return tree_; }
  int32_t expansions() const { return shape_.expansions; }
  // `children` of every row of batch(), from the draft forward of batch().
  void Absorb(const DraftRowChoices& children);
  DraftTree Take() { return std::move(tree_); }

 private:
  struct Candidate {
    double logprob;  // cumulative
    int32_t token;
    int32_t parent;
    int32_t depth;
    bool operator<(const Candidate& other) const;
  };
  void MakeBatch();

  const TreeShape shape_;
  const int64_t committed_length_;
  DraftTree tree_;
  std::vector<int32_t> depths_ = {0};
  std::priority_queue<Candidate> frontier_;
  int32_t forwarded_ = 0;  // nodes [0, forwarded_) have run
  model::Batch batch_;
  bool done_ = false;
};

}  // namespace bitsplit::speculation
