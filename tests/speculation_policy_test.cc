#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "common/speculation/policy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace bitsplit::speculation {
namespace {

// A synthetic target and machine, deliberately not the policy's own model: a tree that keeps k
// children accepts at depth d with probability 1 - (1 - p)^sqrt(k) (the policy's prior assumes
// exponent k), reaches one level deeper than the policy's prior guesses, and drafts with one
// forward more; times carry +-5% noise.
struct Machine {
  double acceptance = 0.5;  // P(draft top-1 == target choice), every depth
  double verify_base_ns = 1e6;
  double verify_per_node_ns = 5e3;  // memory-bound residual: more rows cost little
  double draft_forward_ns = 2e5;

  int32_t Depth(const TreeShape& s) const {
    if (s.expansions == 1) return std::min(s.nodes, s.max_depth);
    return std::min(s.max_depth, (s.nodes + s.expansions - 1) / s.expansions + 1);
  }
  int32_t Forwards(const TreeShape& s) const {
    if (s.expansions == 1) return std::min(s.nodes, s.max_depth);
    return (s.nodes + s.expansions - 1) / s.expansions + 1;
  }
  int32_t VerifiedNodes(const TreeShape& s) const {
    if (s.nodes == 0) return 1;
    return (s.expansions == 1 ? std::min(s.nodes, s.max_depth) : s.nodes) + 1;
  }
  double DepthAcceptance(const TreeShape& s) const {
    return 1.0 - std::pow(1.0 - acceptance, std::sqrt(static_cast<double>(s.expansions)));
  }
  double VerifyNs(int32_t nodes) const { return verify_base_ns + verify_per_node_ns * nodes; }
  double OffRate() const { return 1.0 / VerifyNs(1); }

  // Analytic tokens per ns of always running `s`.
  double FixedRate(const TreeShape& s) const {
    if (s.nodes == 0) return OffRate();
    double expected = 1.0, path = 1.0;
    for (int32_t d = 1; d <= Depth(s); ++d) {
      path *= DepthAcceptance(s);
      expected += path;
    }
    return expected / (Forwards(s) * draft_forward_ns + VerifyNs(VerifiedNodes(s)));
  }

