#include "common/offline/plan_check.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <span>
#include <system_error>

#include "absl/strings/str_format.h"
#include "common/model/kv_cache.h"
#include "common/model/linear_backend.h"
#include "common/model/llama_model.h"
#include "common/offline/eval.h"
#include "common/quant/split_format.h"
#include "common/util/status_macros.h"

namespace bitsplit::offline {
namespace {

// Logits of `model` in `mode` over one window from an empty cache.
absl::StatusOr<std::vector<float>> WindowLogits(model::LlamaModel& model, model::ForwardMode mode,
                                                const std::vector<int32_t>& tokens) {
  ForwardLogitsSource source(
      model.config(),
      [&model, mode](const model::Batch& batch, model::KvCache& cache, std::span<float> logits) {
        return model.Forward(batch, cache, logits, mode);
      });
  std::vector<float> logits;
  BITSPLIT_RETURN_IF_ERROR(source.WindowLogits(tokens, &logits));
  return logits;
}

// Quantizes `q` into the scratch files and returns the mean KL(reference || its verifier)
// (base-only model: its base's) over the calibration window, given the reference's logits
// there; the files are removed.
absl::StatusOr<double> MeasuredWindowKl(const PlanCheckOptions& options,
                                        std::span<const float> reference_logits,
                                        const model::SplitQuantization& q,
                                        const Calibration& calibration) {
  const std::string base = model::SplitBasePath(options.scratch_prefix);
  const std::string residual =
      q.residual_format ? model::SplitResidualPath(options.scratch_prefix) : "";
  const bool calibrated = q.base_format != quant::SplitFormat::kQ8_0;
  BITSPLIT_RETURN_IF_ERROR(QuantizeSplitModel(options.source_path, base, residual,
                                              {.quantization = q, .num_threads = options.threads},
                                              calibrated ? &calibration : nullptr)
                               .status());
  absl::StatusOr<double> kl = [&]() -> absl::StatusOr<double> {
    BITSPLIT_ASSIGN_OR_RETURN(std::unique_ptr<model::LlamaModel> model,
                              model::LlamaModel::LoadSplit(base, residual, options.threads));
    BITSPLIT_ASSIGN_OR_RETURN(
        const std::vector<float> logits,
        WindowLogits(*model,
                     residual.empty() ? model::ForwardMode::kDraft : model::ForwardMode::kVerify,
                     calibration.first_window));
    return MeanKlDivergence(reference_logits, logits, model->config().vocab_size);
  }();
  std::error_code ignored;
  std::filesystem::remove(base, ignored);
  if (!residual.empty()) std::filesystem::remove(residual, ignored);
  return kl;
}

bool SameChoices(const BitPlan& a, const BitPlan& b) {
  return std::equal(a.choices.begin(), a.choices.end(), b.choices.begin(), b.choices.end(),
                    [](const BitPlan::Choice& x, const BitPlan::Choice& y) {
                      return x.base == y.base && x.residual == y.residual;
                    });
}

}  // namespace

uint64_t Q8_0LinearBytes(const model::ModelConfig& config) {
  uint64_t bytes = 0;
  for (const model::LinearGroupId id : model::AllLinearGroups(config)) {
    const int64_t cols = model::LinearGroupInputDim(config, id);
    for (const int64_t rows : model::LinearGroupOutputDims(config, id)) {
      bytes +=
          static_cast<uint64_t>(rows) * quant::SplitRowBytes(quant::SplitFormat::kQ8_0, 32, cols);
    }
  }
  return bytes;
}

absl::StatusOr<uint64_t> BudgetForBaseShare(const model::VramRequest& vram, double percent) {
  BITSPLIT_ASSIGN_OR_RETURN(const uint64_t total, model::VramTotalBytes(vram));
  BITSPLIT_ASSIGN_OR_RETURN(const model::VramPlan plan, model::PlanVram(vram, total));
  return total - plan.base_weights_bytes +
         static_cast<uint64_t>(percent / 100 * static_cast<double>(Q8_0LinearBytes(vram.config)));
}

absl::StatusOr<PlanCheck> CheckBitPlan(const PlanCheckOptions& options,
                                       const BitCandidates& candidates,
                                       const model::SplitQuantization& quantization,
                                       const Calibration& calibration,
                                       const std::vector<GroupSensitivity>& groups,
                                       AllocationRequest& checked) {
  if (options.rounds < 1) return absl::InvalidArgumentError("a plan check needs a round at least");
  std::vector<float> reference_logits;
  {
    BITSPLIT_ASSIGN_OR_RETURN(std::unique_ptr<model::LlamaModel> reference,
                              model::LlamaModel::Load(options.source_path, options.threads));
    BITSPLIT_ASSIGN_OR_RETURN(
        reference_logits,
        WindowLogits(*reference, model::ForwardMode::kReference, calibration.first_window));
  }
  model::SplitQuantization q8_0;
  q8_0.base_format = quant::SplitFormat::kQ8_0;
  q8_0.base_group = 32;
  q8_0.residual_format.reset();
  q8_0.residual_group = 0;
  PlanCheck check;
  BITSPLIT_ASSIGN_OR_RETURN(check.q8_0_kl,
                            MeasuredWindowKl(options, reference_logits, q8_0, calibration));
  const double factor = checked.error_factor;
  check.target_kl = factor * check.q8_0_kl;
  const double target = check.target_kl;
  std::vector<BitPlan> plans;
  std::vector<BoundTrial> trials;
  size_t best = 0;
  auto better = [&](size_t i) {
    const bool met = trials[i].measured_kl <= target;
    const bool best_met = trials[best].measured_kl <= target;
    if (met != best_met) return met;
    return met ? plans[i].seconds_per_token() < plans[best].seconds_per_token()
               : trials[i].measured_kl < trials[best].measured_kl;
  };
  for (int round = 1; round <= options.rounds; ++round) {
    BITSPLIT_ASSIGN_OR_RETURN(BitPlan plan, AllocateBits(groups, candidates, checked));
    // A bound that changes no choice has been measured already.
    const auto seen = std::find_if(plans.begin(), plans.end(),
                                   [&](const BitPlan& p) { return SameChoices(p, plan); });
    double kl = 0;
    if (seen != plans.end()) {
      kl = trials[static_cast<size_t>(seen - plans.begin())].measured_kl;
    } else {
      const model::SplitQuantization q = ApplyBitPlan(groups, candidates, plan, quantization);
      BITSPLIT_ASSIGN_OR_RETURN(kl, MeasuredWindowKl(options, reference_logits, q, calibration));
    }
    if (options.report) {
      options.report(absl::StrFormat(
          "check %d/%d: verifier KL %.3g on the calibration window (%d tokens)%s, target %.3g = "
          "%.3g x Q8_0's %.3g; predicted %.3g, bound %.3g x Q8_0's predicted",
          round, options.rounds, kl, calibration.first_window.size(),
          seen != plans.end() ? " (a plan measured before)" : "", target, factor, check.q8_0_kl,
          plan.verify_error, checked.error_factor));
    }
    plans.push_back(std::move(plan));
    trials.push_back({.error_factor = checked.error_factor, .measured_kl = kl});
    if (better(trials.size() - 1)) best = trials.size() - 1;
    if (kl <= target && kl >= kKlCloseEnough * target) break;
    checked.error_factor = NextErrorFactor(trials, target);
  }
  checked.error_factor = trials[best].error_factor;
  check.measured_kl = trials[best].measured_kl;
  check.plan = std::move(plans[best]);
  return check;
}

}  // namespace bitsplit::offline
