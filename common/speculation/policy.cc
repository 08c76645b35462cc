#include "common/speculation/policy.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/model/config.h"
#include "common/util/status_macros.h"

namespace bitsplit::speculation {
namespace {

// Verify measurements older than ~this many fade out of the cost line fit.
constexpr double kFitWindow = 64.0;

bool IsOff(const TreeShape& shape) { return shape.nodes == 0; }

TreeShape OffShape() { return TreeShape{0, 1, 1}; }

bool SameShape(const TreeShape& a, const TreeShape& b) {
  if (IsOff(a) || IsOff(b)) return IsOff(a) && IsOff(b);
  return a.nodes == b.nodes && a.expansions == b.expansions && a.max_depth == b.max_depth;
}

int32_t CeilDiv(int32_t a, int32_t b) { return (a + b - 1) / b; }

// What a shape's trees look like before it ran: a chain reaches its node count (or the depth
// cap); a best-first tree that keeps k children per expanded node and expands k frontier nodes
// per forward grows about one level per forward.
int32_t PriorDepth(const TreeShape& shape) {
  if (shape.expansions == 1) return std::min(shape.nodes, shape.max_depth);
  return std::clamp(CeilDiv(shape.nodes, shape.expansions), 1, shape.max_depth);
}
int32_t PriorForwards(const TreeShape& shape) {
  if (shape.expansions == 1) return std::min(shape.nodes, shape.max_depth);
  return CeilDiv(shape.nodes, shape.expansions);
}
int32_t PriorVerifiedNodes(const TreeShape& shape) {
  if (shape.expansions == 1) return std::min(shape.nodes, shape.max_depth) + 1;
  return shape.nodes + 1;
}

}  // namespace

std::string DescribeShape(const TreeShape& shape) {
  if (IsOff(shape)) return "off";
  return absl::StrFormat("tree N=%d k=%d depth<=%d", shape.nodes, shape.expansions,
                         shape.max_depth);
}

absl::Status ValidateStepMeasurement(const StepMeasurement& step) {
  const TreeShape& shape = step.shape;
  if (step.draft_ns < 0 || step.verify_ns < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "step times must be >= 0, got draft %d ns, verify %d ns", step.draft_ns, step.verify_ns));
  }
  if (step.batch_rows != 0 && step.batch_rows < step.verified_nodes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("batch rows must be 0 or at least the %d verified nodes, got %d",
                        step.verified_nodes, step.batch_rows));
  }
  if (IsOff(shape)) {
    if (step.verified_nodes != 1 || step.tree_depth != 0 || step.accepted_depth != 0 ||
        step.draft_forwards != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "an off step verifies the root alone: got %d verified nodes, tree depth %d, accepted "
          "depth %d, %d draft forwards",
          step.verified_nodes, step.tree_depth, step.accepted_depth, step.draft_forwards));
    }
    return absl::OkStatus();
  }
  BITSPLIT_RETURN_IF_ERROR(ValidateTreeShape(shape, shape.nodes));
  if (step.verified_nodes < 2 || step.verified_nodes > shape.nodes + 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("verified nodes must be in [2, %d] for %s, got %d", shape.nodes + 1,
                        DescribeShape(shape), step.verified_nodes));
  }
  const int32_t max_tree_depth = std::min(step.verified_nodes - 1, shape.max_depth);
  if (step.tree_depth < 1 || step.tree_depth > max_tree_depth) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tree depth must be in [1, %d], got %d", max_tree_depth, step.tree_depth));
  }
  if (step.accepted_depth < 0 || step.accepted_depth > step.tree_depth) {
    return absl::InvalidArgumentError(absl::StrFormat("accepted depth must be in [0, %d], got %d",
                                                      step.tree_depth, step.accepted_depth));
  }
  if (step.draft_forwards < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a speculative step needs draft forwards, got %d", step.draft_forwards));
  }
  return absl::OkStatus();
}

