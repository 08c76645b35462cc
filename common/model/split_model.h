#pragma once
// A split model as `bitsplit quantize` writes it (docs/split_model.md): a base file
// (base-format linear weights, source-precision norms and embeddings, and the source GGUF's
// metadata for config and tokenizer) and optionally a residual file (the residual of every
// linear weight, the output head included). This header names what is in them and loads them.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/io/gguf.h"
#include "common/io/split_file.h"
#include "common/model/config.h"
#include "common/model/split_backend.h"
#include "common/model/weights.h"
#include "common/quant/split_format.h"
#include "nlohmann/json.hpp"

namespace bitsplit::model {

// Base-file tensor holding the source GGUF's metadata as a tensor-less GGUF image (I8, 1-D):
// gguf::File::Parse reads it, so config, tokenizer and chat template parse exactly as from the
// source file.
inline constexpr char kGgufMetadataTensor[] = "gguf.metadata";
// Top-level key of the split files' JSON metadata under which the quantizer writes its record.
inline constexpr char kSplitMetadataKey[] = "bitsplit";

// One linear weight's formats where a bit plan (bitsplit quantize --vram-budget) departs from the
// quantization's defaults.
struct TensorSplitFormats {
  quant::SplitFormat base = quant::SplitFormat::kB2Asym;
  // nullopt exactly when the model is base only.
  std::optional<quant::SplitFormat> residual;

  bool operator==(const TensorSplitFormats&) const = default;
};

// The quantizer knobs that shape the files (and so are part of the fingerprint).
struct SplitQuantization {
  quant::SplitFormat base_format = quant::SplitFormat::kB2Asym;
  int base_group = 64;
  // nullopt: base only (no residual file), e.g. the Q8_0 reference configuration.
  std::optional<quant::SplitFormat> residual_format = quant::SplitFormat::kR8;
  int residual_group = 32;  // 0 in the files' record of a base-only model
  HadamardRotation rotation;
  // Hex SHA-256 of the calibration text whose activations weighted the base fit; empty when
  // none. The token count and window size make the fit reproducible.
  std::string calibration_sha256;
  int64_t calibration_tokens = 0;
  int64_t calibration_window = 0;
  // A bit plan: formats per linear weight, by tensor name ("blk.3.ffn_down.weight",
  // "output.weight"); tensors absent use base_format / residual_format. The matrices of one
  // linear group (q|k|v, gate|up) share their formats, so that one kernel runs the group. Groups
  // (base_group, residual_group) are the same for every tensor. Empty for uniform models.
  std::map<std::string, TensorSplitFormats, std::less<>> tensor_formats;

  // The formats of linear weight `tensor`.
  quant::SplitFormat BaseFormatOf(std::string_view tensor) const;
  std::optional<quant::SplitFormat> ResidualFormatOf(std::string_view tensor) const;

  bool operator==(const SplitQuantization&) const = default;
};
nlohmann::json SplitQuantizationToJson(const SplitQuantization& quantization);
absl::StatusOr<SplitQuantization> SplitQuantizationFromJson(const nlohmann::json& json);

// OK when every tensor a bit plan names is a linear weight of `config` and the matrices of each
// linear group share their formats; INVALID_ARGUMENT naming the tensor otherwise.
absl::Status ValidateTensorFormats(const SplitQuantization& quantization,
                                   const ModelConfig& config);

// The "version" the quantizer writes into its record. 2: q8_0 bases in the split row layout
// (docs/formats.md); version 1 files held them in ggml's interleaved 34-byte blocks, which this
// build refuses (the other formats are unchanged, so version 1 files of them still load). 3: a
// record with a bit plan (tensor_formats), written only for planned models so that builds which
// cannot read a plan refuse the file by its version instead of by a tensor's format.
inline constexpr int kSplitRecordVersion = 2;
inline constexpr int kSplitRecordVersionWithPlan = 3;
// The version a record of `quantization` carries.
int SplitRecordVersionOf(const SplitQuantization& quantization);

// The quantization in a split file's record (its metadata[kSplitMetadataKey] object), after
// checking the record's version. INVALID_ARGUMENT for a missing or unknown version, a version 1
// q8_0 base, or a malformed quantization.
absl::StatusOr<SplitQuantization> SplitRecordQuantization(const nlohmann::json& record);

// One line for messages and summaries: "b2_asym/g64 + r8/g64, hadamard 64 (seed 1)"; a planned
// model names its formats with their tensor counts: "{b2_asym x120, b4_asym x91}/g64 + {r4 x91,
// r6 x120}/g32, ...".
std::string SplitQuantizationString(const SplitQuantization& quantization);
// Its halves: the base "b2_asym/g64, hadamard 64 (seed 1)" (the rotation applies to the base
// matmul's input) and the residual "r8/g64" ("" for a base-only model).
std::string SplitBaseString(const SplitQuantization& quantization);
std::string SplitResidualString(const SplitQuantization& quantization);
// "b2_asym", "r8", "q8_0", ...
std::string SplitFormatName(quant::SplitFormat format);

// The files of a split model with prefix P.
std::string SplitBasePath(const std::string& prefix);      // P.base.bsplit
std::string SplitResidualPath(const std::string& prefix);  // P.residual.bsplit

// Row byte sizes of the split formats, for SplitFile::Open and SplitFileWriter::Create.
RowSizeOracle SplitFormatRowSizeOracle();

// The mapped files of a split model and validated views of everything the forward reads. No
// tensor byte is copied. Thread safety: immutable after Open.
class SplitModelFiles {
 public:
  // Opens the base file and, when `residual_path` is non-empty, the residual file. Errors:
  // INVALID_ARGUMENT for malformed files or misshapen tensors, NOT_FOUND for missing ones (naming
  // file and tensor),
  // FAILED_PRECONDITION for a file of the wrong kind (e.g. the base file given as the residual)
  // or files of different quantize runs (fingerprints differ).
  static absl::StatusOr<std::unique_ptr<SplitModelFiles>> Open(const std::string& base_path,
                                                               const std::string& residual_path);

  const SplitFile& base() const { return *base_; }
  const SplitFile* residual() const { return residual_.get(); }  // null when base only
  // The source GGUF's metadata (no tensors): for text::Tokenizer / ChatTemplate::FromGguf.
  const gguf::File& gguf_metadata() const { return *gguf_metadata_; }
  const ModelConfig& config() const { return config_; }
  const SplitQuantization& quantization() const { return quantization_; }
  const EmbeddingAndNorms& embedding_and_norms() const { return embedding_and_norms_; }
  const SplitLinearWeights& base_linear() const { return base_linear_; }
  const SplitLinearWeights* residual_linear() const {
    return residual_ != nullptr ? &residual_linear_ : nullptr;
  }

 private:
  SplitModelFiles() = default;

  std::unique_ptr<SplitFile> base_;            // owns the mapping every base view points into
  std::unique_ptr<SplitFile> residual_;        // null when base only
  std::unique_ptr<gguf::File> gguf_metadata_;  // parsed in place from the base mapping
  ModelConfig config_;
  SplitQuantization quantization_;
  EmbeddingAndNorms embedding_and_norms_;
  SplitLinearWeights base_linear_;
  SplitLinearWeights residual_linear_;
};

}  // namespace bitsplit::model
