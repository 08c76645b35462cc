#include "common/ops/rmsnorm.h"

#include <cmath>

namespace bitsplit::ops {

void RmsNorm(const float* x, int64_t num_rows, int64_t n, const float* weight, float eps,
             float* y) {
  for (int64_t row = 0; row < num_rows; ++row) {
    const float* in = x + row * n;
    float* out = y + row * n;
    double sum_squares = 0.0;
    for (int64_t i = 0; i < n; ++i) sum_squares += static_cast<double>(in[i] * in[i]);
    const float mean = static_cast<float>(sum_squares / static_cast<double>(n));
    const float scale = 1.0f / std::sqrt(mean + eps);
    if (weight == nullptr) {
      for (int64_t i = 0; i < n; ++i) out[i] = in[i] * scale;
    } else {
      for (int64_t i = 0; i < n; ++i) out[i] = in[i] * scale * weight[i];
    }
  }
}

}  // namespace bitsplit::ops
