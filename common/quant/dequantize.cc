#include "common/quant/dequantize.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/quant/ggml_blocks.h"
#include "common/util/fp16.h"

namespace bitsplit::quant {
namespace {

// The arithmetic below mirrors ggml's dequantize_row_* (ggml-quants.c) operation for
// operation, including where products are grouped (e.g. (d * sc) * q, not d * (sc * q)), so
// that results are bit-identical to ggml and to gguf-py's numpy port. The build compiles with
// -ffp-contract=off, so none of these a * b + c become FMAs.

// Blocks are copied out with memcpy: a caller may hand us a pointer into a mapped file or a
// byte buffer that is not aligned for the block struct.
template <typename Block>
Block LoadBlock(const void* src, int64_t index) {
  Block block;
  std::memcpy(&block, static_cast<const uint8_t*>(src) + index * sizeof(Block), sizeof(Block));
  return block;
}

void DequantizeRowF32(const void* src, float* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void DequantizeRowF16(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Fp16ToFp32(LoadBlock<BlockF16>(src, i).bits);
}

void DequantizeRowBf16(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFp32(LoadBlock<BlockBf16>(src, i).bits);
}

void DequantizeRowQ8_0(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQk; ++b) {
    const auto block = LoadBlock<BlockQ8_0>(src, b);
    const float d = Fp16ToFp32(block.d);
    float* y = dst + b * kQk;
    for (int j = 0; j < kQk; ++j) y[j] = static_cast<float>(block.qs[j]) * d;
  }
}

// ggml_e8m0_to_fp32_half: 2^(e - 128) as float bits; e < 2 gives the denormals 2^-128, 2^-127.
float E8m0ToFp32Half(uint8_t e) {
  const uint32_t bits = e < 2 ? uint32_t{0x00200000} << e : static_cast<uint32_t>(e - 1) << 23;
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

void DequantizeRowMxfp4(const void* src, float* dst, int64_t n) {
  static constexpr int8_t kDoubledE2m1[16] = {0, 1,  2,  3,  4,  6,  8,  12,
                                              0, -1, -2, -3, -4, -6, -8, -12};
  for (int64_t b = 0; b < n / kQk; ++b) {
    const auto block = LoadBlock<BlockMxfp4>(src, b);
    const float d = E8m0ToFp32Half(block.e);
    float* y = dst + b * kQk;
    for (int j = 0; j < kQk / 2; ++j) {
      y[j] = static_cast<float>(kDoubledE2m1[block.qs[j] & 0x0f]) * d;
      y[j + kQk / 2] = static_cast<float>(kDoubledE2m1[block.qs[j] >> 4]) * d;
    }
  }
}

void DequantizeRowQ4_0(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQk; ++b) {
    const auto block = LoadBlock<BlockQ4_0>(src, b);
    const float d = Fp16ToFp32(block.d);
    float* y = dst + b * kQk;
    for (int j = 0; j < kQk / 2; ++j) {
      const int low = (block.qs[j] & 0x0f) - 8;
      const int high = (block.qs[j] >> 4) - 8;
      y[j] = static_cast<float>(low) * d;
      y[j + kQk / 2] = static_cast<float>(high) * d;
    }
  }
}

void DequantizeRowQ4_1(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQk; ++b) {
    const auto block = LoadBlock<BlockQ4_1>(src, b);
    const float d = Fp16ToFp32(block.d);
    const float m = Fp16ToFp32(block.m);
    float* y = dst + b * kQk;
    for (int j = 0; j < kQk / 2; ++j) {
      const int low = block.qs[j] & 0x0f;
      const int high = block.qs[j] >> 4;
      y[j] = static_cast<float>(low) * d + m;
      y[j + kQk / 2] = static_cast<float>(high) * d + m;
    }
  }
}

uint32_t LoadLittleEndian32(const uint8_t bytes[4]) {
  return static_cast<uint32_t>(bytes[0]) | (static_cast<uint32_t>(bytes[1]) << 8) |
         (static_cast<uint32_t>(bytes[2]) << 16) | (static_cast<uint32_t>(bytes[3]) << 24);
}

void DequantizeRowQ5_0(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQk; ++b) {
    const auto block = LoadBlock<BlockQ5_0>(src, b);
    const float d = Fp16ToFp32(block.d);
    const uint32_t qh = LoadLittleEndian32(block.qh);
    float* y = dst + b * kQk;
    for (int j = 0; j < kQk / 2; ++j) {
      const int low_fifth_bit = ((qh >> j) & 1u) << 4;
      const int high_fifth_bit = ((qh >> (j + kQk / 2)) & 1u) << 4;
      const int low = ((block.qs[j] & 0x0f) | low_fifth_bit) - 16;
      const int high = ((block.qs[j] >> 4) | high_fifth_bit) - 16;
      y[j] = static_cast<float>(low) * d;
      y[j + kQk / 2] = static_cast<float>(high) * d;
    }
  }
}

