// The routing every backend shares (common/model/expert_routing.h): the top-k experts and
// renormalized weights from the router's logits, against the definition computed here in double,
// and the grouping by expert against its invariants.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "common/model/expert_routing.h"

namespace bitsplit::model {
namespace {

ModelConfig Experts(int64_t experts, int64_t used, float scale = 1.0f) {
  ModelConfig config;
  config.num_experts = experts;
  config.num_experts_used = used;
  config.expert_weights_scale = scale;
  return config;
}

TEST(ExpertRoutingTest, RouteRowsPicksTheMostProbableAndRenormalizes) {
  const ModelConfig config = Experts(6, 3, 2.5f);
  // Row 0: distinct logits; row 1: a tie between experts 1 and 4 for second place (the lower
  // index wins); row 2: a NaN logit, which ranks last.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 0.7f, 1.5f, 0.0f,   //
                                     3.0f, 1.0f, -2.0f, 0.5f, 1.0f, -0.5f,  //
                                     1.0f, nan,  0.2f,  0.3f, 0.9f, 0.8f};
  std::vector<int32_t> expert_of(9);
  std::vector<float> weights(9);
  RouteRows(config, logits.data(), 2, expert_of, weights);
  EXPECT_EQ(std::vector<int32_t>(expert_of.begin(), expert_of.begin() + 6),
            (std::vector<int32_t>{1, 4, 3, 0, 1, 4}));
  for (int64_t t = 0; t < 2; ++t) {
    double total = 0;
    for (int64_t e = 0; e < 6; ++e) total += std::exp(static_cast<double>(logits[t * 6 + e]));
    double chosen = 0;
    for (int64_t i = 0; i < 3; ++i)
      chosen += std::exp(logits[t * 6 + expert_of[t * 3 + i]]) / total;
    for (int64_t i = 0; i < 3; ++i) {
      const double p = std::exp(logits[t * 6 + expert_of[t * 3 + i]]) / total;
      EXPECT_NEAR(weights[t * 3 + i], p / chosen * 2.5, 1e-6) << t << " " << i;
    }
  }
  // The NaN row: softmax over a NaN is all NaN on every expert, so every probability ranks last
  // and the order falls back to the index: experts 0, 1, 2.
  RouteRows(config, logits.data() + 12, 1, std::span(expert_of).subspan(6),
            std::span(weights).subspan(6));
  EXPECT_EQ(std::vector<int32_t>(expert_of.begin() + 6, expert_of.end()),
            (std::vector<int32_t>{0, 1, 2}));
}

TEST(ExpertRoutingTest, RouteRowsOfARowDependOnThatRowOnly) {
  const ModelConfig config = Experts(16, 4);
  std::vector<float> logits(16 * 5);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(0.37f * static_cast<float>(i));
  std::vector<int32_t> all_experts(20), one_experts(4);
  std::vector<float> all_weights(20), one_weights(4);
  RouteRows(config, logits.data(), 5, all_experts, all_weights);
  for (int64_t t = 0; t < 5; ++t) {
    RouteRows(config, logits.data() + t * 16, 1, one_experts, one_weights);
    EXPECT_TRUE(std::equal(one_experts.begin(), one_experts.end(), all_experts.begin() + t * 4));
    EXPECT_TRUE(std::equal(one_weights.begin(), one_weights.end(), all_weights.begin() + t * 4));
  }
}

TEST(ExpertRoutingTest, GroupByExpertIsAStablePermutationByExpert) {
  const int64_t k = 3, experts = 8;
  const std::vector<int32_t> expert_of = {5, 1, 7, 1, 5, 2, 7, 0, 1, 5, 6, 2};  // 4 rows
  const ExpertGrouping g = GroupByExpert(expert_of, experts, k);
  // A permutation of the pairs.
  std::vector<int32_t> slots = g.slot_of;
  std::sort(slots.begin(), slots.end());
  std::vector<int32_t> identity(expert_of.size());
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(slots, identity);
  // Segments: every used expert once, ascending, with its count, back to back from row 0.
  std::vector<int32_t> used;
  int64_t next = 0;
  for (const ExpertRows& segment : g.segments) {
    used.push_back(segment.expert);
    EXPECT_EQ(segment.first_row, next);
    EXPECT_EQ(segment.count, std::count(expert_of.begin(), expert_of.end(), segment.expert));
    next += segment.count;
  }
  EXPECT_EQ(used, (std::vector<int32_t>{0, 1, 2, 5, 6, 7}));
  EXPECT_EQ(next, static_cast<int64_t>(expert_of.size()));
  for (size_t pair = 0; pair < expert_of.size(); ++pair) {
    const int32_t slot = g.slot_of[pair];
    // The slot lies in its expert's segment, reads its own row, and pairs keep their order.
    const auto segment = std::find_if(g.segments.begin(), g.segments.end(),
                                      [&](const auto& s) { return s.expert == expert_of[pair]; });
    ASSERT_NE(segment, g.segments.end());
    EXPECT_GE(slot, segment->first_row);
    EXPECT_LT(slot, segment->first_row + segment->count);
    EXPECT_EQ(g.source_row[static_cast<size_t>(slot)], static_cast<int32_t>(pair) / k);
    for (size_t later = pair + 1; later < expert_of.size(); ++later) {
      if (expert_of[later] == expert_of[pair]) {
        EXPECT_GT(g.slot_of[later], slot);
      }
    }
  }
}

}  // namespace
}  // namespace bitsplit::model
