#include "common/ops/rope.h"

#include <cmath>
#include <vector>

#include "common/util/status_macros.h"

namespace bitsplit::ops {

void ApplyRope(float* x, int64_t num_tokens, int64_t num_heads, const int32_t* positions,
               const RopeConfig& config) {
  BITSPLIT_CHECK(config.rotary_dims % 2 == 0 && config.rotary_dims <= config.head_dim);
  const int64_t num_pairs = config.rotary_dims / 2;
  const float theta_scale =
      std::pow(config.freq_base, -2.0f / static_cast<float>(config.rotary_dims));
  std::vector<float> cos_theta(static_cast<size_t>(num_pairs));
  std::vector<float> sin_theta(static_cast<size_t>(num_pairs));
  for (int64_t t = 0; t < num_tokens; ++t) {
    float theta = static_cast<float>(positions[t]);
    for (int64_t i = 0; i < num_pairs; ++i) {
      const float factor = config.freq_factors != nullptr ? config.freq_factors[i] : 1.0f;
      const float angle = config.freq_scale * (theta / factor);
      cos_theta[i] = std::cos(angle);
      sin_theta[i] = std::sin(angle);
      theta *= theta_scale;
    }
    // Pair i is (head[first(i)], head[first(i) + partner_offset]).
    const bool halves = config.style == RopeStyle::kHalves;
    const int64_t partner_offset = halves ? num_pairs : 1;
    const int64_t first_stride = halves ? 1 : 2;
    for (int64_t h = 0; h < num_heads; ++h) {
      float* head = x + (t * num_heads + h) * config.head_dim;
      for (int64_t i = 0; i < num_pairs; ++i) {
        float* first = head + i * first_stride;
        const float x0 = first[0];
        const float x1 = first[partner_offset];
        first[0] = x0 * cos_theta[i] - x1 * sin_theta[i];
        first[partner_offset] = x0 * sin_theta[i] + x1 * cos_theta[i];
      }
    }
  }
}

}  // namespace bitsplit::ops
