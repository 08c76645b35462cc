// `bitsplit eval`: the quality study (docs/quality.md). Every configuration is compared with the
// reference (the source GGUF, reference engine, f32 activations) over the same token windows:
// per-token KL(reference ‖ config) (mean, median, p99), top-1 agreement and perplexity. Split
// configurations are quantized from the source GGUF into a work directory by the split engine's
// quantizer and run through the real kernels (draft mode for base only, verify mode for base +
// residual). Markdown table on stdout, progress on stderr, all rows as JSON with --json.
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/io/gguf.h"
#include "common/model/llama_model.h"
#include "common/model/weights.h"
#include "common/offline/calibration.h"
#include "common/offline/eval.h"
#include "common/offline/eval_configs.h"
#include "common/offline/split_quantizer.h"
#include "common/text/tokenizer.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"
#include "tools/bitsplit/commands.h"

namespace bitsplit::cli {
namespace {

using Clock = std::chrono::steady_clock;
double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

constexpr char kDefaultConfigs[] = "b2,b3,b4,b2+r6,b2+r8,b3+r6,q8_0";

struct EvalCommandOptions {
  std::string model_path;
  std::string text_path;
  std::string configs = kDefaultConfigs;
  std::optional<std::string> json_path;
  int64_t window = 512;
  int64_t max_tokens = 0;
  int threads = 0;
  std::string work_dir;  // empty: a fresh directory under $TMPDIR, removed at exit
  bool keep_work_dir = false;
  std::string calibration_path;
  int64_t calibration_tokens = 4096;
  offline::EvalSpecDefaults defaults;
};

// absl::Status::message() is an absl::string_view, distinct from std::string_view in Debian's
// abseil.
int Fail(int code, absl::string_view message) {
  return ReportError("eval", code, std::string_view(message.data(), message.size()));
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrFormat("cannot read %s", path));
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

// One configuration's row: what it runs and what it measured.
struct Row {
  offline::EvalConfigSpec spec;
  std::string mode;  // "reference", "draft", "verify"
  model::LlamaModel* model = nullptr;
  model::ForwardMode forward_mode = model::ForwardMode::kReference;
  // "hq8": the output head from this base-only Q8_0 model instead of `model`'s.
  model::LlamaModel* head_model = nullptr;
  offline::WeightStats weights;
  bool has_weight_stats = false;
  double quantize_seconds = 0;
  std::string files;  // the quantized files or the GGUF path
};

// Whether the configuration's weights reproduce the source's grid (docs/quality.md, "Reference
// grids"), measured rather than assumed, for the layers' matrices and the head separately:
// "YES" when at least half of the weights equal the source's exactly, "partly" from 1%.
std::string AlignmentWord(double exact_fraction) {
  return exact_fraction >= 0.5 ? "YES" : exact_fraction >= 0.01 ? "partly" : "no";
}

std::string AlignmentLabel(const Row& row) {
  if (row.spec.kind == offline::EvalConfigSpec::Kind::kReference) return "is the reference";
  if (!row.has_weight_stats) return "?";
  const offline::WeightStats& w = row.weights;
  return absl::StrFormat("layers %s, head %s (%.1f%% / %.1f%% exact)",
                         AlignmentWord(w.layers.exact_fraction),
                         AlignmentWord(w.head.exact_fraction), 100.0 * w.layers.exact_fraction,
                         100.0 * w.head.exact_fraction);
}

std::string Percent(double fraction) { return absl::StrFormat("%.2f%%", 100.0 * fraction); }

void PrintTable(const std::vector<Row>& rows, const offline::EvalReport& report,
                const std::string& model_path) {
  std::printf(
      "Reference: %s dequantized to f32, reference engine (f32 activations). %lld windows of <= "
      "%lld tokens from an empty cache, %lld scored positions. Reference perplexity %.4f.\n\n",
      model_path.c_str(), static_cast<long long>(report.windows),
      static_cast<long long>(rows.empty() ? 0 : report.tokens_evaluated / report.windows),
      static_cast<long long>(report.reference.tokens), report.reference.perplexity);
  std::printf(
      "| config | mode | aligned with source grid? | weight rel. err | GPU B/w | RAM B/w | KL mean "
      "| KL median | KL p99 | top-1 | PPL |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    const offline::EvalSummary& s = report.configs[i].summary;
    const std::string weight_error =
        row.has_weight_stats ? absl::StrFormat("%.3g", row.weights.relative_error) : "-";
    const std::string gpu =
        row.has_weight_stats ? absl::StrFormat("%.4f", row.weights.gpu_bytes_per_weight) : "-";
    const std::string ram =
        row.has_weight_stats ? absl::StrFormat("%.4f", row.weights.ram_bytes_per_weight) : "-";
    std::printf("| `%s` | %s | %s | %s | %s | %s | %.3g | %.3g | %.3g | %s | %.4f |\n",
                row.spec.label.c_str(), row.mode.c_str(), AlignmentLabel(row).c_str(),
                weight_error.c_str(), gpu.c_str(), ram.c_str(), s.kl_mean, s.kl_median, s.kl_p99,
                Percent(s.top1_agreement).c_str(), s.perplexity);
  }
  std::fflush(stdout);
}

nlohmann::json SummaryJson(const offline::EvalSummary& s) {
  return {{"tokens", s.tokens},         {"kl_mean", s.kl_mean},
          {"kl_median", s.kl_median},   {"kl_p99", s.kl_p99},
          {"kl_max", s.kl_max},         {"top1_agreement", s.top1_agreement},
          {"perplexity", s.perplexity}, {"nll_mean", s.nll_mean}};
}

// The linear layers of one model with the output head of another (same shapes), e.g. a 2-bit
// draft whose head is Q8_0. Each backend rotates and quantizes its own inputs.
class HeadSwapBackend final : public model::LinearBackend {
 public:
  HeadSwapBackend(model::LinearBackend* body, model::LinearBackend* head)
      : body_(body), head_(head) {}
  absl::Status Apply(model::LinearGroupId id, const float* x, int64_t num_tokens,
                     std::span<float* const> outputs, ThreadPool& pool) override {
    model::LinearBackend* backend = id.group == model::LinearGroup::kOutputHead ? head_ : body_;
    return backend->Apply(id, x, num_tokens, outputs, pool);
  }
  absl::Status ApplyExperts(int32_t layer, model::LinearGroup group, const float* x,
                            int64_t num_rows, std::span<const model::ExpertRows> segments,
                            std::span<float* const> outputs, ThreadPool& pool) override {
    return body_->ApplyExperts(layer, group, x, num_rows, segments, outputs, pool);
  }

