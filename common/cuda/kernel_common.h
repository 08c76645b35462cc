#pragma once
// Device code shared by the *.cu kernels (included by them only): the grid size of an
// elementwise launch, and a dot product in simd::Dot's order (common/ops/simd_dot.h), so that a
// kernel built on it gives the CPU's f32 dot bit for bit.
#include <cuda_runtime.h>

#include <cstdint>

namespace bitsplit::cuda::kernels {

// Blocks of `threads` covering n elements.
inline unsigned Blocks(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

// sum over k < n of a[k] * load_b(k): lane l accumulates k = l, l + 8, ... with one fma each
// (missing tail lanes add 0 * 0), then ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
template <typename LoadB>
__device__ __forceinline__ float SimdOrderDot(const float* a, LoadB load_b, int64_t n) {
  float acc[8];
#pragma unroll
  for (int l = 0; l < 8; ++l) acc[l] = 0.0f;
  for (int64_t k = 0; k < n; k += 8) {
#pragma unroll
    for (int l = 0; l < 8; ++l) {
      const bool inside = k + l < n;
      acc[l] = __fmaf_rn(inside ? a[k + l] : 0.0f, inside ? load_b(k + l) : 0.0f, acc[l]);
    }
  }
  const float s0 = __fadd_rn(acc[0], acc[4]), s1 = __fadd_rn(acc[1], acc[5]);
  const float s2 = __fadd_rn(acc[2], acc[6]), s3 = __fadd_rn(acc[3], acc[7]);
  return __fadd_rn(__fadd_rn(s0, s2), __fadd_rn(s1, s3));
}

}  // namespace bitsplit::cuda::kernels
