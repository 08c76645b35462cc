// `bitsplit quantize`: GGUF -> split model (PREFIX.base.bsplit + PREFIX.residual.bsplit).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/model/config.h"
#include "common/model/kv_cache.h"
#include "common/model/llama_model.h"
#include "common/model/split_model.h"
#include "common/model/vram_plan.h"
#include "common/model/weights.h"
#include "common/offline/bit_allocator.h"
#include "common/offline/calibration.h"
#include "common/offline/offload_plan.h"
#include "common/offline/plan_check.h"
#include "common/offline/split_quantizer.h"
#include "common/ops/kv_rows.h"
#include "common/quant/split_format.h"
#include "common/util/status_macros.h"
#include "tools/bitsplit/commands.h"

namespace bitsplit::cli {
namespace {

// Defaults, chosen by the quality study (docs/quality.md, ablation on SmolLM2): a 2-bit
// asymmetric base in groups of 64 (64 divides the widths of every llama model we know, SmolLM2's
// 576 included; group 32 would cost the draft +20% VRAM), an 8-bit residual in groups of 32
// (halving the residual group cut verify KL ~30% for +4% RAM bytes), and a Hadamard rotation of
// 64-wide blocks (verify KL -44%). Importance weighting stays opt-in (--calib): it helped verify
// by 8% but hurt the draft.
struct QuantizeOptions {
  std::string input_path;
  std::string output_prefix;
  int base_bits = 2;
  std::string base_format = "asym";
  int residual_bits = 8;
  int group = 64;
  int residual_group = 32;
  bool rotate = true;
  int rotate_block = 64;
  uint64_t seed = 1;
  std::optional<std::string> calibration_path;
  int calibration_window = 512;
  int threads = 0;
  // Bits by budget (common/offline/bit_allocator.h): set when --vram-budget is given.
  std::optional<std::string> vram_budget;
  std::string quality = "q8_0";
  int64_t plan_context = 2048;  // the drafter's --max-context default
  int64_t plan_sessions = 1;
  std::string plan_kv_type = "f16";  // the drafter's --kv-type default
  int64_t plan_batch_rows = 256;     // the drafter's --max-batch-rows default
  double ram_gbps = 60;
  double vram_gbps = 1000;
  std::optional<std::string> plan_json_path;
  int check_rounds = 4;
  bool bits_given = false;  // --base-bits or --residual-bits on the command line
};

int Fail(int code, std::string_view message) { return ReportError("quantize", code, message); }

// Bad input (arguments, files) versus a failure of the work itself.
int ExitCodeFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kResourceExhausted:  // a --vram-budget nothing fits
      return kExitBadInput;
    default:
      return kExitFailure;
  }
}

int FailWith(const absl::Status& status) {
  return Fail(ExitCodeFor(status),
              std::string_view(status.message().data(), status.message().size()));
}

absl::StatusOr<model::SplitQuantization> QuantizationFrom(const QuantizeOptions& options) {
  model::SplitQuantization q;
  if (options.base_format == "tern") {
    // Ternary codes (bt_sym): the format fixes the bits, so only the default --base-bits passes.
    if (options.base_bits != 2) {
      return absl::InvalidArgumentError(
          "--base-format tern is the ternary base (bt_sym, 1.75 bits of codes per weight): drop "
          "--base-bits");
    }
    q.base_format = quant::SplitFormat::kBTern;
  } else if (options.base_bits == 8) {
    if (options.base_format != "sym") {
      return absl::InvalidArgumentError(
          "--base-bits 8 is q8_0, which is symmetric: pass --base-format sym");
    }
    q.base_format = quant::SplitFormat::kQ8_0;
  } else {
    const std::string name = absl::StrFormat("b%d_%s", options.base_bits, options.base_format);
    auto format = quant::ParseSplitFormat(name);
    if (!format.ok()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--base-bits %d --base-format %s is not a base format", options.base_bits,
                          options.base_format));
    }
    q.base_format = *format;
  }
  q.base_group = options.group;
  if (options.residual_bits == 0) {
    q.residual_format = std::nullopt;
  } else {
    BITSPLIT_ASSIGN_OR_RETURN(q.residual_format,
                              quant::ResidualFormatOfBits(options.residual_bits));
  }
  q.residual_group = options.residual_group;
  if (options.rotate) q.rotation = {.block = options.rotate_block, .seed = options.seed};
  return q;
}