 private:
  model::LinearBackend* body_;
  model::LinearBackend* head_;
};

// Quantizes (or reuses) the split model of a spec. `jobs` maps a quantization key to its model.
struct SplitJob {
  model::SplitQuantization quantization;
  bool importance = false;
  std::unique_ptr<model::LlamaModel> model;
  double seconds = 0;
  std::string base_path;
  std::string residual_path;
};

// The same quantization without the residual: a base-only spec can run the draft mode of a
// verify job whose base matches (the base codes do not depend on the residual settings).
bool SameBase(const model::SplitQuantization& a, const model::SplitQuantization& b) {
  return a.base_format == b.base_format && a.base_group == b.base_group && a.rotation == b.rotation;
}

// The options that need no file: the configurations parse, the window and token bounds hold, and
// :imp configurations have a calibration text that is not the evaluation text.
int CheckOptions(const EvalCommandOptions& options, std::vector<offline::EvalConfigSpec>* specs) {
  auto parsed = offline::ParseEvalConfigSpecs(options.configs, options.defaults);
  if (!parsed.ok()) return Fail(kExitBadInput, parsed.status().message());
  if (options.window < 2) return Fail(kExitBadInput, "--window must be at least 2");
  if (options.max_tokens < 0) return Fail(kExitBadInput, "--max-tokens must be >= 0");
  bool any_importance = false;
  for (const auto& spec : *parsed) any_importance |= spec.importance;
  if (any_importance && options.calibration_path.empty()) {
    return Fail(kExitBadInput, "configurations with :imp need --calibration FILE");
  }
  if (!options.calibration_path.empty()) {
    std::error_code error;
    if (std::filesystem::equivalent(options.calibration_path, options.text_path, error)) {
      return Fail(kExitBadInput,
                  "--calibration is the evaluation text: a configuration would be fitted on the "
                  "text it is scored on");
    }
  }
  *specs = std::move(*parsed);
  return kExitOk;
}

// The reference and the source weights (a second view of the same mapping, for the weight
// comparison: the model keeps its own private).
struct Source {
  std::unique_ptr<model::LlamaModel> reference;
  std::unique_ptr<gguf::File> file;
  model::ModelWeights weights;  // views into `file`
};

int LoadSource(const EvalCommandOptions& options, Source* source) {
  auto reference = model::LlamaModel::Load(options.model_path, options.threads);
  if (!reference.ok()) return Fail(kExitBadInput, reference.status().message());
  source->reference = std::move(*reference);
  auto file = gguf::File::Open(options.model_path);
  if (!file.ok()) return Fail(kExitBadInput, file.status().message());
  source->file = std::move(*file);
  auto weights = model::ModelWeightsFromGguf(*source->file, source->reference->config());
  if (!weights.ok()) return Fail(kExitBadInput, weights.status().message());
  source->weights = std::move(*weights);
  return kExitOk;
}

// Every split configuration must fit the model before anything is quantized.
int CheckSplitConfigs(const std::vector<offline::EvalConfigSpec>& specs,
                      const model::ModelConfig& config) {
  for (const offline::EvalConfigSpec& spec : specs) {
    if (spec.kind != offline::EvalConfigSpec::Kind::kSplit) continue;
    if (absl::Status status = offline::ValidateSplitQuantization(spec.quantization, config);
        !status.ok()) {
      return Fail(kExitBadInput, absl::StrFormat("%s: %s", spec.label, status.message()));
    }
  }
  return kExitOk;
}

// The evaluation text and its tokens.
struct EvalText {
  std::string bytes;
  std::vector<int32_t> tokens;
};

// Tokenizes --text with the source's tokenizer; fails when that gives no window to score.
int ReadEvalText(const EvalCommandOptions& options, const gguf::File& source_file,
                 const offline::EvalOptions& eval_options, EvalText* eval_text) {
  auto tokenizer = text::Tokenizer::FromGguf(source_file);
  if (!tokenizer.ok()) return Fail(kExitBadInput, tokenizer.status().message());
  auto bytes = ReadFile(options.text_path);
  if (!bytes.ok()) return Fail(kExitBadInput, bytes.status().message());
  eval_text->bytes = std::move(*bytes);
  // Plain text: control-token spellings in it are tokenized as ordinary text.
  eval_text->tokens = (*tokenizer)->Encode(eval_text->bytes, /*parse_special=*/false);
  const std::vector<int32_t>& tokens = eval_text->tokens;
  const auto windows = offline::EvalWindows(static_cast<int64_t>(tokens.size()), eval_options);
  if (windows.empty()) {
    return Fail(kExitBadInput,
                absl::StrFormat("nothing to score: %d tokens (--max-tokens %d) give no window of "
                                "at least 2 tokens",
                                tokens.size(), options.max_tokens));
  }
  int64_t scored = 0;
  for (const auto& [begin, length] : windows) scored += length - 1;
  std::fprintf(stderr,
               "[eval] %s: %zu bytes -> %zu tokens; %zu windows of <= %lld, %lld scored positions; "
               "%d threads\n",
               options.text_path.c_str(), eval_text->bytes.size(), tokens.size(), windows.size(),
               static_cast<long long>(options.window), static_cast<long long>(scored),
               eval_options.num_threads);
  return kExitOk;
}

// Where the quantized models go: --work-dir, or a fresh directory under $TMPDIR, removed with
// this object unless --keep-work-dir.
struct WorkDir {
  WorkDir() = default;
  WorkDir(const WorkDir&) = delete;
  WorkDir& operator=(const WorkDir&) = delete;
  ~WorkDir() {
    if (remove) {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  }

  std::filesystem::path dir;
  bool remove = false;
};

int MakeWorkDir(const EvalCommandOptions& options, WorkDir* work_dir) {
  if (options.work_dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr ? tmp : "/tmp") + "/bitsplit-eval-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) return Fail(kExitFailure, "cannot create a work dir");
    work_dir->dir = pattern;
    work_dir->remove = !options.keep_work_dir;
  } else {
    work_dir->dir = options.work_dir;
    std::error_code error;
    std::filesystem::create_directories(work_dir->dir, error);
    if (error) return Fail(kExitBadInput, "cannot create --work-dir " + work_dir->dir.string());
  }
  return kExitOk;
}

// Builds the rows and owns the models they run: the GGUF configurations' and the split jobs',
// quantized into the work directory when first needed. Must outlive the rows.
class RowBuilder {
 public:
  RowBuilder(const EvalCommandOptions& options, const Source& source,
             const std::filesystem::path& work_dir, ThreadPool& pool)
      : options_(options),
        source_(source),
        config_(source.reference->config()),
        work_dir_(work_dir),
        pool_(pool) {}

