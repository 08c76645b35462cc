#pragma once
// Hyperparameters of a decoder-only transformer, read from GGUF metadata (`<arch>.*` keys), and
// what each supported family does differently (a FamilyTraits entry per general.architecture:
// the forward pass reads flags from the config, never the architecture name).
//
// Families: llama (SmolLM2, Llama 2/3, Mistral, TinyLlama), gemma3, gemma4 (31B and the other
// models without per-layer embeddings or shared-KV layers), qwen2, qwen3, and the
// mixture-of-experts qwen3moe (Qwen3-30B-A3B, 235B-A22B) and gpt-oss (gpt-oss-20b, 120b). Their
// rules follow llama.cpp's loaders and graphs (src/models/<arch>.cpp of the pinned llama.cpp).
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "common/io/gguf.h"
#include "common/ops/rope.h"

namespace bitsplit::model {

using ops::RopeStyle;  // which dimensions of a head RoPE rotates together

// The gated feed-forward activation: act(gate) * up.
enum class FfnActivation {
  kSilu,       // SwiGLU: llama, qwen2, qwen3
  kGeluTanh,   // GeGLU with the tanh-approximated GELU: gemma3, gemma4
  kSwigluOai,  // gpt-oss's clamped SwiGLU (ops::SwigluOaiMul): x sigmoid(1.702 x) (up + 1)
};

// How a mixture-of-experts router's logits become the chosen experts' weights.
enum class ExpertGating {
  // Softmax over all experts, the top k, their probabilities renormalized (qwen3moe, gemma4).
  kSoftmaxThenTopK,
  // The top k logits, then a softmax over those k alone (gpt-oss; llama.cpp's
  // LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT).
  kTopKThenSoftmax,
};

struct ModelConfig {
  std::string architecture;  // general.architecture: one of SupportedArchitectures()
  int64_t num_layers = 0;
  int64_t d_model = 0;       // embedding width
  int64_t d_ff = 0;          // feed-forward hidden width
  int64_t num_heads = 0;     // query heads
  int64_t num_kv_heads = 0;  // key/value heads (grouped-query attention when < num_heads)
  int64_t head_dim = 0;      // of the global (full-attention) layers; see HeadDim(layer)
  int64_t rope_dims = 0;     // leading dims of a global layer's head that RoPE rotates
  float rope_freq_base = 10000.0f;
  float rope_freq_scale = 1.0f;  // 1 / the scaling factor (linear or YaRN)
  // YaRN (rope.scaling.type "yarn", ops::RopeConfig): ext_factor 1 and the original context;
  // rope_attn_factor as llama.cpp's yarn_attn_factor (1 without YaRN).
  float rope_ext_factor = 0.0f;
  float rope_attn_factor = 1.0f;
  int64_t rope_yarn_original_context = 0;
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
  bool qkv_bias = false;          // q, k and v projections carry biases (qwen2, gpt-oss)
  bool attn_output_bias = false;  // the attention output projection carries a bias (gpt-oss)
  // A learned per-head logit in each attention softmax (gpt-oss's attn_sinks, ops::AttentionShape).
  bool attention_sinks = false;
  // The tensor of the norm before the FFN: "ffn_norm.weight", or gpt-oss's
  // "post_attention_norm.weight" (the same norm under llama.cpp's name for that family).
  std::string ffn_norm_tensor = "ffn_norm.weight";
  bool value_norm = false;  // weightless per-head RMSNorm of v (gemma4)
  // Each layer's output (its hidden state after the FFN joined it) is multiplied by the layer's
  // blk.N.layer_output_scale scalar (gemma4).
  bool layer_output_scale = false;
  // logits = cap * tanh(logits / cap) after the output head; 0: none (gemma3, gemma4).
  float final_logit_softcap = 0.0f;
  // Sliding-window attention: a query at position p of a local layer sees the keys at positions
  // (p - sliding_window, p]. 0: every layer attends to the whole context.
  int64_t sliding_window = 0;
  std::vector<uint8_t> layer_is_local;    // [num_layers]; empty when sliding_window == 0
  float rope_freq_base_local = 10000.0f;  // RoPE of the local layers
  // The local layers' RoPE is scaled as the global layers' (gpt-oss); otherwise not at all.
  bool local_rope_scaled = false;
  // Local layers of another head shape than the global ones (gemma4: attention.key_length_swa,
  // rope.dimension_count_swa); 0 when they share head_dim / rope_dims.
  int64_t head_dim_local = 0;
  int64_t rope_dims_local = 0;
  // Per-layer KV head counts when attention.head_count_kv is an array (gemma4: fewer on the
  // global layers); empty when every layer has num_kv_heads.
  std::vector<int64_t> layer_kv_heads;
  // [num_layers] 1 where the layer has no attn_v matrix and its values are its keys' projection
  // (gemma4's global layers: v = RMSNorm(k) before k's own norm and RoPE); empty: all have v.
  // Read from the tensor table (a split model's base file has the same names).
  std::vector<uint8_t> layer_value_is_key;

