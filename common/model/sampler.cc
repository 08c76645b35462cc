#include "common/model/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace bitsplit::model {

absl::Status ValidateSamplingParams(const SamplingParams& params) {
  if (!std::isfinite(params.temperature) || params.temperature < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature must be a finite number >= 0, got ", params.temperature));
  }
  if (params.top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", params.top_k));
  }
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", params.top_p));
  }
  return absl::OkStatus();
}

void MaskLogits(std::span<float> logits, std::span<const uint64_t> allowed) {
  BITSPLIT_CHECK(allowed.size() * 64 >= logits.size());
  bool any = false;
  for (size_t t = 0; t < logits.size(); ++t) {
    if ((allowed[t / 64] >> (t % 64)) & 1) {
      any = true;
    } else {
      logits[t] = -std::numeric_limits<float>::infinity();
    }
  }
  BITSPLIT_CHECK(any);
}

namespace {
int32_t ArgMax(std::span<const float> logits) {
  int32_t best = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(logits.size()); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}
}  // namespace

void Sampler::BuildDistribution(std::span<const float> logits, const SamplingParams& params) {
  const double temperature = params.temperature > 0.0f ? params.temperature : 1.0;
  candidates_.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    candidates_[i] = {static_cast<int32_t>(i), static_cast<double>(logits[i]) / temperature};
  }
  // Order: most likely first, lower id first among equals, so truncation is deterministic.
  auto more_likely = [](const Candidate& a, const Candidate& b) {
    return a.weight > b.weight || (a.weight == b.weight && a.id < b.id);
  };
  size_t keep = candidates_.size();
  if (params.temperature > 0.0f && params.top_k > 0 && static_cast<size_t>(params.top_k) < keep) {
    keep = static_cast<size_t>(params.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(),
                      more_likely);
    candidates_.resize(keep);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), more_likely);
  }
  const double peak = candidates_.front().weight;
  double total = 0.0;
  for (auto& c : candidates_) {
    c.weight = std::exp(c.weight - peak);
    total += c.weight;
  }
  for (auto& c : candidates_) c.weight /= total;
  if (params.temperature > 0.0f && params.top_p < 1.0f) {
    // Smallest prefix whose mass reaches top_p (at least one token), then renormalize.
    double mass = 0.0;
    size_t n = 0;
    while (n < candidates_.size()) {
      mass += candidates_[n].weight;
      ++n;
      if (mass >= params.top_p) break;
    }
    candidates_.resize(n);
    for (auto& c : candidates_) c.weight /= mass;
  }
}

int32_t Sampler::Choose(std::span<const float> logits, const SamplingParams& params,
                        int64_t position) {
  BITSPLIT_CHECK(!logits.empty());
  if (params.temperature == 0.0f) return ArgMax(logits);
  BuildDistribution(logits, params);
  const double u = UniformForPosition(params.seed, position);
  double cumulative = 0.0;
  for (const auto& c : candidates_) {
    cumulative += c.weight;
    if (u < cumulative) return c.id;
  }
  return candidates_.back().id;  // u within rounding of 1.0
}

double Sampler::LogProb(std::span<const float> logits, const SamplingParams& params,
                        int32_t token) {
  BITSPLIT_CHECK(!logits.empty());
  BuildDistribution(logits, params);
  for (const auto& c : candidates_) {
    if (c.id == token) return std::log(c.weight);
  }
  return -INFINITY;
}

}  // namespace bitsplit::model
