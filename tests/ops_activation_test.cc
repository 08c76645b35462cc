#include <algorithm>
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

// The definition in double, for the GELU tests.
double GeluTanhReference(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * x * (1.0 + 0.044715 * x * x)));
}

TEST(GeluTanhTest, MatchesDefinition) {
  for (double x = -12.0; x <= 12.0; x += 0.0137) {
    EXPECT_NEAR(GeluTanh(static_cast<float>(x)), GeluTanhReference(static_cast<float>(x)),
                1e-6 * (1.0 + std::abs(x)))
        << x;
  }
}

// The product in f32: within a few f32 roundings of the definition, everywhere (no fp16 input or
// output rounding, no clamps: an error of |g|·|up|·2^-21 at most, where 1 + tanh cancels).
TEST(GeluTanhMulTest, MatchesDefinitionToF32Rounding) {
  std::vector<float> gate, up;
  for (double x = -14.0; x <= 14.0; x += 0.00731) {
    gate.push_back(static_cast<float>(x));
    up.push_back(static_cast<float>(0.5 + std::sin(x)));
  }
  std::vector<float> out(gate.size());
  GeluTanhMul(gate.data(), up.data(), static_cast<int64_t>(gate.size()), out.data());
  for (size_t i = 0; i < gate.size(); ++i) {
    const double g = gate[i];
    const double bound = std::abs(g) * std::abs(up[i]) * std::ldexp(1.0, -21) + 1e-30;
    EXPECT_NEAR(out[i], GeluTanhReference(g) * up[i], bound) << g;
    EXPECT_EQ(out[i], GeluTanh(gate[i]) * up[i]);  // the one definition, elementwise
  }
  std::vector<float> in_place = gate;
  GeluTanhMul(in_place.data(), up.data(), static_cast<int64_t>(gate.size()), in_place.data());
  EXPECT_EQ(in_place, out);
}

// gpt-oss's clamped SwiGLU against its definition in double: the gate clamped above at the
// limit, up clamped on both sides, the sigmoid sharpened by alpha, and up shifted by one.
TEST(SwigluOaiMulTest, MatchesDefinitionAndClamps) {
  std::vector<float> gate, up;
  for (double x = -12.0; x <= 12.0; x += 0.0173) {
    gate.push_back(static_cast<float>(x));
    up.push_back(static_cast<float>(9.0 * std::sin(3.0 * x)));
  }
  std::vector<float> out(gate.size());
  SwigluOaiMul(gate.data(), up.data(), static_cast<int64_t>(gate.size()), out.data());
  for (size_t i = 0; i < gate.size(); ++i) {
    const double x = std::min<double>(gate[i], 7.0);
    const double y = std::clamp<double>(up[i], -7.0, 7.0);
    const double expected = x / (1.0 + std::exp(-1.702 * x)) * (y + 1.0);
    EXPECT_NEAR(out[i], expected, 1e-5 * (1.0 + std::abs(expected))) << gate[i] << " " << up[i];
  }
  // Beyond the limits the output stops moving: gate 7 and gate 100 agree, as do up 7 and 50.
  const std::vector<float> g = {7.0f, 100.0f, 1.0f, 1.0f}, u = {2.0f, 2.0f, 7.0f, 50.0f};
  std::vector<float> o(4);
  SwigluOaiMul(g.data(), u.data(), 4, o.data());
  EXPECT_EQ(o[0], o[1]);
  EXPECT_EQ(o[2], o[3]);
  // In place over up gives the same bits.
  std::vector<float> in_place = u;
  SwigluOaiMul(g.data(), in_place.data(), 4, in_place.data());
  EXPECT_EQ(in_place, o);
}

}  // namespace
}  // namespace bitsplit::ops
