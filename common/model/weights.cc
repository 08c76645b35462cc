#include "common/model/weights.h"

#include <cstdint>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/util/status_macros.h"

namespace bitsplit::model {
namespace {

std::string DimsString(const std::vector<int64_t>& dims) {
  return absl::StrCat("{", absl::StrJoin(dims, ", "), "}");
}

absl::StatusOr<const gguf::TensorInfo*> FindWithDims(const gguf::File& file,
                                                     const std::string& name,
                                                     const std::vector<int64_t>& dims) {
  const gguf::TensorInfo* tensor = file.FindTensor(name);
  if (tensor == nullptr) {
    return absl::NotFoundError(absl::StrFormat("%s: tensor %s is missing", file.name(), name));
  }
  if (tensor->dims != dims) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: tensor %s has dims %s, expected %s",
                                                      file.name(), name, DimsString(tensor->dims),
                                                      DimsString(dims)));
  }
  return tensor;
}

// Tensor `name` with GGUF dims `dims` as a [rows, cols] matrix of back-to-back rows.
absl::StatusOr<ops::WeightMatrix> MatrixWithDims(const gguf::File& file, const std::string& name,
                                                 const std::vector<int64_t>& dims, int64_t rows,
                                                 int64_t cols) {
  BITSPLIT_ASSIGN_OR_RETURN(const gguf::TensorInfo* tensor, FindWithDims(file, name, dims));
  BITSPLIT_ASSIGN_OR_RETURN(ops::WeightMatrix matrix,
                            ops::MakeWeightMatrix(tensor->type, tensor->data, rows, cols,
                                                  absl::StrCat(file.name(), ": tensor ", name)));
  if (static_cast<uint64_t>(matrix.rows * matrix.row_bytes) != tensor->num_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: tensor %s holds %d bytes, expected %d",
                                                      file.name(), name, tensor->num_bytes,
                                                      matrix.rows * matrix.row_bytes));
  }
  return matrix;
}

// A [rows, cols] linear weight (GGUF dims {cols, rows}).
absl::StatusOr<ops::WeightMatrix> Matrix(const gguf::File& file, const std::string& name,
                                         int64_t rows, int64_t cols) {
  return MatrixWithDims(file, name, {cols, rows}, rows, cols);
}

// A 3-D GGUF tensor {cols, rows, experts} as one tall [experts * rows, cols] matrix.
absl::StatusOr<ops::WeightMatrix> TallExpertMatrix(const gguf::File& file, const std::string& name,
                                                   int64_t experts, int64_t rows, int64_t cols) {
  return MatrixWithDims(file, name, {cols, rows, experts}, experts * rows, cols);
}

// An f32 vector of n elements, read in place.
absl::StatusOr<const float*> Vector(const gguf::File& file, const std::string& name, int64_t n) {
  BITSPLIT_ASSIGN_OR_RETURN(const gguf::TensorInfo* tensor, FindWithDims(file, name, {n}));
  if (tensor->type != GgmlType::kF32) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: tensor %s has type %s, expected F32", file.name(), name, GgmlTypeName(tensor->type)));
  }
  if (reinterpret_cast<uintptr_t>(tensor->data) % alignof(float) != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: tensor %s data is not 4-byte aligned", file.name(), name));
  }
  return reinterpret_cast<const float*>(tensor->data);
}

std::string LayerTensor(int64_t layer, const std::string& what) {
  return absl::StrCat("blk.", layer, ".", what, ".weight");
}

}  // namespace

std::vector<LayerVectorSpec> LayerVectorSpecs(const ModelConfig& config) {
  std::vector<LayerVectorSpec> specs = {
      {"attn_norm.weight", config.d_model, &LayerNorms::attn_norm},
      {"ffn_norm.weight", config.d_model, &LayerNorms::ffn_norm}};
  if (config.post_norms) {
    specs.push_back({"post_attention_norm.weight", config.d_model, &LayerNorms::attn_post_norm});
    specs.push_back({"post_ffw_norm.weight", config.d_model, &LayerNorms::ffn_post_norm});
  }
  if (config.qk_norm) {
    specs.push_back({"attn_q_norm.weight", config.head_dim, &LayerNorms::attn_q_norm});
    specs.push_back({"attn_k_norm.weight", config.head_dim, &LayerNorms::attn_k_norm});
  }
  if (config.qkv_bias) {
    specs.push_back({"attn_q.bias", config.q_dim(), &LayerNorms::q_bias});
    specs.push_back({"attn_k.bias", config.kv_dim(), &LayerNorms::k_bias});
    specs.push_back({"attn_v.bias", config.kv_dim(), &LayerNorms::v_bias});
  }
  return specs;
}

std::vector<ops::WeightMatrix> ExpertSlices(const ops::WeightMatrix& tall, int64_t experts) {
  BITSPLIT_CHECK(experts > 0 && tall.rows % experts == 0);
  const int64_t rows = tall.rows / experts;
  std::vector<ops::WeightMatrix> slices(static_cast<size_t>(experts), tall);
  for (int64_t e = 0; e < experts; ++e) {
    ops::WeightMatrix& slice = slices[static_cast<size_t>(e)];
    slice.rows = rows;
    slice.data = tall.data + e * rows * tall.row_bytes;
  }
  return slices;
}

EmbeddingAndNorms EmbeddingAndNormsOf(const ModelWeights& weights) {
  EmbeddingAndNorms result;
  result.token_embd = weights.token_embd;
  result.output_norm = weights.output_norm;
  result.rope_freq_factors = weights.rope_freq_factors;
  for (const LayerWeights& layer : weights.layers) result.layers.push_back(layer.vectors);
  return result;
}

