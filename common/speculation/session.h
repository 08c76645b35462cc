#pragma once
// Speculative decoding (docs/design.md §3): the step of a sequence (draft a tree with the base
// weights, verify it with base + residual, walk it, commit the accepted path), run for many
// sequences at once (SessionStep, RunBatchedStep: continuous batching); one sequence alone is a
// batch of one. The gpu-drafter service runs a SpeculativeSession per request and its scheduler
// steps them together; the tests and the speculation bench step them in process.
//
//   step of every session at once (committed length L, pending root r at position L):
//     tree    = grow a tree from r        // DraftTreeGrower: best-first, draft forwards only
//     targets = the verifier's choices    // one verifier forward over every session's tree
//     walk    = WalkTree(tree, targets)   // accepted path + emitted tokens
//     commit walk.path                    // L += walk.path.size()
//     r       = walk.tokens.back()        // the bonus token is the next root
//
// Losslessness: the verifier forward is batch-invariant (a node's logits equal those of its path
// run as a causal chain) and the target's choice at a node uses the sampler keyed by (seed,
// absolute position), so the emitted tokens equal plain decoding's whatever the tree shape.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "common/model/llama_model.h"
#include "common/model/sampler.h"
#include "common/speculation/tree.h"

namespace bitsplit::speculation {

// What may come next in a constrained sequence (structured output: a JSON Schema's tokens): a
// state that advances token by token; a draft tree copies it per node. Implementations live
// above this layer (the drafter wraps text::JsonConstraintState).
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  virtual std::unique_ptr<TokenConstraint> Clone() const = 0;
  // Bit t % 64 of mask[t / 64] set iff token t may come next; at least one is.
  virtual void Allowed(std::vector<uint64_t>& mask) const = 0;
  // Moves past `token`; false, and no change, when it may not come next.
  virtual bool Advance(int32_t token) = 0;
};

// The allowed-token mask after each node of a tree (tokens, parents; node 0 the root) whose
// root's children `at_root` constrains: node i's mask is at_root's state advanced by the tokens
// on the path below the root to i. Empty for a node whose path takes a token the constraint
// forbids (the target never chooses it, so the node cannot be on an accepted path) and for a
// node after which the constraint allows nothing (an end token: generation stops there).
std::vector<std::vector<uint64_t>> NodeMasks(const TokenConstraint& at_root,
                                             std::span<const int32_t> tokens,
                                             std::span<const int32_t> parents);

// NodeMasks of a tree that grows node by node, each node's mask computed once: the draft
// forwards mask the rows they expand with it, and the verifier reuses the same masks, so masking
// the draft costs no mask beyond the verifier's.
class NodeMaskTracker {
 public:
  explicit NodeMaskTracker(const TokenConstraint& at_root) : at_root_(at_root) {}
  // Adds the nodes of (tokens, parents) beyond those already seen; the tree only grows.
  void Extend(std::span<const int32_t> tokens, std::span<const int32_t> parents);
  const std::vector<std::vector<uint64_t>>& masks() const { return masks_; }
  std::vector<std::vector<uint64_t>> TakeMasks() { return std::move(masks_); }

 private:
  const TokenConstraint& at_root_;
  std::vector<std::unique_ptr<TokenConstraint>> states_;
  std::vector<std::vector<uint64_t>> masks_;
};

// The target's choice after one node.
struct TargetChoice {
  int32_t token = 0;
  float logprob = 0.0f;  // set when log-probabilities were asked for
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
};

// The checks of a step for a session holding `length` of `capacity` tokens whose forwards take at
// most `max_nodes` rows (INVALID_ARGUMENT / RESOURCE_EXHAUSTED).
absl::Status ValidatePrefill(std::span<const int32_t> tokens, int64_t vocab_size, int64_t length,
                             int64_t capacity);
absl::Status ValidateDraftRequest(int32_t root, const TreeShape& shape, int64_t vocab_size,
                                  int64_t max_nodes, int64_t length, int64_t capacity);