void DequantizeRowQ5_1(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQk; ++b) {
    const auto block = LoadBlock<BlockQ5_1>(src, b);
    const float d = Fp16ToFp32(block.d);
    const float m = Fp16ToFp32(block.m);
    const uint32_t qh = LoadLittleEndian32(block.qh);
    float* y = dst + b * kQk;
    for (int j = 0; j < kQk / 2; ++j) {
      const int low_fifth_bit = ((qh >> j) & 1u) << 4;
      const int high_fifth_bit = ((qh >> (j + kQk / 2)) & 1u) << 4;
      const int low = (block.qs[j] & 0x0f) | low_fifth_bit;
      const int high = (block.qs[j] >> 4) | high_fifth_bit;
      y[j] = static_cast<float>(low) * d + m;
      y[j + kQk / 2] = static_cast<float>(high) * d + m;
    }
  }
}

void DequantizeRowQ2_K(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQkK; ++b) {
    const auto block = LoadBlock<BlockQ2_K>(src, b);
    const float d = Fp16ToFp32(block.d);
    const float dmin = Fp16ToFp32(block.dmin);
    float* y = dst + b * kQkK;
    const uint8_t* q = block.qs;
    int sub_block = 0;
    for (int half = 0; half < kQkK / 128; ++half) {
      for (int shift = 0; shift < 8; shift += 2) {
        // Two sub-blocks of 16 per shift: codes from q[0..15], then from q[16..31].
        for (int part = 0; part < 2; ++part) {
          const uint8_t scale_and_min = block.scales[sub_block++];
          const float dl = d * static_cast<float>(scale_and_min & 0x0f);
          const float ml = dmin * static_cast<float>(scale_and_min >> 4);
          for (int l = 0; l < 16; ++l) {
            const int code = (q[part * 16 + l] >> shift) & 3;
            *y++ = dl * static_cast<float>(code) - ml;
          }
        }
      }
      q += 32;
    }
  }
}

// Unpacks Q3_K's 16 6-bit scales (see BlockQ3_K) and removes their bias of 32.
void UnpackQ3KScales(const uint8_t packed[kKScaleSize], int scales[16]) {
  for (int i = 0; i < 16; ++i) {
    const int low = (i < 8) ? (packed[i] & 0x0f) : (packed[i - 8] >> 4);
    const int high = (packed[8 + (i % 4)] >> (2 * (i / 4))) & 3;
    scales[i] = (low | (high << 4)) - 32;
  }
}

void DequantizeRowQ3_K(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQkK; ++b) {
    const auto block = LoadBlock<BlockQ3_K>(src, b);
    const float d_all = Fp16ToFp32(block.d);
    int scales[16];
    UnpackQ3KScales(block.scales, scales);
    float* y = dst + b * kQkK;
    const uint8_t* q = block.qs;
    uint8_t high_bit_mask = 1;
    int sub_block = 0;
    for (int half = 0; half < kQkK / 128; ++half) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int part = 0; part < 2; ++part) {
          const float dl = d_all * static_cast<float>(scales[sub_block++]);
          for (int l = part * 16; l < part * 16 + 16; ++l) {
            // A clear high bit means the code is 4 lower (ggml stores the bit inverted).
            const int code = ((q[l] >> shift) & 3) - ((block.hmask[l] & high_bit_mask) ? 0 : 4);
            *y++ = dl * static_cast<float>(code);
          }
        }
        high_bit_mask = static_cast<uint8_t>(high_bit_mask << 1);
      }
      q += 32;
    }
  }
}

// ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j (0..7) of Q4_K / Q5_K.
void GetScaleMinK4(int j, const uint8_t packed[kKScaleSize], int* scale, int* min) {
  if (j < 4) {
    *scale = packed[j] & 63;
    *min = packed[j + 4] & 63;
  } else {
    *scale = (packed[j + 4] & 0x0f) | ((packed[j - 4] >> 6) << 4);
    *min = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
  }
}

