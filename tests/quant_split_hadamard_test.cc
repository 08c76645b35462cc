// Block Hadamard rotation (common/quant/hadamard.h), checked by identities: it equals the dense
// (1/sqrt(n)) H S product, preserves norms, the inverse restores x, rotating both W and x keeps
// x · Wᵀ, and the AVX2 and scalar versions agree bit for bit.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "common/quant/hadamard.h"
#include "common/util/fp16.h"
#include "tests/testing/random.h"

namespace bitsplit::quant {
namespace {

using testing::Gaussian;

double Norm2(const float* v, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(v[i]) * v[i];
  return s;
}

constexpr int kBlocks[] = {8, 32, 64, 128, 1024};

TEST(Hadamard, MatchesDenseSylvesterProduct) {
  constexpr uint64_t kSeed = 42;
  for (int n : kBlocks) {
    const int64_t cols = 2 * n;
    const std::vector<float> x = Gaussian(cols, n);
    std::vector<float> rotated = x;
    HadamardRotateRows(rotated.data(), 1, cols, n, kSeed);
    for (int64_t b = 0; b < cols; b += n) {
      for (int i = 0; i < n; ++i) {
        double want = 0.0;
        for (int j = 0; j < n; ++j) {
          const double h = (std::popcount(static_cast<unsigned>(i & j)) & 1) ? -1.0 : 1.0;
          want += h * HadamardSign(kSeed, b + j) * x[b + j];
        }
        want /= std::sqrt(static_cast<double>(n));
        EXPECT_NEAR(rotated[b + i], want, 1e-5 * std::sqrt(static_cast<double>(n)))
            << "n=" << n << " i=" << i;
      }
    }
  }
}

TEST(Hadamard, Avx2MatchesScalarBitForBit) {
  for (int n : kBlocks) {
    const int64_t rows = 3, cols = 4 * n;
    const std::vector<float> x = Gaussian(rows * cols, 100 + n);
    std::vector<float> fast = x, slow = x;
    HadamardRotateRows(fast.data(), rows, cols, n, 7);
    HadamardRotateRowsReference(slow.data(), rows, cols, n, 7);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(BitsFromFp32(fast[i]), BitsFromFp32(slow[i]));
    HadamardUnrotateRows(fast.data(), rows, cols, n, 7);
    HadamardUnrotateRowsReference(slow.data(), rows, cols, n, 7);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(BitsFromFp32(fast[i]), BitsFromFp32(slow[i]));
  }
}

TEST(Hadamard, OrthonormalAndInvertible) {
  for (int n : kBlocks) {
    const int64_t rows = 4, cols = 3 * n;
    const std::vector<float> x = Gaussian(rows * cols, 200 + n);
    std::vector<float> y = x;
    HadamardRotateRows(y.data(), rows, cols, n, 99);
    for (int64_t r = 0; r < rows; ++r) {
      // Norm of every block is preserved (orthonormal), up to f32 rounding.
      for (int64_t b = 0; b < cols; b += n) {
        const double before = Norm2(&x[r * cols + b], n), after = Norm2(&y[r * cols + b], n);
        EXPECT_NEAR(after / before, 1.0, 1e-5) << "n=" << n;
      }
    }
    HadamardUnrotateRows(y.data(), rows, cols, n, 99);
    double err = 0.0;
    for (size_t i = 0; i < x.size(); ++i) err = std::max(err, std::fabs(double(y[i]) - x[i]));
    EXPECT_LT(err, 1e-5) << "n=" << n;
  }
}

TEST(Hadamard, RotatingWeightsAndActivationsKeepsProducts) {
  const int n = 64;
  const int64_t rows = 6, cols = 4 * n, tokens = 3;
  std::vector<float> w = Gaussian(rows * cols, 300), x = Gaussian(tokens * cols, 301);
  // A heavy outlier column, which the rotation spreads over its block.
  for (int64_t t = 0; t < tokens; ++t) x[t * cols + 5] = 40.0f;
  std::vector<double> before(tokens * rows), after(tokens * rows);
  auto products = [&](std::vector<double>* out) {
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t r = 0; r < rows; ++r) {
        double s = 0.0;
        for (int64_t k = 0; k < cols; ++k) s += double(x[t * cols + k]) * w[r * cols + k];
        (*out)[t * rows + r] = s;
      }
    }
  };
  products(&before);
  float max_before = 0.0f;
  for (int64_t k = 0; k < n; ++k) max_before = std::max(max_before, std::fabs(x[k]));
  HadamardRotateRows(w.data(), rows, cols, n, 5);
  HadamardRotateRows(x.data(), tokens, cols, n, 5);
  products(&after);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_NEAR(after[i], before[i], 1e-4);
  float max_after = 0.0f;
  for (int64_t k = 0; k < n; ++k) max_after = std::max(max_after, std::fabs(x[k]));
  EXPECT_LT(max_after, max_before / 4);  // the outlier is spread: 40 -> about 40 / sqrt(64)
}

TEST(Hadamard, SignsDependOnSeedOnly) {
  int negative = 0;
  int differ = 0;
  for (int64_t j = 0; j < 4096; ++j) {
    const float s = HadamardSign(1, j);
    ASSERT_TRUE(s == 1.0f || s == -1.0f);
    negative += s < 0;
    differ += s != HadamardSign(2, j);
    ASSERT_EQ(s, HadamardSign(1, j));
  }
  EXPECT_NEAR(negative, 2048, 200);
  EXPECT_NEAR(differ, 2048, 200);
  // Rows are rotated with the same signs: a row's result does not depend on its neighbours.
  const std::vector<float> x = Gaussian(2 * 128, 400);
  std::vector<float> both = x, first(x.begin(), x.begin() + 128);
  HadamardRotateRows(both.data(), 2, 128, 32, 3);
  HadamardRotateRows(first.data(), 1, 128, 32, 3);
  for (int i = 0; i < 128; ++i) ASSERT_EQ(BitsFromFp32(both[i]), BitsFromFp32(first[i]));
}

TEST(Hadamard, RejectsBadBlocks) {
  EXPECT_FALSE(ValidateHadamard(48, 96).ok());
  EXPECT_FALSE(ValidateHadamard(4, 96).ok());
  EXPECT_FALSE(ValidateHadamard(2048, 4096).ok());
  EXPECT_FALSE(ValidateHadamard(64, 96).ok());
  EXPECT_TRUE(ValidateHadamard(32, 96).ok());
}

}  // namespace
}  // namespace bitsplit::quant
