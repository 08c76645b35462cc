#pragma once
// A mixture-of-experts layer's routing, shared by every backend so that each routes by the same
// rules: from the router's logits, each row's top-k experts and their weights (the rules of
// llama.cpp's build_moe_ffn as qwen3moe and gemma4 use it), then the (row, choice) pairs grouped
// by expert, so that a backend runs each routed expert once on all its rows.
#include <cstdint>
#include <span>
#include <vector>

#include "common/model/config.h"
#include "common/model/linear_backend.h"

namespace bitsplit::model {

// Per row t of `router_logits` ([rows, num_experts]), kSoftmaxThenTopK: softmax over all
// experts, the k = num_experts_used most probable in descending order (ties to the lower index;
// NaN ranks last), their probabilities renormalized (the sum clamped at 2^-14, the smallest
// normal fp16, as llama.cpp) and scaled by expert_weights_scale. kTopKThenSoftmax: the k largest
// logits in descending order (the same ties), weighted by a softmax over those k (times
// expert_weights_scale, which that gating requires to be 1). expert_of and weights are [rows * k],
// row t's choices at t * k in the order chosen. A row's routing depends on that row's logits only.
void RouteRows(const ModelConfig& config, const float* router_logits, int64_t rows,
               std::span<int32_t> expert_of, std::span<float> weights);

// The (row, choice) pairs of `expert_of` ([rows * k]) grouped by expert in increasing expert
// order, pairs of one expert in pair order: pair p goes to grouped row slot_of[p]; source_row[s]
// is the row whose input grouped row s reads (p / k); one segment per expert with rows.
struct ExpertGrouping {
  std::vector<int32_t> slot_of;     // [rows * k]
  std::vector<int32_t> source_row;  // [rows * k]
  std::vector<ExpertRows> segments;
};
ExpertGrouping GroupByExpert(std::span<const int32_t> expert_of, int64_t num_experts,
                             int64_t experts_used);

}  // namespace bitsplit::model