absl::StatusOr<AdaptivePolicy> AdaptivePolicy::Create(const Options& options) {
  if (options.max_nodes < 1 || options.max_depth < 1 || options.max_depth > 64) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_nodes must be >= 1 and max_depth in [1, 64], got %d and %d",
                        options.max_nodes, options.max_depth));
  }
  if (options.probe_interval < 1 || options.max_probe_interval < options.probe_interval) {
    return absl::InvalidArgumentError(
        absl::StrFormat("need 1 <= probe_interval <= max_probe_interval, got %d and %d",
                        options.probe_interval, options.max_probe_interval));
  }
  if (!(options.probe_budget > 0.0 && options.probe_budget < 1.0) || !(options.min_gain >= 1.0) ||
      !(options.cost_smoothing > 0.0 && options.cost_smoothing <= 1.0) ||
      !(options.acceptance_window >= 1.0) ||
      !(options.prior_acceptance >= 0.0 && options.prior_acceptance <= 1.0) ||
      !(options.prior_strength > 0.0) || options.num_experts < 0 || options.experts_used < 0 ||
      options.experts_used > options.num_experts ||
      (options.num_experts > 0 && options.experts_used < 1)) {
    return absl::InvalidArgumentError(
        "adaptive policy knobs out of range: need 0 < probe_budget < 1, min_gain >= 1, "
        "0 < cost_smoothing <= 1, acceptance_window >= 1, prior_acceptance in [0, 1], "
        "prior_strength > 0, 1 <= experts_used <= num_experts (or both 0)");
  }
  auto capped = [&](TreeShape shape) {
    shape.max_depth = std::min(shape.max_depth, options.max_depth);
    // A chain deeper than its depth cap is the shorter chain.
    if (shape.expansions == 1) shape.nodes = std::min(shape.nodes, shape.max_depth);
    return shape;
  };
  Options resolved = options;
  resolved.candidates.clear();
  for (const TreeShape& candidate : options.candidates) {
    if (candidate.nodes == 0) {
      return absl::InvalidArgumentError("off is always a candidate; do not list it (nodes = 0)");
    }
    BITSPLIT_RETURN_IF_ERROR(ValidateTreeShape(candidate, candidate.nodes));
    if (candidate.nodes > options.max_nodes) continue;
    const TreeShape shape = capped(candidate);
    const bool duplicate =
        std::any_of(resolved.candidates.begin(), resolved.candidates.end(),
                    [&](const TreeShape& other) { return SameShape(other, shape); });
    if (!duplicate) resolved.candidates.push_back(shape);
  }
  if (resolved.candidates.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("no speculative candidate shape has at most %d nodes", options.max_nodes));
  }
  if (options.probe.nodes == 0) {
    return absl::InvalidArgumentError("the probe shape must draft at least one node");
  }
  BITSPLIT_RETURN_IF_ERROR(ValidateTreeShape(options.probe, options.max_nodes));
  resolved.probe = capped(options.probe);
  return AdaptivePolicy(resolved);
}

AdaptivePolicy::ShapeKey AdaptivePolicy::KeyOf(const TreeShape& shape) {
  if (IsOff(shape)) return {0, 0, 0};
  return {shape.nodes, shape.expansions, shape.max_depth};
}

void AdaptivePolicy::Update(MovingAverage& average, double sample) const {
  if (!average.valid) {
    average = {sample, true};
    return;
  }
  average.value += options_.cost_smoothing * (sample - average.value);
}

AdaptivePolicy::DecayedRatio AdaptivePolicy::CountsAt(const AcceptanceCounts& counts,
                                                      int32_t depth) const {
  if (depth < 1 || depth > static_cast<int32_t>(counts.by_depth.size())) return {};
  const double fade = std::exp(-static_cast<double>(steps_recorded_ - counts.as_of_step) /
                               options_.acceptance_window);
  const DecayedRatio& ratio = counts.by_depth[depth - 1];
  return {ratio.successes * fade, ratio.trials * fade};
}

void AdaptivePolicy::UpdateAcceptance(AcceptanceCounts& counts, const StepMeasurement& step) const {
  const double fade = std::exp(-static_cast<double>(steps_recorded_ - counts.as_of_step) /
                               options_.acceptance_window);
  for (DecayedRatio& ratio : counts.by_depth) {
    ratio.successes *= fade;
    ratio.trials *= fade;
  }
  counts.as_of_step = steps_recorded_;
  if (static_cast<int32_t>(counts.by_depth.size()) < step.tree_depth) {
    counts.by_depth.resize(step.tree_depth);
  }
  // Depth d was tried iff every depth before it was accepted: d <= accepted_depth + 1.
  const int32_t tried = std::min(step.tree_depth, step.accepted_depth + 1);
  for (int32_t depth = 1; depth <= tried; ++depth) {
    counts.by_depth[depth - 1].trials += 1.0;
    if (depth <= step.accepted_depth) counts.by_depth[depth - 1].successes += 1.0;
  }
}

