#include "common/model/split_model.h"

#include <map>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/ops/matmul.h"
#include "common/quant/hadamard.h"
#include "common/util/status_macros.h"

namespace bitsplit::model {
namespace {

absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

std::string DimsString(const std::vector<int64_t>& dims) {
  return absl::StrCat("{", absl::StrJoin(dims, ", "), "}");
}

// ---- JSON fields -------------------------------------------------------------------------------

absl::Status FieldError(std::string_view key, std::string_view expected) {
  return absl::InvalidArgumentError(absl::StrCat("quantization record: field \"", Absl(key),
                                                 "\" is missing or not ", Absl(expected)));
}

absl::StatusOr<int64_t> IntField(const nlohmann::json& json, const char* key) {
  const auto it = json.find(key);
  if (it == json.end() || !it->is_number_integer()) return FieldError(key, "an integer");
  return it->get<int64_t>();
}

absl::StatusOr<uint64_t> UintField(const nlohmann::json& json, const char* key) {
  const auto it = json.find(key);
  if (it == json.end() || !it->is_number_unsigned()) {
    return FieldError(key, "a non-negative integer");
  }
  return it->get<uint64_t>();
}

absl::StatusOr<std::string> StringField(const nlohmann::json& json, const char* key) {
  const auto it = json.find(key);
  if (it == json.end() || !it->is_string()) return FieldError(key, "a string");
  return it->get<std::string>();
}

absl::StatusOr<quant::SplitFormat> FormatField(const nlohmann::json& json, const char* key) {
  BITSPLIT_ASSIGN_OR_RETURN(std::string name, StringField(json, key));
  auto format = quant::ParseSplitFormat(name);
  if (!format.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("quantization record: field \"", key, "\": ", format.status().message()));
  }
  return *format;
}

// ---- Tensor lookups
// ------------------------------------------------------------------------------

absl::Status TensorError(const SplitFile& file, std::string_view name, absl::string_view detail) {
  return absl::InvalidArgumentError(
      absl::StrCat(file.name(), ": tensor ", Absl(name), " ", detail));
}

// A tensor stored at source precision (a ggml type) with the given dims.
absl::StatusOr<const SplitTensor*> GgmlTensor(const SplitFile& file, std::string_view name,
                                              const std::vector<int64_t>& dims) {
  BITSPLIT_ASSIGN_OR_RETURN(const SplitTensor* tensor, file.GetTensor(name));
  if (!IsGgmlTensorFormat(tensor->format)) {
    return TensorError(file, name,
                       absl::StrCat("has format ", TensorFormatName(tensor->format),
                                    ", expected a ggml type (source precision)"));
  }
  if (tensor->dims != dims) {
    return TensorError(
        file, name,
        absl::StrCat("has dims ", DimsString(tensor->dims), ", expected ", DimsString(dims)));
  }
  return tensor;
}

absl::StatusOr<const float*> F32Vector(const SplitFile& file, std::string_view name,
                                       const std::vector<int64_t>& dims) {
  BITSPLIT_ASSIGN_OR_RETURN(const SplitTensor* tensor, GgmlTensor(file, name, dims));
  if (tensor->format != GgmlTensorFormat(GgmlType::kF32)) {
    return TensorError(
        file, name, absl::StrCat("has type ", TensorFormatName(tensor->format), ", expected F32"));
  }
  // Tensor data is 64-byte aligned in the mapping (split_file.h), so the cast is well-formed.
  return reinterpret_cast<const float*>(tensor->data);
}

// A linear weight [rows, cols] in split format `format` quantized with `group`.
absl::StatusOr<quant::MatrixView> SplitMatrix(const SplitFile& file, const std::string& name,
                                              quant::SplitFormat format, int group, int64_t rows,
                                              int64_t cols) {
  BITSPLIT_ASSIGN_OR_RETURN(const SplitTensor* tensor, file.GetTensor(name));
  const uint32_t expected_format = SplitTensorFormat(static_cast<uint32_t>(format));
  if (tensor->format != expected_format || tensor->group_size != static_cast<uint32_t>(group)) {
    const std::string found =
        IsSplitTensorFormat(tensor->format) &&
                SplitFormatIdOf(tensor->format) < static_cast<uint32_t>(quant::kNumSplitFormats)
            ? absl::StrCat(
                  SplitFormatName(static_cast<quant::SplitFormat>(SplitFormatIdOf(tensor->format))),
                  " group ", tensor->group_size)
            : TensorFormatName(tensor->format);
    return TensorError(file, name,
                       absl::StrCat("is ", found, ", but the file's quantization record says ",
                                    SplitFormatName(format), " group ", group));
  }
  const std::vector<int64_t> dims = {cols, rows};
  if (tensor->dims != dims) {
    return TensorError(
        file, name,
        absl::StrCat("has dims ", DimsString(tensor->dims), ", expected ", DimsString(dims)));
  }
  auto view = quant::MakeMatrixView(format, group, rows, cols, tensor->data, tensor->num_bytes);
  if (!view.ok()) return TensorError(file, name, view.status().message());
  return *view;
}

// Views of every linear weight of `file`, each quantized as format_of(its name) with `group`.
template <typename FormatOf>
absl::StatusOr<SplitLinearWeights> LinearWeights(const SplitFile& file, const ModelConfig& config,
                                                 FormatOf format_of, int group) {
  SplitLinearWeights weights(config);
  for (const LinearGroupId id : AllLinearGroups(config)) {
    const std::vector<std::string> names = LinearGroupTensorNames(config, id);
    const std::vector<int64_t> rows = LinearGroupOutputDims(config, id);
    const int64_t cols = LinearGroupInputDim(config, id);
    std::vector<quant::MatrixView>& views = weights.mutable_group(id);
    for (size_t i = 0; i < names.size(); ++i) {
      BITSPLIT_ASSIGN_OR_RETURN(
          quant::MatrixView view,
          SplitMatrix(file, names[i], format_of(names[i]), group, rows[i], cols));
      views.push_back(view);
    }
  }
  return weights;
}

absl::StatusOr<SplitQuantization> QuantizationOf(const SplitFile& file) {
  const nlohmann::json& metadata = file.metadata();
  const auto record = metadata.find(kSplitMetadataKey);
  if (record == metadata.end() || !record->is_object() || !record->contains("quantization")) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.name(), ": metadata has no \"", kSplitMetadataKey,
                     ".quantization\" record; not a split model written by bitsplit quantize"));
  }
  auto quantization = SplitRecordQuantization(*record);
  if (!quantization.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.name(), ": ", quantization.status().message()));
  }
  return *quantization;
}

}  // namespace

