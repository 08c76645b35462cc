#pragma once
// Block Hadamard rotation with random signs: for each block of n consecutive columns of a row,
//   x' = (1 / sqrt(n)) · H_n · S · x
// where H_n is the n x n Sylvester Hadamard matrix (H[i][j] = (-1)^popcount(i & j)) and S is
// diagonal with the row-independent signs s[column] = HadamardSign(seed, column). The map is
// orthonormal, so rotating both the weight rows (once, at quantize time) and the activation rows
// (at run time) with the same (block, seed) leaves x · Wᵀ unchanged while spreading outliers
// across each block. The inverse is x = S · H_n · x' / sqrt(n).
//
// Each row is transformed independently and in a fixed operation order (sign flip, butterfly
// stages h = 1, 2, 4, ..., n/2 computing a + b and a - b, then one multiply by the f32 constant
// HadamardScale(n)), so the AVX2 and scalar versions agree bit for bit and a row's result does
// not depend on the other rows (batch invariance).
#include <cstdint>

#include "absl/status/status.h"

namespace bitsplit::quant {

// OK when `block` is a power of two in [8, 1024] and `cols` a positive multiple of it.
absl::Status ValidateHadamard(int block, int64_t cols);

// +1 or -1: bit (column % 64) of splitmix64 output number column / 64 + 1 for state `seed`
// (i.e. mix(seed + (column / 64 + 1) * 0x9E3779B97F4A7C15)); set means -1.
float HadamardSign(uint64_t seed, int64_t column);

// float(1 / sqrt(n)), the normalization both implementations multiply by.
float HadamardScale(int block);

// In place on row-major x[rows][cols] (AVX2). BITSPLIT_CHECKs ValidateHadamard.
void HadamardRotateRows(float* x, int64_t rows, int64_t cols, int block, uint64_t seed);
void HadamardUnrotateRows(float* x, int64_t rows, int64_t cols, int block, uint64_t seed);

// Scalar versions of the same operations (bit-identical).
void HadamardRotateRowsReference(float* x, int64_t rows, int64_t cols, int block, uint64_t seed);
void HadamardUnrotateRowsReference(float* x, int64_t rows, int64_t cols, int block, uint64_t seed);

}  // namespace bitsplit::quant