  // Mixture of experts (0 experts: every layer has the dense gate/up/down FFN). A router matrix
  // [num_experts, d_model] scores the experts; softmax over all experts, the num_experts_used
  // most probable are run (ties: the lower index first), their probabilities renormalized to sum
  // 1 (the sum clamped below at 2^-14, as llama.cpp) and multiplied by expert_weights_scale (1:
  // the llama.cpp graphs of both families read no scale); the experts' output is the weighted sum
  // of the chosen experts' gated FFNs (each d_ff_expert wide), added in the order of the choice.
  //   qwen3moe: every FFN is the experts alone (dense_ffn false); the router reads the FFN-normed
  //             hidden state h', which the experts read too.
  //   gemma4:   the experts run beside the dense FFN (parallel_experts): the router reads
  //             RMSNorm(h) / sqrt(d_model) * ffn_gate_inp.scale, the experts read
  //             pre_ffw_norm_2(h) and expert e's output is multiplied by ffn_down_exps.scale[e];
  //             the FFN's output is post_ffw_norm_1(dense) + post_ffw_norm_2(experts).
  //   gpt-oss:  as qwen3moe, but the router and every expert matrix carry biases
  //             (expert_biases: ffn_gate_inp.bias added to the logits, ffn_gate/up/down_exps.bias
  //             to each expert's outputs), the gating is kTopKThenSoftmax and the activation
  //             kSwigluOai.
  int64_t num_experts = 0;
  int64_t num_experts_used = 0;
  int64_t d_ff_expert = 0;
  float expert_weights_scale = 1.0f;
  ExpertGating expert_gating = ExpertGating::kSoftmaxThenTopK;
  bool expert_biases = false;
  bool dense_ffn = true;
  bool parallel_experts = false;
  // The file holds each expert's gate and up in one tensor (ffn_gate_up_exps: the expert's gate
  // rows, then its up rows), as the gemma4 converter writes them. Read from the tensor table.
  bool fused_expert_gate_up = false;

