#include "common/quant/hadamard.h"

#include <immintrin.h>

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/util/fp16.h"
#include "common/util/status_macros.h"

namespace bitsplit::quant {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

uint64_t SplitMixWord(uint64_t seed, int64_t word) {
  uint64_t z = seed + static_cast<uint64_t>(word + 1) * kGolden;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Sign-bit masks (0 or 0x80000000) of columns [0, cols): XOR applies S exactly.
void SignMasks(uint64_t seed, int64_t cols, std::vector<uint32_t>* masks) {
  masks->resize(cols);
  for (int64_t j = 0; j < cols; j += 64) {
    const uint64_t word = SplitMixWord(seed, j / 64);
    for (int64_t k = j; k < std::min(cols, j + 64); ++k) {
      (*masks)[k] = ((word >> (k % 64)) & 1) ? 0x80000000u : 0u;
    }
  }
}

void ApplySignsScalar(float* x, const uint32_t* masks, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = Fp32FromBits(BitsFromFp32(x[i]) ^ masks[i]);
}

// Unnormalized fast Walsh-Hadamard transform of one block (Sylvester order).
void WalshHadamardScalar(float* x, int n) {
  for (int h = 1; h < n; h *= 2) {
    for (int i = 0; i < n; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
}

void ScaleScalar(float* x, int n, float scale) {
  for (int i = 0; i < n; ++i) x[i] *= scale;
}

// One in-register butterfly stage for h = 1, 2, 4: `swapped` holds each lane's partner;
// lanes selected by `Mask` (the upper of each pair) take partner - self, the others self +
// partner: exactly a + b and a - b of the scalar stage.
template <int Mask>
inline __m256 Butterfly(__m256 v, __m256 swapped) {
  return _mm256_blend_ps(_mm256_add_ps(v, swapped), _mm256_sub_ps(swapped, v), Mask);
}

void WalshHadamardAvx2(float* x, int n) {
  for (int i = 0; i < n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    v = Butterfly<0xAA>(v, _mm256_permute_ps(v, 0xB1));          // h = 1
    v = Butterfly<0xCC>(v, _mm256_permute_ps(v, 0x4E));          // h = 2
    v = Butterfly<0xF0>(v, _mm256_permute2f128_ps(v, v, 0x01));  // h = 4
    _mm256_storeu_ps(x + i, v);
  }
  for (int h = 8; h < n; h *= 2) {
    for (int i = 0; i < n; i += 2 * h) {
      for (int j = i; j < i + h; j += 8) {
        const __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + h);
        _mm256_storeu_ps(x + j, _mm256_add_ps(a, b));
        _mm256_storeu_ps(x + j + h, _mm256_sub_ps(a, b));
      }
    }
  }
}

void ApplySignsAvx2(float* x, const uint32_t* masks, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 m =
        _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(masks + i)));
    _mm256_storeu_ps(x + i, _mm256_xor_ps(_mm256_loadu_ps(x + i), m));
  }
}

void ScaleAvx2(float* x, int n, float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  for (int i = 0; i < n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), s));
}

template <bool kInverse, bool kSimd>
void Transform(float* x, int64_t rows, int64_t cols, int block, uint64_t seed) {
  BITSPLIT_CHECK(ValidateHadamard(block, cols).ok());
  thread_local std::vector<uint32_t> masks;
  SignMasks(seed, cols, &masks);
  const float scale = HadamardScale(block);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < cols; b += block) {
      float* v = x + r * cols + b;
      const uint32_t* m = masks.data() + b;
      if constexpr (kSimd) {
        if (!kInverse) ApplySignsAvx2(v, m, block);
        WalshHadamardAvx2(v, block);
        ScaleAvx2(v, block, scale);
        if (kInverse) ApplySignsAvx2(v, m, block);
      } else {
        if (!kInverse) ApplySignsScalar(v, m, block);
        WalshHadamardScalar(v, block);
        ScaleScalar(v, block, scale);
        if (kInverse) ApplySignsScalar(v, m, block);
      }
    }
  }
}

}  // namespace

absl::Status ValidateHadamard(int block, int64_t cols) {
  if (block < 8 || block > 1024 || (block & (block - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Hadamard block ", block, " is not a power of two in [8, 1024]"));
  }
  if (cols <= 0 || cols % block != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("row length ", cols, " is not a positive multiple of Hadamard block ", block));
  }
  return absl::OkStatus();
}

float HadamardSign(uint64_t seed, int64_t column) {
  return ((SplitMixWord(seed, column / 64) >> (column % 64)) & 1) ? -1.0f : 1.0f;
}

float HadamardScale(int block) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(block)));
}

void HadamardRotateRows(float* x, int64_t rows, int64_t cols, int block, uint64_t seed) {
  Transform</*kInverse=*/false, /*kSimd=*/true>(x, rows, cols, block, seed);
}
void HadamardUnrotateRows(float* x, int64_t rows, int64_t cols, int block, uint64_t seed) {
  Transform</*kInverse=*/true, /*kSimd=*/true>(x, rows, cols, block, seed);
}
void HadamardRotateRowsReference(float* x, int64_t rows, int64_t cols, int block, uint64_t seed) {
  Transform</*kInverse=*/false, /*kSimd=*/false>(x, rows, cols, block, seed);
}
void HadamardUnrotateRowsReference(float* x, int64_t rows, int64_t cols, int block, uint64_t seed) {
  Transform</*kInverse=*/true, /*kSimd=*/false>(x, rows, cols, block, seed);
}

}  // namespace bitsplit::quant