  // Verify specs first so that base-only specs can share their base.
  int BuildRows(const std::vector<offline::EvalConfigSpec>& specs, std::vector<Row>* rows) {
    rows->resize(specs.size());
    std::vector<size_t> order;
    for (size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].verify) order.push_back(i);
    }
    for (size_t i = 0; i < specs.size(); ++i) {
      if (!specs[i].verify) order.push_back(i);
    }
    for (size_t i : order) {
      Row& row = (*rows)[i];
      row.spec = specs[i];
      int code = kExitOk;
      switch (row.spec.kind) {
        case offline::EvalConfigSpec::Kind::kReference:
          ReferenceRow(row);
          break;
        case offline::EvalConfigSpec::Kind::kGguf:
          code = GgufRow(row);
          break;
        case offline::EvalConfigSpec::Kind::kSplit:
          code = SplitRow(row);
          break;
        case offline::EvalConfigSpec::Kind::kSplitFiles:
          code = SplitFilesRow(row);
          break;
      }
      if (code != kExitOk) return code;
    }
    return kExitOk;
  }

 private:
  void ReferenceRow(Row& row) {
    row.mode = "reference";
    row.model = source_.reference.get();
    row.files = options_.model_path;
  }

  int GgufRow(Row& row) {
    const offline::EvalConfigSpec& spec = row.spec;
    auto loaded = model::LlamaModel::Load(spec.gguf_path, options_.threads);
    if (!loaded.ok()) return Fail(kExitBadInput, loaded.status().message());
    if ((*loaded)->config().vocab_size != config_.vocab_size) {
      return Fail(kExitBadInput, spec.gguf_path + ": a different vocabulary");
    }
    auto file = gguf::File::Open(spec.gguf_path);
    if (!file.ok()) return Fail(kExitBadInput, file.status().message());
    auto weights = model::ModelWeightsFromGguf(**file, (*loaded)->config());
    if (!weights.ok()) return Fail(kExitBadInput, weights.status().message());
    auto stats = offline::MeasureGgufWeights(source_.weights, config_, *weights, pool_);
    if (!stats.ok()) return Fail(kExitBadInput, stats.status().message());
    row.weights = *stats;
    row.has_weight_stats = true;
    row.mode = "reference";
    row.model = loaded->get();
    row.files = spec.gguf_path;
    gguf_models_.push_back(std::move(*loaded));
    return kExitOk;
  }