  bool has_experts() const { return num_experts > 0; }
  bool IsLocalLayer(int64_t layer) const {
    return sliding_window > 0 && layer_is_local[static_cast<size_t>(layer)] != 0;
  }
  // The attention shape of `layer`.
  int64_t HeadDim(int64_t layer) const {
    return IsLocalLayer(layer) && head_dim_local > 0 ? head_dim_local : head_dim;
  }
  int64_t RopeDims(int64_t layer) const {
    return IsLocalLayer(layer) && rope_dims_local > 0 ? rope_dims_local : rope_dims;
  }
  int64_t NumKvHeads(int64_t layer) const {
    return layer_kv_heads.empty() ? num_kv_heads : layer_kv_heads[static_cast<size_t>(layer)];
  }
  int64_t QDim(int64_t layer) const { return num_heads * HeadDim(layer); }
  int64_t KvDim(int64_t layer) const { return NumKvHeads(layer) * HeadDim(layer); }
  bool ValueIsKey(int64_t layer) const {
    return !layer_value_is_key.empty() && layer_value_is_key[static_cast<size_t>(layer)] != 0;
  }
  // The widest layer's q and k/v (buffers shared by all layers).
  int64_t MaxQDim() const;
  int64_t MaxKvDim() const;
  // The attention window of `layer`: sliding_window for a local layer, 0 (none) otherwise.
  int64_t AttentionWindow(int64_t layer) const { return IsLocalLayer(layer) ? sliding_window : 0; }
  float RopeFreqBase(int64_t layer) const {
    return IsLocalLayer(layer) ? rope_freq_base_local : rope_freq_base;
  }
  // The scaling of `layer`'s RoPE (ops::RopeConfig's freq_scale, ext_factor and attn_factor):
  // none on the local layers unless local_rope_scaled.
  bool RopeScaled(int64_t layer) const { return !IsLocalLayer(layer) || local_rope_scaled; }
  float RopeFreqScale(int64_t layer) const { return RopeScaled(layer) ? rope_freq_scale : 1.0f; }
  // `layer`'s RoPE as ops::ApplyRope takes it; `freq_factors` (rope_freqs: llama 3's scaling,
  // gemma4's proportional RoPE) go to the global layers only. llama.cpp passes YaRN's factors to
  // every layer; with a layer's freq_scale of 1 YaRN changes nothing but the attn_factor.
  ops::RopeConfig LayerRope(int64_t layer, const float* freq_factors) const {
    return ops::RopeConfig{.head_dim = HeadDim(layer),
                           .rotary_dims = RopeDims(layer),
                           .freq_base = RopeFreqBase(layer),
                           .freq_scale = RopeFreqScale(layer),
                           .freq_factors = IsLocalLayer(layer) ? nullptr : freq_factors,
                           .style = rope_style,
                           .ext_factor = rope_ext_factor,
                           .attn_factor = rope_attn_factor,
                           .yarn_original_context = rope_yarn_original_context};
  }
};

// The expected number of distinct experts that `rows` independently routed rows touch, when a
// row is routed to expert e with probability frequencies[e] (the frequencies sum to the experts
// used per row): sum_e 1 - (1 - f_e)^rows. What a verify of `rows` rows reads of an expert group.
double ExpectedDistinctExperts(std::span<const double> frequencies, double rows);
// The same under uniform routing (every f_e = k / E): E (1 - (1 - k/E)^rows).
double ExpectedDistinctExperts(int64_t num_experts, int64_t experts_used, double rows);

// Most layers a config may declare. The deepest published decoders have ~130; the bound exists so
// that a forged block_count cannot size per-layer arrays before the tensors are looked at (the
// metadata of a split model is read before, and apart from, its tensor table).
inline constexpr int64_t kMaxLayers = 1024;

// Reads and validates the config. Rejects architectures other than the supported families
// (naming the one found and the supported ones), missing or non-positive hyperparameters,
// inconsistent head shapes, and features this implementation does not have (experts in a family
// without them, shared experts, a gating function other than softmax, RoPE scaling other than
// linear and YaRN (YaRN with a log multiplier included),
// logit soft-capping outside the gemma families, gemma4's per-layer embeddings and shared-KV
// layers). block_count and embedding_length are checked
// against the tensor table: the blk.N tensors must cover exactly layers [0, block_count), and
// token_embd.weight must be embedding_length wide.
absl::StatusOr<ModelConfig> ModelConfigFromGguf(const gguf::File& file);

// OK when the blk.N tensors of `file` cover exactly the layers [0, config.num_layers) (and
// num_layers is within [1, kMaxLayers]); otherwise INVALID_ARGUMENT naming block_count and the
// first stray tensor or the first layer without tensors. Loops over the tensor table only, so a
// forged block_count costs nothing.
absl::Status CheckLayerTensors(const gguf::File& file, const ModelConfig& config);

// Fills what the tensor table (`has_tensor` of a name, names as the source GGUF has them: the
// source itself, or a split model's base file) says about a gemma4 model: layer_value_is_key (a
// layer without blk.N.attn_v.weight takes its values from its keys) and fused_expert_gate_up
// (blk.0.ffn_gate_up_exps.weight). In other families the flags stay unset and the weight loader
// reports a missing tensor by name.
void ReadTensorLayout(absl::FunctionRef<bool(const std::string&)> has_tensor, ModelConfig& config);

// The same checks for metadata whose embedding table is stored elsewhere (a split model's base
// file embeds the source GGUF's metadata without tensors): `embedding_rows` is the row count of
// that table, i.e. the vocabulary size.
absl::StatusOr<ModelConfig> ModelConfigFromGgufMetadata(const gguf::File& file,
                                                        int64_t embedding_rows);

// "llama, gemma3, gemma4, qwen2, qwen3, qwen3moe": the architectures ModelConfigFromGguf accepts.
std::string SupportedArchitectures();

// Llama-3-8B's shape: 32 layers, d 4096, d_ff 14336, 32 heads over 8 KV heads of 128, vocab
// 128256, context 8192, RoPE base 500000 (for sizing and benchmarks of a realistic model).
ModelConfig EightBClassConfig();

}  // namespace bitsplit::model