  StepMeasurement Run(const TreeShape& s, std::mt19937& rng) const {
    std::uniform_real_distribution<double> noise(0.95, 1.05);
    std::uniform_real_distribution<double> coin(0.0, 1.0);
    StepMeasurement step;
    step.shape = s;
    step.verified_nodes = VerifiedNodes(s);
    step.verify_ns = static_cast<int64_t>(VerifyNs(step.verified_nodes) * noise(rng));
    if (s.nodes == 0) return step;
    step.draft_forwards = Forwards(s);
    step.draft_ns = static_cast<int64_t>(Forwards(s) * draft_forward_ns * noise(rng));
    step.tree_depth = Depth(s);
    while (step.accepted_depth < step.tree_depth && coin(rng) < DepthAcceptance(s)) {
      ++step.accepted_depth;
    }
    return step;
  }
};

struct RunResult {
  double tokens = 0;
  double ns = 0;
  std::map<std::string, int> shape_counts;  // over the last quarter of the steps
  double Rate() const { return tokens / ns; }
};

RunResult Simulate(AdaptivePolicy& policy, const Machine& machine, int steps, uint32_t seed) {
  std::mt19937 rng(seed);
  RunResult result;
  for (int i = 0; i < steps; ++i) {
    const TreeShape shape = policy.Next();
    const StepMeasurement step = machine.Run(shape, rng);
    EXPECT_TRUE(policy.Record(step).ok());
    result.tokens += 1 + step.accepted_depth;
    result.ns += step.draft_ns + step.verify_ns;
    if (i >= steps * 3 / 4) ++result.shape_counts[DescribeShape(shape)];
  }
  return result;
}

AdaptivePolicy NewPolicy(const AdaptivePolicy::Options& options = {}) {
  absl::StatusOr<AdaptivePolicy> policy = AdaptivePolicy::Create(options);
  EXPECT_TRUE(policy.ok()) << policy.status();
  return *std::move(policy);
}

double BestFixedRate(const AdaptivePolicy& policy, const Machine& machine) {
  double best = machine.OffRate();
  for (const TreeShape& shape : policy.options().candidates) {
    best = std::max(best, machine.FixedRate(shape));
  }
  return best;
}

std::string MostRun(const RunResult& result) {
  return std::max_element(result.shape_counts.begin(), result.shape_counts.end(),
                          [](const auto& a, const auto& b) { return a.second < b.second; })
      ->first;
}

TEST(SpeculationPolicyTest, DescribeShapeNamesOffAndTrees) {
  EXPECT_EQ(DescribeShape({0, 4, 8}), "off");
  EXPECT_EQ(DescribeShape({16, 4, 8}), "tree N=16 k=4 depth<=8");
  EXPECT_EQ(DescribeShape({4, 1, 4}), "tree N=4 k=1 depth<=4");
}

TEST(SpeculationPolicyTest, StartsWithOffThenProbeAndNextIsPure) {
  AdaptivePolicy policy = NewPolicy();
  EXPECT_EQ(policy.Describe(), "adaptive: measuring");
  EXPECT_EQ(policy.Next().nodes, 0);
  EXPECT_EQ(policy.Next().nodes, 0);
  Machine machine;
  std::mt19937 rng(1);
  ASSERT_TRUE(policy.Record(machine.Run(policy.Next(), rng)).ok());
  const TreeShape probe = policy.Next();
  EXPECT_EQ(DescribeShape(probe), DescribeShape(policy.options().probe));
  EXPECT_EQ(DescribeShape(policy.Next()), DescribeShape(probe));
  EXPECT_EQ(policy.steps_recorded(), 1);
}

TEST(SpeculationPolicyTest, ZeroAcceptanceConvergesToOffWithinFivePercent) {
  for (double draft_forward_ns : {2e4, 3e5, 1.5e6}) {  // cheap, typical, dearer than a verify
    SCOPED_TRACE(draft_forward_ns);
    Machine machine;
    machine.acceptance = 0.0;
    machine.draft_forward_ns = draft_forward_ns;
    AdaptivePolicy policy = NewPolicy();
    const RunResult result = Simulate(policy, machine, 2000, 7);
    EXPECT_GE(result.Rate(), machine.OffRate() * 0.95)
        << "time overhead " << machine.OffRate() / result.Rate() - 1.0;
    EXPECT_EQ(MostRun(result), "off");
    EXPECT_GE(result.shape_counts.at("off"), 2000 / 4 * 9 / 10);
    EXPECT_TRUE(policy.Describe().starts_with("adaptive: off (probe tree N=2 k=1 depth<=2 every"))
        << policy.Describe();
  }
}

TEST(SpeculationPolicyTest, ProbeIntervalStretchesWithProbeCost) {
  Machine cheap, dear;
  cheap.acceptance = dear.acceptance = 0.0;
  cheap.draft_forward_ns = 2e4;
  dear.draft_forward_ns = 3e6;  // a probe costs ~7 off steps
  AdaptivePolicy cheap_policy = NewPolicy(), dear_policy = NewPolicy();
  Simulate(cheap_policy, cheap, 300, 3);
  Simulate(dear_policy, dear, 300, 3);
  EXPECT_EQ(cheap_policy.EffectiveProbeInterval(), cheap_policy.options().probe_interval);
  const int32_t stretched = dear_policy.EffectiveProbeInterval();
  // loss = 2 forwards + verify(3) - verify(1) ~ 6e6 ns; budget 3% of 1e6 ns per off step.
  EXPECT_GE(stretched, 150);
  EXPECT_LE(stretched, 250);
}

TEST(SpeculationPolicyTest, HighAcceptanceWithCheapDraftsPicksADeepShape) {
  Machine machine;
  machine.acceptance = 0.9;
  machine.draft_forward_ns = 2e4;
  AdaptivePolicy policy = NewPolicy();
  const RunResult result = Simulate(policy, machine, 600, 11);
  const TreeShape chosen = policy.Next();
  EXPECT_GE(chosen.max_depth, 8) << DescribeShape(chosen);
  EXPECT_GE(chosen.nodes, 8) << DescribeShape(chosen);
  EXPECT_GE(result.Rate(), machine.OffRate() * 4.0);
  EXPECT_GE(result.Rate(), BestFixedRate(policy, machine) * 0.85);
  const std::regex described(
      R"(adaptive: tree N=\d+ k=\d+ depth<=\d+ \(expected \d+\.\d\d tok/step, \d+\.\d\dx off\))");
  EXPECT_TRUE(std::regex_match(policy.Describe(), described)) << policy.Describe();
  EXPECT_NE(policy.Describe().find(MostRun(result)), std::string::npos) << policy.Describe();
}

// Deep trees where rows are nearly free and the draft is good (a GPU's memory-bound verify: a
// row costs 1/1000 of the forward): the policy grows to the large candidates (64-128 nodes,
// depth 12-16). Where a row costs about the forward (2 CPU cores, compute-bound), it stays small.
TEST(SpeculationPolicyTest, CheapRowsGrowTheTreeAndDearRowsShrinkIt) {
  Machine cheap_rows;
  cheap_rows.acceptance = 0.9;
  cheap_rows.draft_forward_ns = 2e4;
  cheap_rows.verify_per_node_ns = 1e3;
  AdaptivePolicy policy = NewPolicy();
  const RunResult result = Simulate(policy, cheap_rows, 1500, 21);
  const TreeShape chosen = policy.Next();
  EXPECT_GE(chosen.nodes, 64) << DescribeShape(chosen);
  EXPECT_GE(chosen.max_depth, 12) << DescribeShape(chosen);
  EXPECT_GE(result.Rate(), BestFixedRate(policy, cheap_rows) * 0.85);

  Machine dear_rows = cheap_rows;
  dear_rows.verify_per_node_ns = 1e6;  // a row costs as much as the forward's fixed part
  AdaptivePolicy small = NewPolicy();
  Simulate(small, dear_rows, 1500, 21);
  EXPECT_LE(small.Next().nodes, 16) << DescribeShape(small.Next());
}

// Batched beside other generations, a tree's rows lengthen every generation's forward. Where a
// verify row costs a tenth of the fixed cost, a tree pays alone (its extra tokens beat one
// row's cost) but not beside 31 generations decoding one row each: there the iteration already
// emits a token per 0.13 ms of rows, more than a tree's or a chain's extra tokens buy per row.
// Where rows are nearly free (memory-bound verification) a tree still pays in the batch.
TEST(SpeculationPolicyTest, TheBatchDecidesWhetherATreesRowsPay) {
  const BatchContext decoding_beside{.other_rows = 31, .other_tokens = 31.0};
  Machine dear_rows;
  dear_rows.acceptance = 0.9;
  dear_rows.draft_forward_ns = 2e4;
  dear_rows.verify_per_node_ns = 1e5;
  AdaptivePolicy policy = NewPolicy();
  Simulate(policy, dear_rows, 600, 5);
  EXPECT_THAT(policy.Describe(), ::testing::StartsWith("adaptive: tree")) << policy.Describe();
  EXPECT_THAT(policy.Describe(decoding_beside), ::testing::StartsWith("adaptive: off"))
      << policy.Describe(decoding_beside);
  const int32_t batched_nodes = policy.Next(decoding_beside).nodes;
  EXPECT_TRUE(batched_nodes == 0 || batched_nodes == 2) << batched_nodes;  // off, or the probe
  EXPECT_GT(policy.Predict(TreeShape{}, {}).tokens_per_second,
            policy.Predict(TreeShape{.nodes = 0}, {}).tokens_per_second);
  EXPECT_LT(policy.Predict(TreeShape{}, decoding_beside).tokens_per_second,
            policy.Predict(TreeShape{.nodes = 0}, decoding_beside).tokens_per_second);

  Machine cheap_rows = dear_rows;
  cheap_rows.verify_per_node_ns = 1e3;
  AdaptivePolicy cheap = NewPolicy();
  Simulate(cheap, cheap_rows, 600, 5);
  EXPECT_THAT(cheap.Describe(decoding_beside), ::testing::StartsWith("adaptive: tree"))
      << cheap.Describe(decoding_beside);

  // Batch rows are the forward's: never fewer than the step's own nodes (0: alone).
  StepMeasurement off_step{.shape = {.nodes = 0}, .verified_nodes = 1, .batch_rows = 9};
  EXPECT_TRUE(ValidateStepMeasurement(off_step).ok());
  StepMeasurement chain_step{.shape = {.nodes = 4, .expansions = 1, .max_depth = 4},
                             .draft_forwards = 4,
                             .verified_nodes = 5,
                             .tree_depth = 4,
                             .batch_rows = 0};
  EXPECT_TRUE(ValidateStepMeasurement(chain_step).ok());
  chain_step.batch_rows = 3;
  EXPECT_THAT(ValidateStepMeasurement(chain_step).message(), ::testing::HasSubstr("batch rows"));
}

// Over a grid of acceptance rates and draft costs the adaptive policy is never more than 5%
// slower than off, and close to the best fixed shape chosen with hindsight.
TEST(SpeculationPolicyTest, NeverSlowerThanOffAndNearTheBestFixedShape) {
  for (double acceptance : {0.0, 0.05, 0.2, 0.4, 0.6, 0.8, 0.95}) {
    for (double draft_forward_ns : {2e4, 2e5, 6e5, 1.5e6}) {
      SCOPED_TRACE(testing::Message() << "acceptance " << acceptance << ", draft forward "
                                      << draft_forward_ns << " ns");
      Machine machine;
      machine.acceptance = acceptance;
      machine.draft_forward_ns = draft_forward_ns;
      AdaptivePolicy policy = NewPolicy();
      const RunResult result = Simulate(policy, machine, 1500, 5);
      EXPECT_GE(result.Rate(), machine.OffRate() * 0.95);
      EXPECT_GE(result.Rate(), BestFixedRate(policy, machine) * 0.9);
    }
  }
}

// Feeds two policies the same shapes and outcomes; only the draft cost differs.
TEST(SpeculationPolicyTest, DearerDraftsNeverRaiseThePredictedGain) {
  double previous_gain = 1e9;
  for (double draft_forward_ns : {1e4, 1e5, 3e5, 1e6, 3e6}) {
    Machine machine;
    machine.acceptance = 0.7;
    machine.draft_forward_ns = draft_forward_ns;
    AdaptivePolicy policy = NewPolicy();
    std::mt19937 rng(99);  // same seed: same noise and outcomes
    const std::vector<TreeShape> shapes = {{0, 1, 1}, {2, 1, 2}, {8, 1, 8}, {16, 4, 8}};
    for (int i = 0; i < 40; ++i) ASSERT_TRUE(policy.Record(machine.Run(shapes[i % 4], rng)).ok());
    double gain = 0.0;
    const double off_rate = policy.Predict({0, 1, 1}).tokens_per_second;
    for (const TreeShape& shape : policy.options().candidates) {
      gain = std::max(gain, policy.Predict(shape).tokens_per_second / off_rate);
    }
    EXPECT_LE(gain, previous_gain) << draft_forward_ns;
    previous_gain = gain;
  }
  EXPECT_LT(previous_gain, 1.0);  // at 3 verifies per draft forward nothing pays
}

TEST(SpeculationPolicyTest, MoreAcceptanceMeansMoreExpectedTokensForEveryShape) {
  Machine low, high;
  low.acceptance = 0.0;
  high.acceptance = 1.0;
  AdaptivePolicy low_policy = NewPolicy(), high_policy = NewPolicy();
  Simulate(low_policy, low, 200, 1);
  std::mt19937 rng(1);
  for (const TreeShape& shape : high_policy.options().candidates) {  // every shape measured
    ASSERT_TRUE(high_policy.Record(high.Run({0, 1, 1}, rng)).ok());
    ASSERT_TRUE(high_policy.Record(high.Run(shape, rng)).ok());
  }
  for (const TreeShape& shape : high_policy.options().candidates) {
    SCOPED_TRACE(DescribeShape(shape));
    const double expected_high = high_policy.Predict(shape).expected_tokens;
    EXPECT_GT(expected_high, low_policy.Predict(shape).expected_tokens);
    EXPECT_GT(expected_high, 1.0 + 0.5 * std::min(shape.nodes, shape.max_depth) / 2);
    EXPECT_LE(expected_high, 1.0 + shape.max_depth);
  }
}

TEST(SpeculationPolicyTest, PredictedVerifyCostGrowsWithBatchSize) {
  Machine machine;
  machine.verify_per_node_ns = 1e5;
  AdaptivePolicy policy = NewPolicy();
  std::mt19937 rng(4);
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(policy.Record(machine.Run({0, 1, 1}, rng)).ok());
    ASSERT_TRUE(policy.Record(machine.Run({2, 1, 2}, rng)).ok());
  }
  // Only batches 1 and 3 were measured: 33 (tree N=32) is extrapolated from the line fit.
  const double step32 = policy.Predict({32, 4, 8}).step_ns;
  const double expected32 = machine.VerifyNs(33) + 8 * machine.draft_forward_ns;
  EXPECT_NEAR(step32, expected32, expected32 * 0.1);
  EXPECT_LT(policy.Predict({0, 1, 1}).step_ns, policy.Predict({2, 1, 2}).step_ns);
}

