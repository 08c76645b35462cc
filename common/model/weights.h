#pragma once
// Views of a llama model's tensors inside the mapped GGUF file. Nothing is copied: every pointer
// points into the gguf::File image, which must outlive the ModelWeights.
//
// Thread safety: read-only after ModelWeightsFromGguf; safe to share between threads.
//
// Shape notation: [rows, cols] of the row-major matrix, i.e. the GGUF dims {cols, rows}
// (ggml lists the contiguous dimension first). A linear layer y = x · Wᵀ maps cols -> rows.
#include <string>
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
  const float* attn_q_norm = nullptr;     // [HeadDim(layer)], qk_norm
  const float* attn_k_norm = nullptr;     // [HeadDim(layer)], qk_norm
  const float* q_bias = nullptr;          // [QDim(layer)], qkv_bias
  const float* k_bias = nullptr;          // [KvDim(layer)], qkv_bias
  const float* v_bias = nullptr;          // [KvDim(layer)], qkv_bias
  const float* output_scale = nullptr;    // [1], layer_output_scale
  const float* o_bias = nullptr;          // [d_model], attn_output_bias
  const float* attn_sinks = nullptr;      // [num_heads], attention_sinks
  // expert_biases (gpt-oss): the router's, and each expert's rows of its matrices' biases.
  const float* router_bias = nullptr;       // [num_experts]
  const float* expert_gate_bias = nullptr;  // [num_experts, d_ff_expert]
  const float* expert_up_bias = nullptr;    // [num_experts, d_ff_expert]
  const float* expert_down_bias = nullptr;  // [num_experts, d_model]
  ops::WeightMatrix router;                 // [num_experts, d_model], has_experts (ffn_gate_inp)
  // parallel_experts (gemma4's MoE layers, see ModelConfig):
  const float* router_input_scale = nullptr;   // [d_model], ffn_gate_inp.scale
  const float* expert_output_scale = nullptr;  // [num_experts], ffn_down_exps.scale
  const float* experts_pre_norm = nullptr;     // [d_model], pre_ffw_norm_2
  const float* dense_post_norm = nullptr;      // [d_model], post_ffw_norm_1
  const float* experts_post_norm = nullptr;    // [d_model], post_ffw_norm_2
};

// One per-layer vector of a family: its GGUF tensor name after "blk.N.", its length and the
// LayerNorms field it fills. The forward pass reads exactly these; the quantizer copies them.
struct LayerVectorSpec {
  std::string tensor;  // e.g. "post_attention_norm.weight"
  int64_t length;      // floats in all
  const float* LayerNorms::*field;
  // A per-expert table (the experts' biases): GGUF dims {length / rows, rows}; 1: a vector
  // {length}.
  int64_t rows = 1;

  std::vector<int64_t> GgufDims() const {
    return rows == 1 ? std::vector<int64_t>{length} : std::vector<int64_t>{length / rows, rows};
  }
};
std::vector<LayerVectorSpec> LayerVectorSpecs(const ModelConfig& config, int64_t layer);

struct LayerWeights {
  LayerNorms vectors;
  ops::WeightMatrix wq;  // [QDim(layer), d_model]
  ops::WeightMatrix wk;  // [KvDim(layer), d_model]
  ops::WeightMatrix wv;  // [KvDim(layer), d_model]; none (data null) where ValueIsKey(layer)
  ops::WeightMatrix wo;  // [d_model, QDim(layer)]
  // The dense FFN (dense_ffn): [d_ff, d_model], [d_ff, d_model], [d_model, d_ff].
  ops::WeightMatrix w_gate;
  ops::WeightMatrix w_up;
  ops::WeightMatrix w_down;
  // The experts (has_experts): the 3-D GGUF tensors ({cols, rows, num_experts}) as tall matrices
  // [num_experts * rows, cols] (LinearGroupTensorNames): ffn_gate_exps and ffn_up_exps, or the
  // fused ffn_gate_up_exps alone in experts_gate_up[0] (fused_expert_gate_up); ffn_down_exps.
  std::vector<ops::WeightMatrix> experts_gate_up;
  ops::WeightMatrix experts_down;
  // Expert e's matrices of each group: rows [e * rows, (e + 1) * rows) of the tall matrices
  // (ExpertSlices), [num_experts][matrix].
  std::vector<std::vector<ops::WeightMatrix>> expert_gate_up;
  std::vector<std::vector<ops::WeightMatrix>> expert_down;
};

struct ModelWeights {
  ops::WeightMatrix token_embd;           // [vocab, d_model]
  const float* output_norm = nullptr;     // [d_model]
  ops::WeightMatrix output;               // [vocab, d_model]; token_embd when tied
  bool output_tied_to_embedding = false;  // the file has no output.weight (e.g. SmolLM2)
  // [rope_dims / 2] or null: llama 3's "rope_freqs", gemma4's proportional RoPE; the global
  // layers divide their RoPE frequencies by them.
  const float* rope_freq_factors = nullptr;
  std::vector<LayerWeights> layers;  // [num_layers]
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
// Each expert's slices of a group's tall matrices: [expert][matrix].
std::vector<std::vector<ops::WeightMatrix>> ExpertMatrices(
    const std::vector<ops::WeightMatrix>& tall, int64_t experts);

// Finds and validates every tensor the llama forward pass reads: presence, dims, a type this
// build can dequantize (norms and biases must be F32), and row lengths that are whole blocks.
// Errors name the tensor. Tensors the forward pass would silently ignore (e.g. biases of a family
// that has none) are rejected.
absl::StatusOr<ModelWeights> ModelWeightsFromGguf(const gguf::File& file,
                                                  const ModelConfig& config);

}  // namespace bitsplit::model