absl::StatusOr<ModelWeights> ModelWeightsFromGguf(const gguf::File& file,
                                                  const ModelConfig& config) {
  // The config may come from another file than the tensors (eval compares files): everything
  // below is sized by num_layers, so it is held to this file's tensor table first.
  BITSPLIT_RETURN_IF_ERROR(CheckLayerTensors(file, config));
  // Every tensor must be one the forward pass reads (checked after the expected ones were found,
  // so a missing tensor is named first): a stray bias, an extra layer or a tensor of another
  // family would otherwise be ignored silently.
  std::set<std::string> expected = {"token_embd.weight", "output_norm.weight", "output.weight",
                                    "rope_freqs.weight"};
  const std::vector<LayerVectorSpec> vector_specs = LayerVectorSpecs(config);
  for (int64_t i = 0; i < config.num_layers; ++i) {
    for (const LayerVectorSpec& spec : vector_specs) {
      expected.insert(absl::StrCat("blk.", i, ".", spec.tensor));
    }
    for (const char* matrix : {"attn_q", "attn_k", "attn_v", "attn_output"}) {
      expected.insert(LayerTensor(i, matrix));
    }
    const auto ffn = config.has_experts()
                         ? std::vector<const char*>{"ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps",
                                                    "ffn_down_exps"}
                         : std::vector<const char*>{"ffn_gate", "ffn_up", "ffn_down"};
    for (const char* matrix : ffn) expected.insert(LayerTensor(i, matrix));
  }
  const int64_t d_model = config.d_model;
  ModelWeights weights;
  BITSPLIT_ASSIGN_OR_RETURN(weights.token_embd,
                            Matrix(file, "token_embd.weight", config.vocab_size, d_model));
  BITSPLIT_ASSIGN_OR_RETURN(weights.output_norm, Vector(file, "output_norm.weight", d_model));
  if (file.FindTensor("output.weight") != nullptr) {
    BITSPLIT_ASSIGN_OR_RETURN(weights.output,
                              Matrix(file, "output.weight", config.vocab_size, d_model));
  } else {
    weights.output = weights.token_embd;
    weights.output_tied_to_embedding = true;
  }
  if (file.FindTensor("rope_freqs.weight") != nullptr) {
    BITSPLIT_ASSIGN_OR_RETURN(weights.rope_freq_factors,
                              Vector(file, "rope_freqs.weight", config.rope_dims / 2));
  }

  weights.layers.resize(static_cast<size_t>(config.num_layers));
  for (int64_t i = 0; i < config.num_layers; ++i) {
    LayerWeights& layer = weights.layers[static_cast<size_t>(i)];
    for (const LayerVectorSpec& spec : vector_specs) {
      BITSPLIT_ASSIGN_OR_RETURN(
          layer.vectors.*spec.field,
          Vector(file, absl::StrCat("blk.", i, ".", spec.tensor), spec.length));
    }
    BITSPLIT_ASSIGN_OR_RETURN(layer.wq,
                              Matrix(file, LayerTensor(i, "attn_q"), config.q_dim(), d_model));
    BITSPLIT_ASSIGN_OR_RETURN(layer.wk,
                              Matrix(file, LayerTensor(i, "attn_k"), config.kv_dim(), d_model));
    BITSPLIT_ASSIGN_OR_RETURN(layer.wv,
                              Matrix(file, LayerTensor(i, "attn_v"), config.kv_dim(), d_model));
    BITSPLIT_ASSIGN_OR_RETURN(layer.wo,
                              Matrix(file, LayerTensor(i, "attn_output"), d_model, config.q_dim()));
    if (config.has_experts()) {
      const int64_t experts = config.num_experts;
      const int64_t width = config.d_ff_expert;
      BITSPLIT_ASSIGN_OR_RETURN(layer.vectors.router,
                                Matrix(file, LayerTensor(i, "ffn_gate_inp"), experts, d_model));
      BITSPLIT_ASSIGN_OR_RETURN(
          layer.w_gate,
          TallExpertMatrix(file, LayerTensor(i, "ffn_gate_exps"), experts, width, d_model));
      BITSPLIT_ASSIGN_OR_RETURN(layer.w_up, TallExpertMatrix(file, LayerTensor(i, "ffn_up_exps"),
                                                             experts, width, d_model));
      BITSPLIT_ASSIGN_OR_RETURN(
          layer.w_down,
          TallExpertMatrix(file, LayerTensor(i, "ffn_down_exps"), experts, d_model, width));
      layer.expert_gate = ExpertSlices(layer.w_gate, experts);
      layer.expert_up = ExpertSlices(layer.w_up, experts);
      layer.expert_down = ExpertSlices(layer.w_down, experts);
      continue;
    }
    BITSPLIT_ASSIGN_OR_RETURN(layer.w_gate,
                              Matrix(file, LayerTensor(i, "ffn_gate"), config.d_ff, d_model));
    BITSPLIT_ASSIGN_OR_RETURN(layer.w_up,
                              Matrix(file, LayerTensor(i, "ffn_up"), config.d_ff, d_model));
    BITSPLIT_ASSIGN_OR_RETURN(layer.w_down,
                              Matrix(file, LayerTensor(i, "ffn_down"), d_model, config.d_ff));
  }
  for (const gguf::TensorInfo& tensor : file.tensors()) {
    if (expected.count(tensor.name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: tensor %s is not part of a %d-layer %s model", file.name(),
                          tensor.name, config.num_layers, config.architecture));
    }
  }
  return weights;
}

}  // namespace bitsplit::model