// A mixture-of-experts verifier reads each touched expert's residual once, so its cost follows
// the distinct experts n rows touch, u(n) = E(1 - (1 - k/E)^n), which flattens as n grows. From
// off steps batched beside 0 to 7 other rows (verify rows 1 to 8), the expert-aware policy
// predicts the unmeasured 17- and 65-row verifies within 1% of such a cost law; the same
// measurements fit with a line (a dense verifier's model) overshoot them by 26% and 3.1x.
TEST(SpeculationPolicyTest, MixtureOfExpertsVerifyCostFollowsTheExpertUnion) {
  constexpr int kExperts = 128, kUsed = 8;
  const auto cost = [](int rows) {
    const double u = kExperts * (1.0 - std::pow(1.0 - static_cast<double>(kUsed) / kExperts, rows));
    return 2e6 + 1e4 * rows + 4e5 * u;
  };
  auto experts = MakeAdaptivePolicy({128, 8, 16}, kExperts, kUsed);
  auto dense = MakeAdaptivePolicy({128, 8, 16});
  ASSERT_TRUE(experts.ok() && dense.ok());
  for (int round = 0; round < 4; ++round) {
    for (int rows = 1; rows <= 8; ++rows) {
      const StepMeasurement off{.shape = {.nodes = 0},
                                .verify_ns = static_cast<int64_t>(cost(rows)),
                                .verified_nodes = 1,
                                .batch_rows = rows};
      ASSERT_TRUE(experts->Record(off).ok());
      ASSERT_TRUE(dense->Record(off).ok());
    }
    // A speculative step too: predictions need both kinds measured.
    const StepMeasurement chain{.shape = {2, 1, 2},
                                .draft_ns = 100000,
                                .draft_forwards = 2,
                                .verify_ns = static_cast<int64_t>(cost(3)),
                                .verified_nodes = 3,
                                .tree_depth = 2,
                                .accepted_depth = 1};
    ASSERT_TRUE(experts->Record(chain).ok());
    ASSERT_TRUE(dense->Record(chain).ok());
  }
  for (const auto& [rows, line_over] : {std::pair(17, 1.2), std::pair(65, 3.0)}) {
    SCOPED_TRACE(rows);
    const BatchContext batch{.other_rows = rows - 1};
    const double truth = cost(rows);
    EXPECT_NEAR(experts->Predict({.nodes = 0}, batch).step_ns, truth, 0.01 * truth);
    EXPECT_GT(dense->Predict({.nodes = 0}, batch).step_ns, line_over * truth);
  }
  AdaptivePolicy::Options bad;
  bad.num_experts = 8;
  bad.experts_used = 9;
  EXPECT_FALSE(AdaptivePolicy::Create(bad).ok());
  bad.experts_used = 0;
  EXPECT_FALSE(AdaptivePolicy::Create(bad).ok());
}

