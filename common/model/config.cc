#include "common/model/config.h"

#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/util/status_macros.h"

namespace bitsplit::model {
namespace {

std::string Key(const std::string& suffix) { return absl::StrCat("llama.", suffix); }

// A required positive integer hyperparameter.
absl::StatusOr<int64_t> RequiredCount(const gguf::File& file, const std::string& suffix) {
  BITSPLIT_ASSIGN_OR_RETURN(uint64_t value, file.GetUint(Key(suffix)));
  if (value == 0 || value > (uint64_t{1} << 31)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %s = %d is out of range", file.name(), Key(suffix), value));
  }
  return static_cast<int64_t>(value);
}

// An optional positive integer hyperparameter: `fallback` when the key is absent.
absl::StatusOr<int64_t> OptionalCount(const gguf::File& file, const std::string& suffix,
                                      int64_t fallback) {
  if (file.Find(Key(suffix)) == nullptr) return fallback;
  return RequiredCount(file, suffix);
}

absl::StatusOr<float> OptionalFloat(const gguf::File& file, const std::string& suffix,
                                    float fallback) {
  if (file.Find(Key(suffix)) == nullptr) return fallback;
  BITSPLIT_ASSIGN_OR_RETURN(double value, file.GetFloat(Key(suffix)));
  return static_cast<float>(value);
}

absl::Status Invalid(const gguf::File& file, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat(file.name(), ": ", message));
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfigFromGguf(const gguf::File& file) {
  // The vocabulary is the embedding table's row count; the metadata must agree with it.
  const gguf::TensorInfo* embedding = file.FindTensor("token_embd.weight");
  if (embedding == nullptr || embedding->dims.size() != 2) {
    return Invalid(file, "tensor token_embd.weight is missing or not 2-dimensional");
  }
  return ModelConfigFromGgufMetadata(file, embedding->dims[1]);
}

absl::StatusOr<ModelConfig> ModelConfigFromGgufMetadata(const gguf::File& file,
                                                        int64_t embedding_rows) {
  ModelConfig config;
  BITSPLIT_ASSIGN_OR_RETURN(config.architecture, file.GetString("general.architecture"));
  if (config.architecture != "llama") {
    return absl::UnimplementedError(
        absl::StrFormat("%s: architecture \"%s\" is not supported (only \"llama\" is)", file.name(),
                        config.architecture));
  }
  BITSPLIT_ASSIGN_OR_RETURN(config.num_layers, RequiredCount(file, "block_count"));
  BITSPLIT_ASSIGN_OR_RETURN(config.d_model, RequiredCount(file, "embedding_length"));
  BITSPLIT_ASSIGN_OR_RETURN(config.d_ff, RequiredCount(file, "feed_forward_length"));
  BITSPLIT_ASSIGN_OR_RETURN(config.num_heads, RequiredCount(file, "attention.head_count"));
  BITSPLIT_ASSIGN_OR_RETURN(config.num_kv_heads,
                            OptionalCount(file, "attention.head_count_kv", config.num_heads));
  BITSPLIT_ASSIGN_OR_RETURN(config.context_length, RequiredCount(file, "context_length"));

  if (config.num_heads % config.num_kv_heads != 0) {
    return Invalid(file, absl::StrFormat("attention.head_count %d is not a multiple of "
                                         "attention.head_count_kv %d",
                                         config.num_heads, config.num_kv_heads));
  }
  // Head width: explicit key/value lengths when present, else d_model split over the heads.
  const bool has_key_length = file.Find(Key("attention.key_length")) != nullptr;
  if (!has_key_length && config.d_model % config.num_heads != 0) {
    return Invalid(file, absl::StrFormat("embedding_length %d is not a multiple of "
                                         "attention.head_count %d",
                                         config.d_model, config.num_heads));
  }
  BITSPLIT_ASSIGN_OR_RETURN(config.head_dim, OptionalCount(file, "attention.key_length",
                                                           config.d_model / config.num_heads));
  BITSPLIT_ASSIGN_OR_RETURN(int64_t value_length,
                            OptionalCount(file, "attention.value_length", config.head_dim));
  if (value_length != config.head_dim) {
    return Invalid(file, absl::StrFormat("attention.key_length %d != attention.value_length %d "
                                         "is not supported",
                                         config.head_dim, value_length));
  }
  BITSPLIT_ASSIGN_OR_RETURN(config.rope_dims,
                            OptionalCount(file, "rope.dimension_count", config.head_dim));
  if (config.rope_dims % 2 != 0 || config.rope_dims > config.head_dim) {
    return Invalid(file, absl::StrFormat("rope.dimension_count %d must be even and at most the "
                                         "head width %d",
                                         config.rope_dims, config.head_dim));
  }

  BITSPLIT_ASSIGN_OR_RETURN(config.rope_freq_base, OptionalFloat(file, "rope.freq_base", 10000));
  BITSPLIT_ASSIGN_OR_RETURN(config.rms_norm_eps,
                            OptionalFloat(file, "attention.layer_norm_rms_epsilon", 1e-5f));
  if (!(config.rope_freq_base > 0.0f) || !(config.rms_norm_eps >= 0.0f)) {
    return Invalid(file, absl::StrFormat("rope.freq_base %g / layer_norm_rms_epsilon %g out of "
                                         "range",
                                         config.rope_freq_base, config.rms_norm_eps));
  }
  if (file.Find(Key("rope.scaling.type")) != nullptr) {
    BITSPLIT_ASSIGN_OR_RETURN(std::string scaling, file.GetString(Key("rope.scaling.type")));
    if (scaling == "linear") {
      BITSPLIT_ASSIGN_OR_RETURN(float factor, OptionalFloat(file, "rope.scaling.factor", 1.0f));
      if (!(factor > 0.0f)) return Invalid(file, "rope.scaling.factor must be positive");
      config.rope_freq_scale = 1.0f / factor;
    } else if (scaling != "none") {
      return absl::UnimplementedError(
          absl::StrFormat("%s: rope scaling type \"%s\" is not supported", file.name(), scaling));
    }
  }
  if (file.Find(Key("expert_count")) != nullptr) {
    BITSPLIT_ASSIGN_OR_RETURN(uint64_t num_experts, file.GetUint(Key("expert_count")));
    if (num_experts > 0) {
      return absl::UnimplementedError(
          absl::StrFormat("%s: mixture-of-experts llama models (%d experts) are not supported",
                          file.name(), num_experts));
    }
  }

  if (embedding_rows <= 0) {
    return Invalid(file, absl::StrFormat("embedding table has %d rows", embedding_rows));
  }
  config.vocab_size = embedding_rows;
  if (file.Find(Key("vocab_size")) != nullptr) {
    BITSPLIT_ASSIGN_OR_RETURN(int64_t declared, RequiredCount(file, "vocab_size"));
    if (declared != config.vocab_size) {
      return Invalid(file, absl::StrFormat("llama.vocab_size %d != token_embd.weight rows %d",
                                           declared, config.vocab_size));
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
  return c;
}

}  // namespace bitsplit::model