  int SplitRow(Row& row) {
    const offline::EvalConfigSpec& spec = row.spec;
    bool created_now = false;
    auto found = FindOrQuantize(spec, &created_now);
    if (!found.ok()) return Fail(kExitFailure, found.status().message());
    SplitJob* job = *found;
    if (created_now) row.quantize_seconds = job->seconds;
    row.model = job->model.get();
    row.forward_mode = spec.verify ? model::ForwardMode::kVerify : model::ForwardMode::kDraft;
    row.mode = spec.verify ? "verify" : "draft";
    row.files = job->base_path + (spec.verify ? " + " + job->residual_path : "");
    auto stats = offline::MeasureSplitWeights(source_.weights, config_, *row.model->split_files(),
                                              spec.verify, pool_);
    if (!stats.ok()) return Fail(kExitFailure, stats.status().message());
    row.weights = *stats;
    row.has_weight_stats = true;
    if (spec.head_q8_0) return AddQ8_0Head(row);
    return kExitOk;
  }

  // A split model already on disk (split:PREFIX / split-base:PREFIX).
  int SplitFilesRow(Row& row) {
    const offline::EvalConfigSpec& spec = row.spec;
    const std::string base_path = model::SplitBasePath(spec.split_prefix);
    const std::string residual_path =
        spec.verify ? model::SplitResidualPath(spec.split_prefix) : "";
    auto loaded = model::LlamaModel::LoadSplit(base_path, residual_path, options_.threads);
    if (!loaded.ok()) return Fail(kExitBadInput, loaded.status().message());
    if ((*loaded)->config().vocab_size != config_.vocab_size) {
      return Fail(kExitBadInput, base_path + ": a different vocabulary");
    }
    row.model = loaded->get();
    row.forward_mode = spec.verify ? model::ForwardMode::kVerify : model::ForwardMode::kDraft;
    row.mode = spec.verify ? "verify" : "draft";
    row.files = base_path + (spec.verify ? " + " + residual_path : "");
    auto stats = offline::MeasureSplitWeights(source_.weights, config_, *row.model->split_files(),
                                              spec.verify, pool_);
    if (!stats.ok()) return Fail(kExitBadInput, stats.status().message());
    row.weights = *stats;
    row.has_weight_stats = true;
    split_file_models_.push_back(std::move(*loaded));
    return kExitOk;
  }

