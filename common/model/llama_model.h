#pragma once
// CPU forward pass of the supported decoder families (config.h: llama — SmolLM2, Llama 2/3,
// Mistral, TinyLlama — gemma3, gemma4, qwen2, qwen3, qwen3moe), reading the weights in place from
// memory-mapped files: a GGUF file (the reference), or a split model written by `bitsplit quantize`
// (base file, optionally with its residual file).
//
// One Forward call runs a batch of T tokens through every layer. The batch carries its own RoPE
// positions and an explicit T×T attention mask, so the same call serves prefill and decode
// (causal mask, consecutive positions) and draft-tree verification (each node sees its
// ancestors, position = L + depth). Every kernel is batch-invariant (see common/ops,
// common/quant/split_matmul.h): a token's logits and K/V are bit-identical whatever else is in
// the batch and whatever the thread count.
//
// The linear layers go through a LinearBackend (linear_backend.h), chosen per call by the
// ForwardMode; everything else (embedding, norms, biases, RoPE, attention with its sliding
// window, the gated activation, a mixture-of-experts layer's routing) is the same code for every
// mode, steered by the config's family flags. A mixture-of-experts layer routes each row on its
// own (the router is read at source precision), then hands the backend every chosen (row,
// expert) pair grouped by expert in one ApplyExperts call per expert group. Draft and verify
// forwards of a split model use the same KV cache layout, so a verifier's cache can serve the draft
// (docs/design.md §1, §3).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/io/gguf.h"
#include "common/model/config.h"
#include "common/model/kv_cache.h"
#include "common/model/linear_backend.h"
#include "common/model/split_backend.h"
#include "common/model/split_model.h"
#include "common/model/weights.h"
#include "common/util/thread_pool.h"

namespace bitsplit::model {

struct Batch {
  std::vector<int32_t> tokens;     // [T] token ids
  std::vector<int32_t> positions;  // [T] RoPE positions (>= 0)
  // [T, T] row-major (see `pending_prefix`): attention_mask[i * T + j] != 0 iff token i may attend
  // to batch token j. The committed cache prefix is always visible. Every token must see itself.
  std::vector<uint8_t> attention_mask;
  // Rows whose logits Forward computes, in output order; empty means all T rows. Prefill
  // usually asks for the last row only, which skips most of the output-head cost.
  std::vector<int32_t> logit_rows;
  // Pending cache slots of earlier forwards that this batch extends (a draft tree grown over
  // several forwards): they stay in the cache and the batch's K/V go after them. With C of them
  // the mask is [T, C + T]: column j < C is pending slot j, column C + i is batch token i.
  int32_t pending_prefix = 0;

  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
  int64_t mask_width() const { return pending_prefix + size(); }
  int64_t num_logit_rows() const {
    return logit_rows.empty() ? size() : static_cast<int64_t>(logit_rows.size());
  }