// The target's sampling of a step: valid parameters and top_logprobs >= 0 (INVALID_ARGUMENT).
absl::Status ValidateTargetSampling(const model::SamplingParams& sampling, int32_t top_logprobs);

// Runs `tokens`, to be placed from `first_position` on, in causal chunks of at most `chunk`
// tokens (logits of each chunk's last row only): `forward_and_commit` runs a chunk's batch and
// commits it. Stops at the first error, leaving the earlier chunks committed.
absl::Status ForEachPrefillChunk(
    std::span<const int32_t> tokens, int64_t chunk, int64_t first_position,
    absl::FunctionRef<absl::Status(const model::Batch&)> forward_and_commit);

// Fills choices[i].logprob / top_ids / top_logprobs from the verify logits [n][vocab].
void FillLogprobs(std::span<const float> logits, int64_t vocab_size,
                  const model::SamplingParams& sampling, int32_t top_logprobs,
                  model::Sampler& sampler, std::span<TargetChoice> choices);

// Where the draft reads the committed prefix's keys and values.
enum class DraftKv {
  kShared = 0,  // the verifier's exact KV (the design)
  kOwn = 1,     // the draft model's own KV, computed over the committed tokens (ablation)
};

// One sequence under speculative decoding: its KV cache and the tokens committed to it. It
// grows only by steps (SessionStep) run by its backend's StepMany, alone (a batch of one: the
// backend's Step) or with other sessions of the same model. The CPU implementation is
// CpuSpeculativeSession (below), the CUDA one cuda::CudaSpeculativeSession
// (common/cuda/cuda_session.h); the drafter serves either through this interface.
//
// Thread safety: none. Sessions sharing a model must be serialized (one forward at a time; the
// drafter's scheduler runs every step); a session may be destroyed on any thread.
class SpeculativeSession {
 public:
  virtual ~SpeculativeSession() = default;

  virtual int64_t committed_length() const = 0;
  // Tokens the session accepts: prompt + output + one pending tree.
  virtual int64_t capacity() const = 0;
  virtual std::span<const int32_t> committed_tokens() const = 0;
  // Keeps the first `length` committed tokens and their KV rows, drops the rest, and accepts up
  // to `capacity` tokens from now on: a finished session serving a new request whose prompt
  // starts with those tokens (the drafter's prefix cache). The kept rows are those a fresh
  // prefill of the tokens writes (batch invariance), so the new request's tokens are the ones a
  // fresh session gives. INVALID_ARGUMENT for a length beyond the committed one or a capacity
  // not above it (or beyond the model's context); FAILED_PRECONDITION for a capacity the
  // session's storage cannot hold (a CUDA session's planned KV cache).
  virtual absl::Status Reuse(int64_t length, int64_t capacity) = 0;
};

// The checks Reuse shares across backends.
absl::Status ValidateReuse(int64_t length, int64_t capacity, int64_t committed_length,
                           int64_t context_length);

// One session's share of one batched step: either a chunk of prompt to run and commit, or one
// whole speculation step (grow a draft tree from `root`, verify it, walk it, commit the accepted
// path). The target's choice after a tree node is sampled at sequence index committed_length +
// depth + 1 (Sampler keyed by seed and index); log-probabilities are filled when
// `with_logprobs` or top_logprobs > 0.
struct SessionStep {
  // What to do; every member has a default, so that a step is written with designated
  // initializers of what differs ({.root = r, .shape = s}).
  std::vector<int32_t> prefill = {};  // non-empty: a prefill chunk, and no speculation step
  int32_t root = 0;                   // the next token (not yet committed)
  TreeShape shape = {};               // nodes = 0: off (the root alone is verified)
  model::SamplingParams sampling = {};
  int32_t top_logprobs = 0;  // alternatives per node
  bool with_logprobs = false;
  // Constrained decoding: the constraint's state after every emitted token, the root included
  // (what the root's children must satisfy); null: unconstrained. The target chooses from the
  // masked distribution at every node, so the emitted tokens equal plain constrained decoding's
  // (the sampler still keyed by seed and index). The draft proposes from the masked draft rows
  // too (cpu backend: NodeMaskTracker), which raises acceptance but not the output; a proposal the
  // constraint forbids is never accepted. The cpu backend only (FAILED_PRECONDITION on cuda).
  const TokenConstraint* constraint = nullptr;

