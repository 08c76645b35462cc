#pragma once
// The adaptive speculation policy: from measured draft cost, verify cost and acceptance per
// depth it picks the draft-tree shape of the next step, or turns speculation off, so that
// speculative decoding is never slower than `off` by more than a few percent.
//
// Model. One step of shape s emits E(s) tokens in T(s) nanoseconds:
//   E(s) = 1 + sum_{d=1..D(s)} prod_{j<=d} a_j(s)   (the bonus token, plus the accepted path)
//   T(s) = draft(s) + verify(R + nodes(s) + 1)        (off: verify(R + 1), no draft)
// where a_d(s) is the probability that some node at depth d is accepted given that depth d-1
// was, D(s) the depth the shape's trees reach, and R the rows the other generations of a
// batched iteration verify in the same forward (BatchContext; 0 alone). The policy runs argmax
// (E(s) + E_others) / T(s) over the candidate shapes, E_others being the tokens the others are
// expected to emit: the iteration's rate, so that a tree's rows are worth it only if its extra
// tokens outweigh the time they add to every batched generation (where rows are cheap, as on a
// memory-bound GPU, trees win; where verify cost grows with the rows, as on 2 cores, a full
// batch turns them off). `off` unless the best shape's predicted rate beats off's by `min_gain`.
//
// Estimates. verify(n), n the forward's rows (StepMeasurement::batch_rows): a per-size moving
// average where size n was measured, else a least-squares line a + b*n over all verify
// measurements (b >= 0, never below a smaller measured size; the nearest measured size while
// the line is undetermined). For a verifier with mixture-of-experts layers (Options::num_experts)
// the fit is a + b*n + c*u(n), u(n) = E(1 - (1 - k/E)^n) the distinct experts n rows touch under
// uniform routing: each touched expert's residual is read once, so a tree's cost grows with the
// union of its rows' experts, not with its rows (the line again where that fit is undetermined or
// has a negative coefficient). draft(s): the shape's own moving average once it ran, else a pooled
// cost per draft forward times the shape's forwards. a_d(s): the shape's own decayed success/trial
// counts at depth d, shrunk towards a prior: for chains the pooled first-choice acceptance p_d,
// for a tree that keeps k children 1 - (1 - p_d)^sqrt(k) (a draft's lower choices are accepted
// less often than its first; the measured fit is in speculation_policy.cc). p_d pools every
// shape's steps, each converted back through that model, and is itself shrunk towards p_{d-1},
// p_1 towards `prior_acceptance`: what a 16-node tree saw informs the 128-node tree's prior.
//
// Exploration. While off, a probe step (a short chain) runs every `probe_interval` off steps,
// stretched so that a probe's measured loss against off stays within `probe_budget` of the off
// time in between: with no acceptance at all, probing costs at most that fraction. While
// speculating, the runner-up shape runs once every `probe_interval` steps so that its estimates
// stay fresh (its predicted rate is the closest to the best).
//
// Thread safety: none (one policy per generation loop, or a lock around it).
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/speculation/tree.h"