// Progress on stderr: percent of the source bytes, tensors done / total, MB/s, ETA. On a terminal
// one line redrawn in place (at most ten times a second); elsewhere (systemd, CI, nohup) a line
// each time another 5% is done, so a log shows a long run advancing.
class ProgressLine {
 public:
  ProgressLine() : terminal_(isatty(STDERR_FILENO) != 0) {}

  void Update(const offline::QuantizeProgress& p) {
    const bool done = p.tensors_done == p.tensors_total;
    const double percent = p.source_bytes_total > 0
                               ? 100.0 * static_cast<double>(p.source_bytes_done) /
                                     static_cast<double>(p.source_bytes_total)
                               : 100.0;
    if (terminal_) {
      if (!done && p.elapsed_seconds - last_seconds_ < 0.1) return;
    } else if (!done && percent < next_percent_) {
      return;
    }
    last_seconds_ = p.elapsed_seconds;
    next_percent_ = (std::floor(percent / kLogStepPercent) + 1) * kLogStepPercent;
    const double seconds = std::max(p.elapsed_seconds, 1e-9);
    const double rate = p.source_bytes_done / seconds;  // bytes per second
    const double eta =
        rate > 0 ? static_cast<double>(p.source_bytes_total - p.source_bytes_done) / rate : 0;
    std::fprintf(stderr, "%s[quantize] %3.0f%%  %lld/%lld tensors  %6.1f MB/s  ETA %4.0f s%s",
                 terminal_ ? "\r" : "", percent, static_cast<long long>(p.tensors_done),
                 static_cast<long long>(p.tensors_total), rate / 1e6, eta,
                 terminal_ && !done ? "   " : "\n");
    std::fflush(stderr);
  }

 private:
  static constexpr double kLogStepPercent = 5;
  bool terminal_;
  double last_seconds_ = -1;
  double next_percent_ = 0;
};

std::string Counts(const std::map<std::string, int>& counts) {
  return absl::StrJoin(counts, ", ", [](std::string* out, const auto& entry) {
    absl::StrAppend(out, entry.first, ": ", entry.second);
  });
}

// --quality: "q8_0" (every group's verifier error at most its Q8_0 error) or "q8_0*F" (F times
// that); the factor.
absl::StatusOr<double> QualityFactor(const std::string& text) {
  if (text == "q8_0") return 1.0;
  double factor = 0;
  if (absl::StartsWith(text, "q8_0*") && absl::SimpleAtod(text.substr(5), &factor) && factor > 0 &&
      std::isfinite(factor)) {
    return factor;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--quality \"", text, "\" is neither q8_0 nor q8_0*F with a positive factor F"));
}

// --vram-budget: a size, or N%: the base weights get N% of the linear weights' Q8_0 bytes on top
// of what the rest of the plan (`vram` with uniform bases: constants, KV cache, scratch) needs.
absl::StatusOr<uint64_t> BudgetBytes(const std::string& text, const model::VramRequest& vram) {
  if (absl::EndsWith(text, "%")) {
    double percent = 0;
    if (absl::SimpleAtod(text.substr(0, text.size() - 1), &percent) && percent > 0 &&
        percent <= 1000) {
      return offline::BudgetForBaseShare(vram, percent);
    }
  } else if (absl::StatusOr<uint64_t> bytes = model::ParseBytes(text); bytes.ok()) {
    return *bytes;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--vram-budget \"", text,
      "\" is neither a size (BYTES, or N KiB/MiB/GiB) nor N% (of the linear weights' Q8_0 bytes, "
      "for the base weights)"));
}