  // "hq8": the output head of the base-only Q8_0 model, its weights counted with the row's.
  int AddQ8_0Head(Row& row) {
    auto q8_0 = offline::ParseEvalConfigSpec("q8_0", options_.defaults);
    if (!q8_0.ok()) return Fail(kExitFailure, q8_0.status().message());
    bool head_created = false;
    auto head_job = FindOrQuantize(*q8_0, &head_created);
    if (!head_job.ok()) return Fail(kExitFailure, head_job.status().message());
    if (head_created) row.quantize_seconds += (*head_job)->seconds;
    row.head_model = (*head_job)->model.get();
    auto head_stats = offline::MeasureSplitWeights(source_.weights, config_,
                                                   *row.head_model->split_files(), false, pool_);
    if (!head_stats.ok()) return Fail(kExitFailure, head_stats.status().message());
    row.weights = offline::CombineLayersAndHead(row.weights, *head_stats);
    row.files += "; head: " + (*head_job)->base_path;
    return kExitOk;
  }

  // The split model of a spec: an existing job with the same quantization (a base-only spec
  // may use the draft mode of a verify job with the same base), or a new one quantized now.
  absl::StatusOr<SplitJob*> FindOrQuantize(const offline::EvalConfigSpec& spec, bool* created_now) {
    *created_now = false;
    if (SplitJob* job = FindJob(spec); job != nullptr) return job;
    BITSPLIT_ASSIGN_OR_RETURN(std::unique_ptr<SplitJob> created, Quantize(spec));
    jobs_.push_back(std::move(created));
    *created_now = true;
    return jobs_.back().get();
  }

  SplitJob* FindJob(const offline::EvalConfigSpec& spec) const {
    for (const auto& existing : jobs_) {
      if (existing->importance != spec.importance) continue;
      if (spec.verify ? existing->quantization == spec.quantization
                      : SameBase(existing->quantization, spec.quantization)) {
        return existing.get();
      }
    }
    return nullptr;
  }

