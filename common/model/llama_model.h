#pragma once
// Reference CPU forward pass of a llama-architecture model (SmolLM2, Llama 2/3, Mistral,
// TinyLlama), reading the weights in place from a memory-mapped GGUF file.
//
// One Forward call runs a batch of T tokens through every layer. The batch carries its own RoPE
// positions and an explicit T×T attention mask, so the same call serves prefill and decode
// (causal mask, consecutive positions) and draft-tree verification (each node sees its
// ancestors, position = L + depth). Every kernel is batch-invariant (see common/ops): a token's
// logits and K/V are bit-identical whatever else is in the batch and whatever the thread count.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/io/gguf.h"
#include "common/model/config.h"
#include "common/model/kv_cache.h"
#include "common/model/weights.h"
#include "common/util/thread_pool.h"

namespace bitsplit::model {

struct Batch {
  std::vector<int32_t> tokens;     // [T] token ids
  std::vector<int32_t> positions;  // [T] RoPE positions (>= 0)
  // [T, T] row-major: attention_mask[i * T + j] != 0 iff token i may attend to batch token j.
  // The committed cache prefix is always visible. Every token must see itself.
  std::vector<uint8_t> attention_mask;
  // Rows whose logits Forward computes, in output order; empty means all T rows. Prefill
  // usually asks for the last row only, which skips most of the output-head cost.
  std::vector<int32_t> logit_rows;

  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
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

// Thread safety: Forward may run on one thread at a time (it drives the model's thread pool);
// config() and weights() are immutable after Load.
class LlamaModel {
 public:
  // Maps and validates the GGUF file; the forward pass uses `num_threads` threads (<= 0: all
  // hardware threads), the calling thread included.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(const std::string& path, int num_threads);

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  int num_threads() const { return pool_->num_threads(); }

  // A cache shaped for this model holding up to `capacity` tokens.
  absl::StatusOr<KvCache> NewKvCache(int64_t capacity) const {
    return KvCache::Create(config_, capacity);
  }

  // Runs the batch after the committed prefix of `cache`: writes the batch's keys/values to the
  // pending slots [L, L + T) (see KvCache; the caller commits) and the logits of the selected
  // rows to `logits` as [num_logit_rows, vocab_size]. INVALID_ARGUMENT for a malformed batch,
  // token ids outside the vocabulary, a cache of another shape or a too small `logits`;
  // RESOURCE_EXHAUSTED when L + T exceeds the cache capacity. On error nothing is changed.
  absl::Status Forward(const Batch& batch, KvCache& cache, std::span<float> logits);
  // Same; `logits` must hold batch.num_logit_rows() * vocab_size floats.
  absl::Status Forward(const Batch& batch, KvCache& cache, float* logits) {
    return Forward(
        batch, cache,
        std::span<float>(logits, static_cast<size_t>(batch.num_logit_rows() * config_.vocab_size)));
  }

 private:
  LlamaModel() = default;
  absl::Status ValidateBatch(const Batch& batch, const KvCache& cache, size_t logits_size) const;

  std::unique_ptr<gguf::File> file_;  // owns the mapping every weight view points into
  ModelConfig config_;
  ModelWeights weights_;
  std::unique_ptr<ThreadPool> pool_;
};

}  // namespace bitsplit::model
