#include <cmath>
#include <vector>

#include "common/ops/activation.h"
#include "gtest/gtest.h"

namespace bitsplit::ops {
namespace {

TEST(SiluMulTest, MatchesDefinition) {
  const std::vector<float> gate = {-30.0f, -2.0f, -0.5f, 0.0f, 0.5f, 2.0f, 30.0f};
  const std::vector<float> up = {1.0f, 2.0f, -3.0f, 4.0f, 0.25f, -1.0f, 0.5f};
  std::vector<float> out(gate.size());
  SiluMul(gate.data(), up.data(), gate.size(), out.data());
  for (size_t i = 0; i < gate.size(); ++i) {
    const double g = gate[i];
    const double expected = g / (1.0 + std::exp(-g)) * up[i];
    EXPECT_NEAR(out[i], expected, 1e-6 * (1 + std::abs(expected))) << i;
  }
  EXPECT_EQ(out[3], 0.0f);                  // silu(0) = 0
  EXPECT_NEAR(out[0], 0.0f, 1e-11);         // silu(x) -> 0 for x -> -inf
  EXPECT_NEAR(out[6], 30.0f * 0.5f, 1e-5);  // silu(x) -> x for x -> +inf
}

TEST(SiluMulTest, InPlaceOverGate) {
  std::vector<float> gate = {1.0f, -1.0f};
  const std::vector<float> up = {2.0f, 3.0f};
  std::vector<float> expected(2);
  SiluMul(gate.data(), up.data(), 2, expected.data());
  SiluMul(gate.data(), up.data(), 2, gate.data());
  EXPECT_EQ(gate, expected);
}

}  // namespace
}  // namespace bitsplit::ops
