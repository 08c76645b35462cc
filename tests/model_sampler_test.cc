// Sampling: expectations come from the definitions (argmax, softmax frequencies, truncation
// sets), not from earlier outputs of this code.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "common/model/sampler.h"

namespace bitsplit::model {
namespace {

TEST(Sampler, GreedyIsArgmaxWithLowestIdOnTies) {
  Sampler sampler;
  SamplingParams greedy;
  EXPECT_EQ(sampler.Choose(std::vector<float>{0.1f, 3.0f, -2.0f, 2.9f}, greedy, 7), 1);
  EXPECT_EQ(sampler.Choose(std::vector<float>{1.0f, 5.0f, 5.0f}, greedy, 0), 1);
}

TEST(Sampler, UniformDependsOnlyOnSeedAndPosition) {
  EXPECT_EQ(UniformForPosition(42, 1000), UniformForPosition(42, 1000));
  EXPECT_NE(UniformForPosition(42, 1000), UniformForPosition(42, 1001));
  EXPECT_NE(UniformForPosition(42, 1000), UniformForPosition(43, 1000));
  double sum = 0.0, sum_sq = 0.0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double u = UniformForPosition(7, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    sum_sq += u * u;
  }
  // Mean 1/2 and variance 1/12 of U(0,1), within ~5 standard errors.
  EXPECT_NEAR(sum / n, 0.5, 5 * std::sqrt(1.0 / 12 / n));
  EXPECT_NEAR(sum_sq / n - (sum / n) * (sum / n), 1.0 / 12, 0.002);
}

TEST(Sampler, SameDrawWhateverTheCallOrder) {
  Sampler sampler;
  SamplingParams params{.temperature = 0.8f, .top_k = 0, .top_p = 1.0f, .seed = 3};
  std::vector<float> logits = {0.5f, 0.2f, 0.9f, -1.0f, 0.0f};
  std::vector<int32_t> forward, backward(64);
  for (int p = 0; p < 64; ++p) forward.push_back(sampler.Choose(logits, params, p));
  for (int p = 63; p >= 0; --p) backward[p] = sampler.Choose(logits, params, p);
  EXPECT_EQ(forward, backward);
}

TEST(Sampler, FrequenciesFollowTemperatureSoftmax) {
  Sampler sampler;
  std::vector<float> logits = {1.0f, 2.0f, 0.0f, 1.5f};
  SamplingParams params{.temperature = 0.7f, .top_k = 0, .top_p = 1.0f, .seed = 11};
  std::vector<double> expected(logits.size());
  double total = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) total += expected[i] = std::exp(logits[i] / 0.7);
  std::vector<int> counts(logits.size(), 0);
  const int n = 100000;
  for (int p = 0; p < n; ++p) ++counts[sampler.Choose(logits, params, p)];
  for (size_t i = 0; i < logits.size(); ++i) {
    const double prob = expected[i] / total;
    const double stderr_count = std::sqrt(n * prob * (1 - prob));
    EXPECT_NEAR(counts[i], n * prob, 5 * stderr_count) << "token " << i;
  }
}

TEST(Sampler, TopKAndTopPTruncate) {
  Sampler sampler;
  std::vector<float> logits = {0.0f, 3.0f, 2.9f, -1.0f, 2.8f};
  SamplingParams top2{.temperature = 1.0f, .top_k = 2, .top_p = 1.0f, .seed = 5};
  std::map<int32_t, int> seen;
  for (int p = 0; p < 2000; ++p) ++seen[sampler.Choose(logits, top2, p)];
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_TRUE(seen.count(1) && seen.count(2));

  // Probabilities at T=1: token 1 ~0.36, token 2 ~0.33; top_p 0.5 keeps exactly those two.
  SamplingParams nucleus{.temperature = 1.0f, .top_k = 0, .top_p = 0.5f, .seed = 5};
  seen.clear();
  for (int p = 0; p < 2000; ++p) ++seen[sampler.Choose(logits, nucleus, p)];
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_TRUE(seen.count(1) && seen.count(2));

  SamplingParams k1{.temperature = 1.0f, .top_k = 1, .top_p = 1.0f, .seed = 9};
  SamplingParams tiny_p{.temperature = 1.0f, .top_k = 0, .top_p = 1e-6f, .seed = 9};
  for (int p = 0; p < 100; ++p) {
    EXPECT_EQ(sampler.Choose(logits, k1, p), 1);
    EXPECT_EQ(sampler.Choose(logits, tiny_p, p), 1);
  }
}

TEST(Sampler, LogProbMatchesSoftmaxAndTruncation) {
  Sampler sampler;
  std::vector<float> logits = {1.0f, 2.0f, 3.0f};
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  SamplingParams plain{.temperature = 1.0f};
  EXPECT_NEAR(sampler.LogProb(logits, plain, 0), 1.0 - std::log(z), 1e-12);
  SamplingParams top1{.temperature = 1.0f, .top_k = 1};
  EXPECT_EQ(sampler.LogProb(logits, top1, 2), 0.0);
  EXPECT_EQ(sampler.LogProb(logits, top1, 0), -INFINITY);
}

TEST(Sampler, ValidationRejectsBadParameters) {
  EXPECT_TRUE(ValidateSamplingParams({}).ok());
  EXPECT_FALSE(ValidateSamplingParams({.temperature = -0.1f}).ok());
  EXPECT_FALSE(ValidateSamplingParams({.temperature = NAN}).ok());
  EXPECT_FALSE(ValidateSamplingParams({.temperature = INFINITY}).ok());
  EXPECT_FALSE(ValidateSamplingParams({.top_k = -1}).ok());
  EXPECT_FALSE(ValidateSamplingParams({.top_p = 0.0f}).ok());
  EXPECT_FALSE(ValidateSamplingParams({.top_p = 1.5f}).ok());
  auto status = ValidateSamplingParams({.top_p = 2.0f});
  EXPECT_NE(status.message().find("top_p"), std::string::npos);
}

}  // namespace
}  // namespace bitsplit::model
