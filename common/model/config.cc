#include "common/model/config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string_view>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/io/byte_reader.h"
#include "common/util/status_macros.h"

namespace bitsplit::model {
namespace {

// What a family does differently, as llama.cpp's loader and graph for that architecture.
struct FamilyTraits {
  const char* architecture;
  RopeStyle rope_style;
  FfnActivation ffn_activation;
  bool scale_embedding;  // by sqrt(d_model)
  bool qk_norm;
  bool post_norms;
  bool qkv_bias;
  // Local/global layer pattern when the file names a sliding window but no pattern: every
  // `swa_pattern`-th layer is global, the others local (0: no sliding window in this family).
  int swa_pattern;
};

constexpr FamilyTraits kFamilies[] = {
    {"llama", RopeStyle::kAdjacentPairs, FfnActivation::kSilu, false, false, false, false, 0},
    {"gemma3", RopeStyle::kHalves, FfnActivation::kGeluTanh, true, true, true, false, 6},
    {"qwen2", RopeStyle::kHalves, FfnActivation::kSilu, false, false, false, true, 0},
    {"qwen3", RopeStyle::kHalves, FfnActivation::kSilu, false, true, false, false, 0},
};

const FamilyTraits* FindFamily(const std::string& architecture) {
  for (const FamilyTraits& family : kFamilies) {
    if (architecture == family.architecture) return &family;
  }
  return nullptr;
}

// Reads `<architecture>.<suffix>` keys.
class Keys {
 public:
  Keys(const gguf::File& file, std::string architecture)
      : file_(file), prefix_(std::move(architecture)) {}

  std::string Key(const std::string& suffix) const { return absl::StrCat(prefix_, ".", suffix); }
  bool Has(const std::string& suffix) const { return file_.Find(Key(suffix)) != nullptr; }

  // A required positive integer hyperparameter, at most `max`.
  absl::StatusOr<int64_t> RequiredCount(const std::string& suffix,
                                        int64_t max = int64_t{1} << 31) const {
    BITSPLIT_ASSIGN_OR_RETURN(uint64_t value, file_.GetUint(Key(suffix)));
    if (value == 0 || value > static_cast<uint64_t>(max)) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: %s = %d is out of range [1, %d]",
                                                        file_.name(), Key(suffix), value, max));
    }
    return static_cast<int64_t>(value);
  }
  // An optional positive integer hyperparameter: `fallback` when the key is absent.
  absl::StatusOr<int64_t> OptionalCount(const std::string& suffix, int64_t fallback) const {
    if (!Has(suffix)) return fallback;
    return RequiredCount(suffix);
  }
  absl::StatusOr<float> OptionalFloat(const std::string& suffix, float fallback) const {
    if (!Has(suffix)) return fallback;
    BITSPLIT_ASSIGN_OR_RETURN(double value, file_.GetFloat(Key(suffix)));
    return static_cast<float>(value);
  }

 private:
  const gguf::File& file_;
  std::string prefix_;
};

absl::Status Invalid(const gguf::File& file, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat(file.name(), ": ", message));
}

// The local/global layer pattern of a sliding-window family: the file's
// attention.sliding_window_pattern (a per-layer bool array, or a period n: layer i is local
// unless i % n == n - 1, 0 meaning every layer is local), else the family's period.
absl::Status ReadLayerPattern(const gguf::File& file, const Keys& keys, int default_period,
                              ModelConfig& config) {
  config.layer_is_local.assign(static_cast<size_t>(config.num_layers), 0);
  const std::string key = keys.Key("attention.sliding_window_pattern");
  const gguf::Value* pattern = file.Find(key);
  if (pattern != nullptr) {
    if (const auto* array = std::get_if<gguf::Array>(&pattern->data); array != nullptr) {
      if (static_cast<int64_t>(array->elements.size()) != config.num_layers) {
        return Invalid(file, absl::StrFormat("%s has %d entries for %d layers", key,
                                             array->elements.size(), config.num_layers));
      }
      for (size_t i = 0; i < array->elements.size(); ++i) {
        const bool* local = std::get_if<bool>(&array->elements[i].data);
        if (local == nullptr) return Invalid(file, absl::StrCat(key, " is not a bool array"));
        config.layer_is_local[i] = *local ? 1 : 0;
      }
      return absl::OkStatus();
    }
  }
  int64_t period = default_period;
  if (pattern != nullptr) {
    BITSPLIT_ASSIGN_OR_RETURN(uint64_t value, file.GetUint(key));
    if (value > (uint64_t{1} << 20)) {
      return Invalid(file, absl::StrFormat("%s = %d is out of range", key, value));
    }
    period = static_cast<int64_t>(value);
  }
  for (int64_t i = 0; i < config.num_layers; ++i) {
    config.layer_is_local[static_cast<size_t>(i)] = period == 0 || i % period < period - 1;
  }
  return absl::OkStatus();
}

