#pragma once
// RMS normalization as llama.cpp computes it: y = x * (1 / sqrt(mean(x²) + eps)) * weight.
#include <cstdint>

namespace bitsplit::ops {

// Normalizes `num_rows` rows of length n (row-major) and multiplies them by `weight` [n] (null:
// none); y may alias x. The sum of squares is accumulated in double in index order, so a row's
// result depends on that row alone.
void RmsNorm(const float* x, int64_t num_rows, int64_t n, const float* weight, float eps, float* y);

}  // namespace bitsplit::ops