// --plan-kv-type: a type the device's KV cache holds.
absl::StatusOr<ops::KvType> PlanKvType(const std::string& text) {
  absl::StatusOr<ops::KvType> type = ops::ParseKvType(text);
  if (!type.ok() || *type == ops::KvType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat("--plan-kv-type \"", text, "\" is neither f16 nor q8_0"));
  }
  return type;
}

// What --vram-budget plans with: the source's weights, the candidates and the request, checked
// (an impossible budget refused) before the slow calibration and measurement.
struct BudgetPlanning {
  std::unique_ptr<gguf::File> source;
  model::ModelConfig config;
  model::ModelWeights weights;
  offline::BitCandidates candidates;
  offline::AllocationRequest request;
};

absl::StatusOr<std::unique_ptr<BudgetPlanning>> PrepareBudget(
    const QuantizeOptions& options, const model::SplitQuantization& quantization) {
  auto planning = std::make_unique<BudgetPlanning>();
  BITSPLIT_ASSIGN_OR_RETURN(planning->source, gguf::File::Open(options.input_path));
  BITSPLIT_ASSIGN_OR_RETURN(planning->config, model::ModelConfigFromGguf(*planning->source));
  BITSPLIT_ASSIGN_OR_RETURN(planning->weights,
                            model::ModelWeightsFromGguf(*planning->source, planning->config));
  offline::BitCandidates& candidates = planning->candidates;
  offline::AllocationRequest& request = planning->request;
  if (options.base_format == "sym") {
    candidates.bases = {quant::SplitFormat::kB2Sym, quant::SplitFormat::kB3Sym,
                        quant::SplitFormat::kB4Sym};
  } else if (options.base_format == "tern") {
    // Ternary below the default asymmetric ladder, with its own measured acceptance as the
    // prior's low point (the fewest-bits uniform base).
    candidates.bases = {quant::SplitFormat::kBTern, quant::SplitFormat::kB2Asym,
                        quant::SplitFormat::kB3Asym, quant::SplitFormat::kB4Asym};
    request.prior.low_bits_tau = offline::kTernaryTreeTau;
  }
  BITSPLIT_ASSIGN_OR_RETURN(request.error_factor, QualityFactor(options.quality));
  request.vram.config = planning->config;
  request.vram.base_format = candidates.bases.front();
  request.vram.base_group = quantization.base_group;
  // The allocator spends the whole budget on base bits, so the drafter keeps the embedding table
  // in RAM (model::PlacedEmbeddingBytes puts it on the device only where it costs nothing).
  request.vram.embedding_bytes = 0;
  request.vram.context = options.plan_context;
  request.vram.sessions = options.plan_sessions;
  BITSPLIT_ASSIGN_OR_RETURN(request.vram.kv_type, PlanKvType(options.plan_kv_type));
  request.vram.max_batch_rows = std::min(options.plan_batch_rows, options.plan_context);
  BITSPLIT_ASSIGN_OR_RETURN(request.budget_bytes, BudgetBytes(*options.vram_budget, request.vram));
  request.machine.ram_bytes_per_second = options.ram_gbps * 1e9;
  request.machine.vram_bytes_per_second = options.vram_gbps * 1e9;
  if (absl::StatusOr<model::VramPlan> smallest =
          model::PlanVram(request.vram, request.budget_bytes);
      !smallest.ok()) {
    return absl::Status(smallest.status().code(),
                        absl::StrCat("even the fewest base bits (every linear weight ",
                                     model::SplitFormatName(candidates.bases.front()),
                                     ") do not fit: ", smallest.status().message()));
  }
  return planning;
}