// The N of a "blk.N.<rest>" tensor name; -1 for names of another form. Indices too long to be a
// layer come back as INT64_MAX, which is beyond any block_count.
int64_t LayerOfTensor(std::string_view name) {
  constexpr std::string_view kPrefix = "blk.";
  if (name.substr(0, kPrefix.size()) != kPrefix) return -1;
  size_t i = kPrefix.size();
  int64_t layer = 0;
  size_t digits = 0;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i, ++digits) {
    if (digits < 18) layer = layer * 10 + (name[i] - '0');
  }
  if (digits == 0 || i == name.size() || name[i] != '.') return -1;
  return digits > 18 ? INT64_MAX : layer;
}

}  // namespace

absl::Status CheckLayerTensors(const gguf::File& file, const ModelConfig& config) {
  const std::string key = absl::StrCat(config.architecture, ".block_count");
  if (config.num_layers <= 0 || config.num_layers > kMaxLayers) {
    return Invalid(file, absl::StrFormat("%s = %d is out of range [1, %d]", key, config.num_layers,
                                         kMaxLayers));
  }
  // Layers present, and how many the tensor table implies (the highest index + 1), for messages.
  std::vector<uint8_t> present(static_cast<size_t>(config.num_layers), 0);
  int64_t table_layers = 0;
  const gguf::TensorInfo* stray = nullptr;
  for (const gguf::TensorInfo& tensor : file.tensors()) {
    const int64_t layer = LayerOfTensor(tensor.name);
    if (layer < 0) continue;
    table_layers = std::max(table_layers, layer == INT64_MAX ? layer : layer + 1);
    if (layer >= config.num_layers) {
      if (stray == nullptr) stray = &tensor;
      continue;
    }
    present[static_cast<size_t>(layer)] = 1;
  }
  if (stray != nullptr) {
    return Invalid(file, absl::StrFormat("%s = %d, but tensor %s belongs to layer %d (the tensor "
                                         "table has blk.N tensors up to layer %d)",
                                         key, config.num_layers, io::Quote(stray->name),
                                         LayerOfTensor(stray->name), table_layers - 1));
  }
  for (int64_t layer = 0; layer < config.num_layers; ++layer) {
    if (present[static_cast<size_t>(layer)] == 0) {
      return Invalid(file, absl::StrFormat("%s = %d, but the tensor table has no blk.%d.* tensors "
                                           "(it has blk.N tensors for %d layers)",
                                           key, config.num_layers, layer, table_layers));
    }
  }
  return absl::OkStatus();
}

std::string SupportedArchitectures() {
  std::string names;
  for (const FamilyTraits& family : kFamilies) {
    absl::StrAppend(&names, names.empty() ? "" : ", ", family.architecture);
  }
  return names;
}

absl::StatusOr<ModelConfig> ModelConfigFromGguf(const gguf::File& file) {
  // The vocabulary is the embedding table's row count; the metadata must agree with it.
  const gguf::TensorInfo* embedding = file.FindTensor("token_embd.weight");
  if (embedding == nullptr || embedding->dims.size() != 2) {
    return Invalid(file, "tensor token_embd.weight is missing or not 2-dimensional");
  }
  BITSPLIT_ASSIGN_OR_RETURN(ModelConfig config,
                            ModelConfigFromGgufMetadata(file, embedding->dims[1]));
  if (embedding->dims[0] != config.d_model) {
    return Invalid(file, absl::StrFormat("%s.embedding_length = %d, but token_embd.weight is %d "
                                         "wide",
                                         config.architecture, config.d_model, embedding->dims[0]));
  }
  BITSPLIT_RETURN_IF_ERROR(CheckLayerTensors(file, config));
  return config;
}

