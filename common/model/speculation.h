#pragma once
// Speculative decoding (docs/design.md §3): a step of one sequence (draft a tree with the base
// weights, verify it with base + residual, walk it, commit the accepted path), and the same
// step for many sequences at once (SessionStep, RunBatchedStep: continuous batching). The
// gpu-drafter service runs a SpeculativeSession per request and its scheduler steps them together;
// the tests and the speculation bench run them in process.
//
//   step (committed length L, pending root r at position L):
//     tree    = session.Draft(r, shape)             // best-first growth, draft forwards only
//     targets = session.Verify(tree, sampling)      // one verifier forward over all nodes
//     walk    = WalkTree(tree, targets)             // accepted path + emitted tokens
//     session.Commit(walk.path)                     // L += walk.path.size()
//     r       = walk.tokens.back()                  // the bonus token is the next root
//
// Losslessness: the verifier forward is batch-invariant (a node's logits equal those of its path
// run as a causal chain) and the target's choice at a node uses the sampler keyed by (seed,
// absolute position), so the emitted tokens equal plain decoding's whatever the tree shape.
#include <cstdint>
#include <memory>
#include <queue>
#include <span>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/kv_cache.h"
#include "common/model/llama_model.h"
#include "common/model/sampler.h"

namespace bitsplit::model {

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
// INVALID_ARGUMENT for an empty tree, mismatched lengths, a bad parent, or a token outside
// [0, vocab_size).
absl::Status ValidateTree(std::span<const int32_t> tokens, std::span<const int32_t> parents,
                          int64_t vocab_size, int64_t max_nodes);
// Depth of every node (root 0).
std::vector<int32_t> TreeDepths(std::span<const int32_t> parents);

// The target's choice after one node.
struct TargetChoice {
  int32_t token = 0;
  float logprob = 0.0f;  // set when log-probabilities were asked for
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
};

// The walk of docs/design.md §3: from the root, descend while the target's choice at the current
// node is one of its children. `path` are the accepted node indices (path[0] = 0) and `tokens` the
// emitted tokens: the target's choice at each node of the path (the last is the bonus token).
struct WalkResult {
  std::vector<int32_t> path;
  std::vector<int32_t> tokens;
};
WalkResult WalkTree(std::span<const int32_t> tokens, std::span<const int32_t> parents,
                    std::span<const int32_t> target_tokens);

// ---- Pieces every backend's session shares (the CPU one below, common/cuda's) --------------

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

// Runs one draft forward of `batch` (after the committed prefix, extending the pending slots of
// the earlier forwards of this tree: batch.pending_prefix) and returns each row's k best children.
using DraftForwardFn =
    absl::FunctionRef<absl::StatusOr<DraftRowChoices>(const Batch& batch, int32_t k)>;

// The best-first growth of SpeculativeSession::Draft as a state machine, so that the draft
// forwards of several sessions can run as one batch: while !done(), run batch() (after the
// committed prefix, node i's K/V in pending slot i) and Absorb its rows' k = expansions() best
// children. The first forward runs the root; each later one the nodes that joined in the
// previous round. The caller validated root and shape (ValidateDraftRequest) and drops the
// pending slots afterwards. Thread safety: none (one owner).
class DraftTreeGrower {
 public:
  DraftTreeGrower(int32_t root, const TreeShape& shape, int64_t committed_length);
  bool done() const { return done_; }
  const Batch& batch() const { return batch_; }
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
  Batch batch_;
  bool done_ = false;
};

// The whole growth with one forward per round (one session alone).
absl::StatusOr<DraftTree> GrowDraftTree(int32_t root, const TreeShape& shape,
                                        int64_t committed_length, DraftForwardFn forward);

// The argument checks of Draft and Verify for a session holding `length` of `capacity` tokens
// whose forwards take at most `max_nodes` rows (INVALID_ARGUMENT / RESOURCE_EXHAUSTED).
absl::Status ValidatePrefill(std::span<const int32_t> tokens, int64_t vocab_size, int64_t length,
                             int64_t capacity);
absl::Status ValidateDraftRequest(int32_t root, const TreeShape& shape, int64_t vocab_size,
                                  int64_t max_nodes, int64_t length, int64_t capacity);
// The target's sampling of a step: valid parameters and top_logprobs >= 0 (INVALID_ARGUMENT).
absl::Status ValidateTargetSampling(const SamplingParams& sampling, int32_t top_logprobs);
absl::Status ValidateVerifyRequest(std::span<const int32_t> tokens,
                                   std::span<const int32_t> parents, const SamplingParams& sampling,
                                   int32_t top_logprobs, int64_t vocab_size, int64_t max_nodes,
                                   int64_t length, int64_t capacity);
// A path to commit: node 0, then each a child of the previous in the verified tree of
// `parents` (FAILED_PRECONDITION when nothing is verified: `parents` empty).
absl::Status ValidateCommitPath(std::span<const int32_t> path, std::span<const int32_t> parents);

// Runs `tokens`, to be placed from `first_position` on, in causal chunks of at most `chunk`
// tokens (logits of each chunk's last row only): `forward_and_commit` runs a chunk's batch and
// commits it. Stops at the first error, leaving the earlier chunks committed.
absl::Status ForEachPrefillChunk(std::span<const int32_t> tokens, int64_t chunk,
                                 int64_t first_position,
                                 absl::FunctionRef<absl::Status(const Batch&)> forward_and_commit);

// Fills choices[i].logprob / top_ids / top_logprobs from the verify logits [n][vocab].
void FillLogprobs(std::span<const float> logits, int64_t vocab_size, const SamplingParams& sampling,
                  int32_t top_logprobs, Sampler& sampler, std::span<TargetChoice> choices);

// Where the draft reads the committed prefix's keys and values.
enum class DraftKv {
  kShared = 0,  // the verifier's exact KV (the design)
  kOwn = 1,     // the draft model's own KV, computed over the committed tokens (ablation)
};
std::string_view DraftKvName(DraftKv kv);  // "shared", "own"
absl::StatusOr<DraftKv> ParseDraftKv(std::string_view name);

struct DraftTimings {
  int64_t draft_ns = 0;    // the last Draft (catch-up of an own KV included)
  int64_t verify_ns = 0;   // the last Verify
  int64_t prefill_ns = 0;  // the last Prefill
};

// One sequence under speculative decoding: its KV cache and the four calls that grow it. The
// CPU implementation is CpuSpeculativeSession (below), the CUDA one cuda::CudaSpeculativeSession
// (common/cuda/cuda_session.h); the drafter serves either through this interface. Each
// implementation checks its arguments once, here (ValidatePrefill, ValidateDraftRequest,
// ValidateVerifyRequest, ValidateCommitPath), with the same messages.
//
// Thread safety: none. Sessions sharing a model must be serialized (one forward at a time; the
// drafter holds one engine lock); a session may be destroyed on any thread.
class SpeculativeSession {
 public:
  virtual ~SpeculativeSession() = default;

