#include "common/model/config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/io/byte_reader.h"
#include "common/util/status_macros.h"

namespace bitsplit::model {
namespace {

// Where a family's experts go (ModelConfig: dense_ffn, parallel_experts).
enum class ExpertLayout {
  kNone,            // no experts
  kEveryFfn,        // every layer's FFN is the experts (expert_count required)
  kBesideDenseFfn,  // with expert_count, every layer's experts run beside its dense FFN
};

// What a family does differently, as llama.cpp's loader and graph for that architecture.
struct FamilyTraits {
  const char* architecture;
  RopeStyle rope_style = RopeStyle::kHalves;
  FfnActivation ffn_activation = FfnActivation::kSilu;
  bool scale_embedding = false;  // by sqrt(d_model)
  bool qk_norm = false;
  bool post_norms = false;
  bool qkv_bias = false;
  // Local/global layer pattern when the file names a sliding window but no pattern: every
  // `swa_pattern`-th layer is global, the others local (0: no sliding window in this family;
  // kPatternArrayRequired: the file must give the window and the per-layer bool array).
  int swa_pattern = 0;
  ExpertLayout experts = ExpertLayout::kNone;
  bool softcap = false;  // the graph applies final_logit_softcapping
  // gemma4: local layers with their own head width and RoPE dims, per-layer KV head counts,
  // layers without attn_v, the weightless v norm, layer_output_scale, attention scale 1.
  bool per_layer_attention = false;
  // gpt-oss: attention sinks, the output projection's bias, biased router and experts, top-k
  // then softmax gating, the pre-FFN norm named post_attention_norm, and local layers whose RoPE
  // has the global base and scaling unless the file names rope.freq_base_swa.
  bool gpt_oss_layers = false;
};

constexpr int kPatternArrayRequired = -1;

constexpr FamilyTraits kFamilies[] = {
    {.architecture = "llama", .rope_style = RopeStyle::kAdjacentPairs},
    {.architecture = "gemma3",
     .ffn_activation = FfnActivation::kGeluTanh,
     .scale_embedding = true,
     .qk_norm = true,
     .post_norms = true,
     .swa_pattern = 6,
     .softcap = true},
    {.architecture = "gemma4",
     .ffn_activation = FfnActivation::kGeluTanh,
     .scale_embedding = true,
     .qk_norm = true,
     .post_norms = true,
     .swa_pattern = kPatternArrayRequired,
     .experts = ExpertLayout::kBesideDenseFfn,
     .softcap = true,
     .per_layer_attention = true},
    {.architecture = "qwen2", .qkv_bias = true},
    {.architecture = "qwen3", .qk_norm = true},
    {.architecture = "qwen3moe", .qk_norm = true, .experts = ExpertLayout::kEveryFfn},
    {.architecture = "gpt-oss",
     .ffn_activation = FfnActivation::kSwigluOai,
     .qkv_bias = true,
     .swa_pattern = 2,
     .experts = ExpertLayout::kEveryFfn,
     .gpt_oss_layers = true},
};

const FamilyTraits* FamilyOf(std::string_view architecture) {
  for (const FamilyTraits& family : kFamilies) {
    if (architecture == family.architecture) return &family;
  }
  return nullptr;
}

// Most experts a layer may declare (the largest published MoE models have 512).
constexpr int64_t kMaxExperts = 4096;

constexpr int64_t kMaxCount = int64_t{1} << 31;

// The hyperparameters that fill a field as they are: `<architecture>.<suffix>`, in reading order.
// A count is an integer in [1, max]; when absent it copies the field `same_as` (read before it),
// and without `same_as` it is required. An absent real takes `fallback`.
struct CountKey {
  const char* suffix;
  int64_t ModelConfig::*field;
  int64_t max = kMaxCount;
  int64_t ModelConfig::*same_as = nullptr;
};
struct FloatKey {
  const char* suffix;
  float ModelConfig::*field;
  float fallback;
};

constexpr CountKey kCountKeys[] = {
    {"block_count", &ModelConfig::num_layers, kMaxLayers},
    {"embedding_length", &ModelConfig::d_model},
    {"feed_forward_length", &ModelConfig::d_ff},
    {"attention.head_count", &ModelConfig::num_heads},
    {"context_length", &ModelConfig::context_length},
};
constexpr FloatKey kFloatKeys[] = {
    {"rope.freq_base", &ModelConfig::rope_freq_base, 10000.0f},
    {"attention.layer_norm_rms_epsilon", &ModelConfig::rms_norm_eps, 1e-5f},
};

template <typename... Args>
absl::Status Invalid(const gguf::File& file, const absl::FormatSpec<Args...>& format,
                     const Args&... args) {
  return absl::InvalidArgumentError(
      absl::StrCat(file.name(), ": ", absl::StrFormat(format, args...)));
}

template <typename... Args>
absl::Status Unsupported(const gguf::File& file, const absl::FormatSpec<Args...>& format,
                         const Args&... args) {
  return absl::UnimplementedError(
      absl::StrCat(file.name(), ": ", absl::StrFormat(format, args...)));
}

absl::StatusOr<const FamilyTraits*> FindFamily(const gguf::File& file) {
  BITSPLIT_ASSIGN_OR_RETURN(const std::string architecture, file.GetString("general.architecture"));
  if (const FamilyTraits* family = FamilyOf(architecture); family != nullptr) return family;
  return Unsupported(file, "architecture \"%s\" is not supported (supported: %s)", architecture,
                     SupportedArchitectures());
}

// The `<architecture>.*` keys of a file.
struct Metadata {
  const gguf::File& file;
  std::string prefix;  // "<architecture>."