// Chooses per linear group the base and residual formats for --vram-budget and prints the plan.
absl::StatusOr<model::SplitQuantization> PlanBits(const QuantizeOptions& options,
                                                  const BudgetPlanning& planning,
                                                  model::SplitQuantization quantization,
                                                  const offline::Calibration* calibration) {
  const model::ModelConfig& config = planning.config;
  const model::ModelWeights& weights = planning.weights;
  const offline::BitCandidates& candidates = planning.candidates;
  const offline::AllocationRequest& request = planning.request;
  std::fprintf(stderr,
               "[quantize] budget %s: measuring every linear group at %zu bases x %zu "
               "residuals, weighted by the calibration activations\n",
               model::FormatBytes(request.budget_bytes).c_str(), candidates.bases.size(),
               candidates.residuals.size());
  const auto start = std::chrono::steady_clock::now();
  const bool tty = isatty(STDERR_FILENO) != 0;
  BITSPLIT_ASSIGN_OR_RETURN(
      std::vector<offline::GroupSensitivity> groups,
      offline::MeasureSensitivities(
          weights, config, quantization, candidates, calibration, options.threads,
          [&](int64_t done, int64_t total) {
            if (!tty) return;
            const double seconds =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            std::fprintf(stderr, "\r[quantize] measured %lld/%lld groups  ETA %4.0f s   ",
                         static_cast<long long>(done), static_cast<long long>(total),
                         seconds / static_cast<double>(done) * static_cast<double>(total - done));
            if (done == total) std::fputc('\n', stderr);
            std::fflush(stderr);
          }));
  std::fprintf(stderr, "[quantize] measuring the KL each matrix kind's error causes\n");
  {
    BITSPLIT_ASSIGN_OR_RETURN(std::unique_ptr<model::LlamaModel> reference,
                              model::LlamaModel::Load(options.input_path, options.threads));
    BITSPLIT_RETURN_IF_ERROR(offline::MeasureKlSensitivities(*reference, *calibration, groups));
  }
  BITSPLIT_ASSIGN_OR_RETURN(offline::BitPlan plan,
                            offline::AllocateBits(groups, candidates, request));
  offline::AllocationRequest checked = request;
  if (options.check_rounds > 0) {
    BITSPLIT_ASSIGN_OR_RETURN(
        const offline::PlanCheck check,
        offline::CheckBitPlan({.source_path = options.input_path,
                               .scratch_prefix = options.output_prefix + ".check",
                               .rounds = options.check_rounds,
                               .threads = options.threads,
                               .report =
                                   [](const std::string& line) {
                                     std::fprintf(stderr, "[quantize] %s\n", line.c_str());
                                   }},
                              candidates, quantization, *calibration, groups, checked));
    std::printf("measured: verifier KL %.3g on the calibration window, %.3f x Q8_0's %.3g%s\n",
                check.measured_kl, check.measured_kl / check.q8_0_kl, check.q8_0_kl,
                check.met() ? "" : ": MISSED --quality after --check-rounds plans");
    plan = check.plan;
  }
  std::printf("%s", offline::BitPlanReport(groups, candidates, plan, checked).c_str());
  if (options.plan_json_path) {
    std::ofstream out(*options.plan_json_path);
    out << offline::BitPlanJson(groups, candidates, plan, checked).dump(1) << "\n";
    if (!out) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot write --plan-json ", *options.plan_json_path));
    }
  }
  return offline::ApplyBitPlan(groups, candidates, plan, std::move(quantization));
}