  // Quantizes the spec into the work directory (config<N> for the N-th job) and loads it.
  absl::StatusOr<std::unique_ptr<SplitJob>> Quantize(const offline::EvalConfigSpec& spec) {
    auto created = std::make_unique<SplitJob>();
    created->quantization = spec.quantization;
    created->importance = spec.importance;
    const std::string stem = (work_dir_ / absl::StrFormat("config%zu", jobs_.size())).string();
    created->base_path = model::SplitBasePath(stem);
    created->residual_path =
        spec.quantization.residual_format ? model::SplitResidualPath(stem) : "";
    std::fprintf(stderr, "[eval] quantizing %s ...\n", spec.label.c_str());
    const Clock::time_point start = Clock::now();
    const offline::Calibration* calibration = nullptr;
    if (spec.importance) {
      BITSPLIT_ASSIGN_OR_RETURN(calibration, CalibrationFor(spec.quantization.rotation));
    }
    offline::SplitQuantizeOptions quantize_options;
    quantize_options.quantization = spec.quantization;
    quantize_options.num_threads = options_.threads;
    auto summary =
        offline::QuantizeSplitModel(options_.model_path, created->base_path, created->residual_path,
                                    quantize_options, calibration);
    if (!summary.ok()) {
      return absl::Status(summary.status().code(), absl::StrFormat("quantizing %s: %s", spec.label,
                                                                   summary.status().message()));
    }
    created->seconds = SecondsSince(start);
    auto loaded =
        model::LlamaModel::LoadSplit(created->base_path, created->residual_path, options_.threads);
    if (!loaded.ok()) return loaded.status();
    created->model = std::move(*loaded);
    std::fprintf(stderr, "[eval] quantized %s in %.1f s\n", spec.label.c_str(), created->seconds);
    return created;
  }

  // One calibration per rotation (importance lives in the rotated space), collected once.
  absl::StatusOr<const offline::Calibration*> CalibrationFor(
      const model::HadamardRotation& rotation) {
    const std::string key = absl::StrFormat("%d/%d", rotation.block, rotation.seed);
    auto it = calibrations_.find(key);
    if (it == calibrations_.end()) {
      auto collected = offline::CalibrateFromTextFile(
          options_.model_path, options_.calibration_path, rotation, options_.calibration_tokens,
          options_.window, options_.threads);
      if (!collected.ok()) return collected.status();
      it = calibrations_.emplace(key, std::move(*collected)).first;
    }
    return &it->second;
  }

  const EvalCommandOptions& options_;
  const Source& source_;
  const model::ModelConfig& config_;
  const std::filesystem::path& work_dir_;
  ThreadPool& pool_;
  std::vector<std::unique_ptr<SplitJob>> jobs_;
  std::vector<std::unique_ptr<model::LlamaModel>> gguf_models_;
  std::vector<std::unique_ptr<model::LlamaModel>> split_file_models_;
  std::map<std::string, offline::Calibration> calibrations_;
};

// The logits source of every row, in row order: its model in its forward mode, or with the
// output head of its head model.
struct RowSources {
  std::vector<std::unique_ptr<HeadSwapBackend>> head_swaps;
  std::vector<std::unique_ptr<offline::LogitsSource>> sources;
  std::vector<offline::LogitsSource*> pointers;
};

RowSources MakeRowSources(const std::vector<Row>& rows) {
  RowSources out;
  for (const Row& row : rows) {
    model::LlamaModel* m = row.model;
    const model::ForwardMode mode = row.forward_mode;
    if (row.head_model != nullptr) {
      out.head_swaps.push_back(std::make_unique<HeadSwapBackend>(
          m->backend(mode), row.head_model->backend(model::ForwardMode::kDraft)));
      HeadSwapBackend* swap = out.head_swaps.back().get();
      out.sources.push_back(std::make_unique<offline::ForwardLogitsSource>(
          m->config(),
          [m, swap](const model::Batch& batch, model::KvCache& cache, std::span<float> logits) {
            return m->ForwardWith(*swap, batch, cache, logits);
          }));
      out.pointers.push_back(out.sources.back().get());
      continue;
    }
    out.sources.push_back(std::make_unique<offline::ForwardLogitsSource>(
        m->config(),
        [m, mode](const model::Batch& batch, model::KvCache& cache, std::span<float> logits) {
          return m->Forward(batch, cache, logits, mode);
        }));
    out.pointers.push_back(out.sources.back().get());
  }
  return out;
}

