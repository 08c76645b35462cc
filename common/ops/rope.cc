#include "common/ops/rope.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/util/status_macros.h"

namespace bitsplit::ops {

namespace {

// ggml_rope_yarn_corr_dim: the pair index at which a rotation completes `rotations` turns over
// the original context.
float YarnCorrectionDim(int64_t dims, int64_t original_context, float rotations, float base) {
  return static_cast<float>(dims) *
         std::log(static_cast<float>(original_context) /
                  (rotations * 2.0f * static_cast<float>(M_PI))) /
         (2.0f * std::log(base));
}

// rope_yarn_ramp: 1 below `low`, 0 above `high`, linear between (over the pair index).
float YarnRamp(float low, float high, int64_t pair) {
  const float y = (static_cast<float>(pair) - low) / std::max(0.001f, high - low);
  return 1.0f - std::min(1.0f, std::max(0.0f, y));
}

}  // namespace

void YarnCorrectionDims(const RopeConfig& config, float dims[2]) {
  const float start = std::floor(YarnCorrectionDim(config.rotary_dims, config.yarn_original_context,
                                                   config.yarn_beta_fast, config.freq_base));
  const float end = std::ceil(YarnCorrectionDim(config.rotary_dims, config.yarn_original_context,
                                                config.yarn_beta_slow, config.freq_base));
  dims[0] = std::max(0.0f, start);
  dims[1] = std::min(static_cast<float>(config.rotary_dims - 1), end);
}

void RopeCosSin(const RopeConfig& config, int32_t position, float* cos_out, float* sin_out) {
  const int64_t num_pairs = config.rotary_dims / 2;
  const float theta_scale =
      std::pow(config.freq_base, -2.0f / static_cast<float>(config.rotary_dims));
  const bool yarn = config.ext_factor != 0.0f;
  float corr_dims[2] = {0.0f, 0.0f};
  float mscale = config.attn_factor;
  if (yarn) {
    BITSPLIT_CHECK(config.yarn_original_context > 0);
    YarnCorrectionDims(config, corr_dims);
    mscale *= 1.0f + 0.1f * std::log(1.0f / config.freq_scale);
  }
  float theta = static_cast<float>(position);
  for (int64_t i = 0; i < num_pairs; ++i) {
    const float factor = config.freq_factors != nullptr ? config.freq_factors[i] : 1.0f;
    const float extrapolated = theta / factor;
    float angle = config.freq_scale * extrapolated;
    if (yarn) {
      const float mix = YarnRamp(corr_dims[0], corr_dims[1], i) * config.ext_factor;
      angle = angle * (1.0f - mix) + extrapolated * mix;
    }
    cos_out[i] = std::cos(angle) * mscale;
    sin_out[i] = std::sin(angle) * mscale;
    theta *= theta_scale;
  }
}

void ApplyRope(float* x, int64_t num_tokens, int64_t num_heads, const int32_t* positions,
               const RopeConfig& config) {
  BITSPLIT_CHECK(config.rotary_dims % 2 == 0 && config.rotary_dims <= config.head_dim);
  const int64_t num_pairs = config.rotary_dims / 2;
  std::vector<float> cos_theta(static_cast<size_t>(num_pairs));
  std::vector<float> sin_theta(static_cast<size_t>(num_pairs));
  // Pair i is (head[first(i)], head[first(i) + partner_offset]).
  const bool halves = config.style == RopeStyle::kHalves;
  const int64_t partner_offset = halves ? num_pairs : 1;
  const int64_t first_stride = halves ? 1 : 2;
  for (int64_t t = 0; t < num_tokens; ++t) {
    RopeCosSin(config, positions[t], cos_theta.data(), sin_theta.data());
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