int RunQuantize(const QuantizeOptions& options) {
  if (options.vram_budget && !options.calibration_path) {
    return Fail(kExitBadInput,
                "--vram-budget measures what each tensor's error costs on calibration text: pass "
                "--calib FILE");
  }
  if (options.vram_budget && options.bits_given) {
    return Fail(kExitBadInput,
                "--vram-budget chooses the base and residual bits per tensor: drop --base-bits and "
                "--residual-bits (they are for uniform models)");
  }
  auto quantization = QuantizationFrom(options);
  if (!quantization.ok()) return FailWith(quantization.status());
  // Check the knobs against the model before the (slower) calibration pass.
  {
    auto source = gguf::File::Open(options.input_path);
    if (!source.ok()) return FailWith(source.status());
    auto config = model::ModelConfigFromGguf(**source);
    if (!config.ok()) return FailWith(config.status());
    if (auto status = offline::ValidateSplitQuantization(*quantization, *config); !status.ok()) {
      return FailWith(status);
    }
  }
  std::optional<absl::StatusOr<std::unique_ptr<BudgetPlanning>>> budget;
  if (options.vram_budget) {
    budget = PrepareBudget(options, *quantization);
    if (!budget->ok()) return FailWith(budget->status());
  }
  std::optional<offline::Calibration> calibration;
  if (options.calibration_path) {
    std::fprintf(stderr, "[quantize] calibrating on %s\n", options.calibration_path->c_str());
    auto collected = offline::CalibrateFromTextFile(
        options.input_path, *options.calibration_path, quantization->rotation,
        /*max_tokens=*/0, options.calibration_window, options.threads);
    if (!collected.ok()) return FailWith(collected.status());
    calibration = std::move(*collected);
  }
  if (budget) {
    auto planned = PlanBits(options, ***budget, *quantization, &*calibration);
    if (!planned.ok()) return FailWith(planned.status());
    quantization = std::move(*planned);
  }

  ProgressLine progress;
  const offline::SplitQuantizeOptions quantize_options{.quantization = *quantization,
                                                       .num_threads = options.threads};
  auto summary = offline::QuantizeSplitModel(
      options.input_path, model::SplitBasePath(options.output_prefix),
      quantization->residual_format ? model::SplitResidualPath(options.output_prefix) : "",
      quantize_options, calibration ? &*calibration : nullptr,
      [&progress](const offline::QuantizeProgress& p) { progress.Update(p); });
  if (!summary.ok()) return FailWith(summary.status());

  const offline::QuantizeSummary& s = *summary;
  std::printf("quantization: %s\n", model::SplitQuantizationString(s.quantization).c_str());
  std::printf("fingerprint:  %s\n", SplitFingerprintToHex(s.fingerprint).c_str());
  std::printf(
      "VRAM (base):  %s  %.1f MB, %.3f bits/weight over %lld parameters (linear weights "
      "%.3f bits/weight)\n",
      s.base_path.c_str(), s.base_file_bytes / 1e6, s.base_bits_per_weight(),
      static_cast<long long>(s.source_parameters), s.base_linear_bits_per_weight());
  if (!s.residual_path.empty()) {
    std::printf("RAM (residual): %s  %.1f MB, %.3f bits/weight over %lld linear weights\n",
                s.residual_path.c_str(), s.residual_file_bytes / 1e6, s.residual_bits_per_weight(),
                static_cast<long long>(s.linear_parameters));
  } else {
    std::printf("RAM (residual): none (base only)\n");
  }
  std::printf("tensors:      base {%s}", Counts(s.base_format_counts).c_str());
  if (!s.residual_format_counts.empty()) {
    std::printf(", residual {%s}", Counts(s.residual_format_counts).c_str());
  }
  std::printf("\ntime:         %.1f s\n", s.seconds);
  return kExitOk;
}

}  // namespace

