#pragma once
// The target's choice of next token: greedy, or a seeded sample after temperature, top-k and
// top-p. The random number comes from a counter-based generator (Philox4x32-10) keyed by
// (seed, absolute position), so a position's draw is the same however the position was
// reached: one token at a time, in a prefill batch, or inside a speculation tree. The
// losslessness invariant (docs/design.md §3) depends on this.
//
// Thread safety: all functions are pure; a Sampler holds scratch space and must not be shared
// between threads.
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "common/quant/split_common.h"

namespace bitsplit::model {

struct SamplingParams {
  float temperature = 0.0f;  // 0 selects greedy decoding; must be finite and >= 0
  int32_t top_k = 0;         // 0 disables; otherwise keep the k most likely tokens
  float top_p = 1.0f;        // nucleus mass in (0, 1]; 1 disables
  uint64_t seed = 0;
};

absl::Status ValidateSamplingParams(const SamplingParams& params);

// Uniform double in [0, 1) determined only by (seed, position): bitsplit::PhiloxUniform, which
// the device's choice kernels draw too (common/quant/split_common.h).
inline double UniformForPosition(uint64_t seed, int64_t position) {
  return PhiloxUniform(seed, position);
}

// Sets the logits of the tokens `allowed` excludes to -inf (bit t % 64 of word t / 64: token t
// may come next), so that Sampler::Choose and LogProb sample the constrained distribution, as
// constrained decoding does. `allowed` covers every token and allows at least one.
void MaskLogits(std::span<float> logits, std::span<const uint64_t> allowed);

class Sampler {
 public:
  // Picks the token for sequence index `position` (the index the new token will occupy) from
  // one row of logits. Ties break toward the lower token id. Params must be valid.
  int32_t Choose(std::span<const float> logits, const SamplingParams& params, int64_t position);

  // Log-probability of `token` under the distribution Choose samples from (temperature, top-k
  // and top-p applied; greedy uses temperature 1 without truncation). -inf when excluded.
  double LogProb(std::span<const float> logits, const SamplingParams& params, int32_t token);

 private:
  struct Candidate {
    int32_t id;
    double weight;
  };
  // Fills candidates_ with the truncated, normalized distribution of `params`.
  void BuildDistribution(std::span<const float> logits, const SamplingParams& params);
  std::vector<Candidate> candidates_;
};

}  // namespace bitsplit::model