  // What happened.
  absl::Status status = absl::OkStatus();  // this session's own outcome
  DraftTree tree = {};                     // the verified tree (the root alone when off)
  std::vector<TargetChoice> choices = {};  // the target's choice after each tree node
  WalkResult walk = {};                    // path committed, tokens emitted
  // The iteration's draft forwards (shared by its sessions; an own KV's catch-up included).
  int64_t draft_ns = 0;
  int64_t verify_ns = 0;   // the iteration's verifier forward
  int32_t batch_rows = 0;  // rows of that verifier forward, every session's
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
    const model::Batch* batch = nullptr;
    int32_t top_k = 0;  // draft forwards: children kept per row
    // Draft forwards of a constrained session: row r's allowed tokens (empty: unmasked); the
    // children are the top-k of the masked row.
    std::span<const std::vector<uint64_t>> row_masks = {};
  };

  virtual ~BatchedStepModel() = default;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t committed_length(size_t session) const = 0;
  virtual int64_t capacity(size_t session) const = 0;
  // The largest tree (root included) the session may draft.
  virtual int64_t max_draft_nodes(size_t session) const = 0;
  // Work a session needs before its draft rounds (the own-KV ablation's catch-up).
  virtual absl::Status PrepareDraft(size_t session, const SessionStep& step) = 0;
  // One draft forward over `sequences`; (*children)[j] = sequences[j]'s rows' top-k children.
  virtual absl::Status DraftForward(std::span<const Sequence> sequences,
                                    std::vector<DraftRowChoices>* children) = 0;
  virtual void DiscardDraft(size_t session) = 0;
  // One verifier forward over `sequences` (their KV stays pending).
  virtual absl::Status VerifyForward(std::span<const Sequence> sequences) = 0;
  // After VerifyForward: the target's choice after every row of sequences[index], from the
  // logits masked by node_masks[row] where that is not empty (none: unconstrained).
  virtual absl::StatusOr<std::vector<TargetChoice>> Targets(
      size_t index, const SessionStep& step, std::span<const std::vector<uint64_t>> node_masks) = 0;
  virtual void DiscardVerify(size_t session) = 0;
  // Keeps a verified prefill chunk (every pending slot) or a tree's accepted path.
  virtual absl::Status CommitPrefill(size_t session, std::span<const int32_t> tokens) = 0;
  virtual absl::Status CommitPath(size_t session, std::span<const int32_t> path,
                                  std::span<const int32_t> tree_tokens) = 0;
};

// One iteration of continuous batching: every session's draft round in one draft forward, then
// every prefill chunk and every tree in one verifier forward, then each session's sampling, walk
// and commit. A session whose step is invalid gets its own error in `steps[i].status` and takes
// no part (INVALID_ARGUMENT for a bad token or shape, RESOURCE_EXHAUSTED beyond its capacity);
// a failed shared forward fails every session in it (their committed caches unchanged). Batch
// invariance makes each session's tokens equal to its steps run alone.
void RunBatchedStep(BatchedStepModel& model, std::span<SessionStep> steps);

// Prefills `tokens` into `session` with steps of at most `chunk` tokens, each a batch of one
// (Session::Step). Stops at the first error, the earlier chunks committed.
template <class Session>
absl::Status PrefillInChunks(Session& session, std::span<const int32_t> tokens, int64_t chunk) {
  for (size_t begin = 0; begin < tokens.size(); begin += static_cast<size_t>(chunk)) {
    SessionStep step;
    const std::span<const int32_t> part =
        tokens.subspan(begin, std::min(tokens.size() - begin, static_cast<size_t>(chunk)));
    step.prefill.assign(part.begin(), part.end());
    if (absl::Status status = session.Step(step); !status.ok()) return status;
  }
  return absl::OkStatus();
}

}  // namespace bitsplit::speculation
