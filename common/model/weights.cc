#include "common/model/weights.h"

#include <cstdint>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/model/linear_backend.h"
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

// An f32 tensor of GGUF dims `dims`, read in place.
absl::StatusOr<const float*> Vector(const gguf::File& file, const std::string& name,
                                    const std::vector<int64_t>& dims) {
  BITSPLIT_ASSIGN_OR_RETURN(const gguf::TensorInfo* tensor, FindWithDims(file, name, dims));
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

std::vector<LayerVectorSpec> LayerVectorSpecs(const ModelConfig& config, int64_t layer) {
  std::vector<LayerVectorSpec> specs = {
      {"attn_norm.weight", config.d_model, &LayerNorms::attn_norm},
      {config.ffn_norm_tensor, config.d_model, &LayerNorms::ffn_norm}};
  if (config.post_norms) {
    specs.push_back({"post_attention_norm.weight", config.d_model, &LayerNorms::attn_post_norm});
    specs.push_back({"post_ffw_norm.weight", config.d_model, &LayerNorms::ffn_post_norm});
  }
  if (config.qk_norm) {
    specs.push_back({"attn_q_norm.weight", config.HeadDim(layer), &LayerNorms::attn_q_norm});
    specs.push_back({"attn_k_norm.weight", config.HeadDim(layer), &LayerNorms::attn_k_norm});
  }
  if (config.qkv_bias) {
    specs.push_back({"attn_q.bias", config.QDim(layer), &LayerNorms::q_bias});
    specs.push_back({"attn_k.bias", config.KvDim(layer), &LayerNorms::k_bias});
    specs.push_back({"attn_v.bias", config.KvDim(layer), &LayerNorms::v_bias});
  }
  if (config.layer_output_scale) {
    specs.push_back({"layer_output_scale.weight", 1, &LayerNorms::output_scale});
  }
  if (config.attn_output_bias) {
    specs.push_back({"attn_output.bias", config.d_model, &LayerNorms::o_bias});
  }
  if (config.attention_sinks) {
    specs.push_back({"attn_sinks.weight", config.num_heads, &LayerNorms::attn_sinks});
  }
  if (config.expert_biases) {
    const int64_t experts = config.num_experts;
    specs.push_back({"ffn_gate_inp.bias", experts, &LayerNorms::router_bias});
    specs.push_back({"ffn_gate_exps.bias", experts * config.d_ff_expert,
                     &LayerNorms::expert_gate_bias, experts});
    specs.push_back(
        {"ffn_up_exps.bias", experts * config.d_ff_expert, &LayerNorms::expert_up_bias, experts});
    specs.push_back(
        {"ffn_down_exps.bias", experts * config.d_model, &LayerNorms::expert_down_bias, experts});
  }
  if (config.parallel_experts) {
    specs.push_back({"ffn_gate_inp.scale", config.d_model, &LayerNorms::router_input_scale});
    specs.push_back({"ffn_down_exps.scale", config.num_experts, &LayerNorms::expert_output_scale});
    specs.push_back({"pre_ffw_norm_2.weight", config.d_model, &LayerNorms::experts_pre_norm});
    specs.push_back({"post_ffw_norm_1.weight", config.d_model, &LayerNorms::dense_post_norm});
    specs.push_back({"post_ffw_norm_2.weight", config.d_model, &LayerNorms::experts_post_norm});
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

std::vector<std::vector<ops::WeightMatrix>> ExpertMatrices(
    const std::vector<ops::WeightMatrix>& tall, int64_t experts) {
  std::vector<std::vector<ops::WeightMatrix>> result(static_cast<size_t>(experts));
  for (const ops::WeightMatrix& matrix : tall) {
    const std::vector<ops::WeightMatrix> slices = ExpertSlices(matrix, experts);
    for (int64_t e = 0; e < experts; ++e) {
      result[static_cast<size_t>(e)].push_back(slices[static_cast<size_t>(e)]);
    }
  }
  return result;
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
  for (int64_t i = 0; i < config.num_layers; ++i) {
    for (const LayerVectorSpec& spec : LayerVectorSpecs(config, i)) {
      expected.insert(absl::StrCat("blk.", i, ".", spec.tensor));
    }
    for (const char* matrix : {"attn_q", "attn_k", "attn_output"}) {
      expected.insert(LayerTensor(i, matrix));
    }
    if (!config.ValueIsKey(i)) expected.insert(LayerTensor(i, "attn_v"));
    for (const LinearGroup group : LinearGroupLayout::Of(config).LayerGroups()) {
      for (std::string& name : LinearGroupTensorNames(config, {static_cast<int32_t>(i), group})) {
        expected.insert(std::move(name));
      }
    }
    if (config.has_experts()) expected.insert(LayerTensor(i, "ffn_gate_inp"));
  }
  const int64_t d_model = config.d_model;
  ModelWeights weights;
  BITSPLIT_ASSIGN_OR_RETURN(weights.token_embd,
                            Matrix(file, "token_embd.weight", config.vocab_size, d_model));
  BITSPLIT_ASSIGN_OR_RETURN(weights.output_norm, Vector(file, "output_norm.weight", {d_model}));
  if (file.FindTensor("output.weight") != nullptr) {
    BITSPLIT_ASSIGN_OR_RETURN(weights.output,
                              Matrix(file, "output.weight", config.vocab_size, d_model));
  } else {
    weights.output = weights.token_embd;
    weights.output_tied_to_embedding = true;
  }
  if (file.FindTensor("rope_freqs.weight") != nullptr) {
    BITSPLIT_ASSIGN_OR_RETURN(weights.rope_freq_factors,
                              Vector(file, "rope_freqs.weight", {config.rope_dims / 2}));
  }

  weights.layers.resize(static_cast<size_t>(config.num_layers));
  for (int64_t i = 0; i < config.num_layers; ++i) {
    LayerWeights& layer = weights.layers[static_cast<size_t>(i)];
    for (const LayerVectorSpec& spec : LayerVectorSpecs(config, i)) {
      BITSPLIT_ASSIGN_OR_RETURN(
          layer.vectors.*spec.field,
          Vector(file, absl::StrCat("blk.", i, ".", spec.tensor), spec.GgufDims()));
    }
    const int64_t q_dim = config.QDim(i);
    const int64_t kv_dim = config.KvDim(i);
    BITSPLIT_ASSIGN_OR_RETURN(layer.wq, Matrix(file, LayerTensor(i, "attn_q"), q_dim, d_model));
    BITSPLIT_ASSIGN_OR_RETURN(layer.wk, Matrix(file, LayerTensor(i, "attn_k"), kv_dim, d_model));
    if (!config.ValueIsKey(i)) {
      BITSPLIT_ASSIGN_OR_RETURN(layer.wv, Matrix(file, LayerTensor(i, "attn_v"), kv_dim, d_model));
    }
    BITSPLIT_ASSIGN_OR_RETURN(layer.wo,
                              Matrix(file, LayerTensor(i, "attn_output"), d_model, q_dim));
    if (config.dense_ffn) {
      BITSPLIT_ASSIGN_OR_RETURN(layer.w_gate,
                                Matrix(file, LayerTensor(i, "ffn_gate"), config.d_ff, d_model));
      BITSPLIT_ASSIGN_OR_RETURN(layer.w_up,
                                Matrix(file, LayerTensor(i, "ffn_up"), config.d_ff, d_model));
      BITSPLIT_ASSIGN_OR_RETURN(layer.w_down,
                                Matrix(file, LayerTensor(i, "ffn_down"), d_model, config.d_ff));
    }
    if (config.has_experts()) {
      const int64_t experts = config.num_experts;
      BITSPLIT_ASSIGN_OR_RETURN(layer.vectors.router,
                                Matrix(file, LayerTensor(i, "ffn_gate_inp"), experts, d_model));
      const LinearGroupId gate_up{static_cast<int32_t>(i), LinearGroup::kExpertGateUp};
      const std::vector<std::string> names = LinearGroupTensorNames(config, gate_up);
      const std::vector<int64_t> rows = ExpertOutputDims(config, LinearGroup::kExpertGateUp);
      for (size_t m = 0; m < names.size(); ++m) {
        BITSPLIT_ASSIGN_OR_RETURN(ops::WeightMatrix tall,
                                  TallExpertMatrix(file, names[m], experts, rows[m], d_model));
        layer.experts_gate_up.push_back(tall);
      }
      BITSPLIT_ASSIGN_OR_RETURN(layer.experts_down,
                                TallExpertMatrix(file, LayerTensor(i, "ffn_down_exps"), experts,
                                                 d_model, config.d_ff_expert));
      layer.expert_gate_up = ExpertMatrices(layer.experts_gate_up, experts);
      layer.expert_down = ExpertMatrices({layer.experts_down}, experts);
    }
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