namespace bitsplit::speculation {

// "off" for nodes = 0, else "tree N=16 k=4 depth<=8" (a chain is k=1): the shape string of the
// public speculation stats.
std::string DescribeShape(const TreeShape& shape);

// One speculation step as it ran.
struct StepMeasurement {
  TreeShape shape;             // nodes = 0: off (a plain decode step: verify of the root only)
  int64_t draft_ns = 0;        // every draft forward of the step (0 when off)
  int32_t draft_forwards = 0;  // DraftTree::draft_forwards
  int64_t verify_ns = 0;       // the verifier forward
  int32_t verified_nodes = 1;  // verify batch: tree size including the root (off: 1)
  int32_t tree_depth = 0;      // deepest node of the drafted tree (root 0)
  int32_t accepted_depth = 0;  // accepted tokens beyond the root: path length - 1
  // Rows of the verifier forward the step ran in, every batched generation's (0: the step ran
  // alone, verified_nodes). The verify cost is learned against these rows.
  int32_t batch_rows = 0;
};

// What the other generations of a batched iteration add to it (continuous batching): their
// verifier rows, and the tokens they are expected to emit. Zero for a generation alone.
struct BatchContext {
  int32_t other_rows = 0;
  double other_tokens = 0.0;
};
// INVALID_ARGUMENT for negative times, verified_nodes outside [1, shape.nodes + 1], a tree
// depth outside [0, min(verified_nodes - 1, max_depth)] (0 iff off), accepted_depth outside
// [0, tree_depth], draft forwards on an off step or none on a speculative one.
absl::Status ValidateStepMeasurement(const StepMeasurement& step);

class AdaptivePolicy {
 public:
  struct Options {
    // Speculative shapes to choose from (off is always a candidate). Shapes with more than
    // `max_nodes` nodes are dropped; depths are capped at `max_depth`.
    std::vector<TreeShape> candidates = {
        {2, 1, 2},   {4, 1, 4},   {8, 1, 8},    {16, 1, 16},  // chains
        {8, 2, 8},   {16, 4, 8},  {32, 4, 8},                 // trees
        {64, 8, 12}, {96, 8, 16}, {128, 8, 16},               // deep trees, for cheap rows
    };
    int32_t max_nodes = 128;
    int32_t max_depth = 16;
    TreeShape probe = {2, 1, 2};  // the step run now and then while off
    int32_t probe_interval = 16;  // off steps between probes (at least; see probe_budget)
    double probe_budget = 0.03;   // probe loss / off time in between, at most
    int32_t max_probe_interval = 1024;
    double min_gain = 1.0;           // speculate only when predicted rate > off rate * min_gain
    double cost_smoothing = 0.2;     // weight of a new sample in the cost moving averages
    double acceptance_window = 256;  // acceptance evidence fades by 1/e per this many steps
    double prior_acceptance = 0.5;   // p_1 before any chain step
    double prior_strength = 1.0;     // pseudo-trials of every shrinkage prior
    // The verifier's mixture-of-experts layers: E experts of which k per row (0: none).
    int32_t num_experts = 0;
    int32_t experts_used = 0;
  };

  // What the policy predicts for a shape (from the current estimates).
  struct Estimate {
    TreeShape shape;
    double expected_tokens = 1.0;  // per step, E(s)
    double step_ns = 0.0;          // T(s)
    double tokens_per_second = 0.0;
  };

  // INVALID_ARGUMENT for an invalid candidate or probe shape (ValidateTreeShape; a candidate
  // with 0 nodes), no candidate within max_nodes, or a knob out of range.
  static absl::StatusOr<AdaptivePolicy> Create(const Options& options);
  static absl::StatusOr<AdaptivePolicy> Create() { return Create(Options()); }

  // The shape to run next (nodes = 0: off), in an iteration shared with `batch`. Pure: calling
  // it again without Record gives the same answer. The first step runs off and the second the
  // probe (both costs are needed).
  TreeShape Next(const BatchContext& batch = {}) const;

  // Feeds back one step's measurements (any shape, also one Next did not suggest).
  // INVALID_ARGUMENT (ValidateStepMeasurement) leaves the state unchanged.
  absl::Status Record(const StepMeasurement& step);

  // e.g. "adaptive: tree N=16 k=4 depth<=8 (expected 2.31 tok/step, 1.80x off)",
  // "adaptive: off (probe tree N=2 k=1 depth<=2 every 16 steps)", "adaptive: measuring".
  std::string Describe(const BatchContext& batch = {}) const;

  // The prediction for a shape (off included); an unmeasured cost counts as unknown (rate 0)
  // until the first off and first speculative step were recorded.
  // tokens_per_second is the iteration's (this step's tokens and batch.other_tokens).
  Estimate Predict(const TreeShape& shape, const BatchContext& batch = {}) const;
  // Off steps between probes right now (probe_interval, stretched by the probe budget).
  int32_t EffectiveProbeInterval(const BatchContext& batch = {}) const;
  int64_t steps_recorded() const { return steps_recorded_; }
  const Options& options() const { return options_; }