absl::Status ValidateTensorFormats(const SplitQuantization& q, const ModelConfig& config) {
  size_t planned = 0;
  for (const LinearGroupId id : AllLinearGroups(config)) {
    const std::vector<std::string> names = LinearGroupTensorNames(config, id);
    for (const std::string& name : names) {
      if (q.tensor_formats.contains(name)) ++planned;
      if (q.BaseFormatOf(name) != q.BaseFormatOf(names[0]) ||
          q.ResidualFormatOf(name) != q.ResidualFormatOf(names[0])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "bit plan: tensor ", name, " and tensor ", names[0],
            " are in one linear group and must share their formats (one kernel runs the group)"));
      }
    }
  }
  if (planned == q.tensor_formats.size()) return absl::OkStatus();
  std::set<std::string, std::less<>> linear;
  for (const LinearGroupId id : AllLinearGroups(config)) {
    for (std::string& name : LinearGroupTensorNames(config, id)) linear.insert(std::move(name));
  }
  for (const auto& [name, formats] : q.tensor_formats) {
    if (!linear.contains(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bit plan: tensor ", name, " is not a linear weight of this model"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SplitQuantization> SplitRecordQuantization(const nlohmann::json& record) {
  if (!record.is_object() || !record.contains("quantization")) {
    return absl::InvalidArgumentError("the split record has no quantization");
  }
  const auto version = record.find("version");
  if (version == record.end() || !version->is_number_integer()) {
    return absl::InvalidArgumentError("the split record has no integer \"version\"");
  }
  const int64_t number = version->get<int64_t>();
  if (number < 1 || number > kSplitRecordVersionWithPlan) {
    return absl::InvalidArgumentError(
        absl::StrCat("split record version ", number, " is not one this build reads (1..",
                     kSplitRecordVersionWithPlan, "); quantize the model again with this build"));
  }
  BITSPLIT_ASSIGN_OR_RETURN(SplitQuantization q, SplitQuantizationFromJson(record["quantization"]));
  if (number < kSplitRecordVersionWithPlan && !q.tensor_formats.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("a split record of version ", number,
                                                   " holds a bit plan (tensor_formats), which "
                                                   "only version ",
                                                   kSplitRecordVersionWithPlan, " records have"));
  }
  if (number == 1 && q.base_format == quant::SplitFormat::kQ8_0) {
    return absl::InvalidArgumentError(
        "a q8_0 model of split record version 1 (ggml's interleaved 34-byte blocks, which this "
        "build no longer reads); quantize it again with this build");
  }
  return q;
}

nlohmann::json SplitQuantizationToJson(const SplitQuantization& q) {
  nlohmann::json json = {
      {"base_format", SplitFormatName(q.base_format)},
      {"base_group", q.base_group},
      {"residual_format",
       q.residual_format ? nlohmann::json(SplitFormatName(*q.residual_format)) : nlohmann::json()},
      {"residual_group", q.residual_format ? q.residual_group : 0},
      {"rotate_block", q.rotation.block},
      {"rotate_seed", q.rotation.seed},
      {"calibration_sha256", q.calibration_sha256},
      {"calibration_tokens", q.calibration_tokens},
      {"calibration_window", q.calibration_window},
  };
  // Written only when there is a plan, so that uniform models keep their records (and with
  // them their fingerprints) as before plans existed.
  if (!q.tensor_formats.empty()) {
    nlohmann::json plan = nlohmann::json::object();
    for (const auto& [name, formats] : q.tensor_formats) {
      plan[name] = {
          SplitFormatName(formats.base),
          formats.residual ? nlohmann::json(SplitFormatName(*formats.residual)) : nlohmann::json()};
    }
    json["tensor_formats"] = std::move(plan);
  }
  return json;
}

int SplitRecordVersionOf(const SplitQuantization& q) {
  return q.tensor_formats.empty() ? kSplitRecordVersion : kSplitRecordVersionWithPlan;
}

quant::SplitFormat SplitQuantization::BaseFormatOf(std::string_view tensor) const {
  const auto it = tensor_formats.find(tensor);
  return it != tensor_formats.end() ? it->second.base : base_format;
}

std::optional<quant::SplitFormat> SplitQuantization::ResidualFormatOf(
    std::string_view tensor) const {
  const auto it = tensor_formats.find(tensor);
  return it != tensor_formats.end() ? it->second.residual : residual_format;
}

absl::StatusOr<SplitQuantization> SplitQuantizationFromJson(const nlohmann::json& json) {
  if (!json.is_object()) {
    return absl::InvalidArgumentError("quantization record is not a JSON object");
  }
  SplitQuantization q;
  BITSPLIT_ASSIGN_OR_RETURN(q.base_format, FormatField(json, "base_format"));
  BITSPLIT_ASSIGN_OR_RETURN(int64_t base_group, IntField(json, "base_group"));
  const auto residual = json.find("residual_format");
  if (residual == json.end()) return FieldError("residual_format", "a string or null");
  if (residual->is_null()) {
    q.residual_format.reset();
  } else {
    BITSPLIT_ASSIGN_OR_RETURN(q.residual_format, FormatField(json, "residual_format"));
  }
  BITSPLIT_ASSIGN_OR_RETURN(int64_t residual_group, IntField(json, "residual_group"));
  BITSPLIT_ASSIGN_OR_RETURN(int64_t rotate_block, IntField(json, "rotate_block"));
  BITSPLIT_ASSIGN_OR_RETURN(q.rotation.seed, UintField(json, "rotate_seed"));
  BITSPLIT_ASSIGN_OR_RETURN(q.calibration_sha256, StringField(json, "calibration_sha256"));
  BITSPLIT_ASSIGN_OR_RETURN(q.calibration_tokens, IntField(json, "calibration_tokens"));
  BITSPLIT_ASSIGN_OR_RETURN(q.calibration_window, IntField(json, "calibration_window"));
  // Group sizes and blocks are checked against every matrix when the tensors are; here only
  // that they are sane integers, so the casts below cannot truncate.
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"base_group", base_group},
                                    {"residual_group", residual_group},
                                    {"rotate_block", rotate_block}}) {
    if (value < 0 || value > (int64_t{1} << 20)) {
      return absl::InvalidArgumentError(
          absl::StrCat("quantization record: ", name, " = ", value, " is out of range"));
    }
  }
  q.base_group = static_cast<int>(base_group);
  q.residual_group = static_cast<int>(residual_group);
  q.rotation.block = static_cast<int>(rotate_block);
  if (!quant::GetSplitFormatInfo(q.base_format).is_base &&
      q.base_format != quant::SplitFormat::kQ8_0) {
    return absl::InvalidArgumentError(absl::StrCat("quantization record: base format ",
                                                   SplitFormatName(q.base_format),
                                                   " is not a base format"));
  }
  if (q.residual_format && !quant::GetSplitFormatInfo(*q.residual_format).is_residual) {
    return absl::InvalidArgumentError(absl::StrCat("quantization record: residual format ",
                                                   SplitFormatName(*q.residual_format),
                                                   " is not a residual format"));
  }
  if (const auto plan = json.find("tensor_formats"); plan != json.end()) {
    if (!plan->is_object()) return FieldError("tensor_formats", "an object");
    for (const auto& item : plan->items()) {
      // Named copies: lambdas may not capture structured bindings (clang, C++20).
      const std::string name = item.key();
      const nlohmann::json& entry = item.value();
      auto bad = [&](std::string_view detail) {
        return absl::InvalidArgumentError(
            absl::StrCat("quantization record: tensor_formats[\"", name, "\"] ", Absl(detail)));
      };
      if (!entry.is_array() || entry.size() != 2 || !entry[0].is_string() ||
          !(entry[1].is_string() || entry[1].is_null())) {
        return bad("is not [base format, residual format or null]");
      }
      TensorSplitFormats formats;
      absl::StatusOr<quant::SplitFormat> base =
          quant::ParseSplitFormat(entry[0].get<std::string>());
      if (!base.ok()) return bad(std::string(base.status().message()));
      if (!quant::GetSplitFormatInfo(*base).is_base) return bad("has no base format for its base");
      formats.base = *base;
      if (!entry[1].is_null()) {
        absl::StatusOr<quant::SplitFormat> residual =
            quant::ParseSplitFormat(entry[1].get<std::string>());
        if (!residual.ok()) return bad(std::string(residual.status().message()));
        if (!quant::GetSplitFormatInfo(*residual).is_residual) {
          return bad("has no residual format for its residual");
        }
        formats.residual = *residual;
      }
      if (formats.residual.has_value() != q.residual_format.has_value()) {
        return bad(q.residual_format ? "has no residual in a model with one"
                                     : "has a residual in a base-only model");
      }
      q.tensor_formats.emplace(name, formats);
    }
  }
  return q;
}

