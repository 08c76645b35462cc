#pragma once
// Random inputs tests build their data from (reproducible: a fixed seed gives the same values).
#include <cstdint>
#include <random>
#include <vector>

namespace bitsplit::testing {

// n samples of N(0, sigma^2) from mt19937 seeded with `seed`.
inline std::vector<float> Gaussian(int64_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = normal(rng);
  return v;
}

}  // namespace bitsplit::testing