  // A causal chain: token i at position first_position + i sees tokens 0..i.
  static Batch Causal(std::span<const int32_t> tokens, int32_t first_position);
  // A tree in topological order: parents[i] < i is the batch index of token i's parent, or -1
  // for a child of the committed prefix. Token i sees itself and its ancestors, at position
  // first_position + depth(i) (depth 0 for parent -1). INVALID_ARGUMENT for a bad parent.
  static absl::StatusOr<Batch> Tree(std::span<const int32_t> tokens,
                                    std::span<const int32_t> parents, int32_t first_position);
};

// The checks of a batch that every forward makes, whatever the backend: sizes, token ids within
// [0, vocab_size), positions >= 0, every token attending to itself, logit rows inside the batch,
// and a pending_prefix equal to the cache's `pending_length` (or 0). INVALID_ARGUMENT naming the
// problem.
absl::Status ValidateBatch(const Batch& batch, int64_t vocab_size, int64_t pending_length);

// One sequence of a multi-sequence forward: its batch, its own KV cache and where its logits go
// ([batch.num_logit_rows(), vocab_size]). The pointers must outlive the call.
struct SequenceForward {
  const Batch* batch = nullptr;
  KvCache* cache = nullptr;
  std::span<float> logits;
};

// How the linear layers are computed.
enum class ForwardMode {
  kReference = 0,  // the source GGUF's weights (a model loaded with Load)
  kDraft = 1,      // split model: base weights only
  kVerify = 2,     // split model: base + residual (two matmuls, outputs added)
};
inline constexpr int kNumForwardModes = 3;
std::string_view ForwardModeName(ForwardMode mode);  // "reference", "draft", "verify"
absl::StatusOr<ForwardMode> ParseForwardMode(std::string_view name);

// Thread safety: Forward may run on one thread at a time (it drives the model's thread pool and
// the backends' scratch); the accessors are immutable after loading.
class LlamaModel {
 public:
  // Maps and validates a GGUF file: reference mode. The forward pass uses `num_threads` threads
  // (<= 0: all hardware threads), the calling thread included.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(const std::string& path, int num_threads);
  // Maps and validates a split model (SplitModelFiles::Open): draft mode, and verify mode when
  // `residual_path` is non-empty.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> LoadSplit(const std::string& base_path,
                                                               const std::string& residual_path,
                                                               int num_threads);

  const ModelConfig& config() const { return config_; }
  // The GGUF metadata the tokenizer and chat template read: the source file itself, or the image
  // a split model's base file embeds.
  const gguf::File& gguf_metadata() const { return *gguf_metadata_; }
  const EmbeddingAndNorms& embedding_and_norms() const { return embedding_and_norms_; }
  // The split files, or null for a GGUF model.
  const SplitModelFiles* split_files() const { return split_files_.get(); }
  int num_threads() const { return pool_->num_threads(); }

  bool SupportsMode(ForwardMode mode) const { return backend(mode) != nullptr; }
  // reference for a GGUF model; verify for a split model with its residual, else draft.
  ForwardMode default_mode() const { return default_mode_; }
  // The backend of `mode`, or null when this model cannot run it. Callers may wrap it (e.g. to
  // record activations) and pass the wrapper to ForwardWith.
  LinearBackend* backend(ForwardMode mode) const {
    return backends_[static_cast<size_t>(mode)].get();
  }

  // A cache shaped for this model holding up to `capacity` tokens (the same for every mode) in
  // rows of `type`.
  absl::StatusOr<KvCache> NewKvCache(int64_t capacity, ops::KvType type = ops::KvType::kF32) const {
    return KvCache::Create(config_, capacity, type);
  }

  // Runs the batch after the committed prefix of `cache`: writes the batch's keys/values to the
  // pending slots [L, L + T) (see KvCache; the caller commits; with batch.pending_prefix = C > 0
  // the cache must hold exactly C pending slots and the batch's go to [L + C, L + C + T)) and the
  // logits of the selected rows to `logits` as [num_logit_rows, vocab_size]. INVALID_ARGUMENT for a
  // malformed batch, token ids outside the vocabulary, a cache of another shape or a too small
  // `logits`; RESOURCE_EXHAUSTED when L + T exceeds the cache capacity; FAILED_PRECONDITION for a
  // mode this model cannot run. On those errors nothing is changed. A backend error (e.g. a
  // residual service that went away) is returned as is; the committed cache is unchanged then.
  absl::Status Forward(const Batch& batch, KvCache& cache, std::span<float> logits,
                       ForwardMode mode);
  // The same in default_mode().
  absl::Status Forward(const Batch& batch, KvCache& cache, std::span<float> logits) {
    return Forward(batch, cache, logits, default_mode_);
  }
  // Same; `logits` must hold batch.num_logit_rows() * vocab_size floats.
  absl::Status Forward(const Batch& batch, KvCache& cache, float* logits, ForwardMode mode) {
    return Forward(
        batch, cache,
        std::span<float>(logits, static_cast<size_t>(batch.num_logit_rows() * config_.vocab_size)),
        mode);
  }
  absl::Status Forward(const Batch& batch, KvCache& cache, float* logits) {
    return Forward(batch, cache, logits, default_mode_);
  }
  // Replaces the residual of verify mode (split models only): e.g. a RemoteResidual of the
  // cpu-residual service instead of the residual file mapped in process. nullptr removes verify
  // mode. `source` must outlive its use. FAILED_PRECONDITION for a GGUF model.
  absl::Status SetResidualSource(ResidualSource* source);