namespace {

// "b2_asym" for a uniform model; "{b2_asym x120, b4_asym x91}" for a planned one (every linear
// tensor counted once; `of` gives a tensor's format).
template <typename FormatOf>
std::string FormatsString(const SplitQuantization& q, quant::SplitFormat uniform, FormatOf of) {
  if (q.tensor_formats.empty()) return SplitFormatName(uniform);
  std::map<std::string, int> counts;
  for (const auto& [name, formats] : q.tensor_formats) ++counts[SplitFormatName(of(formats))];
  std::vector<std::string> parts;
  for (const auto& [name, count] : counts) parts.push_back(absl::StrCat(name, " x", count));
  return absl::StrCat("{", absl::StrJoin(parts, ", "), "}");
}

std::string BaseFormatsString(const SplitQuantization& q) {
  return FormatsString(q, q.base_format, [](const TensorSplitFormats& f) { return f.base; });
}

std::string ResidualFormatsString(const SplitQuantization& q) {
  return FormatsString(q, *q.residual_format,
                       [](const TensorSplitFormats& f) { return *f.residual; });
}

}  // namespace

std::string SplitQuantizationString(const SplitQuantization& q) {
  std::string text = absl::StrCat(BaseFormatsString(q), "/g", q.base_group);
  if (q.residual_format) {
    absl::StrAppend(&text, " + ", ResidualFormatsString(q), "/g", q.residual_group);
  } else {
    absl::StrAppend(&text, " (base only)");
  }
  if (q.rotation.enabled()) {
    absl::StrAppend(&text, ", hadamard ", q.rotation.block, " (seed ", q.rotation.seed, ")");
  }
  if (!q.calibration_sha256.empty()) {
    absl::StrAppend(&text, ", calibrated on ", q.calibration_tokens, " tokens");
  }
  return text;
}

