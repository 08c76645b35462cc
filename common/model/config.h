#pragma once
// Hyperparameters of a decoder-only transformer, read from GGUF metadata (`<arch>.*` keys), and
// what each supported family does differently (a FamilyTraits entry per general.architecture:
// the forward pass reads flags from the config, never the architecture name).
//
// Families: llama (SmolLM2, Llama 2/3, Mistral, TinyLlama), gemma3, qwen2, qwen3, and the
// mixture-of-experts qwen3moe (Qwen3-30B-A3B, 235B-A22B). Their rules follow llama.cpp's loaders
// and graphs (src/models/<arch>.cpp of the pinned llama.cpp).
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/io/gguf.h"
#include "common/ops/rope.h"

namespace bitsplit::model {

using ops::RopeStyle;  // which dimensions of a head RoPE rotates together

// The gated feed-forward activation: act(gate) * up.
enum class FfnActivation {
  kSilu,      // SwiGLU: llama, qwen2, qwen3
  kGeluTanh,  // GeGLU with the tanh-approximated GELU: gemma3
};

struct ModelConfig {
  std::string architecture;  // general.architecture: one of SupportedArchitectures()
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

  // Family behaviour (FamilyTraits of `architecture`, completed from the file).
  RopeStyle rope_style = RopeStyle::kAdjacentPairs;
  FfnActivation ffn_activation = FfnActivation::kSilu;
  float embedding_scale = 1.0f;  // multiplies the embedding rows (gemma: sqrt(d_model))
  float attention_scale = 0.0f;  // multiplies q·k (normally 1 / sqrt(head_dim))
  bool qk_norm = false;          // per-head RMSNorm of q and k before RoPE (gemma3, qwen3)
  bool post_norms =
      false;  // RMSNorm of the attention and FFN outputs before they join the hidden state
  bool qkv_bias = false;  // q, k and v projections carry biases (qwen2)
  // Sliding-window attention: a query at position p of a local layer sees the keys at positions
  // (p - sliding_window, p]. 0: every layer attends to the whole context.
  int64_t sliding_window = 0;
  std::vector<uint8_t> layer_is_local;    // [num_layers]; empty when sliding_window == 0
  float rope_freq_base_local = 10000.0f;  // RoPE of the local layers (no scaling there)

  // Mixture of experts (0 experts: every layer has the dense gate/up/down FFN). A router matrix
  // [num_experts, d_model] scores the experts on the FFN-normed hidden state; softmax over all
  // experts, the num_experts_used most probable are run (ties: the lower index first), their
  // probabilities renormalized to sum 1 (the sum clamped below at 2^-14, as llama.cpp) and
  // multiplied by expert_weights_scale (1 for qwen3moe: its llama.cpp graph reads no scale); the
  // FFN output is the weighted sum of the chosen experts' gated FFNs (each d_ff_expert wide),
  // added in the order of the choice.
  int64_t num_experts = 0;
  int64_t num_experts_used = 0;
  int64_t d_ff_expert = 0;
  float expert_weights_scale = 1.0f;

  bool has_experts() const { return num_experts > 0; }
  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  bool IsLocalLayer(int64_t layer) const {
    return sliding_window > 0 && layer_is_local[static_cast<size_t>(layer)] != 0;
  }
  // The attention window of `layer`: sliding_window for a local layer, 0 (none) otherwise.
  int64_t AttentionWindow(int64_t layer) const { return IsLocalLayer(layer) ? sliding_window : 0; }
  float RopeFreqBase(int64_t layer) const {
    return IsLocalLayer(layer) ? rope_freq_base_local : rope_freq_base;
  }
  float RopeFreqScale(int64_t layer) const { return IsLocalLayer(layer) ? 1.0f : rope_freq_scale; }
};

// Most layers a config may declare. The deepest published decoders have ~130; the bound exists so
// that a forged block_count cannot size per-layer arrays before the tensors are looked at (the
// metadata of a split model is read before, and apart from, its tensor table).
inline constexpr int64_t kMaxLayers = 1024;

// Reads and validates the config. Rejects architectures other than the supported families
// (naming the one found and the supported ones), missing or non-positive hyperparameters,
// inconsistent head shapes, and features this implementation does not have (experts in a family
// without them, shared experts, a gating function other than softmax, non-linear RoPE scaling,
// logit soft-capping). block_count and embedding_length are checked
// against the tensor table: the blk.N tensors must cover exactly layers [0, block_count), and
// token_embd.weight must be embedding_length wide.
absl::StatusOr<ModelConfig> ModelConfigFromGguf(const gguf::File& file);

// OK when the blk.N tensors of `file` cover exactly the layers [0, config.num_layers) (and
// num_layers is within [1, kMaxLayers]); otherwise INVALID_ARGUMENT naming block_count and the
// first stray tensor or the first layer without tensors. Loops over the tensor table only, so a
// forged block_count costs nothing.
absl::Status CheckLayerTensors(const gguf::File& file, const ModelConfig& config);

// The same checks for metadata whose embedding table is stored elsewhere (a split model's base
// file embeds the source GGUF's metadata without tensors): `embedding_rows` is the row count of
// that table, i.e. the vocabulary size.
absl::StatusOr<ModelConfig> ModelConfigFromGgufMetadata(const gguf::File& file,
                                                        int64_t embedding_rows);

// "llama, gemma3, qwen2, qwen3, qwen3moe": the architectures ModelConfigFromGguf accepts.
std::string SupportedArchitectures();

// Llama-3-8B's shape: 32 layers, d 4096, d_ff 14336, 32 heads over 8 KV heads of 128, vocab
// 128256, context 8192, RoPE base 500000 (for sizing and benchmarks of a realistic model).
ModelConfig EightBClassConfig();

}  // namespace bitsplit::model