void PrintProgress(int64_t done, int64_t total, double seconds) {
  std::fprintf(stderr, "[eval] window %lld/%lld, %.0f s elapsed, ~%.0f s left\n",
               static_cast<long long>(done), static_cast<long long>(total), seconds,
               seconds / static_cast<double>(done) * static_cast<double>(total - done));
}

void PrintTimes(const std::vector<Row>& rows, const offline::EvalReport& report,
                double eval_seconds) {
  std::fprintf(stderr, "[eval] evaluation %.1f s (reference forward %.1f s)\n", eval_seconds,
               report.reference_forward_seconds);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::fprintf(stderr, "[eval]   %-36s quantize %6.1f s, forward %6.1f s, stats %5.1f s\n",
                 rows[i].spec.label.c_str(), rows[i].quantize_seconds,
                 report.configs[i].forward_seconds, report.configs[i].stats_seconds);
  }
}

nlohmann::json RowJson(const Row& row, const offline::EvalResult& result) {
  nlohmann::json c;
  c["label"] = row.spec.label;
  c["mode"] = row.mode;
  c["files"] = row.files;
  if (row.spec.kind == offline::EvalConfigSpec::Kind::kSplit) {
    c["quantization"] = model::SplitQuantizationToJson(row.spec.quantization);
    c["importance"] = row.spec.importance;
  } else if (row.spec.kind == offline::EvalConfigSpec::Kind::kSplitFiles) {
    c["quantization"] = model::SplitQuantizationToJson(row.model->split_files()->quantization());
  }
  c["aligned_with_source_grid"] = AlignmentLabel(row);
  if (row.has_weight_stats) {
    c["weights"] = {{"count", row.weights.weights},
                    {"gpu_bytes_per_weight", row.weights.gpu_bytes_per_weight},
                    {"ram_bytes_per_weight", row.weights.ram_bytes_per_weight},
                    {"relative_error", row.weights.relative_error},
                    {"exact_fraction", row.weights.exact_fraction},
                    {"layers",
                     {{"count", row.weights.layers.weights},
                      {"relative_error", row.weights.layers.relative_error},
                      {"exact_fraction", row.weights.layers.exact_fraction}}},
                    {"head",
                     {{"count", row.weights.head.weights},
                      {"relative_error", row.weights.head.relative_error},
                      {"exact_fraction", row.weights.head.exact_fraction}}}};
  }
  c["summary"] = SummaryJson(result.summary);
  c["quantize_seconds"] = row.quantize_seconds;
  c["forward_seconds"] = result.forward_seconds;
  c["stats_seconds"] = result.stats_seconds;
  return c;
}

// --json: the run's inputs, the reference and every row.
int WriteJson(const EvalCommandOptions& options, const EvalText& eval_text, int threads,
              const offline::EvalReport& report, double eval_seconds,
              const std::vector<Row>& rows) {
  nlohmann::json json;
  json["model"] = options.model_path;
  json["text"] = options.text_path;
  json["text_bytes"] = eval_text.bytes.size();
  json["text_tokens"] = eval_text.tokens.size();
  json["window"] = options.window;
  json["max_tokens"] = options.max_tokens;
  json["windows"] = report.windows;
  json["tokens_evaluated"] = report.tokens_evaluated;
  json["threads"] = threads;
  json["reference"] = {{"engine", "reference (source GGUF dequantized, f32 activations)"},
                       {"summary", SummaryJson(report.reference)},
                       {"forward_seconds", report.reference_forward_seconds}};
  json["eval_seconds"] = eval_seconds;
  nlohmann::json configs = nlohmann::json::array();
  for (size_t i = 0; i < rows.size(); ++i) configs.push_back(RowJson(rows[i], report.configs[i]));
  json["configs"] = std::move(configs);
  std::ofstream out(*options.json_path);
  out << json.dump(2) << "\n";
  if (!out) return Fail(kExitFailure, "cannot write " + *options.json_path);
  return kExitOk;
}