std::string SplitBaseString(const SplitQuantization& q) {
  std::string text = absl::StrCat(BaseFormatsString(q), "/g", q.base_group);
  if (q.rotation.enabled()) {
    absl::StrAppend(&text, ", hadamard ", q.rotation.block, " (seed ", q.rotation.seed, ")");
  }
  return text;
}

std::string SplitResidualString(const SplitQuantization& q) {
  if (!q.residual_format) return "";
  return absl::StrCat(ResidualFormatsString(q), "/g", q.residual_group);
}

std::string SplitFormatName(quant::SplitFormat format) {
  return quant::GetSplitFormatInfo(format).name;
}

RowSizeOracle SplitFormatRowSizeOracle() {
  return [](uint32_t id, uint32_t group, int64_t cols) -> absl::StatusOr<uint64_t> {
    if (id >= static_cast<uint32_t>(quant::kNumSplitFormats)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown split format id ", id));
    }
    if (group > (uint32_t{1} << 20)) {
      return absl::InvalidArgumentError(absl::StrCat("group size ", group, " is out of range"));
    }
    const auto format = static_cast<quant::SplitFormat>(id);
    BITSPLIT_RETURN_IF_ERROR(quant::ValidateSplitLayout(format, static_cast<int>(group), cols));
    return quant::SplitRowBytes(format, static_cast<int>(group), cols);
  };
}

