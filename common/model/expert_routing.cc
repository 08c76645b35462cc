#include "common/model/expert_routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/ops/softmax.h"
#include "common/util/status_macros.h"

namespace bitsplit::model {

void RouteRows(const ModelConfig& config, const float* router_logits, int64_t rows,
               std::span<int32_t> expert_of, std::span<float> weights) {
  const int64_t k = config.num_experts_used;
  const int64_t experts = config.num_experts;
  BITSPLIT_CHECK(k >= 1 && k <= experts);
  BITSPLIT_CHECK(static_cast<int64_t>(expert_of.size()) >= rows * k &&
                 static_cast<int64_t>(weights.size()) >= rows * k);
  std::vector<float> probabilities(static_cast<size_t>(experts));
  std::vector<int32_t> order(static_cast<size_t>(experts));
  std::vector<float> chosen(static_cast<size_t>(k));
  const bool top_k_first = config.expert_gating == ExpertGating::kTopKThenSoftmax;
  for (int64_t t = 0; t < rows; ++t) {
    // The ranking: by probability, or (top-k first) by the logits themselves.
    if (top_k_first) {
      std::copy_n(router_logits + t * experts, experts, probabilities.data());
    } else {
      ops::Softmax(router_logits + t * experts, experts, probabilities.data());
    }
    std::iota(order.begin(), order.end(), 0);
    // A NaN probability (from NaN weights) ranks last, so the order stays a strict weak one.
    const auto rank = [&](int32_t e) {
      const float p = probabilities[static_cast<size_t>(e)];
      return std::isnan(p) ? -1.0f : p;
    };
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      const float pa = rank(a), pb = rank(b);
      return pa != pb ? pa > pb : a < b;
    });
    if (top_k_first) {  // a softmax over the chosen logits, in the order chosen
      for (int64_t i = 0; i < k; ++i) chosen[i] = probabilities[static_cast<size_t>(order[i])];
      ops::Softmax(chosen.data(), k, chosen.data());
      for (int64_t i = 0; i < k; ++i) {
        expert_of[static_cast<size_t>(t * k + i)] = order[static_cast<size_t>(i)];
        weights[static_cast<size_t>(t * k + i)] = chosen[static_cast<size_t>(i)];
      }
      continue;
    }
    float sum = 0.0f;
    for (int64_t i = 0; i < k; ++i) sum += probabilities[static_cast<size_t>(order[i])];
    sum = std::max(sum, 0x1p-14f);
    for (int64_t i = 0; i < k; ++i) {
      expert_of[static_cast<size_t>(t * k + i)] = order[static_cast<size_t>(i)];
      weights[static_cast<size_t>(t * k + i)] =
          probabilities[static_cast<size_t>(order[i])] / sum * config.expert_weights_scale;
    }
  }
}

ExpertGrouping GroupByExpert(std::span<const int32_t> expert_of, int64_t num_experts,
                             int64_t experts_used) {
  BITSPLIT_CHECK(experts_used >= 1);
  const size_t pairs = expert_of.size();
  ExpertGrouping grouping;
  grouping.slot_of.resize(pairs);
  grouping.source_row.resize(pairs);
  std::vector<int32_t> count(static_cast<size_t>(num_experts), 0);
  for (const int32_t expert : expert_of) {
    BITSPLIT_CHECK(expert >= 0 && expert < num_experts);
    ++count[static_cast<size_t>(expert)];
  }
  std::vector<int32_t> next(static_cast<size_t>(num_experts), 0);
  int32_t first = 0;
  for (int32_t e = 0; e < num_experts; ++e) {
    next[static_cast<size_t>(e)] = first;
    if (count[static_cast<size_t>(e)] > 0) {
      grouping.segments.push_back(
          {.expert = e, .first_row = first, .count = count[static_cast<size_t>(e)]});
    }
    first += count[static_cast<size_t>(e)];
  }
  for (size_t pair = 0; pair < pairs; ++pair) {
    const int32_t slot = next[static_cast<size_t>(expert_of[pair])]++;
    grouping.slot_of[pair] = slot;
    grouping.source_row[static_cast<size_t>(slot)] =
        static_cast<int32_t>(static_cast<int64_t>(pair) / experts_used);
  }
  return grouping;
}

}  // namespace bitsplit::model