  // The same forward with the linear layers computed by `backend`, which must compute this
  // model's groups (e.g. a wrapper of backend(mode)).
  absl::Status ForwardWith(LinearBackend& backend, const Batch& batch, KvCache& cache,
                           std::span<float> logits);

  // Several sequences in one pass (continuous batching): their rows are concatenated for every
  // linear layer (one residual request per group carries all of them), while each sequence's
  // attention reads its own cache with its own positions and mask. Batch invariance makes every
  // sequence's logits and K/V bit-identical to its Forward alone. Every sequence is validated
  // first (the first error names the sequence; nothing changes then); distinct caches only.
  absl::Status ForwardSequences(std::span<const SequenceForward> sequences, ForwardMode mode);
  absl::Status ForwardSequencesWith(LinearBackend& backend,
                                    std::span<const SequenceForward> sequences);

 private:
  LlamaModel() = default;
  absl::Status ValidateBatch(const Batch& batch, const KvCache& cache, size_t logits_size) const;
  absl::Status ValidateSequences(std::span<const SequenceForward> sequences) const;

  // The blocks of ForwardSequencesWith, in the order it runs them (CudaModel's forward has the
  // same blocks under the same names). A ForwardPass holds one forward's sequences, their rows
  // and the activations.
  struct SequenceSlice;
  struct ForwardPass;
  void EmbedTokens(ForwardPass& pass) const;
  void PrepareSlidingWindow(ForwardPass& pass) const;
  absl::Status AttentionBlock(int32_t layer, ForwardPass& pass);
  void StoreKvAndAttend(int32_t layer, ForwardPass& pass);
  absl::Status FeedForwardBlock(int32_t layer, ForwardPass& pass);
  // gate = act(gate) * up over `rows` rows of `width`.
  void GatedActivation(int64_t rows, int64_t width, float* gate, const float* up) const;
  // Mixture of experts: each row's chosen experts and weights from the router's input, then the
  // experts' FFNs on `input`, their weighted sum in pass.experts_sum.
  void RouteToExperts(int32_t layer, const float* router_input, ForwardPass& pass);
  absl::Status ExpertsBlock(int32_t layer, const float* input, const float* router_input,
                            ForwardPass& pass);
  // x += projected, RMS-normalized first with `post_norm` where the config has post-norms.
  void AddToHiddenState(const float* post_norm, ForwardPass& pass) const;
  absl::Status OutputHead(ForwardPass& pass);

  // GGUF models: the mapping every view points into and the reference weights.
  std::unique_ptr<gguf::File> gguf_file_;
  ModelWeights gguf_weights_;
  // Split models: the mapped files and the in-process residual of verify mode.
  std::unique_ptr<SplitModelFiles> split_files_;
  std::unique_ptr<InProcessResidual> residual_source_;

  const gguf::File* gguf_metadata_ = nullptr;  // into gguf_file_ or split_files_
  ModelConfig config_;
  EmbeddingAndNorms embedding_and_norms_;
  std::unique_ptr<LinearBackend> backends_[kNumForwardModes];  // null: mode unsupported
  ForwardMode default_mode_ = ForwardMode::kReference;
  std::unique_ptr<ThreadPool> pool_;
};

}  // namespace bitsplit::model