  std::string Key(const std::string& suffix) const { return prefix + suffix; }
  bool Has(const std::string& suffix) const { return file.Find(Key(suffix)) != nullptr; }
  // An integer in [1, max]; `fallback` when the key is absent, which without one is an error.
  absl::StatusOr<int64_t> Count(const std::string& suffix,
                                std::optional<int64_t> fallback = std::nullopt,
                                int64_t max = kMaxCount) const {
    if (fallback.has_value() && !Has(suffix)) return *fallback;
    BITSPLIT_ASSIGN_OR_RETURN(const uint64_t value, file.GetUint(Key(suffix)));
    if (value == 0 || value > static_cast<uint64_t>(max)) {
      return Invalid(file, "%s = %d is out of range [1, %d]", Key(suffix), value, max);
    }
    return static_cast<int64_t>(value);
  }
  absl::StatusOr<uint64_t> Uint(const std::string& suffix, uint64_t fallback) const {
    if (!Has(suffix)) return fallback;
    return file.GetUint(Key(suffix));
  }
  absl::StatusOr<float> Float(const std::string& suffix, float fallback) const {
    if (!Has(suffix)) return fallback;
    BITSPLIT_ASSIGN_OR_RETURN(const double value, file.GetFloat(Key(suffix)));
    return static_cast<float>(value);
  }
};

// An element of an integer array, or nullopt for another type.
std::optional<int64_t> IntegerElement(const gguf::Value& element) {
  if (const auto* u = std::get_if<uint64_t>(&element.data); u != nullptr) {
    return *u > static_cast<uint64_t>(kMaxCount) ? kMaxCount + 1 : static_cast<int64_t>(*u);
  }
  if (const auto* i = std::get_if<int64_t>(&element.data); i != nullptr) return *i;
  return std::nullopt;
}

// attention.head_count_kv: absent (as many as the query heads), one count, or (per-layer
// families) one count per layer, each dividing the query heads. num_kv_heads is the largest.
absl::Status ReadKvHeads(const Metadata& meta, bool per_layer, ModelConfig& config) {
  const std::string key = meta.Key("attention.head_count_kv");
  const gguf::Value* value = meta.file.Find(key);
  const auto* array = value == nullptr ? nullptr : std::get_if<gguf::Array>(&value->data);
  std::vector<int64_t> counts;
  if (array != nullptr && per_layer) {
    if (static_cast<int64_t>(array->elements.size()) != config.num_layers) {
      return Invalid(meta.file, "%s has %d entries for %d layers", key, array->elements.size(),
                     config.num_layers);
    }
    for (const gguf::Value& element : array->elements) {
      const std::optional<int64_t> count = IntegerElement(element);
      if (!count.has_value()) return Invalid(meta.file, "%s is not an integer array", key);
      counts.push_back(*count);
    }
  } else {
    BITSPLIT_ASSIGN_OR_RETURN(const int64_t count,
                              meta.Count("attention.head_count_kv", config.num_heads));
    counts.push_back(count);
  }
  for (const int64_t count : counts) {
    if (count < 1 || count > config.num_heads || config.num_heads % count != 0) {
      return Invalid(meta.file, "attention.head_count %d is not a multiple of %s %d",
                     config.num_heads, "attention.head_count_kv", count);
    }
  }
  config.num_kv_heads = *std::max_element(counts.begin(), counts.end());
  const bool uniform =
      std::all_of(counts.begin(), counts.end(), [&](int64_t count) { return count == counts[0]; });
  if (counts.size() > 1 && !uniform) config.layer_kv_heads = counts;
  return absl::OkStatus();
}

// A head width (`<prefix>key_length`, `fallback` when absent) with values as wide as keys, and
// the RoPE dims of such a head (`rope.dimension_count<suffix>`, `rope_fallback` when absent).
absl::Status ReadHeadWidth(const Metadata& meta, const std::string& suffix, int64_t fallback,
                           int64_t rope_fallback, int64_t& head_dim, int64_t& rope_dims) {
  const std::string key_length = "attention.key_length" + suffix;
  const std::string value_length = "attention.value_length" + suffix;
  const std::string rope_count = "rope.dimension_count" + suffix;
  BITSPLIT_ASSIGN_OR_RETURN(head_dim, meta.Count(key_length, fallback));
  BITSPLIT_ASSIGN_OR_RETURN(const int64_t values, meta.Count(value_length, head_dim));
  if (values != head_dim) {
    return Invalid(meta.file, "%s %d != %s %d is not supported", key_length, head_dim, value_length,
                   values);
  }
  BITSPLIT_ASSIGN_OR_RETURN(rope_dims,
                            meta.Count(rope_count, rope_fallback > 0 ? rope_fallback : head_dim));
  if (rope_dims % 2 != 0 || rope_dims > head_dim) {
    return Invalid(meta.file, "%s %d must be even and at most the head width %d", rope_count,
                   rope_dims, head_dim);
  }
  return absl::OkStatus();
}

// KV heads that group the query heads evenly; the head width from attention.key_length, else
// d_model split over the heads; values as wide as keys; RoPE over an even part of the head. A
// per-layer family's local layers may have their own width and RoPE dims (the *_swa keys).
absl::Status ReadHeadShape(const Metadata& meta, bool per_layer, ModelConfig& config) {
  BITSPLIT_RETURN_IF_ERROR(ReadKvHeads(meta, per_layer, config));
  if (!meta.Has("attention.key_length") && config.d_model % config.num_heads != 0) {
    return Invalid(meta.file, "embedding_length %d is not a multiple of attention.head_count %d",
                   config.d_model, config.num_heads);
  }
  BITSPLIT_RETURN_IF_ERROR(ReadHeadWidth(meta, "", config.d_model / config.num_heads, 0,
                                         config.head_dim, config.rope_dims));
  if (!per_layer) return absl::OkStatus();
  int64_t local_head_dim = 0;
  int64_t local_rope_dims = 0;
  BITSPLIT_RETURN_IF_ERROR(ReadHeadWidth(meta, "_swa", config.head_dim, config.rope_dims,
                                         local_head_dim, local_rope_dims));
  if (local_rope_dims > local_head_dim) {
    return Invalid(meta.file, "rope.dimension_count_swa %d exceeds the local head width %d",
                   local_rope_dims, local_head_dim);
  }
  if (local_head_dim != config.head_dim || local_rope_dims != config.rope_dims) {
    config.head_dim_local = local_head_dim;
    config.rope_dims_local = local_rope_dims;
  }
  return absl::OkStatus();
}

// The RoPE scaling: none, linear (freq_scale = 1 / factor) or YaRN, with llama.cpp's defaults
// for a yarn file (ext_factor 1, beta_fast 32, beta_slow 1, the original context from
// rope.scaling.original_context_length or else the training context) and its attention factor:
// (1 + 0.1 ln s) / (1 + 0.1 ln s) * rope.scaling.attn_factor (that key alone otherwise), in f32 as
// llama_context does (the first factor is YaRN's magnitude correction, which rope_yarn applies
// again, so llama.cpp cancels it here). Other scalings, and YaRN with a log multiplier
// (DeepSeek's mscale), are refused.
absl::Status ReadRopeScaling(const Metadata& meta, ModelConfig& config) {
  config.rope_freq_scale = 1.0f;
  // llama.cpp multiplies every RoPE cos/sin by this, whatever the scaling.
  BITSPLIT_ASSIGN_OR_RETURN(const float attn_factor, meta.Float("rope.scaling.attn_factor", 1.0f));
  if (!(attn_factor > 0.0f) || !std::isfinite(attn_factor)) {
    return Invalid(meta.file, "rope.scaling.attn_factor must be positive");
  }
  config.rope_attn_factor = attn_factor;
  if (!meta.Has("rope.scaling.type")) return absl::OkStatus();
  BITSPLIT_ASSIGN_OR_RETURN(const std::string scaling,
                            meta.file.GetString(meta.Key("rope.scaling.type")));
  if (scaling == "none") return absl::OkStatus();
  if (scaling != "linear" && scaling != "yarn") {
    return Unsupported(meta.file, "rope scaling type \"%s\" is not supported", scaling);
  }
  BITSPLIT_ASSIGN_OR_RETURN(const float factor, meta.Float("rope.scaling.factor", 1.0f));
  if (!(factor > 0.0f) || !std::isfinite(factor)) {
    return Invalid(meta.file, "rope.scaling.factor must be positive");
  }
  config.rope_freq_scale = 1.0f / factor;
  if (scaling == "linear") return absl::OkStatus();
  BITSPLIT_ASSIGN_OR_RETURN(const float log_multiplier,
                            meta.Float("rope.scaling.yarn_log_multiplier", 0.0f));
  if (log_multiplier != 0.0f) {
    return Unsupported(meta.file, "YaRN with rope.scaling.yarn_log_multiplier %g is not supported",
                       log_multiplier);
  }
  BITSPLIT_ASSIGN_OR_RETURN(
      config.rope_yarn_original_context,
      meta.Count("rope.scaling.original_context_length", config.context_length));
  config.rope_ext_factor = 1.0f;
  const float s = 1.0f / config.rope_freq_scale;
  float yarn_attn_factor = s <= 1.0f ? 1.0f : 0.1f * 1.0f * std::log(s) + 1.0f;
  yarn_attn_factor *= 1.0f / (1.0f + 0.1f * std::log(s));
  config.rope_attn_factor = yarn_attn_factor * attn_factor;
  return absl::OkStatus();
}

// The experts of a mixture-of-experts family: how many, how many a token uses, their FFN width,
// and the routing rules llama.cpp's graph for the family applies (softmax gating, renormalized
// weights, no shared expert); a file that declares other rules is refused, not misread.
absl::Status ReadExperts(const Metadata& meta, ModelConfig& config) {
  BITSPLIT_ASSIGN_OR_RETURN(config.num_experts,
                            meta.Count("expert_count", std::nullopt, kMaxExperts));
  BITSPLIT_ASSIGN_OR_RETURN(config.num_experts_used,
                            meta.Count("expert_used_count", std::nullopt, config.num_experts));
  BITSPLIT_ASSIGN_OR_RETURN(config.d_ff_expert, meta.Count("expert_feed_forward_length"));
  BITSPLIT_ASSIGN_OR_RETURN(const uint64_t shared, meta.Uint("expert_shared_count", 0));
  if (shared != 0) {
    return Unsupported(meta.file, "%s: shared experts (%d) are not supported", config.architecture,
                       shared);
  }
  if (config.expert_gating == ExpertGating::kTopKThenSoftmax) {
    // gpt-oss: llama.cpp's graph fixes the gating (softmax over the chosen logits, no
    // renormalization) whatever the file says; only a scale other than none/1 is refused.
    BITSPLIT_ASSIGN_OR_RETURN(const float scale, meta.Float("expert_weights_scale", 0.0f));
    if (scale != 0.0f && scale != 1.0f) {
      return Unsupported(meta.file, "%s: expert_weights_scale %g is not supported",
                         config.architecture, scale);
    }
    config.expert_weights_scale = 1.0f;
    return absl::OkStatus();
  }
  // llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX is 1.
  BITSPLIT_ASSIGN_OR_RETURN(const uint64_t gating, meta.Uint("expert_gating_func", 1));
  if (gating != 1) {
    return Unsupported(meta.file, "%s: expert gating function %d is not supported (softmax only)",
                       config.architecture, gating);
  }
  const gguf::Value* norm = meta.file.Find(meta.Key("expert_weights_norm"));
  const bool* renormalize = norm == nullptr ? nullptr : std::get_if<bool>(&norm->data);
  if (norm != nullptr && (renormalize == nullptr || !*renormalize)) {
    return Unsupported(meta.file,
                       "%s: expert_weights_norm must be true (the family renormalizes the chosen "
                       "experts' weights)",
                       config.architecture);
  }
  // llama.cpp's qwen3moe graph never scales the weights (its scale stays 0: none); gemma4's
  // passes 1.
  BITSPLIT_ASSIGN_OR_RETURN(const float scale, meta.Float("expert_weights_scale", 0.0f));
  if (scale != 0.0f && scale != 1.0f) {
    return Unsupported(meta.file,
                       "%s: expert_weights_scale %g is not supported (the family adds the "
                       "renormalized weights unscaled)",
                       config.architecture, scale);
  }
  config.expert_weights_scale = 1.0f;
  return absl::OkStatus();
}

absl::Status RejectUnsupportedFeatures(const Metadata& meta, const FamilyTraits& family) {
  BITSPLIT_ASSIGN_OR_RETURN(const uint64_t experts, meta.Uint("expert_count", 0));
  if (experts > 0 && family.experts == ExpertLayout::kNone) {
    return Unsupported(meta.file,
                       "%s with experts (%d) is not supported; the mixture-of-experts "
                       "architectures supported are qwen3moe, gemma4 and gpt-oss",
                       family.architecture, experts);
  }
  if (!family.per_layer_attention) return absl::OkStatus();
  // The small gemma4 models (E2B, E4B) add per-layer token embeddings, layers that reuse an
  // earlier layer's KV cache and double-wide FFNs on those layers; the larger ones have none.
  BITSPLIT_ASSIGN_OR_RETURN(const uint64_t per_layer_embedding,
                            meta.Uint("embedding_length_per_layer_input", 0));
  BITSPLIT_ASSIGN_OR_RETURN(const uint64_t shared_kv, meta.Uint("attention.shared_kv_layers", 0));
  if (per_layer_embedding != 0 || shared_kv != 0) {
    return Unsupported(meta.file,
                       "%s with per-layer embeddings (%d wide) or shared-KV layers (%d) is not "
                       "supported (the E2B/E4B models); supported: gemma4 without them (31B, "
                       "26B-A4B)",
                       family.architecture, per_layer_embedding, shared_kv);
  }
  const gguf::Value* ffn = meta.file.Find(meta.Key("feed_forward_length"));
  if (ffn != nullptr && std::holds_alternative<gguf::Array>(ffn->data)) {
    return Unsupported(meta.file, "%s: per-layer feed_forward_length (E2B/E4B) is not supported",
                       family.architecture);
  }
  return absl::OkStatus();
}

// final_logit_softcapping where the family's graph applies it; refused elsewhere.
absl::StatusOr<float> ReadSoftcap(const Metadata& meta, const FamilyTraits& family) {
  BITSPLIT_ASSIGN_OR_RETURN(const float softcap, meta.Float("final_logit_softcapping", 0.0f));
  if (softcap != 0.0f && !family.softcap) {
    return Unsupported(meta.file, "%s: final logit soft-capping (%g) is not supported",
                       family.architecture, softcap);
  }
  if (softcap < 0.0f || !std::isfinite(softcap)) {
    return Invalid(meta.file, "final_logit_softcapping %g must be a finite non-negative number",
                   softcap);
  }
  return softcap;
}

// 1/sqrt(head width), except gemma3 27B (62 layers), whose queries are scaled by
// 1/sqrt(d_model / heads) (gemma_pytorch's query_pre_attn_scalar, as llama.cpp), and gemma4,
// whose normalized queries are not scaled.
float AttentionScale(const ModelConfig& config) {
  if (config.architecture == "gemma4") return 1.0f;
  const bool gemma3_27b = config.architecture == "gemma3" && config.num_layers == 62;
  const int64_t width = gemma3_27b ? config.d_model / config.num_heads : config.head_dim;
  return 1.0f / std::sqrt(static_cast<float>(width));
}

// Which layers of a sliding-window family are local: the file's attention.sliding_window_pattern
// (a per-layer bool array, or a period n: layer i is local unless i % n == n - 1, 0 meaning every
// layer is local), else the family's period.
absl::Status ReadLayerPattern(const Metadata& meta, int default_period, ModelConfig& config) {
  const std::string key = meta.Key("attention.sliding_window_pattern");
  const gguf::Value* pattern = meta.file.Find(key);
  const auto* flags = pattern == nullptr ? nullptr : std::get_if<gguf::Array>(&pattern->data);
  if (flags == nullptr && default_period == kPatternArrayRequired) {
    return Invalid(meta.file, "%s must be a per-layer bool array in a %s model", key,
                   config.architecture);
  }
  std::vector<uint8_t>& local = config.layer_is_local;
  local.assign(static_cast<size_t>(config.num_layers), 0);
  if (flags != nullptr) {
    if (flags->elements.size() != local.size()) {
      return Invalid(meta.file, "%s has %d entries for %d layers", key, flags->elements.size(),
                     config.num_layers);
    }
    for (size_t i = 0; i < local.size(); ++i) {
      const bool* flag = std::get_if<bool>(&flags->elements[i].data);
      if (flag == nullptr) return Invalid(meta.file, "%s is not a bool array", key);
      local[i] = *flag ? 1 : 0;
    }
    return absl::OkStatus();
  }
  BITSPLIT_ASSIGN_OR_RETURN(const uint64_t period,
                            meta.Uint("attention.sliding_window_pattern", default_period));
  if (period > (uint64_t{1} << 20)) {
    return Invalid(meta.file, "%s = %d is out of range", key, period);
  }
  for (size_t i = 0; i < local.size(); ++i) local[i] = period == 0 || i % period < period - 1;
  return absl::OkStatus();
}

// The window of a sliding-window family (the file may name none, or 0), its layer pattern and
// the local layers' RoPE base (rope.freq_base_swa, else `default_local_base`).
absl::Status ReadSlidingWindow(const Metadata& meta, int default_period, float default_local_base,
                               ModelConfig& config) {
  if (default_period == kPatternArrayRequired && !meta.Has("attention.sliding_window")) {
    return Invalid(meta.file, "%s is missing", meta.Key("attention.sliding_window"));
  }
  BITSPLIT_ASSIGN_OR_RETURN(const uint64_t window, meta.Uint("attention.sliding_window", 0));
  if (window > static_cast<uint64_t>(kMaxCount)) {
    return Invalid(meta.file, "attention.sliding_window = %d is out of range", window);
  }
  config.sliding_window = static_cast<int64_t>(window);
  if (window == 0) return absl::OkStatus();
  BITSPLIT_RETURN_IF_ERROR(ReadLayerPattern(meta, default_period, config));
  BITSPLIT_ASSIGN_OR_RETURN(config.rope_freq_base_local,
                            meta.Float("rope.freq_base_swa", default_local_base));
  if (!(config.rope_freq_base_local > 0.0f)) {
    return Invalid(meta.file, "rope.freq_base_swa must be positive");
  }
  return absl::OkStatus();
}

// The vocabulary is the embedding table's rows; vocab_size and the tokenizer must fit it.
absl::Status SetVocabulary(const Metadata& meta, int64_t embedding_rows, ModelConfig& config) {
  if (embedding_rows <= 0) {
    return Invalid(meta.file, "embedding table has %d rows", embedding_rows);
  }
  config.vocab_size = embedding_rows;
  BITSPLIT_ASSIGN_OR_RETURN(const int64_t declared, meta.Count("vocab_size", embedding_rows));
  if (declared != embedding_rows) {
    return Invalid(meta.file, "%s %d != token_embd.weight rows %d", meta.Key("vocab_size"),
                   declared, embedding_rows);
  }
  const gguf::Value* tokens = meta.file.Find("tokenizer.ggml.tokens");
  const auto* array = tokens == nullptr ? nullptr : std::get_if<gguf::Array>(&tokens->data);
  if (array != nullptr && static_cast<int64_t>(array->elements.size()) > embedding_rows) {
    return Invalid(meta.file, "tokenizer has %d tokens but token_embd.weight only %d rows",
                   array->elements.size(), embedding_rows);
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
    return Invalid(file, "%s = %d is out of range [1, %d]", key, config.num_layers, kMaxLayers);
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
    return Invalid(file,
                   "%s = %d, but tensor %s belongs to layer %d (the tensor table has blk.N tensors "
                   "up to layer %d)",
                   key, config.num_layers, io::Quote(stray->name), LayerOfTensor(stray->name),
                   table_layers - 1);
  }
  for (int64_t layer = 0; layer < config.num_layers; ++layer) {
    if (present[static_cast<size_t>(layer)] == 0) {
      return Invalid(file,
                     "%s = %d, but the tensor table has no blk.%d.* tensors (it has blk.N tensors "
                     "for %d layers)",
                     key, config.num_layers, layer, table_layers);
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
    return Invalid(file, "%s.embedding_length = %d, but token_embd.weight is %d wide",
                   config.architecture, config.d_model, embedding->dims[0]);
  }
  BITSPLIT_RETURN_IF_ERROR(CheckLayerTensors(file, config));
  ReadTensorLayout([&](const std::string& name) { return file.FindTensor(name) != nullptr; },
                   config);
  return config;
}

void ReadTensorLayout(absl::FunctionRef<bool(const std::string&)> has_tensor, ModelConfig& config) {
  config.layer_value_is_key.clear();
  const FamilyTraits* family = FamilyOf(config.architecture);
  // Elsewhere a missing attn_v or expert tensor is the weight loader's error.
  if (family == nullptr || !family->per_layer_attention) return;
  config.fused_expert_gate_up = config.has_experts() && has_tensor("blk.0.ffn_gate_up_exps.weight");
  std::vector<uint8_t> without(static_cast<size_t>(config.num_layers), 0);
  bool any = false;
  for (int64_t layer = 0; layer < config.num_layers; ++layer) {
    if (has_tensor(absl::StrCat("blk.", layer, ".attn_v.weight"))) continue;
    without[static_cast<size_t>(layer)] = 1;
    any = true;
  }
  if (any) config.layer_value_is_key = std::move(without);
}

double ExpectedDistinctExperts(std::span<const double> frequencies, double rows) {
  double distinct = 0;
  for (const double f : frequencies)
    distinct += 1.0 - std::pow(1.0 - std::clamp(f, 0.0, 1.0), rows);
  return distinct;
}

double ExpectedDistinctExperts(int64_t num_experts, int64_t experts_used, double rows) {
  if (num_experts <= 0) return 0;
  const double e = static_cast<double>(num_experts);
  return e * (1.0 - std::pow(1.0 - static_cast<double>(experts_used) / e, rows));
}

int64_t ModelConfig::MaxQDim() const {
  int64_t widest = 0;
  for (int64_t layer = 0; layer < num_layers; ++layer) widest = std::max(widest, QDim(layer));
  return widest;
}

int64_t ModelConfig::MaxKvDim() const {
  int64_t widest = 0;
  for (int64_t layer = 0; layer < num_layers; ++layer) widest = std::max(widest, KvDim(layer));
  return widest;
}

absl::StatusOr<ModelConfig> ModelConfigFromGgufMetadata(const gguf::File& file,
                                                        int64_t embedding_rows) {
  BITSPLIT_ASSIGN_OR_RETURN(const FamilyTraits* family, FindFamily(file));
  ModelConfig config;
  config.architecture = family->architecture;
  config.rope_style = family->rope_style;
  config.ffn_activation = family->ffn_activation;
  config.qk_norm = family->qk_norm;
  config.post_norms = family->post_norms;
  config.qkv_bias = family->qkv_bias;
  config.value_norm = family->per_layer_attention;
  config.layer_output_scale = family->per_layer_attention;
  if (family->gpt_oss_layers) {
    config.attention_sinks = true;
    config.attn_output_bias = true;
    config.expert_biases = true;
    config.expert_gating = ExpertGating::kTopKThenSoftmax;
    config.ffn_norm_tensor = "post_attention_norm.weight";
    config.local_rope_scaled = true;
  }

  const Metadata meta{file, config.architecture + "."};
  BITSPLIT_RETURN_IF_ERROR(RejectUnsupportedFeatures(meta, *family));
  for (const CountKey& key : kCountKeys) {
    std::optional<int64_t> fallback;
    if (key.same_as != nullptr) fallback = config.*key.same_as;
    BITSPLIT_ASSIGN_OR_RETURN(config.*key.field, meta.Count(key.suffix, fallback, key.max));
  }
  BITSPLIT_RETURN_IF_ERROR(ReadHeadShape(meta, family->per_layer_attention, config));
  for (const FloatKey& key : kFloatKeys) {
    BITSPLIT_ASSIGN_OR_RETURN(config.*key.field, meta.Float(key.suffix, key.fallback));
  }
  if (!(config.rope_freq_base > 0.0f) || !(config.rms_norm_eps >= 0.0f)) {
    return Invalid(file, "rope.freq_base %g / layer_norm_rms_epsilon %g out of range",
                   config.rope_freq_base, config.rms_norm_eps);
  }
  BITSPLIT_RETURN_IF_ERROR(ReadRopeScaling(meta, config));
  BITSPLIT_ASSIGN_OR_RETURN(config.final_logit_softcap, ReadSoftcap(meta, *family));
  BITSPLIT_ASSIGN_OR_RETURN(const uint64_t experts, meta.Uint("expert_count", 0));
  if (family->experts == ExpertLayout::kEveryFfn || experts > 0) {
    BITSPLIT_RETURN_IF_ERROR(ReadExperts(meta, config));
    config.dense_ffn = family->experts == ExpertLayout::kBesideDenseFfn;
    config.parallel_experts = config.dense_ffn;
  }

  config.attention_scale = AttentionScale(config);
  config.embedding_scale =
      family->scale_embedding ? std::sqrt(static_cast<float>(config.d_model)) : 1.0f;
  if (family->swa_pattern != 0) {
    BITSPLIT_RETURN_IF_ERROR(
        ReadSlidingWindow(meta, family->swa_pattern,
                          family->gpt_oss_layers ? config.rope_freq_base : 10000.0f, config));
  }
  BITSPLIT_RETURN_IF_ERROR(SetVocabulary(meta, embedding_rows, config));
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