TEST(SpeculationPolicyTest, DepthCapShortensChainsAndDropsDuplicates) {
  AdaptivePolicy::Options options;
  options.max_depth = 4;
  options.max_nodes = 16;
  AdaptivePolicy policy = NewPolicy(options);
  std::vector<std::string> names;
  for (const TreeShape& shape : policy.options().candidates) names.push_back(DescribeShape(shape));
  EXPECT_EQ(names, (std::vector<std::string>{"tree N=2 k=1 depth<=2", "tree N=4 k=1 depth<=4",
                                             "tree N=8 k=2 depth<=4", "tree N=16 k=4 depth<=4"}));
}

TEST(SpeculationPolicyTest, CreateRejectsBadOptions) {
  auto rejected = [](const AdaptivePolicy::Options& options) {
    return AdaptivePolicy::Create(options).status().code() == absl::StatusCode::kInvalidArgument;
  };
  AdaptivePolicy::Options options;
  options.candidates = {{0, 1, 1}};
  EXPECT_TRUE(rejected(options));
  options.candidates = {{4, 0, 4}};
  EXPECT_TRUE(rejected(options));
  options.candidates = {{4, 1, 65}};
  EXPECT_TRUE(rejected(options));
  options.candidates = {{256, 4, 8}};  // none within max_nodes = 128
  EXPECT_TRUE(rejected(options));
  options = {};
  options.probe = {0, 1, 1};
  EXPECT_TRUE(rejected(options));
  options = {};
  options.probe_budget = 0.0;
  EXPECT_TRUE(rejected(options));
  options = {};
  options.min_gain = 0.9;
  EXPECT_TRUE(rejected(options));
  options = {};
  options.probe_interval = 0;
  EXPECT_TRUE(rejected(options));
  options = {};
  options.max_depth = 65;
  EXPECT_TRUE(rejected(options));
  options = {};
  options.prior_acceptance = 1.5;
  EXPECT_TRUE(rejected(options));
  options = {};
  options.cost_smoothing = 0.0;
  EXPECT_TRUE(rejected(options));
  EXPECT_TRUE(AdaptivePolicy::Create().ok());
}

