#pragma once
// Softmax family over one vector of logits or scores. Max subtraction keeps exp() in range; the
// normalizing sums are accumulated in double in index order (deterministic and accurate).
#include <cstdint>

namespace bitsplit::ops {

// log(sum_i exp(x[i])), computed as max + log(sum exp(x - max)). n must be > 0.
double LogSumExp(const float* x, int64_t n);

// out[i] = exp(x[i]) / sum_j exp(x[j]); out may alias x.
void Softmax(const float* x, int64_t n, float* out);

// out[i] = x[i] - LogSumExp(x); out may alias x.
void LogSoftmax(const float* x, int64_t n, float* out);

// Index of the largest element; the first one on ties. n must be > 0.
int64_t ArgMax(const float* x, int64_t n);

}  // namespace bitsplit::ops
