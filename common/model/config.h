#pragma once
// Hyperparameters of a llama-architecture model, read from GGUF metadata (llama.* keys).
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/io/gguf.h"

namespace bitsplit::model {

struct ModelConfig {
  std::string architecture;  // always "llama" for now
  int64_t num_layers = 0;
  int64_t d_model = 0;       // embedding width
  int64_t d_ff = 0;          // feed-forward hidden width
  int64_t num_heads = 0;     // query heads
  int64_t num_kv_heads = 0;  // key/value heads (grouped-query attention when < num_heads)
  int64_t head_dim = 0;
  int64_t rope_dims = 0;  // leading dims of each head that RoPE rotates
  float rope_freq_base = 10000.0f;
  float rope_freq_scale = 1.0f;  // 1 / linear scaling factor
  float rms_norm_eps = 1e-5f;
  int64_t context_length = 0;  // training context; the KV cache may be smaller
  int64_t vocab_size = 0;

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
};

// Reads and validates the config. Rejects architectures other than "llama" (naming the one
// found), missing or non-positive hyperparameters, inconsistent head shapes, and features this
// implementation does not have (mixture of experts, non-linear RoPE scaling).
absl::StatusOr<ModelConfig> ModelConfigFromGguf(const gguf::File& file);

// The same checks for metadata whose embedding table is stored elsewhere (a split model's base
// file embeds the source GGUF's metadata without tensors): `embedding_rows` is the row count of
// that table, i.e. the vocabulary size.
absl::StatusOr<ModelConfig> ModelConfigFromGgufMetadata(const gguf::File& file,
                                                        int64_t embedding_rows);

// Llama-3-8B's shape: 32 layers, d 4096, d_ff 14336, 32 heads over 8 KV heads of 128, vocab
// 128256, context 8192, RoPE base 500000 (for sizing and benchmarks of a realistic model).
ModelConfig EightBClassConfig();

}  // namespace bitsplit::model
