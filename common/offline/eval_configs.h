#pragma once
// Configurations of `bitsplit eval` (docs/quality.md): what each row of the study runs, and the
// weight-side facts printed beside its KL (bytes per weight, distance of its weights from the
// source's, i.e. whether it reproduces the source grid).
//
// Spec syntax (one configuration):
//   ref                the reference itself (the source GGUF, reference engine): KL exactly 0
//   gguf:PATH          another GGUF run by the reference engine (e.g. llama.cpp's Q2_K)
//   split:PREFIX       a split model `bitsplit quantize` wrote (e.g. a bit plan), base + residual
//   split-base:PREFIX  the same model's base alone (its draft)
//   q8_0               Q8_0 from our own quantizer (split base-only format kQ8_0, group 32)
//   bN                 split base only, N in {2, 3, 4}: the draft model (ForwardMode::kDraft)
//   bN+rM              base + residual, M in {3, 4, 5, 6, 8}: the verifier (ForwardMode::kVerify)
//   bt, bt+rM          the same with the ternary base bt_sym (symmetric: "asym" is refused)
// followed by options, each after a ':'
//   gK                 base and residual group K     bgK / rgK   base / residual group only
//   sym | asym         base grid                     rot | rotK | norot   Hadamard block K
//   imp | noimp        importance weighting of the base fit from calibration activations
//   hq8                the output head from q8_0 (base only) instead (a diagnostic of how much
//                      of a draft's error the head carries)
// e.g. "b2+r6:g64:asym:rot:imp". Options not given take the defaults passed to the parser;
// q8_0 accepts only rot/norot. The canonical label (EvalConfigSpec::label) spells out every
// knob, so two specs name the same configuration iff their labels are equal.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/linear_backend.h"
#include "common/model/llama_model.h"
#include "common/model/split_model.h"
#include "common/model/weights.h"
#include "common/util/thread_pool.h"

namespace bitsplit::offline {

// The knobs a spec does not set: the defaults docs/quality.md picked by measurement on SmolLM2
// (ablation table there): 2-bit-family bases asymmetric with group 64, residuals with group 32,
// Hadamard rotation in blocks of 64, no importance weighting.
struct EvalSpecDefaults {
  int base_group = 64;
  int residual_group = 32;
  bool asymmetric = true;   // base grid
  int rotation_block = 64;  // 0: no rotation
  uint64_t rotation_seed = 1;
  bool importance = false;
};

struct EvalConfigSpec {
  enum class Kind { kReference, kGguf, kSplit, kSplitFiles };
  Kind kind = Kind::kSplit;
  std::string label;         // canonical, e.g. "b2+r6:g64:asym:rot64:noimp"
  std::string gguf_path;     // kGguf
  std::string split_prefix;  // kSplitFiles (verify: base + residual, else the base alone)
  // kSplit: what to quantize (residual_format nullopt for base-only specs and q8_0) and whether
  // the calibration activations weight the base fit; `verify` runs base + residual.
  model::SplitQuantization quantization;
  bool importance = false;
  bool verify = false;
  bool head_q8_0 = false;  // "hq8": the output head runs q8_0's base instead
};

// Parses one spec (see the syntax above). INVALID_ARGUMENT naming the spec and the bad part.
absl::StatusOr<EvalConfigSpec> ParseEvalConfigSpec(std::string_view spec,
                                                   const EvalSpecDefaults& defaults);
// A comma-separated list; empty items are errors.
absl::StatusOr<std::vector<EvalConfigSpec>> ParseEvalConfigSpecs(std::string_view specs,
                                                                 const EvalSpecDefaults& defaults);

// The matrices of a linear group in a GGUF model's weights, in LinearGroupTensorNames order.
std::vector<const ops::WeightMatrix*> GgufMatricesOf(const model::ModelWeights& weights,
                                                     model::LinearGroupId id);

// Distance of a set of weights from the source's.
struct WeightErrorPart {
  int64_t weights = 0;
  double relative_error = 0;  // ||W_src - W_cfg||_F / ||W_src||_F
  double exact_fraction = 0;  // weights equal to the source's in f32
  double gpu_bytes = 0;       // bytes (not per weight) of this part, as in WeightStats
  double ram_bytes = 0;
  // Sums behind relative_error, so that parts of different configurations can be combined.
  double error2 = 0;
  double source2 = 0;
};

// Weight-side facts of a configuration over the linear weights the split model quantizes: the
// 7 matrices of every layer (q, k, v, o, gate, up, down) and the output head (token_embd's matrix
// when tied). Embedding lookups, norms and RoPE factors are not counted.
struct WeightStats {
  int64_t weights = 0;              // elements counted
  double gpu_bytes_per_weight = 0;  // base file's linear weights (a GGUF config: all of them)
  double ram_bytes_per_weight = 0;  // residual file's (0 without a residual)
  // ||W_src - W_cfg||_F / ||W_src||_F over all counted weights, in the configuration's own
  // (possibly Hadamard-rotated) basis; the rotation is orthonormal so this equals the error of
  // the equivalent unrotated weights up to float rounding.
  double relative_error = 0;
  // Fraction of weights whose configuration value equals the source's exactly (in f32). With
  // rotation this compares rotated values, which never sit on the source grid.
  double exact_fraction = 0;
  // The same split into the layers' matrices and the output head (whose source type often
  // differs: SmolLM2's layers are Q4_1, its tied head Q8_0).
  WeightErrorPart layers;
  WeightErrorPart head;
};

// The layers' matrices of `layers_from` with the head of `head_from` (e.g. a 2-bit base whose
// output head is Q8_0).
WeightStats CombineLayersAndHead(const WeightStats& layers_from, const WeightStats& head_from);

// `source`: the reference GGUF's weights. For a split model (`split` loaded with LoadSplit) the
// configuration's weights are dequant(base) (+ dequant(residual) when `verify`).
absl::StatusOr<WeightStats> MeasureSplitWeights(const model::ModelWeights& source,
                                                const model::ModelConfig& config,
                                                const model::SplitModelFiles& split, bool verify,
                                                ThreadPool& pool);
// For a GGUF configuration (another quantization of the same model).
absl::StatusOr<WeightStats> MeasureGgufWeights(const model::ModelWeights& source,
                                               const model::ModelConfig& config,
                                               const model::ModelWeights& candidate,
                                               ThreadPool& pool);

}  // namespace bitsplit::offline
