#include "common/offline/split_quantizer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <numeric>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/io/gguf.h"
#include "common/model/weights.h"
#include "common/ops/matmul.h"
#include "common/quant/hadamard.h"
#include "common/quant/split_format.h"
#include "common/util/sha256.h"
#include "common/util/status_macros.h"
#include "common/util/thread_pool.h"

namespace bitsplit::offline {
namespace {

using Clock = std::chrono::steady_clock;

// Bumped whenever the quantizer's output for the same source and knobs changes, so that files
// of different quantizer versions never pair.
constexpr char kFingerprintDomain[] = "bitsplit split model v1";

std::string FormatName(quant::SplitFormat format) { return quant::GetSplitFormatInfo(format).name; }

// ---- Calibration ------------------------------------------------------------------------------

// Wraps a backend and accumulates, per group, the sum over rows of each input column's square
// (after the rotation the base is fitted in). Thread safety: one forward at a time.
class ActivationRecorder final : public model::LinearBackend {
 public:
  ActivationRecorder(model::LinearBackend& inner, const model::ModelConfig& config,
                     model::HadamardRotation rotation)
      : inner_(inner), config_(config), rotation_(rotation) {
    for (const model::LinearGroupId id : model::AllLinearGroups(config)) {
      sums_.emplace_back(static_cast<size_t>(model::LinearGroupInputDim(config, id)), 0.0);
    }
    source_sums_ = sums_;
    rows_.assign(sums_.size(), 0);
    if (config.has_experts()) {
      expert_rows_.assign(static_cast<size_t>(config.num_layers),
                          std::vector<int64_t>(static_cast<size_t>(config.num_experts), 0));
    }
  }

  absl::Status Apply(model::LinearGroupId id, const float* x, int64_t num_tokens,
                     std::span<float* const> outputs, ThreadPool& pool) override {
    Record(id, x, num_tokens);
    return inner_.Apply(id, x, num_tokens, outputs, pool);
  }
  // Every routed row of an expert group counts toward the group (the tall matrices of all its
  // experts share one input importance).
  absl::Status ApplyExperts(int32_t layer, model::LinearGroup group, const float* x,
                            int64_t num_rows, std::span<const model::ExpertRows> segments,
                            std::span<float* const> outputs, ThreadPool& pool) override {
    Record({layer, group}, x, num_rows);
    // Every routed row passes the gate|up group once.
    if (group == model::LinearGroup::kExpertGateUp) {
      for (const model::ExpertRows& segment : segments) {
        expert_rows_[layer][static_cast<size_t>(segment.expert)] += segment.count;
      }
    }
    return inner_.ApplyExperts(layer, group, x, num_rows, segments, outputs, pool);
  }

  // Mean squared activation per group and column, in the rotated basis (source = false) or the
  // source's.
  std::vector<std::vector<float>> Importance(bool source = false) const {
    const std::vector<std::vector<double>>& of = source ? source_sums_ : sums_;
    std::vector<std::vector<float>> importance(of.size());
    for (size_t g = 0; g < of.size(); ++g) {
      importance[g].resize(of[g].size());
      for (size_t j = 0; j < of[g].size(); ++j) {
        importance[g][j] =
            rows_[g] > 0 ? static_cast<float>(of[g][j] / static_cast<double>(rows_[g])) : 0.0f;
      }
    }
    return importance;
  }
  const std::vector<std::vector<int64_t>>& expert_rows() const { return expert_rows_; }

 private:
  void Record(model::LinearGroupId id, const float* x, int64_t num_tokens) {
    const size_t index = static_cast<size_t>(model::LinearGroupIndex(config_, id));
    const int64_t cols = model::LinearGroupInputDim(config_, id);
    rotated_.assign(x, x + num_tokens * cols);
    model::RotateRows(rotation_, rotated_.data(), num_tokens, cols);
    std::vector<double>& sums = sums_[index];
    std::vector<double>& source_sums = source_sums_[index];
    for (int64_t t = 0; t < num_tokens; ++t) {
      const float* row = rotated_.data() + t * cols;
      const float* source_row = x + t * cols;
      for (int64_t j = 0; j < cols; ++j) {
        sums[j] += static_cast<double>(row[j]) * row[j];
        source_sums[j] += static_cast<double>(source_row[j]) * source_row[j];
      }
    }
    rows_[index] += num_tokens;
  }

