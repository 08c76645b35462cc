#include "common/ops/softmax.h"

#include <cmath>

#include "common/util/status_macros.h"

namespace bitsplit::ops {
namespace {

float MaxOf(const float* x, int64_t n) {
  float max_value = x[0];
  for (int64_t i = 1; i < n; ++i) max_value = std::fmax(max_value, x[i]);
  return max_value;
}

}  // namespace

double LogSumExp(const float* x, int64_t n) {
  BITSPLIT_CHECK(n > 0);
  const float max_value = MaxOf(x, n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - max_value);
  return max_value + std::log(sum);
}

void Softmax(const float* x, int64_t n, float* out) {
  BITSPLIT_CHECK(n > 0);
  const float max_value = MaxOf(x, n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    out[i] = std::exp(x[i] - max_value);
    sum += out[i];
  }
  const float inverse = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) out[i] *= inverse;
}

void LogSoftmax(const float* x, int64_t n, float* out) {
  const double log_sum = LogSumExp(x, n);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(x[i] - log_sum);
}

int64_t ArgMax(const float* x, int64_t n) {
  BITSPLIT_CHECK(n > 0);
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

}  // namespace bitsplit::ops
