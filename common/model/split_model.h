#pragma once
// A split model as `bitsplit quantize` writes it (docs/split_model.md): a base file
// (base-format linear weights, source-precision norms and embeddings, and the source GGUF's
// metadata for config and tokenizer) and optionally a residual file (the residual of every
// linear weight, the output head included). This header names what is in them and loads them.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

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

// The quantizer knobs that shape the files (and so are part of the fingerprint).
struct SplitQuantization {
  quant::SplitFormat base_format = quant::SplitFormat::kB2Asym;
  int base_group = 64;
  // nullopt: base only (no residual file), e.g. the Q8_0 reference configuration.
  std::optional<quant::SplitFormat> residual_format = quant::SplitFormat::kR8;
  int residual_group = 64;  // 0 in the files' record of a base-only model
  HadamardRotation rotation;
  // Hex SHA-256 of the calibration text whose activations weighted the base fit; empty when
  // none. The token count and window size make the fit reproducible.
  std::string calibration_sha256;
  int64_t calibration_tokens = 0;
  int64_t calibration_window = 0;

  bool operator==(const SplitQuantization&) const = default;
};
nlohmann::json SplitQuantizationToJson(const SplitQuantization& quantization);
absl::StatusOr<SplitQuantization> SplitQuantizationFromJson(const nlohmann::json& json);

// The "version" the quantizer writes into its record. 2: q8_0 bases in the split row layout
// (docs/formats.md); version 1 files held them in ggml's interleaved 34-byte blocks, which this
// build refuses (the other formats are unchanged, so version 1 files of them still load).
inline constexpr int kSplitRecordVersion = 2;

// The quantization in a split file's record (its metadata[kSplitMetadataKey] object), after
// checking the record's version. INVALID_ARGUMENT for a missing or unknown version, a version 1
// q8_0 base, or a malformed quantization.
absl::StatusOr<SplitQuantization> SplitRecordQuantization(const nlohmann::json& record);

// One line for messages and summaries: "b2_asym/g64 + r8/g64, hadamard 64 (seed 1)".
std::string SplitQuantizationString(const SplitQuantization& quantization);
// Its halves: the base "b2_asym/g64, hadamard 64 (seed 1)" (the rotation applies to the base
// matmul's input) and the residual "r8/g64" ("" for a base-only model).
std::string SplitBaseString(const SplitQuantization& quantization);
std::string SplitResidualString(const SplitQuantization& quantization);
// "b2_asym", "r8", "q8_0", ...
std::string SplitFormatName(quant::SplitFormat format);

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
