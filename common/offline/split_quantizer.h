#pragma once
// `bitsplit quantize`: turns a GGUF of a supported family into a split model (docs/design.md §4;
// the files are described in docs/split_model.md).
//
// Every linear weight W (wq, wk, wv, wo, gate, up, down of every layer, and the output head;
// for tied embeddings the head is token_embd's matrix) is dequantized to f32 rows, optionally
// rotated along its input dimension (W' = W·Qᵀ with Q the block Hadamard of split_backend.h, so
// x·Wᵀ = (x·Qᵀ)·W'ᵀ: activations are rotated at run time), split into a base B (2/3/4-bit,
// importance-weighted when calibrated) and a residual R = W' - B quantized to r3, r4, r5, r6 or
// r8 with its own group scale (or, with a bit plan, each linear group at its own formats). Norms
// and the embedding table go to the base file at source precision, with the source GGUF's metadata
// (config, tokenizer, chat template). A base-only run (no residual) also serves the Q8_0 reference
// configuration through the same kernels.
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/io/split_file.h"
#include "common/model/config.h"
#include "common/model/llama_model.h"
#include "common/model/split_model.h"

namespace bitsplit::offline {

// Per-input-column importance of every linear group: the mean squared activation of the group's
// input over the calibration tokens, in the rotated space when the model is rotated (the space
// the base is fitted in).
struct Calibration {
  std::string text_sha256;  // hex SHA-256 of the calibration text (recorded in the files)
  int64_t tokens = 0;       // tokens run through the reference model
  int64_t window = 0;       // tokens per forward (each window starts from an empty cache)
  std::vector<std::vector<float>> importance;  // [LinearGroupIndex][input dim]
  // The same in the source basis (equal to `importance` without rotation): what weighs the
  // errors of a configuration that is not rotated (the bit allocator's Q8_0 yardstick).
  std::vector<std::vector<float>> source_importance;
  // The first window's tokens (BOS included when the model adds one), for probes that run the
  // model on the calibration text again (the bit allocator's sensitivities).
  std::vector<int32_t> first_window;
  // Mixture-of-experts models: per layer, the rows the router sent to each expert over the
  // calibration text ([layer][expert]; empty for a dense model). What the bit allocator weighs
  // each expert's errors and a verify's expert reads by.
  std::vector<std::vector<int64_t>> expert_rows;
};

// Runs `model` (a reference GGUF model) over `tokens` in windows of `window` tokens, each from an
// empty cache and starting with `bos` when bos >= 0, and collects the mean squared input of
// every linear group (rotated by `rotation` first). INVALID_ARGUMENT for no tokens or a window
// below 1 or beyond the context length.
absl::StatusOr<Calibration> CollectCalibration(model::LlamaModel& model,
                                               std::span<const int32_t> tokens, int64_t window,
                                               int32_t bos,
                                               const model::HadamardRotation& rotation);

struct SplitQuantizeOptions {
  model::SplitQuantization quantization;  // its calibration_* fields are filled from `calibration`
  int num_threads = 0;                    // <= 0: all hardware threads
};

// Checks `quantization` against a model: known formats of the right kind, groups and the
// rotation block dividing every linear weight's input dimension. INVALID_ARGUMENT naming the
// first tensor that does not fit and the values that would fit every tensor.
absl::Status ValidateSplitQuantization(const model::SplitQuantization& quantization,
                                       const model::ModelConfig& config);

struct QuantizeProgress {
  int64_t tensors_done = 0;
  int64_t tensors_total = 0;
  uint64_t source_bytes_done = 0;  // source tensor bytes processed (the work measure)
  uint64_t source_bytes_total = 0;
  double elapsed_seconds = 0;
};
using QuantizeProgressFn = std::function<void(const QuantizeProgress&)>;

struct QuantizeSummary {
  std::string base_path;
  std::string residual_path;  // empty when base only
  SplitFingerprint fingerprint{};
  model::SplitQuantization quantization;
  int64_t source_parameters = 0;     // elements of every source tensor (a tied head counted once)
  int64_t linear_parameters = 0;     // elements of every linear weight, the head included
  uint64_t base_file_bytes = 0;      // all of it lives in VRAM
  uint64_t base_linear_bytes = 0;    // of which linear weights
  uint64_t residual_file_bytes = 0;  // lives in system RAM
  std::map<std::string, int> base_format_counts;  // tensors per format ("b2_asym", "F32", ...)
  std::map<std::string, int> residual_format_counts;
  double seconds = 0;

  // Bits per weight of the base file over the model's parameters, of the base's linear weights
  // over the linear parameters, and of the residual file over the linear parameters.
  double base_bits_per_weight() const;
  double base_linear_bits_per_weight() const;
  double residual_bits_per_weight() const;
};

// Quantizes the GGUF at `gguf_path` into `base_path` and `residual_path` (which must be empty
// exactly when the quantization is base only; the CLI uses SplitBasePath / SplitResidualPath of
// its -o prefix). `calibration` (nullable) must come from the same model and rotation.
// `progress` (may be empty) is called after every tensor, on the calling thread. Errors:
// NOT_FOUND / INVALID_ARGUMENT for a missing or malformed source, INVALID_ARGUMENT for options
// that do not fit the model (before anything is written); I/O errors from the writers. Output
// files appear only complete (split_file.h).
absl::StatusOr<QuantizeSummary> QuantizeSplitModel(const std::string& gguf_path,
                                                   const std::string& base_path,
                                                   const std::string& residual_path,
                                                   const SplitQuantizeOptions& options,
                                                   const Calibration* calibration = nullptr,
                                                   const QuantizeProgressFn& progress = {});

}  // namespace bitsplit::offline