Command AddQuantizeCommand(CLI::App& app) {
  auto options = std::make_shared<QuantizeOptions>();
  CLI::App* sub = app.add_subcommand(
      "quantize", "split a GGUF model into a low-bit base file and a residual file");
  sub->add_option("input", options->input_path,
                  absl::StrCat("source GGUF model (", model::SupportedArchitectures(), ")"))
      ->required()
      ->check(CLI::ExistingFile);
  sub->add_option("-o,--output", options->output_prefix,
                  "output prefix: writes PREFIX.base.bsplit and PREFIX.residual.bsplit")
      ->required();
  CLI::Option* base_bits =
      sub->add_option("--base-bits", options->base_bits, "base bits: 2, 3, 4, or 8 (= q8_0)")
          ->check(CLI::IsMember({2, 3, 4, 8}))
          ->capture_default_str();
  sub->add_option("--base-format", options->base_format,
                  "base grid: sym, asym, or tern (the ternary base bt_sym: codes -1/0/+1 times a "
                  "scale, 2.0 bits per weight at group 64; takes no --base-bits). With "
                  "--vram-budget, the family the allocator chooses among (tern: bt_sym, then "
                  "b2..b4 asym)")
      ->check(CLI::IsMember({"sym", "asym", "tern"}))
      ->capture_default_str();
  CLI::Option* residual_bits =
      sub->add_option("--residual-bits", options->residual_bits,
                      "residual bits: 3, 4, 5, 6, 8, or 0 (base only, e.g. for q8_0)")
          ->check(CLI::IsMember({0, 3, 4, 5, 6, 8}))
          ->capture_default_str();
  sub->add_option("--group", options->group,
                  "base quantization group (a multiple of 32 dividing every input width)")
      ->capture_default_str();
  sub->add_option("--residual-group", options->residual_group,
                  "residual quantization group (a multiple of 32 dividing every input width)")
      ->capture_default_str();
  sub->add_flag("--rotate,!--no-rotate", options->rotate,
                "block Hadamard rotation of every linear layer's input dimension")
      ->capture_default_str();
  sub->add_option("--rotate-block", options->rotate_block,
                  "rotation block: a power of two in [8, 1024] dividing every input width")
      ->capture_default_str();
  sub->add_option("--seed", options->seed, "seed of the rotation's random signs")
      ->capture_default_str();
  sub->add_option("--calib", options->calibration_path,
                  "text file: weight the base fit by the model's activations on it")
      ->check(CLI::ExistingFile);
  sub->add_option("--calib-window", options->calibration_window,
                  "tokens per calibration forward pass")
      ->capture_default_str();
  sub->add_option("--threads,-t", options->threads, "worker threads (0 = all cores)")
      ->capture_default_str();
  sub->add_option("--vram-budget", options->vram_budget,
                  "choose base and residual bits per linear group so that the CUDA drafter's "
                  "VRAM plan fits SIZE (BYTES or N KiB/MiB/GiB), or so that the base weights take "
                  "N% of the linear weights' Q8_0 bytes beside the plan's KV cache, scratch and "
                  "tables; --calib weighs the measured errors by the model's activations");
  sub->add_option("--quality", options->quality,
                  "with --vram-budget: q8_0 (every group's base + residual error at most its "
                  "Q8_0 error) or q8_0*F (F times that)")
      ->capture_default_str();
  sub->add_option("--plan-context", options->plan_context,
                  "with --vram-budget: tokens per session the VRAM plan holds (drafter "
                  "--max-context)")
      ->capture_default_str();
  sub->add_option("--plan-sessions", options->plan_sessions,
                  "with --vram-budget: KV caches the VRAM plan holds")
      ->capture_default_str();
  sub->add_option("--plan-kv-type", options->plan_kv_type,
                  "with --vram-budget: the KV cache's rows, f16 or q8_0 (drafter --kv-type)")
      ->capture_default_str();
  sub->add_option("--plan-batch-rows", options->plan_batch_rows,
                  "with --vram-budget: rows of the largest forward (drafter --max-batch-rows)")
      ->capture_default_str();
  sub->add_option("--ram-gbps", options->ram_gbps,
                  "with --vram-budget: RAM bandwidth of the projection, GB/s")
      ->capture_default_str();
  sub->add_option("--vram-gbps", options->vram_gbps,
                  "with --vram-budget: VRAM bandwidth of the projection, GB/s")
      ->capture_default_str();
  sub->add_option("--check-rounds", options->check_rounds,
                  "with --vram-budget: plans quantized and measured on the calibration window "
                  "in the search for the cheapest whose verifier's KL meets --quality (0: trust "
                  "the prediction)")
      ->capture_default_str();
  sub->add_option("--plan-json", options->plan_json_path,
                  "with --vram-budget: write the measured sensitivities and the plan here");
  return {sub, [options, base_bits, residual_bits] {
            QuantizeOptions run = *options;
            run.bits_given = base_bits->count() > 0 || residual_bits->count() > 0;
            return RunQuantize(run);
          }};
}

}  // namespace bitsplit::cli
