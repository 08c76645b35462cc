#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/ops/attention.h"
#include "gtest/gtest.h"

namespace bitsplit::ops {
namespace {

// 4 query heads share 2 kv heads; head_dim 20 leaves a 4-element tail after the 8-lane groups.
constexpr AttentionShape kShape{.num_heads = 4, .num_kv_heads = 2, .head_dim = 20, .scale = 0.3f};
constexpr int64_t kQDim = 4 * 20;
constexpr int64_t kKvDim = 2 * 20;
constexpr int64_t kPrefix = 5;
constexpr int64_t kTokens = 4;

// f32 cache rows of kKvDim elements.
KvRows F32Rows(const std::vector<float>& rows) {
  return {reinterpret_cast<const uint8_t*>(rows.data()), KvType::kF32, kKvDim * 4};
}

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

// Token 0 is a child of the prefix, 1 and 2 are children of 0, 3 is a child of 2.
const std::vector<uint8_t> kTreeMask = {
    1, 0, 0, 0,  //
    1, 1, 0, 0,  //
    1, 0, 1, 0,  //
    1, 0, 1, 1,  //
};
const std::vector<uint8_t> kCausalMask = {
    1, 0, 0, 0,  //
    1, 1, 0, 0,  //
    1, 1, 1, 0,  //
    1, 1, 1, 1,  //
};

// Softmax attention in double, straight from the definition.
// With `sinks`, head h's softmax denominator also holds exp(sinks[h]) (no value).
std::vector<double> Reference(const std::vector<float>& q, const std::vector<float>& keys,
                              const std::vector<float>& values, const std::vector<uint8_t>& mask,
                              const float* sinks = nullptr) {
  std::vector<double> out(kTokens * kQDim, 0.0);
  const int64_t group = kShape.num_heads / kShape.num_kv_heads;
  for (int64_t t = 0; t < kTokens; ++t) {
    std::vector<int64_t> visible;
    for (int64_t s = 0; s < kPrefix; ++s) visible.push_back(s);
    for (int64_t j = 0; j < kTokens; ++j) {
      if (mask[t * kTokens + j]) visible.push_back(kPrefix + j);
    }
    for (int64_t h = 0; h < kShape.num_heads; ++h) {
      const int64_t kv = (h / group) * kShape.head_dim;
      std::vector<double> scores;
      double max_score = -1e300;
      for (int64_t s : visible) {
        double dot = 0;
        for (int64_t d = 0; d < kShape.head_dim; ++d) {
          dot += double{q[t * kQDim + h * kShape.head_dim + d]} * keys[s * kKvDim + kv + d];
        }
        scores.push_back(dot * kShape.scale);
        max_score = std::max(max_score, scores.back());
      }
      double sum = 0;
      for (double& s : scores) sum += (s = std::exp(s - max_score));
      if (sinks != nullptr) sum += std::exp(double{sinks[h]} - max_score);
      for (size_t j = 0; j < visible.size(); ++j) {
        for (int64_t d = 0; d < kShape.head_dim; ++d) {
          out[t * kQDim + h * kShape.head_dim + d] +=
              scores[j] / sum * values[visible[j] * kKvDim + kv + d];
        }
      }
    }
  }
  return out;
}

class AttentionTest : public ::testing::Test {
 protected:
  std::vector<float> q_ = Random(kTokens * kQDim, 1);
  std::vector<float> keys_ = Random((kPrefix + kTokens) * kKvDim, 2);
  std::vector<float> values_ = Random((kPrefix + kTokens) * kKvDim, 3);

  std::vector<float> Run(const std::vector<uint8_t>& mask, int threads,
                         const float* sinks = nullptr) {
    ThreadPool pool(threads);
    std::vector<float> out(kTokens * kQDim);
    AttentionShape shape = kShape;
    shape.sinks = sinks;
    Attention(q_.data(), kTokens, F32Rows(keys_), F32Rows(values_), kPrefix, mask.data(), shape,
              out.data(), pool);
    return out;
  }
};

TEST_F(AttentionTest, MatchesDoubleReference) {
  for (const auto* mask : {&kCausalMask, &kTreeMask}) {
    const std::vector<float> out = Run(*mask, 2);
    const std::vector<double> expected = Reference(q_, keys_, values_, *mask);
    for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], expected[i], 1e-5) << i;
  }
}

