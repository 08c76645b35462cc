#include "common/ops/activation.h"

#include <algorithm>
#include <cmath>

namespace bitsplit::ops {

void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

float GeluTanh(float x) {
  constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
  constexpr float kCoefficient = 0.044715f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + kCoefficient * x * x)));
}

void GeluTanhMul(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = GeluTanh(gate[i]) * up[i];
}

void SwigluOaiMul(const float* gate, const float* up, int64_t n, float* out, float alpha,
                  float limit) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = std::min(gate[i], limit);
    const float y = std::clamp(up[i], -limit, limit);
    const float glu = x / (1.0f + std::exp(alpha * (-x)));
    out[i] = glu * (y + 1.0f);
  }
}

}  // namespace bitsplit::ops
