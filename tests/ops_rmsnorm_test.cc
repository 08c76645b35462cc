#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/ops/rmsnorm.h"
#include "gtest/gtest.h"

namespace bitsplit::ops {
namespace {

std::vector<float> Random(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

TEST(RmsNormTest, UnitWeightGivesUnitRootMeanSquare) {
  constexpr int64_t kN = 576;
  const std::vector<float> x = Random(kN, 1, 3.0f);
  const std::vector<float> ones(kN, 1.0f);
  std::vector<float> y(kN);
  RmsNorm(x.data(), 1, kN, ones.data(), 0.0f, y.data());
  double sum = 0;
  for (float v : y) sum += double{v} * v;
  EXPECT_NEAR(std::sqrt(sum / kN), 1.0, 1e-6);
}

TEST(RmsNormTest, MatchesDirectFormulaWithWeightAndEps) {
  constexpr int64_t kN = 37;
  constexpr float kEps = 1e-2f;
  const std::vector<float> x = Random(kN, 2, 0.1f);
  const std::vector<float> weight = Random(kN, 3);
  std::vector<float> y(kN);
  RmsNorm(x.data(), 1, kN, weight.data(), kEps, y.data());
  double mean_square = 0;
  for (float v : x) mean_square += double{v} * v / kN;
  const double scale = 1.0 / std::sqrt(mean_square + kEps);
  for (int64_t i = 0; i < kN; ++i) {
    EXPECT_NEAR(y[i], x[i] * scale * weight[i], 1e-6 * (1 + std::abs(y[i]))) << i;
  }
}

TEST(RmsNormTest, ScaleInvariantWithoutEps) {
  constexpr int64_t kN = 64;
  const std::vector<float> x = Random(kN, 4);
  std::vector<float> scaled = x;
  for (float& v : scaled) v *= 8.0f;
  const std::vector<float> weight = Random(kN, 5);
  std::vector<float> a(kN), b(kN);
  RmsNorm(x.data(), 1, kN, weight.data(), 0.0f, a.data());
  RmsNorm(scaled.data(), 1, kN, weight.data(), 0.0f, b.data());
  for (int64_t i = 0; i < kN; ++i) EXPECT_NEAR(a[i], b[i], 1e-6 * (1 + std::abs(a[i])));
}

TEST(RmsNormTest, RowsAreIndependentAndInPlaceWorks) {
  constexpr int64_t kN = 48, kRows = 5;
  const std::vector<float> x = Random(kN * kRows, 6);
  const std::vector<float> weight = Random(kN, 7);
  std::vector<float> batched = x;
  RmsNorm(batched.data(), kRows, kN, weight.data(), 1e-5f, batched.data());
  for (int64_t r = 0; r < kRows; ++r) {
    std::vector<float> alone(kN);
    RmsNorm(x.data() + r * kN, 1, kN, weight.data(), 1e-5f, alone.data());
    EXPECT_EQ(std::memcmp(alone.data(), batched.data() + r * kN, kN * sizeof(float)), 0) << r;
  }
}

}  // namespace
}  // namespace bitsplit::ops
