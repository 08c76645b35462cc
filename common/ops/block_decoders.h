#pragma once
// AVX2 decoders of one ggml block into f32 vectors, shared by the SIMD row dequantizers
// (dequantize_simd.cc) and the fused dequantize-and-dot kernel of MatMul (matmul.cc). Sharing
// them makes the two paths produce the same weight bits by construction; the row dequantizers
// are tested bit-exact against the scalar reference in common/quant.
//
// Each decoder performs exactly the float operations of the reference: integer code -> float,
// times the block scale, plus the block offset (Q4_1); no FMA.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/quant/ggml_blocks.h"
#include "common/util/fp16.h"

namespace bitsplit::ops::simd {

inline float LoadHalf(const uint8_t* at) {
  uint16_t bits;
  std::memcpy(&bits, at, sizeof(bits));
  return Fp16ToFp32(bits);
}

// Low nibbles of 16 code bytes are elements 0..15, high nibbles elements 16..31.
inline void SplitNibbles(const uint8_t* qs, __m128i* low, __m128i* high) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  *low = _mm_and_si128(bytes, mask);
  *high = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
}

// Integer codes (unsigned bytes) of element groups 0..3 (8 each) of a nibble-packed block.
inline void NibbleCodes(const uint8_t* qs, __m256i codes[4]) {
  __m128i low, high;
  SplitNibbles(qs, &low, &high);
  codes[0] = _mm256_cvtepu8_epi32(low);
  codes[1] = _mm256_cvtepu8_epi32(_mm_srli_si128(low, 8));
  codes[2] = _mm256_cvtepu8_epi32(high);
  codes[3] = _mm256_cvtepu8_epi32(_mm_srli_si128(high, 8));
}

// Each decoder: kElements per block, kBytes per block, Decode(block, out[kElements / 8]).
struct DecodeF16 {
  static constexpr int kElements = 8;  // a "block" of 8 consecutive halves
  static constexpr int kBytes = 16;
  static void Decode(const uint8_t* block, __m256* out) {
    out[0] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block)));
  }
};

struct DecodeQ8_0 {
  static constexpr int kElements = quant::kQk;
  static constexpr int kBytes = sizeof(quant::BlockQ8_0);
  static void Decode(const uint8_t* block, __m256* out) {
    const __m256 d = _mm256_set1_ps(LoadHalf(block + offsetof(quant::BlockQ8_0, d)));
    const uint8_t* qs = block + offsetof(quant::BlockQ8_0, qs);
    for (int j = 0; j < 4; ++j) {
      const __m128i codes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8 * j));
      out[j] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes)), d);
    }
  }
};

struct DecodeQ4_0 {
  static constexpr int kElements = quant::kQk;
  static constexpr int kBytes = sizeof(quant::BlockQ4_0);
  static void Decode(const uint8_t* block, __m256* out) {
    const __m256 d = _mm256_set1_ps(LoadHalf(block + offsetof(quant::BlockQ4_0, d)));
    __m256i codes[4];
    NibbleCodes(block + offsetof(quant::BlockQ4_0, qs), codes);
    const __m256i eight = _mm256_set1_epi32(8);
    for (int j = 0; j < 4; ++j) {
      out[j] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(codes[j], eight)), d);
    }
  }
};

struct DecodeQ4_1 {
  static constexpr int kElements = quant::kQk;
  static constexpr int kBytes = sizeof(quant::BlockQ4_1);
  static void Decode(const uint8_t* block, __m256* out) {
    const __m256 d = _mm256_set1_ps(LoadHalf(block + offsetof(quant::BlockQ4_1, d)));
    const __m256 m = _mm256_set1_ps(LoadHalf(block + offsetof(quant::BlockQ4_1, m)));
    __m256i codes[4];
    NibbleCodes(block + offsetof(quant::BlockQ4_1, qs), codes);
    for (int j = 0; j < 4; ++j) {
      out[j] = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(codes[j]), d), m);
    }
  }
};

}  // namespace bitsplit::ops::simd