// The draft's first choice at depth d, from every step: a shape that keeps k children and
// accepted at depth d with rate a counts as first-choice rate 1 - (1 - a)^(1 / sqrt(k)) (the
// inverse of ShapeAcceptance's model), weighted by its trials.
std::vector<double> AdaptivePolicy::PooledChainAcceptance(int32_t depth) const {
  std::vector<double> acceptance(depth);
  double prior = options_.prior_acceptance;
  for (int32_t d = 1; d <= depth; ++d) {
    double weighted = 0.0, trials = 0.0;
    for (const auto& [expansions, pooled] : acceptance_by_expansions_) {
      const DecayedRatio counts = CountsAt(pooled, d);
      if (!(counts.trials > 0.0)) continue;
      const double rate = counts.successes / counts.trials;
      weighted += counts.trials *
                  (1.0 - std::pow(1.0 - rate, 1.0 / std::sqrt(static_cast<double>(expansions))));
      trials += counts.trials;
    }
    acceptance[d - 1] =
        (weighted + options_.prior_strength * prior) / (trials + options_.prior_strength);
    prior = acceptance[d - 1];  // an untried depth accepts like the one before it
  }
  return acceptance;
}

std::vector<double> AdaptivePolicy::ShapeAcceptance(const TreeShape& shape, const ShapeStats* stats,
                                                    int32_t depth) const {
  std::vector<double> acceptance = PooledChainAcceptance(depth);
  for (int32_t d = 1; d <= depth; ++d) {
    double prior = acceptance[d - 1];
    // k children of the accepted node are candidates for the target's choice at depth d, but
    // the draft's 2nd..k-th choices are accepted far less often than its first: as if sqrt(k)
    // independent tries (measured depth-1 acceptance, chain -> tree k = 4: SmolLM2 b2 0.25 ->
    // 0.49, b4 0.80 -> 0.97, gemma b2 0.50 -> 0.65; sqrt(k) predicts 0.44, 0.96, 0.75 and k
    // 0.68, 1.00, 0.94, which would try wide trees on drafts that cannot fill them).
    if (shape.expansions > 1) {
      prior = 1.0 - std::pow(1.0 - prior, std::sqrt(static_cast<double>(shape.expansions)));
    }
    const DecayedRatio counts = stats != nullptr ? CountsAt(stats->acceptance, d) : DecayedRatio{};
    acceptance[d - 1] = (counts.successes + options_.prior_strength * prior) /
                        (counts.trials + options_.prior_strength);
  }
  return acceptance;
}

bool AdaptivePolicy::CostsKnown() const {
  return !verify_by_batch_.empty() && draft_ns_per_forward_.valid;
}

double AdaptivePolicy::ExpertUnion(int32_t rows) const {
  return model::ExpectedDistinctExperts(options_.num_experts, options_.experts_used, rows);
}

std::optional<double> AdaptivePolicy::ExpertFit(int32_t rows) const {
  if (options_.num_experts == 0 || fit_weight_ <= 0.0) return std::nullopt;
  // Normal equations of y = a + b*x + c*u over the decayed sums, by Cramer's rule.
  const double m[3][3] = {
      {fit_weight_, fit_x_, fit_u_}, {fit_x_, fit_xx_, fit_xu_}, {fit_u_, fit_xu_, fit_uu_}};
  const double v[3] = {fit_y_, fit_xy_, fit_uy_};
  const auto det = [](const double a[3][3]) {
    return a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1]) -
           a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0]) +
           a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0]);
  };
  const double d = det(m);
  double scale = 0.0;  // of the determinant's terms, for a relative singularity test
  for (const auto& row : m) {
    for (double value : row) scale = std::max(scale, std::abs(value));
  }
  if (!(std::abs(d) > 1e-9 * scale * scale * scale)) return std::nullopt;
  double coefficients[3];
  for (int k = 0; k < 3; ++k) {
    double replaced[3][3];
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 3; ++j) replaced[i][j] = j == k ? v[i] : m[i][j];
    }
    coefficients[k] = det(replaced) / d;
  }
  if (coefficients[1] < 0.0 || coefficients[2] < 0.0) return std::nullopt;
  return coefficients[0] + coefficients[1] * rows + coefficients[2] * ExpertUnion(rows);
}

