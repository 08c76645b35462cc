#pragma once
// Views of a llama model's tensors inside the mapped GGUF file. Nothing is copied: every pointer
// points into the gguf::File image, which must outlive the ModelWeights.
//
// Thread safety: read-only after ModelWeightsFromGguf; safe to share between threads.
//
// Shape notation: [rows, cols] of the row-major matrix, i.e. the GGUF dims {cols, rows}
// (ggml lists the contiguous dimension first). A linear layer y = x · Wᵀ maps cols -> rows.
#include <vector>

#include "absl/status/statusor.h"
#include "common/io/gguf.h"
#include "common/model/config.h"
#include "common/ops/matmul.h"

namespace bitsplit::model {

// The per-layer tensors the forward pass reads itself, at source precision: f32 vectors (null when
// the family has none, see LayerVectorSpecs) and a mixture-of-experts layer's router, which stays
// exact so that every forward mode routes a hidden state to the same experts.
struct LayerNorms {
  const float* attn_norm = nullptr;       // [d_model]
  const float* ffn_norm = nullptr;        // [d_model]
  const float* attn_post_norm = nullptr;  // [d_model], post_norms
  const float* ffn_post_norm = nullptr;   // [d_model], post_norms
  const float* attn_q_norm = nullptr;     // [head_dim], qk_norm
  const float* attn_k_norm = nullptr;     // [head_dim], qk_norm
  const float* q_bias = nullptr;          // [q_dim], qkv_bias
  const float* k_bias = nullptr;          // [kv_dim], qkv_bias
  const float* v_bias = nullptr;          // [kv_dim], qkv_bias
  ops::WeightMatrix router;               // [num_experts, d_model], has_experts (ffn_gate_inp)
};

// One per-layer vector of a family: its GGUF tensor name after "blk.N.", its length and the
// LayerNorms field it fills. The forward pass reads exactly these; the quantizer copies them.
struct LayerVectorSpec {
  const char* tensor;  // e.g. "post_attention_norm.weight"
  int64_t length;
  const float* LayerNorms::*field;
};
std::vector<LayerVectorSpec> LayerVectorSpecs(const ModelConfig& config);

struct LayerWeights {
  LayerNorms vectors;
  ops::WeightMatrix wq;  // [q_dim, d_model]
  ops::WeightMatrix wk;  // [kv_dim, d_model]
  ops::WeightMatrix wv;  // [kv_dim, d_model]
  ops::WeightMatrix wo;  // [d_model, q_dim]
  // [d_ff, d_model], [d_ff, d_model], [d_model, d_ff]. In a mixture-of-experts layer: the 3-D
  // GGUF tensors ffn_{gate,up,down}_exps ({cols, rows, num_experts}) as tall matrices
  // [num_experts * rows, cols] (LinearGroupTensorNames).
  ops::WeightMatrix w_gate;
  ops::WeightMatrix w_up;
  ops::WeightMatrix w_down;
  // A mixture-of-experts layer's experts: expert e is rows [e * rows, (e + 1) * rows) of the tall
  // matrices above (ExpertSlices).
  std::vector<ops::WeightMatrix> expert_gate;  // [num_experts] of [d_ff_expert, d_model]
  std::vector<ops::WeightMatrix> expert_up;    // [num_experts] of [d_ff_expert, d_model]
  std::vector<ops::WeightMatrix> expert_down;  // [num_experts] of [d_model, d_ff_expert]
};

struct ModelWeights {
  ops::WeightMatrix token_embd;              // [vocab, d_model]
  const float* output_norm = nullptr;        // [d_model]
  ops::WeightMatrix output;                  // [vocab, d_model]; token_embd when tied
  bool output_tied_to_embedding = false;     // the file has no output.weight (e.g. SmolLM2)
  const float* rope_freq_factors = nullptr;  // [rope_dims / 2] or null (llama 3 "rope_freqs")
  std::vector<LayerWeights> layers;          // [num_layers]
};

// What the forward pass reads itself, whatever computes its linear layers (a LinearBackend owns
// those): the embedding table, the norms and the RoPE frequency factors. The same views come from
// a GGUF file (EmbeddingAndNormsOf) or from a split model's base file.
struct EmbeddingAndNorms {
  ops::WeightMatrix token_embd;              // [vocab, d_model], any dequantizable type
  const float* output_norm = nullptr;        // [d_model]
  const float* rope_freq_factors = nullptr;  // [rope_dims / 2] or null
  std::vector<LayerNorms> layers;            // [num_layers]
};
EmbeddingAndNorms EmbeddingAndNormsOf(const ModelWeights& weights);

// The `experts` equal row slices of a tall expert matrix, one view each.
std::vector<ops::WeightMatrix> ExpertSlices(const ops::WeightMatrix& tall, int64_t experts);

// Finds and validates every tensor the llama forward pass reads: presence, dims, a type this
// build can dequantize (norms and biases must be F32), and row lengths that are whole blocks.
// Errors name the tensor. Tensors the forward pass would silently ignore (e.g. biases of a family
// that has none) are rejected.
absl::StatusOr<ModelWeights> ModelWeightsFromGguf(const gguf::File& file,
                                                  const ModelConfig& config);

}  // namespace bitsplit::model
