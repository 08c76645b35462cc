#include <cmath>
#include <vector>

#include "common/ops/softmax.h"
#include "gtest/gtest.h"

namespace bitsplit::ops {
namespace {

const std::vector<float> kLogits = {1.5f, -2.0f, 0.25f, 3.0f, 3.0f, -40.0f, 0.0f};

TEST(SoftmaxTest, SumsToOneAndIsPositive) {
  std::vector<float> p(kLogits.size());
  Softmax(kLogits.data(), kLogits.size(), p.data());
  double sum = 0;
  for (float v : p) {
    EXPECT_GT(v, 0.0f);
    sum += v;
  }
  EXPECT_NEAR(sum, 1.0, 1e-6);
}

TEST(SoftmaxTest, MatchesDirectFormula) {
  std::vector<float> p(kLogits.size());
  Softmax(kLogits.data(), kLogits.size(), p.data());
  double z = 0;
  for (float v : kLogits) z += std::exp(double{v});
  for (size_t i = 0; i < kLogits.size(); ++i) {
    EXPECT_NEAR(p[i], std::exp(double{kLogits[i]}) / z, 1e-7) << i;
  }
}

TEST(SoftmaxTest, ShiftInvariantAndSafeForHugeLogits) {
  std::vector<float> shifted = kLogits;
  for (float& v : shifted) v += 1000.0f;  // exp(1000) would overflow without max subtraction
  std::vector<float> p(kLogits.size()), q(kLogits.size());
  Softmax(kLogits.data(), kLogits.size(), p.data());
  Softmax(shifted.data(), shifted.size(), q.data());
  for (size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(p[i], q[i], 1e-6) << i;
  EXPECT_NEAR(LogSumExp(shifted.data(), shifted.size()),
              LogSumExp(kLogits.data(), kLogits.size()) + 1000.0, 1e-9);
}

TEST(SoftmaxTest, LogSoftmaxIsLogOfSoftmax) {
  std::vector<float> p(kLogits.size()), log_p(kLogits.size());
  Softmax(kLogits.data(), kLogits.size(), p.data());
  LogSoftmax(kLogits.data(), kLogits.size(), log_p.data());
  for (size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(std::exp(log_p[i]), p[i], 1e-6) << i;
}

TEST(SoftmaxTest, LogSumExpOfEqualValues) {
  const std::vector<float> zeros(4, 0.0f);
  EXPECT_NEAR(LogSumExp(zeros.data(), zeros.size()), std::log(4.0), 1e-12);
}

TEST(SoftmaxTest, ArgMaxPicksFirstOfTies) {
  EXPECT_EQ(ArgMax(kLogits.data(), kLogits.size()), 3);
  const float single = -5.0f;
  EXPECT_EQ(ArgMax(&single, 1), 0);
}

}  // namespace
}  // namespace bitsplit::ops