double AdaptivePolicy::PredictVerifyNs(int32_t batch) const {
  if (auto it = verify_by_batch_.find(batch); it != verify_by_batch_.end()) {
    return it->second.value;
  }
  // A larger batch never costs less than a smaller measured one.
  double floor = 0.0;
  double above = -1.0;  // the smallest measured size above `batch`
  for (const auto& [size, average] : verify_by_batch_) {
    if (size < batch) floor = std::max(floor, average.value);
    if (size > batch && above < 0.0) above = average.value;
  }
  if (const std::optional<double> fit = ExpertFit(batch); fit.has_value()) {
    return std::max(floor, *fit);
  }
  const double spread = fit_weight_ * fit_xx_ - fit_x_ * fit_x_;
  if (fit_weight_ <= 0.0 || spread <= 1e-9 * fit_weight_ * fit_weight_) {
    return floor > 0.0 || above < 0.0 ? floor : above;
  }
  const double slope = std::max(0.0, (fit_weight_ * fit_xy_ - fit_x_ * fit_y_) / spread);
  const double intercept = (fit_y_ - slope * fit_x_) / fit_weight_;
  return std::max(floor, intercept + slope * batch);
}

double AdaptivePolicy::PredictDraftNs(const TreeShape& shape, const ShapeStats* stats) const {
  if (stats != nullptr && stats->draft_ns.valid) return stats->draft_ns.value;
  return draft_ns_per_forward_.value * PriorForwards(shape);
}

int32_t AdaptivePolicy::PredictDepth(const TreeShape& shape, const ShapeStats* stats) const {
  if (stats != nullptr && stats->tree_depth.valid) {
    return std::clamp(static_cast<int32_t>(std::lround(stats->tree_depth.value)), 1,
                      shape.max_depth);
  }
  return PriorDepth(shape);
}

AdaptivePolicy::Estimate AdaptivePolicy::Predict(const TreeShape& shape,
                                                 const BatchContext& batch) const {
  Estimate estimate;
  estimate.shape = IsOff(shape) ? OffShape() : shape;
  if (!CostsKnown()) return estimate;
  if (IsOff(shape)) {
    estimate.step_ns = PredictVerifyNs(batch.other_rows + 1);
  } else {
    auto it = shapes_.find(KeyOf(shape));
    const ShapeStats* stats = it != shapes_.end() ? &it->second : nullptr;
    const int32_t depth = PredictDepth(shape, stats);
    double path_probability = 1.0;
    for (double acceptance : ShapeAcceptance(shape, stats, depth)) {
      path_probability *= acceptance;
      estimate.expected_tokens += path_probability;
    }
    const int32_t verified = stats != nullptr && stats->verified_nodes.valid
                                 ? static_cast<int32_t>(std::lround(stats->verified_nodes.value))
                                 : PriorVerifiedNodes(shape);
    estimate.step_ns = PredictDraftNs(shape, stats) + PredictVerifyNs(batch.other_rows + verified);
  }
  estimate.tokens_per_second =
      (estimate.expected_tokens + batch.other_tokens) * 1e9 / std::max(estimate.step_ns, 1.0);
  return estimate;
}

void AdaptivePolicy::Rank(const BatchContext& batch, TreeShape* best, TreeShape* runner_up) const {
  std::vector<Estimate> estimates;
  estimates.push_back(Predict(OffShape(), batch));
  for (const TreeShape& candidate : options_.candidates) {
    estimates.push_back(Predict(candidate, batch));
  }
  // Off first and ties to the earlier (smaller) shape: stable sort keeps the listed order.
  std::stable_sort(estimates.begin(), estimates.end(), [](const Estimate& a, const Estimate& b) {
    return a.tokens_per_second > b.tokens_per_second;
  });
  const double off_rate = Predict(OffShape(), batch).tokens_per_second;
  if (!IsOff(estimates[0].shape) &&
      !(estimates[0].tokens_per_second > off_rate * options_.min_gain)) {
    // Not enough gain: off is best, the best speculative shape the runner-up.
    *best = OffShape();
    *runner_up = estimates[0].shape;
    return;
  }
  *best = estimates[0].shape;
  *runner_up = estimates[1].shape;
}

int32_t AdaptivePolicy::EffectiveProbeInterval(const BatchContext& batch) const {
  if (!CostsKnown()) return options_.probe_interval;
  const Estimate off = Predict(OffShape(), batch);
  const Estimate probe = Predict(options_.probe, batch);
  // Off would have produced the probe's tokens in expected_tokens * off.step_ns.
  const double loss_ns = probe.step_ns - probe.expected_tokens * off.step_ns;
  if (!(loss_ns > 0.0) || !(off.step_ns > 0.0)) return options_.probe_interval;
  const double needed = std::ceil(loss_ns / (options_.probe_budget * off.step_ns));
  return static_cast<int32_t>(std::clamp(needed, static_cast<double>(options_.probe_interval),
                                         static_cast<double>(options_.max_probe_interval)));
}