int RunEval(const EvalCommandOptions& options) {
  std::vector<offline::EvalConfigSpec> specs;
  if (int code = CheckOptions(options, &specs); code != kExitOk) return code;

  const Clock::time_point load_start = Clock::now();
  Source source;
  if (int code = LoadSource(options, &source); code != kExitOk) return code;
  const model::ModelConfig& config = source.reference->config();
  const int threads = source.reference->num_threads();
  ThreadPool pool(threads);
  if (int code = CheckSplitConfigs(specs, config); code != kExitOk) return code;

  offline::EvalOptions eval_options;
  eval_options.window = options.window;
  eval_options.max_tokens = options.max_tokens;
  eval_options.num_threads = threads;
  EvalText eval_text;
  if (int code = ReadEvalText(options, *source.file, eval_options, &eval_text); code != kExitOk) {
    return code;
  }

  WorkDir work_dir;
  if (int code = MakeWorkDir(options, &work_dir); code != kExitOk) return code;
  RowBuilder builder(options, source, work_dir.dir, pool);
  std::vector<Row> rows;
  if (int code = builder.BuildRows(specs, &rows); code != kExitOk) return code;
  spdlog::debug("setup took {:.1f} s", SecondsSince(load_start));

  offline::LlamaLogitsSource reference_source(source.reference.get());
  const RowSources sources = MakeRowSources(rows);
  eval_options.progress = PrintProgress;
  const Clock::time_point eval_start = Clock::now();
  auto report =
      offline::Evaluate(reference_source, sources.pointers, eval_text.tokens, eval_options);
  if (!report.ok()) return Fail(kExitFailure, report.status().message());
  const double eval_seconds = SecondsSince(eval_start);

  PrintTable(rows, *report, options.model_path);
  PrintTimes(rows, *report, eval_seconds);
  if (options.json_path) return WriteJson(options, eval_text, threads, *report, eval_seconds, rows);
  return kExitOk;
}

}  // namespace

Command AddEvalCommand(CLI::App& app) {
  auto options = std::make_shared<EvalCommandOptions>();
  CLI::App* sub = app.add_subcommand(
      "eval", "KL / top-1 / perplexity of quantized configurations against the source GGUF");
  sub->add_option("--model,-m", options->model_path, "source GGUF model (the reference)")
      ->required()
      ->check(CLI::ExistingFile);
  sub->add_option("--text", options->text_path, "evaluation text (UTF-8)")
      ->required()
      ->check(CLI::ExistingFile);
  sub->add_option("--configs", options->configs,
                  "comma-separated configurations: ref, q8_0, gguf:PATH, bN, bN+rM with "
                  ":gK :bgK :rgK :sym :asym :rot :rotK :norot :imp :noimp")
      ->capture_default_str();
  sub->add_option("--json", options->json_path, "write every row as JSON here");
  sub->add_option("--window", options->window, "tokens per window (each from an empty cache)")
      ->capture_default_str();
  sub->add_option("--max-tokens", options->max_tokens, "use at most this many tokens (0 = all)")
      ->capture_default_str();
  sub->add_option("--threads,-t", options->threads, "worker threads (0 = all cores)")
      ->capture_default_str();
  sub->add_option("--work-dir", options->work_dir,
                  "where quantized models go (default: a temporary directory, removed after)");
  sub->add_flag("--keep-work-dir", options->keep_work_dir, "keep the temporary work directory");
  sub->add_option("--calibration", options->calibration_path,
                  "calibration text for :imp configurations (must differ from --text)")
      ->check(CLI::ExistingFile);
  sub->add_option("--calibration-tokens", options->calibration_tokens,
                  "calibration tokens for :imp configurations")
      ->capture_default_str();
  sub->add_option("--default-base-group", options->defaults.base_group,
                  "base group when a spec gives none")
      ->capture_default_str();
  sub->add_option("--default-residual-group", options->defaults.residual_group,
                  "residual group when a spec gives none")
      ->capture_default_str();
  sub->add_option("--default-rotation", options->defaults.rotation_block,
                  "Hadamard block when a spec gives none (0 = off)")
      ->capture_default_str();
  return {sub, [options] { return RunEval(*options); }};
}

}  // namespace bitsplit::cli