 private:
  using ShapeKey = std::tuple<int32_t, int32_t, int32_t>;
  struct DecayedRatio {  // successes / trials with exponential forgetting
    double successes = 0.0;
    double trials = 0.0;
  };
  struct MovingAverage {
    double value = 0.0;
    bool valid = false;
  };
  // Per-depth acceptance counts that fade with the steps recorded since (any shape's).
  struct AcceptanceCounts {
    std::vector<DecayedRatio> by_depth;  // index d - 1
    int64_t as_of_step = 0;
  };
  struct ShapeStats {
    MovingAverage draft_ns;
    MovingAverage draft_forwards;
    MovingAverage tree_depth;
    MovingAverage verified_nodes;
    AcceptanceCounts acceptance;
  };

  explicit AdaptivePolicy(const Options& options) : options_(options) {}
  static ShapeKey KeyOf(const TreeShape& shape);
  void Update(MovingAverage& average, double sample) const;
  // Records the outcome of every depth tried in `step` (depth d is tried when d - 1 was accepted).
  void UpdateAcceptance(AcceptanceCounts& counts, const StepMeasurement& step) const;
  // The counts at depth d (1-based) as of now; zero beyond what was ever tried.
  DecayedRatio CountsAt(const AcceptanceCounts& counts, int32_t depth) const;
  // The best candidate by predicted rate, and the runner-up (off included in both).
  void Rank(const BatchContext& batch, TreeShape* best, TreeShape* runner_up) const;
  bool CostsKnown() const;
  double PredictVerifyNs(int32_t batch) const;
  double PredictDraftNs(const TreeShape& shape, const ShapeStats* stats) const;
  int32_t PredictDepth(const TreeShape& shape, const ShapeStats* stats) const;
  // p_d for d = 1..depth from the pooled chain counts.
  std::vector<double> PooledChainAcceptance(int32_t depth) const;
  // a_d(s) for d = 1..depth.
  std::vector<double> ShapeAcceptance(const TreeShape& shape, const ShapeStats* stats,
                                      int32_t depth) const;

  Options options_;
  std::map<ShapeKey, ShapeStats> shapes_;
  // Pooled over every step of the shapes that keep k children, by k.
  std::map<int32_t, AcceptanceCounts> acceptance_by_expansions_;
  std::map<int32_t, MovingAverage> verify_by_batch_;
  MovingAverage draft_ns_per_forward_;
  // u(n): the distinct experts n rows are expected to touch (0 without experts).
  double ExpertUnion(int32_t rows) const;
  // The a + b*n + c*u(n) fit at `rows`, or nullopt where it is undetermined or a coefficient is
  // negative.
  std::optional<double> ExpertFit(int32_t rows) const;

  // Decayed sums of the verify-cost line fit.
  double fit_weight_ = 0.0, fit_x_ = 0.0, fit_y_ = 0.0, fit_xx_ = 0.0, fit_xy_ = 0.0;
  // And of the expert-union regressor u (mixture-of-experts verifiers).
  double fit_u_ = 0.0, fit_uu_ = 0.0, fit_xu_ = 0.0, fit_uy_ = 0.0;
  int64_t steps_recorded_ = 0;
  int64_t off_steps_recorded_ = 0;
  int64_t speculative_steps_recorded_ = 0;
  int32_t off_steps_since_speculation_ = 0;
  int32_t best_steps_since_runner_up_ = 0;
};

// The adaptive policy for shapes within `bounds` (at most bounds.nodes nodes, depth at most
// bounds.max_depth, at most bounds.expansions children per expansion): the policy's default
// candidates that fit, else `bounds` itself; for a verifier of `num_experts` experts, k used
// per row (0: dense), the expert-union cost model.
absl::StatusOr<AdaptivePolicy> MakeAdaptivePolicy(const TreeShape& bounds, int32_t num_experts = 0,
                                                  int32_t experts_used = 0);

}  // namespace bitsplit::speculation