// The effective scales and mins of the two 32-element sub-blocks (2*pair, 2*pair+1) that share
// one 32-byte run of nibbles in Q4_K / Q5_K: y = d1 * q - m1 (low nibbles), d2 * q - m2 (high).
struct SubBlockPairScales {
  float d1, m1, d2, m2;
};
SubBlockPairScales GetSubBlockPairScales(int pair, const uint8_t packed[kKScaleSize], float d,
                                         float dmin) {
  int scale, min;
  GetScaleMinK4(2 * pair, packed, &scale, &min);
  SubBlockPairScales s;
  s.d1 = d * static_cast<float>(scale);
  s.m1 = dmin * static_cast<float>(min);
  GetScaleMinK4(2 * pair + 1, packed, &scale, &min);
  s.d2 = d * static_cast<float>(scale);
  s.m2 = dmin * static_cast<float>(min);
  return s;
}

void DequantizeRowQ4_K(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQkK; ++b) {
    const auto block = LoadBlock<BlockQ4_K>(src, b);
    const float d = Fp16ToFp32(block.d);
    const float dmin = Fp16ToFp32(block.dmin);
    float* y = dst + b * kQkK;
    const uint8_t* q = block.qs;
    for (int pair = 0; pair < kQkK / 64; ++pair) {
      const auto [d1, m1, d2, m2] = GetSubBlockPairScales(pair, block.scales, d, dmin);
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0x0f) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
      q += 32;
    }
  }
}

void DequantizeRowQ5_K(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQkK; ++b) {
    const auto block = LoadBlock<BlockQ5_K>(src, b);
    const float d = Fp16ToFp32(block.d);
    const float dmin = Fp16ToFp32(block.dmin);
    float* y = dst + b * kQkK;
    const uint8_t* ql = block.qs;
    for (int pair = 0; pair < kQkK / 64; ++pair) {
      const auto [d1, m1, d2, m2] = GetSubBlockPairScales(pair, block.scales, d, dmin);
      const uint8_t low_mask = static_cast<uint8_t>(1u << (2 * pair));
      const uint8_t high_mask = static_cast<uint8_t>(2u << (2 * pair));
      for (int l = 0; l < 32; ++l) {
        const int code = (ql[l] & 0x0f) + ((block.qh[l] & low_mask) ? 16 : 0);
        *y++ = d1 * static_cast<float>(code) - m1;
      }
      for (int l = 0; l < 32; ++l) {
        const int code = (ql[l] >> 4) + ((block.qh[l] & high_mask) ? 16 : 0);
        *y++ = d2 * static_cast<float>(code) - m2;
      }
      ql += 32;
    }
  }
}

void DequantizeRowQ6_K(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQkK; ++b) {
    const auto block = LoadBlock<BlockQ6_K>(src, b);
    const float d = Fp16ToFp32(block.d);
    float* y = dst + b * kQkK;
    const uint8_t* ql = block.ql;
    const uint8_t* qh = block.qh;
    const int8_t* sc = block.scales;
    for (int half = 0; half < kQkK / 128; ++half) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        // (d * scale) * q, grouped as in ggml.
        y[l] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

}  // namespace

DequantizeRowFn GetDequantizeRowFn(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return DequantizeRowF32;
    case GgmlType::kF16:
      return DequantizeRowF16;
    case GgmlType::kBF16:
      return DequantizeRowBf16;
    case GgmlType::kQ8_0:
      return DequantizeRowQ8_0;
    case GgmlType::kQ4_0:
      return DequantizeRowQ4_0;
    case GgmlType::kMXFP4:
      return DequantizeRowMxfp4;
    case GgmlType::kQ4_1:
      return DequantizeRowQ4_1;
    case GgmlType::kQ5_0:
      return DequantizeRowQ5_0;
    case GgmlType::kQ5_1:
      return DequantizeRowQ5_1;
    case GgmlType::kQ2_K:
      return DequantizeRowQ2_K;
    case GgmlType::kQ3_K:
      return DequantizeRowQ3_K;
    case GgmlType::kQ4_K:
      return DequantizeRowQ4_K;
    case GgmlType::kQ5_K:
      return DequantizeRowQ5_K;
    case GgmlType::kQ6_K:
      return DequantizeRowQ6_K;
    default:
      return nullptr;
  }
}

absl::Status DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n) {
  const DequantizeRowFn fn = GetDequantizeRowFn(type);
  if (fn == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("dequantization of ggml type ", GgmlTypeName(type), " is not supported"));
  }
  // Every supported type has known traits; the lookup cannot fail here.
  const int64_t block_elements = GetGgmlTypeTraits(type)->block_elements;
  if (n < 0 || n % block_elements != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot dequantize ", n, " elements of ",
                                                   GgmlTypeName(type), ": not a multiple of its ",
                                                   block_elements, "-element block"));
  }
  if (n > 0 && (src == nullptr || dst == nullptr)) {
    return absl::InvalidArgumentError("dequantize: null source or destination buffer");
  }
  fn(src, dst, n);
  return absl::OkStatus();
}

}  // namespace bitsplit::quant