  virtual int64_t committed_length() const = 0;
  // Tokens the session accepts: prompt + output + one pending tree.
  virtual int64_t capacity() const = 0;
  virtual std::span<const int32_t> committed_tokens() const = 0;

  // Runs the verifier over `tokens` in chunks and commits them. INVALID_ARGUMENT for token ids
  // outside the vocabulary, RESOURCE_EXHAUSTED beyond the capacity (nothing committed then).
  virtual absl::Status Prefill(std::span<const int32_t> tokens) = 0;

  // Grows a tree from `root` (the next token, not yet committed) by best-first expansion on
  // draft probabilities: each draft forward runs the `expansions` most probable frontier nodes;
  // every node keeps its `expansions` most probable children as candidates; the `nodes` most
  // probable candidates (within max_depth) become the tree. shape.nodes = 0 returns the root.
  virtual absl::StatusOr<DraftTree> Draft(int32_t root, const TreeShape& shape) = 0;

  // One verifier forward over the tree: the target's choice after every node, sampled at
  // position committed_length + depth + 1. `top_logprobs` >= 0 alternatives per node; log-
  // probabilities are filled when `with_logprobs` (or top_logprobs > 0). The tree's KV stays
  // pending until Commit.
  virtual absl::StatusOr<std::vector<TargetChoice>> Verify(std::span<const int32_t> tokens,
                                                           std::span<const int32_t> parents,
                                                           const SamplingParams& sampling,
                                                           int32_t top_logprobs,
                                                           bool with_logprobs) = 0;

