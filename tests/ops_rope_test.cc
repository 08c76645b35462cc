#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/ops/rope.h"
#include "gtest/gtest.h"

namespace bitsplit::ops {
namespace {

constexpr int64_t kHeadDim = 64;
constexpr int64_t kHeads = 3;

RopeConfig Config() {
  return RopeConfig{.head_dim = kHeadDim, .rotary_dims = kHeadDim, .freq_base = 100000.0f};
}

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

double Dot(const float* a, const float* b, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += double{a[i]} * b[i];
  return sum;
}

TEST(RopeTest, PositionZeroIsIdentity) {
  const std::vector<float> x = Random(kHeads * kHeadDim, 1);
  std::vector<float> y = x;
  const int32_t position = 0;
  ApplyRope(y.data(), 1, kHeads, &position, Config());
  EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0);
}

TEST(RopeTest, RotatesAdjacentPairsByTheDocumentedAngles) {
  // Unit vector in each pair's first coordinate: pair i must become (cos, sin) of its angle,
  // theta_i = position * base^(-2i / d) (computed here in double, directly).
  constexpr int32_t kPosition = 7;
  for (int64_t pair = 0; pair < kHeadDim / 2; ++pair) {
    std::vector<float> x(kHeadDim, 0.0f);
    x[2 * pair] = 1.0f;
    ApplyRope(x.data(), 1, 1, &kPosition, Config());
    const double theta = kPosition * std::pow(100000.0, -2.0 * pair / kHeadDim);
    EXPECT_NEAR(x[2 * pair], std::cos(theta), 1e-5) << "pair " << pair;
    EXPECT_NEAR(x[2 * pair + 1], std::sin(theta), 1e-5) << "pair " << pair;
    for (int64_t i = 0; i < kHeadDim; ++i) {
      if (i / 2 != pair) {
        EXPECT_EQ(x[i], 0.0f) << "pair " << pair << " leaked into " << i;
      }
    }
  }
}

TEST(RopeTest, PreservesPairNorms) {
  const std::vector<float> x = Random(2 * kHeads * kHeadDim, 2);
  std::vector<float> y = x;
  const int32_t positions[2] = {5, 4000};
  ApplyRope(y.data(), 2, kHeads, positions, Config());
  for (size_t i = 0; i < x.size(); i += 2) {
    const double before = std::hypot(double{x[i]}, double{x[i + 1]});
    const double after = std::hypot(double{y[i]}, double{y[i + 1]});
    EXPECT_NEAR(after, before, 1e-5 * (1 + before)) << "pair at " << i;
  }
}

TEST(RopeTest, ScoresDependOnlyOnRelativePosition) {
  const std::vector<float> q = Random(kHeadDim, 3);
  const std::vector<float> k = Random(kHeadDim, 4);
  auto score = [&](int32_t q_position, int32_t k_position) {
    std::vector<float> qr = q, kr = k;
    ApplyRope(qr.data(), 1, 1, &q_position, Config());
    ApplyRope(kr.data(), 1, 1, &k_position, Config());
    return Dot(qr.data(), kr.data(), kHeadDim);
  };
  EXPECT_NEAR(score(10, 3), score(107, 100), 1e-3);
  EXPECT_NEAR(score(3, 3), score(50, 50), 1e-3);
  EXPECT_NEAR(score(3, 3), Dot(q.data(), k.data(), kHeadDim), 1e-4);
}

TEST(RopeTest, LeavesDimsBeyondRotaryDimsUnchanged) {
  RopeConfig config = Config();
  config.rotary_dims = 32;
  const std::vector<float> x = Random(kHeads * kHeadDim, 5);
  std::vector<float> y = x;
  const int32_t position = 9;
  ApplyRope(y.data(), 1, kHeads, &position, config);
  for (int64_t h = 0; h < kHeads; ++h) {
    for (int64_t i = 0; i < kHeadDim; ++i) {
      const int64_t at = h * kHeadDim + i;
      if (i < 32) {
        EXPECT_NE(y[at], x[at]) << at;
      } else {
        EXPECT_EQ(y[at], x[at]) << at;
      }
    }
  }
}

TEST(RopeTest, FrequencyFactorsDivideTheAngle) {
  // Factor 2 on every pair at position 2p is exactly position p without factors (scaling by 2
  // is exact in binary floating point).
  const std::vector<float> factors(kHeadDim / 2, 2.0f);
  RopeConfig with_factors = Config();
  with_factors.freq_factors = factors.data();
  const std::vector<float> x = Random(kHeads * kHeadDim, 6);
  std::vector<float> a = x, b = x;
  const int32_t double_position = 246, position = 123;
  ApplyRope(a.data(), 1, kHeads, &double_position, with_factors);
  ApplyRope(b.data(), 1, kHeads, &position, Config());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

TEST(RopeTest, EachTokenUsesItsOwnPosition) {
  const std::vector<float> x = Random(3 * kHeads * kHeadDim, 7);
  std::vector<float> batched = x;
  const int32_t positions[3] = {12, 3, 12};
  ApplyRope(batched.data(), 3, kHeads, positions, Config());
  for (int64_t t = 0; t < 3; ++t) {
    std::vector<float> alone(x.begin() + t * kHeads * kHeadDim,
                             x.begin() + (t + 1) * kHeads * kHeadDim);
    ApplyRope(alone.data(), 1, kHeads, &positions[t], Config());
    EXPECT_EQ(std::memcmp(alone.data(), batched.data() + t * kHeads * kHeadDim,
                          alone.size() * sizeof(float)),
              0)
        << "token " << t;
  }
}

// NEOX pairing is the adjacent-pair rotation of the same head with its halves interleaved:
// (x[i], x[i + d/2]) sit at (2i, 2i + 1) after the permutation, so the bits must agree exactly.
TEST(RopeTest, HalvesStyleIsAdjacentPairsOfTheInterleavedHead) {
  const int64_t rotary = 48;  // 16 trailing dims pass through unchanged
  RopeConfig adjacent{.head_dim = kHeadDim, .rotary_dims = rotary, .freq_base = 10000.0f};
  RopeConfig halves = adjacent;
  halves.style = RopeStyle::kHalves;
  const std::vector<float> x = Random(kHeads * kHeadDim, 7);
  std::vector<float> interleaved = x;
  for (int64_t h = 0; h < kHeads; ++h) {
    for (int64_t i = 0; i < rotary / 2; ++i) {
      interleaved[h * kHeadDim + 2 * i] = x[h * kHeadDim + i];
      interleaved[h * kHeadDim + 2 * i + 1] = x[h * kHeadDim + i + rotary / 2];
    }
  }
  const int32_t position = 1234;
  std::vector<float> y = x;
  ApplyRope(y.data(), 1, kHeads, &position, halves);
  ApplyRope(interleaved.data(), 1, kHeads, &position, adjacent);
  for (int64_t h = 0; h < kHeads; ++h) {
    for (int64_t i = 0; i < rotary / 2; ++i) {
      EXPECT_EQ(y[h * kHeadDim + i], interleaved[h * kHeadDim + 2 * i]);
      EXPECT_EQ(y[h * kHeadDim + i + rotary / 2], interleaved[h * kHeadDim + 2 * i + 1]);
    }
    for (int64_t d = rotary; d < kHeadDim; ++d) EXPECT_EQ(y[h * kHeadDim + d], x[h * kHeadDim + d]);
  }
}

// YaRN with gpt-oss's numbers (64 rotary dims, base 150000, 4096 original context, factor 32):
// the correction dims are floor/ceil of d ln(ctx / (2 pi beta)) / (2 ln base) for beta 32 and 1
// (8 and 18 here); pairs below the first keep the unscaled angle, pairs above the second take the
// interpolated angle (divided by the factor), pairs between blend linearly; every pair's length
// is multiplied by 1 + 0.1 ln 32.
TEST(RopeTest, YarnBlendsExtrapolationAndInterpolationAcrossTheCorrectionDims) {
  const RopeConfig config{.head_dim = 64,
                          .rotary_dims = 64,
                          .freq_base = 150000.0f,
                          .freq_scale = 1.0f / 32.0f,
                          .style = RopeStyle::kHalves,
                          .ext_factor = 1.0f,
                          .yarn_original_context = 4096};
  float dims[2];
  YarnCorrectionDims(config, dims);
  const double ln_base = std::log(150000.0);
  const auto corr = [&](double beta) {
    return 64.0 * std::log(4096.0 / (beta * 2.0 * M_PI)) / (2.0 * ln_base);
  };
  EXPECT_EQ(dims[0], std::floor(corr(32.0)));
  EXPECT_EQ(dims[1], std::ceil(corr(1.0)));
  EXPECT_EQ(dims[0], 8.0f);
  EXPECT_EQ(dims[1], 18.0f);
  const double mscale = 1.0 + 0.1 * std::log(32.0);
  constexpr int32_t kPosition = 300;
  for (int64_t pair = 0; pair < 32; ++pair) {
    std::vector<float> x(64, 0.0f);
    x[pair] = 1.0f;  // halves: pair i is (x[i], x[i + 32])
    ApplyRope(x.data(), 1, 1, &kPosition, config);
    const double extrapolated = kPosition * std::pow(150000.0, -2.0 * pair / 64.0);
    const double ramp = 1.0 - std::clamp((pair - 8.0) / 10.0, 0.0, 1.0);
    const double angle = extrapolated / 32.0 * (1.0 - ramp) + extrapolated * ramp;
    EXPECT_NEAR(x[pair], mscale * std::cos(angle), 1e-4) << "pair " << pair;
    EXPECT_NEAR(x[pair + 32], mscale * std::sin(angle), 1e-4) << "pair " << pair;
  }
  // Without ext_factor the same config is linear scaling, with attn_factor as the length.
  RopeConfig linear = config;
  linear.ext_factor = 0.0f;
  linear.attn_factor = 0.5f;
  std::vector<float> x(64, 0.0f);
  x[3] = 1.0f;
  ApplyRope(x.data(), 1, 1, &kPosition, linear);
  const double angle = kPosition * std::pow(150000.0, -6.0 / 64.0) / 32.0;
  EXPECT_NEAR(x[3], 0.5 * std::cos(angle), 1e-5);
  EXPECT_NEAR(x[35], 0.5 * std::sin(angle), 1e-5);
}

}  // namespace
}  // namespace bitsplit::ops
