#pragma once
// Fixed-order f32 dot products (AVX2/FMA), the one reduction that matmul and attention share.
//
// Batch invariance rests on this file: every dot product of length n is computed the same way,
// whichever block kernel computes it and however many other dot products run beside it:
//   lane l (0..7) accumulates a[k]*b[k] for k = l, l+8, l+16, ... in increasing k with one FMA
//   each (the tail beyond the last full 8-group is loaded masked, so its missing lanes add 0*0),
//   then the 8 lanes are summed by the fixed tree in HorizontalSum.
// The block kernels only share loads between dot products; they never change this order.
#include <immintrin.h>

#include <cstdint>

namespace bitsplit::ops::simd {

// ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)), always in this order.
inline float HorizontalSum(__m256 v) {
  const __m128 quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
  const __m128 single = _mm_add_ss(pair, _mm_movehdup_ps(pair));
  return _mm_cvtss_f32(single);
}

// Mask selecting the first `count` (0..7) lanes, for the tail of a row.
inline __m256i TailMask(int64_t count) {
  alignas(32) static constexpr int32_t kLanes[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                                     0,  0,  0,  0,  0,  0,  0,  0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kLanes + 8 - count));
}

// out[t * out_stride + r] = dot(a_t, b_r) for kRowsA rows a_t = a + t * a_stride and kRowsB
// rows b_r = b + r * b_stride, each of length n. Every output follows the order described at
// the top of this file, so DotBlock<1, 1> and DotBlock<4, 2> agree bit for bit.
template <int kRowsA, int kRowsB>
inline void DotBlock(const float* a, int64_t a_stride, const float* b, int64_t b_stride, int64_t n,
                     float* out, int64_t out_stride) {
  __m256 acc[kRowsA][kRowsB];
  for (int t = 0; t < kRowsA; ++t) {
    for (int r = 0; r < kRowsB; ++r) acc[t][r] = _mm256_setzero_ps();
  }
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    __m256 bv[kRowsB];
    for (int r = 0; r < kRowsB; ++r) bv[r] = _mm256_loadu_ps(b + r * b_stride + k);
    for (int t = 0; t < kRowsA; ++t) {
      const __m256 av = _mm256_loadu_ps(a + t * a_stride + k);
      for (int r = 0; r < kRowsB; ++r) acc[t][r] = _mm256_fmadd_ps(av, bv[r], acc[t][r]);
    }
  }
  if (k < n) {
    const __m256i mask = TailMask(n - k);
    __m256 bv[kRowsB];
    for (int r = 0; r < kRowsB; ++r) bv[r] = _mm256_maskload_ps(b + r * b_stride + k, mask);
    for (int t = 0; t < kRowsA; ++t) {
      const __m256 av = _mm256_maskload_ps(a + t * a_stride + k, mask);
      for (int r = 0; r < kRowsB; ++r) acc[t][r] = _mm256_fmadd_ps(av, bv[r], acc[t][r]);
    }
  }
  for (int t = 0; t < kRowsA; ++t) {
    for (int r = 0; r < kRowsB; ++r) out[t * out_stride + r] = HorizontalSum(acc[t][r]);
  }
}

inline float Dot(const float* a, const float* b, int64_t n) {
  float result;
  DotBlock<1, 1>(a, 0, b, 0, n, &result, 0);
  return result;
}

}  // namespace bitsplit::ops::simd