  model::LinearBackend& inner_;
  const model::ModelConfig config_;
  const model::HadamardRotation rotation_;
  std::vector<std::vector<double>> sums_;          // [LinearGroupIndex][input dim], rotated
  std::vector<std::vector<double>> source_sums_;   // the same before the rotation
  std::vector<int64_t> rows_;                      // [LinearGroupIndex]
  std::vector<std::vector<int64_t>> expert_rows_;  // [layer][expert]
  std::vector<float> rotated_;                     // scratch
};

// ---- Validation -------------------------------------------------------------------------------

// The first tensor of each distinct input width, in forward order, for messages.
struct InputDim {
  std::string tensor;
  int64_t cols;
};
std::vector<InputDim> DistinctInputDims(const model::ModelConfig& config) {
  std::vector<InputDim> dims;
  for (const model::LinearGroupId id : model::AllLinearGroups(config)) {
    const int64_t cols = model::LinearGroupInputDim(config, id);
    if (std::none_of(dims.begin(), dims.end(), [&](const InputDim& d) { return d.cols == cols; })) {
      dims.push_back({model::LinearGroupTensorNames(config, id)[0], cols});
    }
  }
  return dims;
}

// Values in `candidates` that divide every input width, as "32, 64, 96" (or "none").
std::string FittingValues(const std::vector<InputDim>& dims, const std::vector<int>& candidates) {
  std::vector<int> fitting;
  for (int value : candidates) {
    if (std::all_of(dims.begin(), dims.end(),
                    [&](const InputDim& d) { return d.cols % value == 0; })) {
      fitting.push_back(value);
    }
  }
  return fitting.empty() ? "none" : absl::StrJoin(fitting, ", ");
}

absl::Status CheckGroup(const char* what, quant::SplitFormat format, int group,
                        const std::vector<InputDim>& dims) {
  for (const InputDim& dim : dims) {
    if (quant::ValidateSplitLayout(format, group, dim.cols).ok()) continue;
    std::vector<int> candidates;
    if (format == quant::SplitFormat::kQ8_0) {
      candidates = {32};
    } else {
      for (int g = quant::kSplitSubBlock; g <= 4096; g += quant::kSplitSubBlock) {
        candidates.push_back(g);
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat(what, " group size ", group, " (", FormatName(format),
                     ") does not fit tensor ", dim.tensor, ": its input dimension ", dim.cols,
                     " is not a multiple of it (groups are positive multiples of 32",
                     format == quant::SplitFormat::kQ8_0 ? "; q8_0 takes exactly 32" : "",
                     "); group sizes that fit every linear weight of this model: ",
                     FittingValues(dims, candidates)));
  }
  return absl::OkStatus();
}

// ---- Output -------------------------------------------------------------------------------------

// The source's metadata as a tensor-less GGUF image: its bytes up to the end of the metadata
// entries, with the tensor count set to 0.
absl::StatusOr<std::vector<uint8_t>> GgufMetadataImage(const gguf::File& source) {
  constexpr size_t kTensorCountOffset = 8;  // after magic and version
  const uint64_t end = source.metadata_end_offset();
  if (end < kTensorCountOffset + sizeof(uint64_t) || end > source.image_size()) {
    return absl::InternalError(absl::StrCat(source.name(), ": bad metadata end offset ", end));
  }
  std::vector<uint8_t> image(source.image_data(), source.image_data() + end);
  const uint64_t zero = 0;
  std::memcpy(image.data() + kTensorCountOffset, &zero, sizeof(zero));
  // The loader parses it the same way; fail here rather than write an unloadable model.
  BITSPLIT_RETURN_IF_ERROR(
      gguf::File::Parse(image.data(), image.size(), "metadata image").status());
  return image;
}

SplitFingerprint Fingerprint(const std::string& source_sha256, const model::SplitQuantization& q) {
  Sha256 hasher;
  hasher.Update(std::string(kFingerprintDomain));
  hasher.Update("\n", 1);
  hasher.Update(source_sha256);
  hasher.Update("\n", 1);
  hasher.Update(model::SplitQuantizationToJson(q).dump());
  return hasher.Finish();
}

// A linear weight to split.
struct SplitJob {
  std::string name;
  model::LinearGroupId id;
  ops::WeightMatrix source;  // [rows, cols]
  uint64_t source_bytes;
};

absl::StatusOr<const gguf::TensorInfo*> SourceTensor(const gguf::File& file,
                                                     const std::string& name) {
  const gguf::TensorInfo* tensor = file.FindTensor(name);
  if (tensor == nullptr) {
    return absl::NotFoundError(absl::StrCat(file.name(), ": tensor ", name, " is missing"));
  }
  return tensor;
}

// What goes into the files, in base-file order: the metadata blob, the tensors copied before the
// first layer (embedding table, output norm, RoPE factors), then per layer its vectors (norms and
// biases, LayerVectorSpecs) before its q|k|v, then per linear group its matrices; the head last.
struct PlanStep {
  std::vector<const gguf::TensorInfo*> norms;
  std::vector<SplitJob> jobs;
};
struct FilePlan {
  std::vector<uint8_t> metadata_image;
  std::vector<const gguf::TensorInfo*> copies;
  std::vector<PlanStep> steps;
  int64_t linear_parameters = 0;

  int64_t num_tensors() const {
    int64_t n = 1 + static_cast<int64_t>(copies.size());
    for (const PlanStep& step : steps)
      n += static_cast<int64_t>(step.norms.size() + step.jobs.size());
    return n;
  }
  uint64_t source_bytes() const {
    uint64_t bytes = 0;
    for (const gguf::TensorInfo* tensor : copies) bytes += tensor->num_bytes;
    for (const PlanStep& step : steps) {
      for (const gguf::TensorInfo* tensor : step.norms) bytes += tensor->num_bytes;
      for (const SplitJob& job : step.jobs) bytes += job.source_bytes;
    }
    return bytes;
  }
};

absl::StatusOr<FilePlan> PlanFiles(const gguf::File& source, const model::ModelConfig& config,
                                   const model::ModelWeights& weights) {
  FilePlan plan;
  BITSPLIT_ASSIGN_OR_RETURN(plan.metadata_image, GgufMetadataImage(source));
  for (const char* name : {"token_embd.weight", "output_norm.weight", "rope_freqs.weight"}) {
    if (const gguf::TensorInfo* tensor = source.FindTensor(name); tensor != nullptr) {
      plan.copies.push_back(tensor);
    }
  }
  for (const model::LinearGroupId id : model::AllLinearGroups(config)) {
    PlanStep& step = plan.steps.emplace_back();
    if (id.group == model::LinearGroup::kQkv) {
      for (const model::LayerVectorSpec& spec : model::LayerVectorSpecs(config, id.layer)) {
        BITSPLIT_ASSIGN_OR_RETURN(
            const gguf::TensorInfo* tensor,
            SourceTensor(source, absl::StrCat("blk.", id.layer, ".", spec.tensor)));
        step.norms.push_back(tensor);
      }
      if (config.has_experts()) {  // the router, at source precision (every mode routes alike)
        BITSPLIT_ASSIGN_OR_RETURN(
            const gguf::TensorInfo* router,
            SourceTensor(source, absl::StrCat("blk.", id.layer, ".ffn_gate_inp.weight")));
        step.norms.push_back(router);
      }
    }
    const std::vector<std::string> names = model::LinearGroupTensorNames(config, id);
    const model::GgufGroupMatrices matrices = model::GroupMatricesOf(weights, id);
    for (size_t i = 0; i < names.size(); ++i) {
      const ops::WeightMatrix& matrix = matrices[i];
      step.jobs.push_back(
          {names[i], id, matrix, static_cast<uint64_t>(matrix.rows * matrix.row_bytes)});
      plan.linear_parameters += matrix.rows * matrix.cols;
    }
  }
  return plan;
}

// Declares every tensor of the plan (fixing both files' layouts) and counts formats.
absl::Status DeclareTensors(const FilePlan& plan, const model::SplitQuantization& q,
                            SplitFileWriter& base, SplitFileWriter* residual,
                            QuantizeSummary* summary) {
  BITSPLIT_RETURN_IF_ERROR(base.DeclareTensor(model::kGgufMetadataTensor,
                                              GgmlTensorFormat(GgmlType::kI8), 0,
                                              {static_cast<int64_t>(plan.metadata_image.size())})
                               .status());
  ++summary->base_format_counts[GgmlTypeName(GgmlType::kI8)];
  auto declare_copy = [&](const gguf::TensorInfo* tensor) -> absl::Status {
    ++summary->base_format_counts[GgmlTypeName(tensor->type)];
    return base.DeclareTensor(tensor->name, GgmlTensorFormat(tensor->type), 0, tensor->dims)
        .status();
  };
  for (const gguf::TensorInfo* tensor : plan.copies) BITSPLIT_RETURN_IF_ERROR(declare_copy(tensor));
  for (const PlanStep& step : plan.steps) {
    for (const gguf::TensorInfo* tensor : step.norms) {
      BITSPLIT_RETURN_IF_ERROR(declare_copy(tensor));
    }
    for (const SplitJob& job : step.jobs) {
      const std::vector<int64_t> dims = {job.source.cols, job.source.rows};
      const quant::SplitFormat base_format = q.BaseFormatOf(job.name);
      BITSPLIT_ASSIGN_OR_RETURN(
          const uint64_t base_bytes,
          base.DeclareTensor(job.name, SplitTensorFormat(static_cast<uint32_t>(base_format)),
                             static_cast<uint32_t>(q.base_group), dims));
      summary->base_linear_bytes += base_bytes;
      ++summary->base_format_counts[FormatName(base_format)];
      if (residual != nullptr) {
        const quant::SplitFormat residual_format = *q.ResidualFormatOf(job.name);
        BITSPLIT_RETURN_IF_ERROR(
            residual
                ->DeclareTensor(job.name, SplitTensorFormat(static_cast<uint32_t>(residual_format)),
                                static_cast<uint32_t>(q.residual_group), dims)
                .status());
        ++summary->residual_format_counts[FormatName(residual_format)];
      }
    }
  }
  return absl::OkStatus();
}

// Base and residual codes of one matrix, rows in parallel.
class MatrixSplitter {
 public:
  MatrixSplitter(const model::SplitQuantization& q, ThreadPool& pool) : q_(q), pool_(pool) {}

  // Fills base (rows × base row bytes) and residual (rows × residual row bytes, when the
  // quantization has a residual) from `job.source`.
  absl::Status Run(const SplitJob& job, const float* importance, std::vector<uint8_t>* base,
                   std::vector<uint8_t>* residual) {
    const ops::WeightMatrix& w = job.source;
    const model::TensorSplitFormats formats = {q_.BaseFormatOf(job.name),
                                               q_.ResidualFormatOf(job.name)};
    const size_t base_row_bytes = quant::SplitRowBytes(formats.base, q_.base_group, w.cols);
    const size_t residual_row_bytes =
        formats.residual ? quant::SplitRowBytes(*formats.residual, q_.residual_group, w.cols) : 0;
    base->resize(static_cast<size_t>(w.rows) * base_row_bytes);
    residual->resize(static_cast<size_t>(w.rows) * residual_row_bytes);
    scratch_.resize(static_cast<size_t>(pool_.num_threads()));
    struct {
      std::mutex mutex;
      absl::Status first_error ABSL_GUARDED_BY(mutex);
    } errors;
    pool_.ParallelFor(w.rows, [&](int64_t begin, int64_t end, int worker) {
      std::vector<float>& scratch = scratch_[static_cast<size_t>(worker)];
      scratch.resize(static_cast<size_t>(2 * w.cols));
      float* row = scratch.data();
      float* rest = scratch.data() + w.cols;
      for (int64_t r = begin; r < end; ++r) {
        absl::Status status =
            SplitRow(formats, w, r, importance, row, rest, base->data() + r * base_row_bytes,
                     residual->data() + r * residual_row_bytes);
        if (!status.ok()) {
          std::lock_guard<std::mutex> lock(errors.mutex);
          if (errors.first_error.ok()) {
            errors.first_error =
                absl::Status(status.code(),
                             absl::StrCat("tensor ", job.name, " row ", r, ": ", status.message()));
          }
          return;
        }
      }
    });
    return errors.first_error;  // the workers have finished
  }

 private:
  // row, rest: scratch of w.cols floats each.
  absl::Status SplitRow(const model::TensorSplitFormats& formats, const ops::WeightMatrix& w,
                        int64_t r, const float* importance, float* row, float* rest,
                        uint8_t* base_out, uint8_t* residual_out) const {
    ops::DequantizeWeightRow(w, r, row);
    model::RotateRows(q_.rotation, row, 1, w.cols);
    if (formats.base == quant::SplitFormat::kQ8_0) {
      quant::QuantizeQ8_0SplitRow(row, w.cols, base_out);
    } else {
      BITSPLIT_RETURN_IF_ERROR(
          quant::QuantizeBaseRow(formats.base, q_.base_group, row, importance, w.cols, base_out));
    }
    if (!formats.residual) return absl::OkStatus();
    quant::DequantizeSplitRow(formats.base, q_.base_group, base_out, w.cols, rest);
    for (int64_t i = 0; i < w.cols; ++i) rest[i] = row[i] - rest[i];
    return quant::QuantizeResidualRow(*formats.residual, q_.residual_group, rest, w.cols,
                                      residual_out);
  }

  const model::SplitQuantization& q_;
  ThreadPool& pool_;
  std::vector<std::vector<float>> scratch_;  // per worker
};

}  // namespace

double QuantizeSummary::base_bits_per_weight() const {
  return source_parameters > 0 ? 8.0 * base_file_bytes / source_parameters : 0.0;
}
double QuantizeSummary::base_linear_bits_per_weight() const {
  return linear_parameters > 0 ? 8.0 * base_linear_bytes / linear_parameters : 0.0;
}
double QuantizeSummary::residual_bits_per_weight() const {
  return linear_parameters > 0 ? 8.0 * residual_file_bytes / linear_parameters : 0.0;
}

absl::StatusOr<Calibration> CollectCalibration(model::LlamaModel& model,
                                               std::span<const int32_t> tokens, int64_t window,
                                               int32_t bos,
                                               const model::HadamardRotation& rotation) {
  const model::ModelConfig& config = model.config();
  model::LinearBackend* reference = model.backend(model::ForwardMode::kReference);
  if (reference == nullptr) {
    return absl::FailedPreconditionError(
        "calibration needs the source model (reference mode), not a split model");
  }
  if (tokens.empty()) return absl::InvalidArgumentError("calibration text has no tokens");
  const int64_t prefix = bos >= 0 ? 1 : 0;
  if (window <= prefix || window > config.context_length) {
    return absl::InvalidArgumentError(absl::StrCat("calibration window ", window, " must be in [",
                                                   prefix + 1, ", ", config.context_length, "]"));
  }
  ActivationRecorder recorder(*reference, config, rotation);
  BITSPLIT_ASSIGN_OR_RETURN(model::KvCache cache, model.NewKvCache(window));
  std::vector<float> logits;
  std::vector<int32_t> chunk, first_window;
  for (size_t begin = 0; begin < tokens.size();) {
    const size_t count = std::min(tokens.size() - begin, static_cast<size_t>(window - prefix));
    chunk.clear();
    if (bos >= 0) chunk.push_back(bos);
    chunk.insert(chunk.end(), tokens.begin() + begin, tokens.begin() + begin + count);
    // Every row's logits, so that the output head sees every position's input.
    const model::Batch batch = model::Batch::Causal(chunk, 0);
    logits.resize(chunk.size() * static_cast<size_t>(config.vocab_size));
    cache.Clear();
    BITSPLIT_RETURN_IF_ERROR(model.ForwardWith(recorder, batch, cache, logits));
    if (begin == 0) first_window = chunk;
    begin += count;
  }
  Calibration calibration;
  calibration.first_window = std::move(first_window);
  calibration.tokens = static_cast<int64_t>(tokens.size());
  calibration.window = window;
  calibration.importance = recorder.Importance();
  calibration.source_importance = recorder.Importance(/*source=*/true);
  calibration.expert_rows = recorder.expert_rows();
  return calibration;
}

absl::Status ValidateSplitQuantization(const model::SplitQuantization& q,
                                       const model::ModelConfig& config) {
  const quant::SplitFormatInfo& base = quant::GetSplitFormatInfo(q.base_format);
  if (!base.is_base && q.base_format != quant::SplitFormat::kQ8_0) {
    return absl::InvalidArgumentError(
        absl::StrCat(base.name, " is not a base format (b2/b3/b4 sym/asym, or q8_0)"));
  }
  if (q.base_format == quant::SplitFormat::kQ8_0 && q.residual_format) {
    return absl::InvalidArgumentError(
        "a q8_0 base is the Q8_0 reference configuration and takes no residual (residual bits 0)");
  }
  if (q.residual_format && !quant::GetSplitFormatInfo(*q.residual_format).is_residual) {
    return absl::InvalidArgumentError(absl::StrCat(
        FormatName(*q.residual_format), " is not a residual format (r3, r4, r5, r6 or r8)"));
  }
  const std::vector<InputDim> dims = DistinctInputDims(config);
  BITSPLIT_RETURN_IF_ERROR(CheckGroup("base", q.base_format, q.base_group, dims));
  if (q.residual_format) {
    BITSPLIT_RETURN_IF_ERROR(CheckGroup("residual", *q.residual_format, q.residual_group, dims));
  }
  for (const auto& [name, formats] : q.tensor_formats) {
    if (!quant::GetSplitFormatInfo(formats.base).is_base) {
      return absl::InvalidArgumentError(absl::StrCat("bit plan: tensor ", name, "'s base ",
                                                     FormatName(formats.base),
                                                     " is not a base format (b2/b3/b4 sym/asym)"));
    }
    if (formats.residual.has_value() != q.residual_format.has_value() ||
        (formats.residual && !quant::GetSplitFormatInfo(*formats.residual).is_residual)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bit plan: tensor ", name,
                       q.residual_format ? " needs a residual format (r3, r4, r5, r6 or r8)"
                                         : " has a residual in a base-only quantization"));
    }
    BITSPLIT_RETURN_IF_ERROR(CheckGroup("base", formats.base, q.base_group, dims));
    if (formats.residual) {
      BITSPLIT_RETURN_IF_ERROR(CheckGroup("residual", *formats.residual, q.residual_group, dims));
    }
  }
  BITSPLIT_RETURN_IF_ERROR(model::ValidateTensorFormats(q, config));
  if (q.rotation.enabled()) {
    for (const InputDim& dim : dims) {
      if (quant::ValidateHadamard(q.rotation.block, dim.cols).ok()) continue;
      std::vector<int> candidates;
      for (int block = 8; block <= 1024; block *= 2) candidates.push_back(block);
      return absl::InvalidArgumentError(
          absl::StrCat("rotation block ", q.rotation.block, " does not fit tensor ", dim.tensor,
                       ": blocks are powers of two in [8, 1024] dividing the input dimension (",
                       dim.cols, "); blocks that fit every linear weight of this model: ",
                       FittingValues(dims, candidates)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<QuantizeSummary> QuantizeSplitModel(const std::string& gguf_path,
                                                   const std::string& base_path,
                                                   const std::string& residual_path,
                                                   const SplitQuantizeOptions& options,
                                                   const Calibration* calibration,
                                                   const QuantizeProgressFn& progress) {
  const Clock::time_point start = Clock::now();
  BITSPLIT_ASSIGN_OR_RETURN(std::unique_ptr<gguf::File> source, gguf::File::Open(gguf_path));
  BITSPLIT_ASSIGN_OR_RETURN(const model::ModelConfig config, model::ModelConfigFromGguf(*source));
  BITSPLIT_ASSIGN_OR_RETURN(const model::ModelWeights weights,
                            model::ModelWeightsFromGguf(*source, config));

  model::SplitQuantization q = options.quantization;
  if (!q.residual_format) q.residual_group = 0;  // canonical, as the record stores it
  q.calibration_sha256.clear();
  q.calibration_tokens = q.calibration_window = 0;
  if (calibration != nullptr) {
    const std::vector<model::LinearGroupId> groups = model::AllLinearGroups(config);
    bool fits = calibration->importance.size() == groups.size();
    for (size_t g = 0; fits && g < groups.size(); ++g) {
      fits = static_cast<int64_t>(calibration->importance[g].size()) ==
             model::LinearGroupInputDim(config, groups[g]);
    }
    if (!fits) return absl::InvalidArgumentError("calibration was collected on a different model");
    q.calibration_sha256 = calibration->text_sha256;
    q.calibration_tokens = calibration->tokens;
    q.calibration_window = calibration->window;
  }
  BITSPLIT_RETURN_IF_ERROR(ValidateSplitQuantization(q, config));
  if (residual_path.empty() == q.residual_format.has_value()) {
    return absl::InvalidArgumentError(
        q.residual_format ? "the quantization has a residual but no residual path was given"
                          : "a base-only quantization takes no residual path");
  }

  const std::string source_sha256 = Sha256Hex(Sha256Of(source->image_data(), source->image_size()));
  QuantizeSummary summary;
  summary.quantization = q;
  summary.fingerprint = Fingerprint(source_sha256, q);
  summary.base_path = base_path;
  summary.residual_path = residual_path;
  for (const gguf::TensorInfo& tensor : source->tensors()) {
    summary.source_parameters += tensor.num_elements;
  }

  BITSPLIT_ASSIGN_OR_RETURN(const FilePlan plan, PlanFiles(*source, config, weights));
  summary.linear_parameters = plan.linear_parameters;

  const nlohmann::json metadata = {
      {model::kSplitMetadataKey,
       {{"version", model::SplitRecordVersionOf(q)},
        {"quantization", model::SplitQuantizationToJson(q)},
        {"source",
         {{"file", std::filesystem::path(gguf_path).filename().string()},
          {"sha256", source_sha256},
          {"bytes", source->image_size()}}},
        {"output_tied_to_embedding", weights.output_tied_to_embedding}}}};
  const RowSizeOracle oracle = model::SplitFormatRowSizeOracle();
  BITSPLIT_ASSIGN_OR_RETURN(std::unique_ptr<SplitFileWriter> base,
                            SplitFileWriter::Create(summary.base_path, SplitFileKind::kBase,
                                                    summary.fingerprint, metadata, oracle));
  std::unique_ptr<SplitFileWriter> residual;
  if (q.residual_format) {
    BITSPLIT_ASSIGN_OR_RETURN(
        residual, SplitFileWriter::Create(summary.residual_path, SplitFileKind::kResidual,
                                          summary.fingerprint, metadata, oracle));
  }

  BITSPLIT_RETURN_IF_ERROR(DeclareTensors(plan, q, *base, residual.get(), &summary));

  // Data, in file order. Progress counts tensors; its work measure is source bytes.
  QuantizeProgress state;
  state.tensors_total = plan.num_tensors();
  state.source_bytes_total = plan.source_bytes();
  auto advance = [&](uint64_t bytes) {
    ++state.tensors_done;
    state.source_bytes_done += bytes;
    state.elapsed_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (progress) progress(state);
  };
  auto write_copy = [&](const gguf::TensorInfo* tensor) -> absl::Status {
    BITSPLIT_RETURN_IF_ERROR(base->WriteTensorData(tensor->name, tensor->data, tensor->num_bytes));
    advance(tensor->num_bytes);
    return absl::OkStatus();
  };
  BITSPLIT_RETURN_IF_ERROR(base->WriteTensorData(
      model::kGgufMetadataTensor, plan.metadata_image.data(), plan.metadata_image.size()));
  advance(0);
  for (const gguf::TensorInfo* tensor : plan.copies) BITSPLIT_RETURN_IF_ERROR(write_copy(tensor));

  ThreadPool pool(options.num_threads);
  MatrixSplitter splitter(q, pool);
  std::vector<uint8_t> base_codes, residual_codes;
  for (const PlanStep& step : plan.steps) {
    for (const gguf::TensorInfo* tensor : step.norms) BITSPLIT_RETURN_IF_ERROR(write_copy(tensor));
    for (const SplitJob& job : step.jobs) {
      const float* importance =
          calibration != nullptr
              ? calibration
                    ->importance[static_cast<size_t>(model::LinearGroupIndex(config, job.id))]
                    .data()
              : nullptr;
      BITSPLIT_RETURN_IF_ERROR(splitter.Run(job, importance, &base_codes, &residual_codes));
      BITSPLIT_RETURN_IF_ERROR(
          base->WriteTensorData(job.name, base_codes.data(), base_codes.size()));
      if (residual != nullptr) {
        BITSPLIT_RETURN_IF_ERROR(
            residual->WriteTensorData(job.name, residual_codes.data(), residual_codes.size()));
      }
      advance(job.source_bytes);
    }
  }
  BITSPLIT_RETURN_IF_ERROR(base->Finish());
  if (residual != nullptr) BITSPLIT_RETURN_IF_ERROR(residual->Finish());

  std::error_code error;
  summary.base_file_bytes = std::filesystem::file_size(summary.base_path, error);
  if (residual != nullptr) {
    summary.residual_file_bytes = std::filesystem::file_size(summary.residual_path, error);
  }
  summary.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return summary;
}

}  // namespace bitsplit::offline