absl::StatusOr<std::unique_ptr<SplitModelFiles>> SplitModelFiles::Open(
    const std::string& base_path, const std::string& residual_path) {
  std::unique_ptr<SplitModelFiles> files(new SplitModelFiles());
  const RowSizeOracle oracle = SplitFormatRowSizeOracle();
  // Kinds are checked after both files are open, so that swapped files get CheckSplitPair's
  // message naming which file was given as what.
  BITSPLIT_ASSIGN_OR_RETURN(files->base_, SplitFile::Open(base_path, std::nullopt, oracle));
  if (!residual_path.empty()) {
    BITSPLIT_ASSIGN_OR_RETURN(files->residual_,
                              SplitFile::Open(residual_path, std::nullopt, oracle));
    BITSPLIT_RETURN_IF_ERROR(CheckSplitPair(*files->base_, *files->residual_));
  } else if (files->base_->kind() != SplitFileKind::kBase) {
    return absl::FailedPreconditionError(
        absl::StrCat(base_path, ": is a residual split file, but it was given as the base file"));
  }
  const SplitFile& base = *files->base_;
  BITSPLIT_ASSIGN_OR_RETURN(files->quantization_, QuantizationOf(base));
  const SplitQuantization& q = files->quantization_;
  if (files->residual_ != nullptr) {
    BITSPLIT_ASSIGN_OR_RETURN(SplitQuantization residual_q, QuantizationOf(*files->residual_));
    if (!(residual_q == q)) {  // equal fingerprints make this unreachable but for forgeries
      return absl::FailedPreconditionError(absl::StrCat(
          residual_path, ": quantization record (", SplitQuantizationString(residual_q),
          ") differs from the base file's (", SplitQuantizationString(q), ")"));
    }
    if (!q.residual_format) {
      return absl::FailedPreconditionError(
          absl::StrCat(base_path, ": a base-only model (", SplitQuantizationString(q),
                       ") has no residual, but residual file ", residual_path, " was given"));
    }
  }

  // Config and tokenizer: the source GGUF's metadata image, parsed in place.
  BITSPLIT_ASSIGN_OR_RETURN(const SplitTensor* image, base.GetTensor(kGgufMetadataTensor));
  if (image->format != GgmlTensorFormat(GgmlType::kI8) || image->dims.size() != 1) {
    return TensorError(base, kGgufMetadataTensor, "is not a 1-D I8 byte blob");
  }
  BITSPLIT_ASSIGN_OR_RETURN(files->gguf_metadata_,
                            gguf::File::Parse(image->data, image->num_bytes,
                                              absl::StrCat(base_path, ":", kGgufMetadataTensor)));
  BITSPLIT_ASSIGN_OR_RETURN(const SplitTensor* embedding, base.GetTensor("token_embd.weight"));
  if (embedding->dims.size() != 2) {
    return TensorError(base, "token_embd.weight", "is not 2-dimensional");
  }
  BITSPLIT_ASSIGN_OR_RETURN(
      files->config_, ModelConfigFromGgufMetadata(*files->gguf_metadata_, embedding->dims[1]));
  // The base file names the linear weights as the source did.
  ReadTensorLayout([&](const std::string& name) { return base.FindTensor(name) != nullptr; },
                   files->config_);
  const ModelConfig& config = files->config_;
  if (q.rotation.enabled()) {
    for (const LinearGroupId id : AllLinearGroups(config)) {
      if (absl::Status status =
              quant::ValidateHadamard(q.rotation.block, LinearGroupInputDim(config, id));
          !status.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(base_path, ": rotation of the ",
                                                       LinearGroupIdString(id),
                                                       " input: ", status.message()));
      }
    }
  }

  // Source-precision tensors the forward reads directly.
  EmbeddingAndNorms& direct = files->embedding_and_norms_;
  BITSPLIT_ASSIGN_OR_RETURN(
      embedding, GgmlTensor(base, "token_embd.weight", {config.d_model, config.vocab_size}));
  BITSPLIT_ASSIGN_OR_RETURN(
      direct.token_embd,
      ops::MakeWeightMatrix(static_cast<GgmlType>(embedding->format), embedding->data,
                            config.vocab_size, config.d_model,
                            absl::StrCat(base_path, ": tensor token_embd.weight")));
  BITSPLIT_ASSIGN_OR_RETURN(direct.output_norm,
                            F32Vector(base, "output_norm.weight", {config.d_model}));
  if (base.FindTensor("rope_freqs.weight") != nullptr) {
    BITSPLIT_ASSIGN_OR_RETURN(direct.rope_freq_factors,
                              F32Vector(base, "rope_freqs.weight", {config.rope_dims / 2}));
  }
  direct.layers.resize(static_cast<size_t>(config.num_layers));
  for (int64_t layer = 0; layer < config.num_layers; ++layer) {
    LayerNorms& vectors = direct.layers[static_cast<size_t>(layer)];
    for (const LayerVectorSpec& spec : LayerVectorSpecs(config, layer)) {
      BITSPLIT_ASSIGN_OR_RETURN(
          vectors.*spec.field,
          F32Vector(base, absl::StrCat("blk.", layer, ".", spec.tensor), spec.GgufDims()));
    }
    if (config.has_experts()) {
      const std::string name = absl::StrCat("blk.", layer, ".ffn_gate_inp.weight");
      BITSPLIT_ASSIGN_OR_RETURN(const SplitTensor* router,
                                GgmlTensor(base, name, {config.d_model, config.num_experts}));
      BITSPLIT_ASSIGN_OR_RETURN(
          vectors.router, ops::MakeWeightMatrix(static_cast<GgmlType>(router->format), router->data,
                                                config.num_experts, config.d_model,
                                                absl::StrCat(base_path, ": tensor ", name)));
    }
  }

  // Linear weights.
  BITSPLIT_RETURN_IF_ERROR(ValidateTensorFormats(q, config));
  BITSPLIT_ASSIGN_OR_RETURN(
      files->base_linear_,
      LinearWeights(
          base, config, [&](const std::string& name) { return q.BaseFormatOf(name); },
          q.base_group));
  if (files->residual_ != nullptr) {
    BITSPLIT_ASSIGN_OR_RETURN(
        files->residual_linear_,
        LinearWeights(
            *files->residual_, config,
            [&](const std::string& name) { return *q.ResidualFormatOf(name); }, q.residual_group));
  }
  return files;
}

std::string SplitBasePath(const std::string& prefix) { return prefix + ".base.bsplit"; }
std::string SplitResidualPath(const std::string& prefix) { return prefix + ".residual.bsplit"; }

}  // namespace bitsplit::model