TEST(SpeculationPolicyTest, RecordRejectsInconsistentMeasurementsAndKeepsState) {
  AdaptivePolicy policy = NewPolicy();
  Machine machine;
  std::mt19937 rng(2);
  ASSERT_TRUE(policy.Record(machine.Run({0, 1, 1}, rng)).ok());
  const std::string before = DescribeShape(policy.Next());

  StepMeasurement good = machine.Run({8, 1, 8}, rng);
  ASSERT_TRUE(ValidateStepMeasurement(good).ok());
  std::vector<StepMeasurement> bad;
  StepMeasurement step = good;
  step.verify_ns = -1;
  bad.push_back(step);
  step = good;
  step.draft_ns = -5;
  bad.push_back(step);
  step = good;
  step.verified_nodes = 10;  // N + 2
  bad.push_back(step);
  step = good;
  step.verified_nodes = 1;
  bad.push_back(step);
  step = good;
  step.tree_depth = 9;
  bad.push_back(step);
  step = good;
  step.accepted_depth = good.tree_depth + 1;
  bad.push_back(step);
  step = good;
  step.accepted_depth = -1;
  bad.push_back(step);
  step = good;
  step.draft_forwards = 0;
  bad.push_back(step);
  step = good;
  step.shape.expansions = 0;
  bad.push_back(step);
  StepMeasurement off;  // an off step with a tree
  off.shape = {0, 1, 1};
  off.verified_nodes = 3;
  bad.push_back(off);
  off.verified_nodes = 1;
  off.accepted_depth = 1;
  bad.push_back(off);
  for (const StepMeasurement& measurement : bad) {
    EXPECT_EQ(policy.Record(measurement).code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(policy.steps_recorded(), 1);
  EXPECT_EQ(DescribeShape(policy.Next()), before);
  EXPECT_TRUE(policy.Record(good).ok());
}

}  // namespace
}  // namespace bitsplit::speculation