  // Keeps the verifier KV of `path` (node indices of the last Verify: 0, then each a child of the
  // previous). FAILED_PRECONDITION without a pending Verify; INVALID_ARGUMENT for a bad path.
  virtual absl::Status Commit(std::span<const int32_t> path) = 0;

  virtual const DraftTimings& timings() const = 0;
};

// One session's share of one iteration of the drafter's scheduler: either a chunk of prompt to
// run and commit, or one whole speculation step (draft a tree from `root`, verify it, walk it,
// commit the accepted path).
struct SessionStep {
  std::vector<int32_t> prefill;  // non-empty: a prefill chunk, and no speculation step
  int32_t root = 0;              // the next token (not yet committed)
  TreeShape shape;               // nodes = 0: off (the root alone is verified)
  SamplingParams sampling;
  int32_t top_logprobs = 0;
  bool with_logprobs = false;

  absl::Status status;                // this session's own outcome
  DraftTree tree;                     // the verified tree (the root alone when off)
  std::vector<TargetChoice> choices;  // the target's choice after each tree node
  WalkResult walk;                    // path committed, tokens emitted
  int64_t draft_ns = 0;               // the iteration's draft forwards (shared by its sessions)
  int64_t verify_ns = 0;              // the iteration's verifier forward
  int32_t batch_rows = 0;             // rows of that verifier forward, every session's
};

// What one batched iteration (RunBatchedStep) needs of an engine: its sessions, numbered as the
// steps are, and forwards that run the rows of many sessions at once, each row with its own
// session's KV cache, positions and mask. CpuSpeculativeSession::StepMany and
// cuda::CudaSpeculativeSession::StepMany implement it over their models.
//
// Thread safety: none (the engine's lock).
class BatchedStepModel {
 public:
  // One sequence of a shared forward: session `session`'s rows.
  struct Sequence {
    size_t session = 0;
    const Batch* batch = nullptr;
    int32_t top_k = 0;  // draft forwards: children kept per row
  };

