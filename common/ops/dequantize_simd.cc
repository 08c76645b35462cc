#include "common/ops/dequantize_simd.h"

#include <cstdint>

#include "common/ops/block_decoders.h"

namespace bitsplit::ops {
namespace {

template <typename Decoder>
void DequantizeWholeBlocks(const uint8_t* src, float* dst, int64_t num_blocks) {
  constexpr int kVectors = Decoder::kElements / 8;
  for (int64_t b = 0; b < num_blocks; ++b) {
    __m256 values[kVectors];
    Decoder::Decode(src + b * Decoder::kBytes, values);
    for (int j = 0; j < kVectors; ++j) {
      _mm256_storeu_ps(dst + b * Decoder::kElements + 8 * j, values[j]);
    }
  }
}

template <typename Decoder>
void DequantizeRow(const void* src, float* dst, int64_t n) {
  DequantizeWholeBlocks<Decoder>(static_cast<const uint8_t*>(src), dst, n / Decoder::kElements);
}

// F16 rows may end in a partial group of 8.
void DequantizeRowF16(const void* src, float* dst, int64_t n) {
  const auto* in = static_cast<const uint8_t*>(src);
  const int64_t whole = n / 8;
  DequantizeWholeBlocks<simd::DecodeF16>(in, dst, whole);
  for (int64_t i = whole * 8; i < n; ++i) dst[i] = simd::LoadHalf(in + 2 * i);
}

}  // namespace

quant::DequantizeRowFn GetSimdDequantizeRowFn(GgmlType type) {
  switch (type) {
    case GgmlType::kF16:
      return DequantizeRowF16;
    case GgmlType::kQ8_0:
      return DequantizeRow<simd::DecodeQ8_0>;
    case GgmlType::kQ4_0:
      return DequantizeRow<simd::DecodeQ4_0>;
    case GgmlType::kQ4_1:
      return DequantizeRow<simd::DecodeQ4_1>;
    default:
      return nullptr;
  }
}

}  // namespace bitsplit::ops