TreeShape AdaptivePolicy::Next(const BatchContext& batch) const {
  if (off_steps_recorded_ == 0) return OffShape();
  if (speculative_steps_recorded_ == 0) return options_.probe;
  TreeShape best, runner_up;
  Rank(batch, &best, &runner_up);
  if (IsOff(best)) {
    return off_steps_since_speculation_ >= EffectiveProbeInterval(batch) ? options_.probe : best;
  }
  if (best_steps_since_runner_up_ >= options_.probe_interval) return runner_up;
  return best;
}

absl::Status AdaptivePolicy::Record(const StepMeasurement& step) {
  BITSPLIT_RETURN_IF_ERROR(ValidateStepMeasurement(step));
  TreeShape best = OffShape(), runner_up = OffShape();
  if (CostsKnown()) Rank(BatchContext(), &best, &runner_up);
  best_steps_since_runner_up_ = SameShape(step.shape, best) ? best_steps_since_runner_up_ + 1 : 0;

  const int32_t rows = step.batch_rows > 0 ? step.batch_rows : step.verified_nodes;
  Update(verify_by_batch_[rows], static_cast<double>(step.verify_ns));
  const double keep = 1.0 - 1.0 / kFitWindow;
  const double x = rows, y = static_cast<double>(step.verify_ns);
  fit_weight_ = fit_weight_ * keep + 1.0;
  fit_x_ = fit_x_ * keep + x;
  fit_y_ = fit_y_ * keep + y;
  fit_xx_ = fit_xx_ * keep + x * x;
  fit_xy_ = fit_xy_ * keep + x * y;
  const double u = ExpertUnion(rows);
  fit_u_ = fit_u_ * keep + u;
  fit_uu_ = fit_uu_ * keep + u * u;
  fit_xu_ = fit_xu_ * keep + x * u;
  fit_uy_ = fit_uy_ * keep + u * y;

  if (IsOff(step.shape)) {
    ++off_steps_recorded_;
    ++off_steps_since_speculation_;
  } else {
    ++speculative_steps_recorded_;
    off_steps_since_speculation_ = 0;
    ShapeStats& stats = shapes_[KeyOf(step.shape)];
    Update(stats.draft_ns, static_cast<double>(step.draft_ns));
    Update(stats.draft_forwards, step.draft_forwards);
    Update(stats.tree_depth, step.tree_depth);
    Update(stats.verified_nodes, step.verified_nodes);
    Update(draft_ns_per_forward_, static_cast<double>(step.draft_ns) / step.draft_forwards);
    UpdateAcceptance(stats.acceptance, step);
    UpdateAcceptance(acceptance_by_expansions_[step.shape.expansions], step);
  }
  ++steps_recorded_;
  return absl::OkStatus();
}

std::string AdaptivePolicy::Describe(const BatchContext& batch) const {
  if (!CostsKnown()) return "adaptive: measuring";
  TreeShape best, runner_up;
  Rank(batch, &best, &runner_up);
  if (IsOff(best)) {
    return absl::StrFormat("adaptive: off (probe %s every %d steps)", DescribeShape(options_.probe),
                           EffectiveProbeInterval(batch));
  }
  const Estimate estimate = Predict(best, batch);
  const Estimate off = Predict(OffShape(), batch);
  return absl::StrFormat("adaptive: %s (expected %.2f tok/step, %.2fx off)", DescribeShape(best),
                         estimate.expected_tokens,
                         estimate.tokens_per_second / std::max(off.tokens_per_second, 1e-12));
}

absl::StatusOr<AdaptivePolicy> MakeAdaptivePolicy(const TreeShape& bounds, int32_t num_experts,
                                                  int32_t experts_used) {
  AdaptivePolicy::Options options;
  options.num_experts = num_experts;
  options.experts_used = experts_used;
  options.max_nodes = bounds.nodes;
  options.max_depth = bounds.max_depth;
  options.probe.nodes = std::min(options.probe.nodes, bounds.nodes);
  options.probe.max_depth = std::min(options.probe.max_depth, bounds.max_depth);
  std::erase_if(options.candidates, [&](const TreeShape& shape) {
    return shape.nodes > bounds.nodes || shape.expansions > bounds.expansions;
  });
  if (options.candidates.empty()) options.candidates = {bounds};
  return AdaptivePolicy::Create(options);
}

}  // namespace bitsplit::speculation