absl::StatusOr<ModelConfig> ModelConfigFromGgufMetadata(const gguf::File& file,
                                                        int64_t embedding_rows) {
  ModelConfig config;
  BITSPLIT_ASSIGN_OR_RETURN(config.architecture, file.GetString("general.architecture"));
  const FamilyTraits* family = FindFamily(config.architecture);
  if (family == nullptr) {
    return absl::UnimplementedError(
        absl::StrFormat("%s: architecture \"%s\" is not supported (supported: %s)", file.name(),
                        config.architecture, SupportedArchitectures()));
  }
  config.rope_style = family->rope_style;
  config.ffn_activation = family->ffn_activation;
  config.qk_norm = family->qk_norm;
  config.post_norms = family->post_norms;
  config.qkv_bias = family->qkv_bias;

  const Keys keys(file, config.architecture);
  BITSPLIT_ASSIGN_OR_RETURN(config.num_layers, keys.RequiredCount("block_count", kMaxLayers));
  BITSPLIT_ASSIGN_OR_RETURN(config.d_model, keys.RequiredCount("embedding_length"));
  BITSPLIT_ASSIGN_OR_RETURN(config.d_ff, keys.RequiredCount("feed_forward_length"));
  BITSPLIT_ASSIGN_OR_RETURN(config.num_heads, keys.RequiredCount("attention.head_count"));
  BITSPLIT_ASSIGN_OR_RETURN(config.num_kv_heads,
                            keys.OptionalCount("attention.head_count_kv", config.num_heads));
  BITSPLIT_ASSIGN_OR_RETURN(config.context_length, keys.RequiredCount("context_length"));

  if (config.num_heads % config.num_kv_heads != 0) {
    return Invalid(file, absl::StrFormat("attention.head_count %d is not a multiple of "
                                         "attention.head_count_kv %d",
                                         config.num_heads, config.num_kv_heads));
  }
  // Head width: explicit key/value lengths when present, else d_model split over the heads.
  if (!keys.Has("attention.key_length") && config.d_model % config.num_heads != 0) {
    return Invalid(file, absl::StrFormat("embedding_length %d is not a multiple of "
                                         "attention.head_count %d",
                                         config.d_model, config.num_heads));
  }
  BITSPLIT_ASSIGN_OR_RETURN(config.head_dim, keys.OptionalCount("attention.key_length",
                                                                config.d_model / config.num_heads));
  BITSPLIT_ASSIGN_OR_RETURN(int64_t value_length,
                            keys.OptionalCount("attention.value_length", config.head_dim));
  if (value_length != config.head_dim) {
    return Invalid(file, absl::StrFormat("attention.key_length %d != attention.value_length %d "
                                         "is not supported",
                                         config.head_dim, value_length));
  }
  BITSPLIT_ASSIGN_OR_RETURN(config.rope_dims,
                            keys.OptionalCount("rope.dimension_count", config.head_dim));
  if (config.rope_dims % 2 != 0 || config.rope_dims > config.head_dim) {
    return Invalid(file, absl::StrFormat("rope.dimension_count %d must be even and at most the "
                                         "head width %d",
                                         config.rope_dims, config.head_dim));
  }

  BITSPLIT_ASSIGN_OR_RETURN(config.rope_freq_base, keys.OptionalFloat("rope.freq_base", 10000));
  BITSPLIT_ASSIGN_OR_RETURN(config.rms_norm_eps,
                            keys.OptionalFloat("attention.layer_norm_rms_epsilon", 1e-5f));
  if (!(config.rope_freq_base > 0.0f) || !(config.rms_norm_eps >= 0.0f)) {
    return Invalid(file, absl::StrFormat("rope.freq_base %g / layer_norm_rms_epsilon %g out of "
                                         "range",
                                         config.rope_freq_base, config.rms_norm_eps));
  }
  if (keys.Has("rope.scaling.type")) {
    BITSPLIT_ASSIGN_OR_RETURN(std::string scaling, file.GetString(keys.Key("rope.scaling.type")));
    if (scaling == "linear") {
      BITSPLIT_ASSIGN_OR_RETURN(float factor, keys.OptionalFloat("rope.scaling.factor", 1.0f));
      if (!(factor > 0.0f)) return Invalid(file, "rope.scaling.factor must be positive");
      config.rope_freq_scale = 1.0f / factor;
    } else if (scaling != "none") {
      return absl::UnimplementedError(
          absl::StrFormat("%s: rope scaling type \"%s\" is not supported", file.name(), scaling));
    }
  }
  if (keys.Has("expert_count")) {
    BITSPLIT_ASSIGN_OR_RETURN(uint64_t num_experts, file.GetUint(keys.Key("expert_count")));
    if (num_experts > 0) {
      return absl::UnimplementedError(
          absl::StrFormat("%s: mixture-of-experts models (%d experts) are not supported",
                          file.name(), num_experts));
    }
  }
  if (keys.Has("final_logit_softcapping")) {
    BITSPLIT_ASSIGN_OR_RETURN(float softcap, keys.OptionalFloat("final_logit_softcapping", 0));
    if (softcap != 0.0f) {
      return absl::UnimplementedError(absl::StrFormat(
          "%s: final logit soft-capping (%g) is not supported", file.name(), softcap));
    }
  }

  // Attention scale: 1/sqrt(head width), except gemma3 27B (62 layers), whose queries are
  // scaled by 1/sqrt(d_model / heads) (gemma_pytorch's query_pre_attn_scalar, as llama.cpp).
  config.attention_scale = 1.0f / std::sqrt(static_cast<float>(config.head_dim));
  if (config.architecture == "gemma3" && config.num_layers == 62) {
    config.attention_scale =
        1.0f / std::sqrt(static_cast<float>(config.d_model / config.num_heads));
  }
  if (family->scale_embedding) {
    config.embedding_scale = std::sqrt(static_cast<float>(config.d_model));
  }
  if (family->swa_pattern > 0 && keys.Has("attention.sliding_window")) {
    BITSPLIT_ASSIGN_OR_RETURN(uint64_t window, file.GetUint(keys.Key("attention.sliding_window")));
    if (window > (uint64_t{1} << 31)) {
      return Invalid(file,
                     absl::StrFormat("attention.sliding_window = %d is out of range", window));
    }
    config.sliding_window = static_cast<int64_t>(window);
    if (config.sliding_window > 0) {
      BITSPLIT_RETURN_IF_ERROR(ReadLayerPattern(file, keys, family->swa_pattern, config));
      BITSPLIT_ASSIGN_OR_RETURN(config.rope_freq_base_local,
                                keys.OptionalFloat("rope.freq_base_swa", 10000.0f));
      if (!(config.rope_freq_base_local > 0.0f)) {
        return Invalid(file, "rope.freq_base_swa must be positive");
      }
    }
  }

  if (embedding_rows <= 0) {
    return Invalid(file, absl::StrFormat("embedding table has %d rows", embedding_rows));
  }
  config.vocab_size = embedding_rows;
  if (keys.Has("vocab_size")) {
    BITSPLIT_ASSIGN_OR_RETURN(int64_t declared, keys.RequiredCount("vocab_size"));
    if (declared != config.vocab_size) {
      return Invalid(file, absl::StrFormat("%s %d != token_embd.weight rows %d",
                                           keys.Key("vocab_size"), declared, config.vocab_size));
    }
  }
  if (const gguf::Value* tokens = file.Find("tokenizer.ggml.tokens"); tokens != nullptr) {
    const auto* array = std::get_if<gguf::Array>(&tokens->data);
    if (array != nullptr && static_cast<int64_t>(array->elements.size()) > config.vocab_size) {
      return Invalid(file, absl::StrFormat("tokenizer has %d tokens but token_embd.weight only "
                                           "%d rows",
                                           array->elements.size(), config.vocab_size));
    }
  }
  return config;
}

ModelConfig EightBClassConfig() {
  ModelConfig c;
  c.architecture = "llama";
  c.num_layers = 32;
  c.d_model = 4096;
  c.d_ff = 14336;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.rope_dims = 128;
  c.rope_freq_base = 500000.0f;
  c.rms_norm_eps = 1e-5f;
  c.context_length = 8192;
  c.vocab_size = 128256;
  c.attention_scale = 1.0f / std::sqrt(128.0f);
  return c;
}

}  // namespace bitsplit::model