// Sinks (gpt-oss) take probability mass without adding a value: a sink far below the scores
// changes nothing measurable, one far above drives the output to zero, and in between the
// output is the reference's with the sink in the denominator (the largest sink here is above
// every score, so it also sets the softmax's maximum).
TEST_F(AttentionTest, SinksJoinTheDenominator) {
  const std::vector<float> sinks = {-1.5f, 0.0f, 2.5f, 40.0f};
  for (const auto* mask : {&kCausalMask, &kTreeMask}) {
    const std::vector<float> out = Run(*mask, 2, sinks.data());
    const std::vector<double> expected = Reference(q_, keys_, values_, *mask, sinks.data());
    for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], expected[i], 1e-5) << i;
    for (int64_t t = 0; t < kTokens; ++t) {
      for (int64_t d = 0; d < kShape.head_dim; ++d) {
        EXPECT_NEAR(out[t * kQDim + 3 * kShape.head_dim + d], 0.0f, 1e-12);
      }
    }
  }
  const std::vector<float> far_below(4, -1000.0f);
  EXPECT_EQ(Run(kTreeMask, 2, far_below.data()), Run(kTreeMask, 2));
}

TEST_F(AttentionTest, IndependentOfThreadCount) {
  const std::vector<float> one = Run(kTreeMask, 1);
  for (int threads : {2, 3, 5}) {
    const std::vector<float> many = Run(kTreeMask, threads);
    EXPECT_EQ(std::memcmp(one.data(), many.data(), one.size() * sizeof(float)), 0) << threads;
  }
}

// A tree node's output equals, bit for bit, running its root-to-node path alone: the path's
// ancestors then sit in the committed prefix and the node is a batch of one.
TEST_F(AttentionTest, TreeNodeMatchesItsPathRunAlone) {
  const std::vector<float> batched = Run(kTreeMask, 2);
  ThreadPool pool(2);
  for (int64_t t = 0; t < kTokens; ++t) {
    std::vector<float> keys(keys_.begin(), keys_.begin() + kPrefix * kKvDim);
    std::vector<float> values(values_.begin(), values_.begin() + kPrefix * kKvDim);
    for (int64_t j = 0; j < kTokens; ++j) {  // ancestors, then the node itself (j == t)
      if (!kTreeMask[t * kTokens + j]) continue;
      const int64_t slot = kPrefix + j;
      keys.insert(keys.end(), keys_.begin() + slot * kKvDim, keys_.begin() + (slot + 1) * kKvDim);
      values.insert(values.end(), values_.begin() + slot * kKvDim,
                    values_.begin() + (slot + 1) * kKvDim);
    }
    const int64_t path_prefix = static_cast<int64_t>(keys.size()) / kKvDim - 1;
    const uint8_t self = 1;
    std::vector<float> alone(kQDim);
    Attention(q_.data() + t * kQDim, 1, F32Rows(keys), F32Rows(values), path_prefix, &self, kShape,
              alone.data(), pool);
    EXPECT_EQ(std::memcmp(alone.data(), batched.data() + t * kQDim, kQDim * sizeof(float)), 0)
        << "token " << t;
  }
}

// A sliding window drops the slots more than window - 1 positions behind the query: a windowed
// tree node equals, bit for bit, its path's last `window` slots run alone without a window. The
// slot positions are not the slot numbers, as after a tree commit would leave them.
TEST_F(AttentionTest, SlidingWindowKeepsTheLastWindowPositionsOfThePath) {
  // Prefix slots at positions 0..4; batch token t at position 5 + depth(t) in kTreeMask.
  const std::vector<int32_t> slot_positions = {0, 1, 2, 3, 4, 5, 6, 6, 7};
  const std::vector<int32_t> query_positions(slot_positions.begin() + kPrefix,
                                             slot_positions.end());
  ThreadPool pool(2);
  for (int64_t window : {1, 2, 3, 6, 100}) {
    std::vector<float> windowed(kTokens * kQDim);
    AttentionWithContext(q_.data(), kTokens, F32Rows(keys_), F32Rows(values_), kPrefix, 0,
                         kTreeMask.data(), kShape, windowed.data(), pool,
                         {.size = window,
                          .query_positions = query_positions.data(),
                          .slot_positions = slot_positions.data()});
    for (int64_t t = 0; t < kTokens; ++t) {
      std::vector<float> keys, values;
      for (int64_t slot = 0; slot < kPrefix + kTokens; ++slot) {
        const bool on_path = slot < kPrefix || kTreeMask[t * kTokens + (slot - kPrefix)];
        if (!on_path || query_positions[t] - slot_positions[slot] >= window) continue;
        keys.insert(keys.end(), keys_.begin() + slot * kKvDim, keys_.begin() + (slot + 1) * kKvDim);
        values.insert(values.end(), values_.begin() + slot * kKvDim,
                      values_.begin() + (slot + 1) * kKvDim);
      }
      const int64_t path_prefix = static_cast<int64_t>(keys.size()) / kKvDim - 1;
      const uint8_t self = 1;
      std::vector<float> alone(kQDim);
      Attention(q_.data() + t * kQDim, 1, F32Rows(keys), F32Rows(values), path_prefix, &self,
                kShape, alone.data(), pool);
      EXPECT_EQ(std::memcmp(alone.data(), windowed.data() + t * kQDim, kQDim * sizeof(float)), 0)
          << "window " << window << " token " << t;
    }
  }
}

}  // namespace
}  // namespace bitsplit::ops
