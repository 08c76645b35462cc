#pragma once
// Error measures tests compare results with.
#include <cstddef>
#include <span>

namespace bitsplit::testing {

// Normalized mean squared error: sum (actual - expected)^2 / sum expected^2 (the plain squared
// error when `expected` is all zeros).
inline double Nmse(std::span<const float> actual, std::span<const float> expected) {
  double error = 0.0, energy = 0.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double d = static_cast<double>(actual[i]) - expected[i];
    error += d * d;
    energy += static_cast<double>(expected[i]) * expected[i];
  }
  return energy > 0.0 ? error / energy : error;
}

}  // namespace bitsplit::testing