  virtual ~BatchedStepModel() = default;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t committed_length(size_t session) const = 0;
  virtual int64_t capacity(size_t session) const = 0;
  // The largest tree (root included) the session may draft.
  virtual int64_t max_draft_nodes(size_t session) const = 0;
  // Forgets a verified tree that was not committed (a new step begins).
  virtual void ClearPendingTree(size_t session) = 0;
  // Work a session needs before its draft rounds (the own-KV ablation's catch-up).
  virtual absl::Status PrepareDraft(size_t session, const SessionStep& step) = 0;
  // One draft forward over `sequences`; (*children)[j] = sequences[j]'s rows' top-k children.
  virtual absl::Status DraftForward(std::span<const Sequence> sequences,
                                    std::vector<DraftRowChoices>* children) = 0;
  virtual void DiscardDraft(size_t session) = 0;
  // One verifier forward over `sequences` (their KV stays pending).
  virtual absl::Status VerifyForward(std::span<const Sequence> sequences) = 0;
  // After VerifyForward: the target's choice after every row of sequences[index].
  virtual absl::StatusOr<std::vector<TargetChoice>> Targets(size_t index,
                                                            const SessionStep& step) = 0;
  virtual void DiscardVerify(size_t session) = 0;
  // Keeps a verified prefill chunk (every pending slot) or a tree's accepted path.
  virtual absl::Status CommitPrefill(size_t session, std::span<const int32_t> tokens) = 0;
  virtual absl::Status CommitPath(size_t session, std::span<const int32_t> path,
                                  std::span<const int32_t> tree_tokens) = 0;
};

// One iteration of continuous batching: every session's draft round in one draft forward, then
// every prefill chunk and every tree in one verifier forward, then each session's sampling, walk
// and commit. A session whose step is invalid gets its own error in `steps[i].status` and takes
// no part; a failed shared forward fails every session in it (their committed caches
// unchanged). Batch invariance makes each session's tokens equal to its steps run alone.
void RunBatchedStep(BatchedStepModel& model, std::span<SessionStep> steps);

// SpeculativeSession on the CPU: the target and the draft are LlamaModels (the split model in
// verify and draft mode, or a separate draft GGUF in reference mode).
class CpuSpeculativeSession final : public SpeculativeSession {
 public:
  struct Options {
    int64_t capacity = 2048;  // tokens the session may hold (prompt + output + a tree)
    int64_t prefill_chunk = 64;
    DraftKv draft_kv = DraftKv::kShared;
  };

  // `target` runs in `target_mode` (verify for a split model), `draft` in `draft_mode` (draft for
  // the split model's base; reference for a separate GGUF draft model). Both must outlive the
  // session and have the same layer count and KV width when the draft reads the verifier's KV.
  static absl::StatusOr<std::unique_ptr<CpuSpeculativeSession>> Create(LlamaModel& target,
                                                                       ForwardMode target_mode,
                                                                       LlamaModel& draft,
                                                                       ForwardMode draft_mode,
                                                                       const Options& options);

  int64_t committed_length() const override { return target_cache_.committed_length(); }
  int64_t capacity() const override { return target_cache_.capacity(); }
  std::span<const int32_t> committed_tokens() const override { return committed_tokens_; }
  absl::Status Prefill(std::span<const int32_t> tokens) override;
  absl::StatusOr<DraftTree> Draft(int32_t root, const TreeShape& shape) override;
  absl::StatusOr<std::vector<TargetChoice>> Verify(std::span<const int32_t> tokens,
                                                   std::span<const int32_t> parents,
                                                   const SamplingParams& sampling,
                                                   int32_t top_logprobs,
                                                   bool with_logprobs) override;
  absl::Status Commit(std::span<const int32_t> path) override;
  const DraftTimings& timings() const override { return timings_; }

  // RunBatchedStep over sessions that share their target and draft models (their forwards are
  // LlamaModel::ForwardSequences).
  static void StepMany(std::span<CpuSpeculativeSession* const> sessions,
                       std::span<SessionStep> steps);

 private:
  friend class CpuBatchedStep;
  CpuSpeculativeSession(LlamaModel& target, ForwardMode target_mode, LlamaModel& draft,
                        ForwardMode draft_mode, const Options& options, KvCache target_cache);
  // Brings the draft's own cache up to the committed tokens (own-KV mode).
  absl::Status CatchUpDraftCache();

  LlamaModel& target_;
  const ForwardMode target_mode_;
  LlamaModel& draft_;
  const ForwardMode draft_mode_;
  const Options options_;
  KvCache target_cache_;
  std::unique_ptr<KvCache> draft_cache_;  // own-KV mode only
  std::vector<int32_t> committed_tokens_;
  // The last Verify's tree, until Commit.
  std::vector<int32_t> pending_tokens_;
  std::vector<int32_t> pending_parents_;
  Sampler sampler_;
  std::vector<float> logits_;
  DraftTimings timings_;
};

}  // namespace bitsplit::model
