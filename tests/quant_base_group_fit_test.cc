// The group fitter's level sums against their definition: each value's code from the scalar
// expression, summed value by value in double.
#include <gtest/gtest.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "common/quant/base_group_fit.h"

namespace bitsplit::quant {
namespace {

using LevelSums = BaseGroupFitter::LevelSums;

LevelSums Direct(const GroupData& g, int levels, float d, float m, float offset, bool asymmetric) {
  LevelSums sums;
  sums.levels = levels;
  std::fill(sums.a, sums.a + kMaxBaseLevels, 0.0);
  std::fill(sums.aw, sums.aw + kMaxBaseLevels, 0.0);
  std::fill(sums.aww, sums.aww + kMaxBaseLevels, 0.0);
  for (int i = 0; i < g.n; ++i) {
    const float u =
        asymmetric ? std::nearbyint((g.w[i] - m) / d) : std::nearbyint(g.w[i] / d + offset);
    const int q = static_cast<int>(std::clamp(u, 0.0f, static_cast<float>(levels - 1)));
    const double w = g.w[i], a = g.a[i];
    sums.a[q] += a;
    sums.aw[q] += a * w;
    sums.aww[q] += a * w * w;
  }
  return sums;
}

void ExpectSame(const LevelSums& got, const LevelSums& want, const char* what) {
  ASSERT_EQ(got.levels, want.levels);
  double scale = 0.0;
  for (int k = 0; k < want.levels; ++k) scale += want.a[k] + std::fabs(want.aw[k]) + want.aww[k];
  for (int k = 0; k < want.levels; ++k) {
    // The same values on each level; only the order of the additions differs.
    EXPECT_NEAR(got.a[k], want.a[k], 1e-12 * scale) << what << " level " << k;
    EXPECT_NEAR(got.aw[k], want.aw[k], 1e-12 * scale) << what << " level " << k;
    EXPECT_NEAR(got.aww[k], want.aww[k], 1e-12 * scale) << what << " level " << k;
  }
}

// Values that make the level assignment hard: repeats, both zeros, and values exactly halfway
// between two levels of the candidate (where round-half-even decides).
std::vector<float> HardValues(int n, float d, float m, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(n);
  for (int i = 0; i < n; ++i) {
    switch (i % 5) {
      case 0:
        w[i] = normal(rng);
        break;
      case 1:
        w[i] = m + d * (static_cast<float>(i % 7) + 0.5f);  // a tie (often exactly)
        break;
      case 2:
        w[i] = i % 2 ? 0.0f : -0.0f;
        break;
      case 3:
        w[i] = w[i - 3];  // a repeat
        break;
      default:
        w[i] = 4.0f * normal(rng);  // beyond the grid: clamped
    }
  }
  std::shuffle(w.begin(), w.end(), rng);
  return w;
}

TEST(BaseGroupFit, LevelSumsMatchTheirDefinition) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> weight(0.0f, 3.0f);
  BaseGroupFitter fitter;
  for (int n : {32, 64, 256}) {
    for (int levels : {3, 4, 8, 16}) {
      for (int trial = 0; trial < 20; ++trial) {
        const float d = 0.25f * (1 + trial % 4), m = -0.5f * levels * d + 0.1f * (trial % 3);
        const std::vector<float> w = HardValues(n, d, m, rng);
        std::vector<float> a(n, 1.0f);
        if (trial % 2) {
          for (float& x : a) x = weight(rng);
        }
        const GroupData g{w.data(), a.data(), n};
        ExpectSame(fitter.AsymmetricLevelsForTest(g, levels, d, m),
                   Direct(g, levels, d, m, 0.0f, true), "asymmetric");
        // Symmetric, with either sign of the scale (mid-tread grids use both).
        const float offset = levels % 2 ? (levels - 1) / 2.0f : levels / 2.0f;
        for (float sd : {d, -d}) {
          ExpectSame(fitter.SymmetricLevelsForTest(g, levels, sd, offset),
                     Direct(g, levels, sd, 0.0f, offset, false), "symmetric");
        }
      }
    }
  }
}

// The fitted codes are the stored parameters' nearest levels, and the chosen parameters are at
// least as good as every candidate the search is documented to consider that we recompute here
// by brute force on the same grid (range-derived asymmetric parameters).
TEST(BaseGroupFit, AsymmetricFitBeatsTheRangeCandidate) {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  BaseGroupFitter fitter;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> w(64), a(64, 1.0f);
    for (float& x : w) x = normal(rng);
    std::vector<uint8_t> codes(64);
    uint16_t dh, mh;
    fitter.FitAsymmetric(GroupData{w.data(), a.data(), 64}, 4, codes.data(), &dh, &mh);
    const float d = _cvtsh_ss(dh), m = _cvtsh_ss(mh);
    const auto [lo, hi] = std::minmax_element(w.begin(), w.end());
    const float rd = _cvtsh_ss(_cvtss_sh((*hi - *lo) / 3, 0)), rm = _cvtsh_ss(_cvtss_sh(*lo, 0));
    double fitted = 0, range = 0;
    for (int i = 0; i < 64; ++i) {
      const float y = d * codes[i] + m;
      fitted += (w[i] - y) * static_cast<double>(w[i] - y);
      const float q = std::clamp(std::nearbyint((w[i] - rm) / rd), 0.0f, 3.0f);
      const float yr = rd * q + rm;
      range += (w[i] - yr) * static_cast<double>(w[i] - yr);
      const float nearest = std::clamp(std::nearbyint((w[i] - m) / d), 0.0f, 3.0f);
      ASSERT_EQ(codes[i], static_cast<uint8_t>(nearest));
    }
    EXPECT_LE(fitted, range * (1 + 1e-9));
  }
}

}  // namespace
}  // namespace bitsplit::quant
