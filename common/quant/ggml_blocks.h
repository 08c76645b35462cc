#pragma once
// Block layouts of the ggml quantization formats, byte for byte as ggml-common.h defines them
// (so a block can be memcpy'd straight out of a GGUF tensor). Half-precision fields are kept as
// raw uint16_t bit patterns; convert them with common/util/fp16.h.
//
// Every struct is standard-layout with 2-byte alignment (MXFP4's: 1) and no padding; the
// static_asserts pin the sizes to GetGgmlTypeTraits() (common/io/ggml_type.cc), which the GGUF
// reader uses to validate tensor extents.
//
// Notation in the comments: a "block" covers kQk (32) or kQkK (256) consecutive elements of a
// row; y[i] is element i of the dequantized block.
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace bitsplit::quant {

// Elements per block of the "legacy" formats (Q4_0 ... Q8_0).
inline constexpr int kQk = 32;
// Elements per super-block of the K-quants (Q2_K ... Q6_K).
inline constexpr int kQkK = 256;
// Bytes of the packed 6-bit scales/mins of Q4_K and Q5_K (and the 6-bit scales of Q3_K).
inline constexpr int kKScaleSize = 12;

// F16 / BF16: one element per "block", a raw 16-bit pattern.
struct BlockF16 {
  uint16_t bits;
};
struct BlockBf16 {
  uint16_t bits;
};

// Q4_0: symmetric 4-bit. y[j] = d * (q[j] - 8), q in 0..15.
// Element j < 16 lives in the low nibble of qs[j], element j + 16 in the high nibble of qs[j].
struct BlockQ4_0 {
  uint16_t d;           // fp16 scale
  uint8_t qs[kQk / 2];  // nibbles, split low/high as above
};

// Q4_1: asymmetric 4-bit. y[j] = d * q[j] + m, q in 0..15; nibble order as Q4_0.
struct BlockQ4_1 {
  uint16_t d;           // fp16 scale
  uint16_t m;           // fp16 offset (the block minimum)
  uint8_t qs[kQk / 2];  // nibbles
};

// Q5_0: symmetric 5-bit. y[j] = d * (q[j] - 16), q in 0..31. The low 4 bits are packed like
// Q4_0; bit 4 of element j is bit j of the little-endian 32-bit word qh.
struct BlockQ5_0 {
  uint16_t d;           // fp16 scale
  uint8_t qh[4];        // fifth bits, little-endian uint32 (kept as bytes: unaligned in ggml)
  uint8_t qs[kQk / 2];  // low nibbles
};

// Q5_1: asymmetric 5-bit. y[j] = d * q[j] + m, q in 0..31; bits packed as Q5_0.
struct BlockQ5_1 {
  uint16_t d;           // fp16 scale
  uint16_t m;           // fp16 offset
  uint8_t qh[4];        // fifth bits, little-endian uint32
  uint8_t qs[kQk / 2];  // low nibbles
};

// Q8_0: symmetric 8-bit. y[j] = d * qs[j].
struct BlockQ8_0 {
  uint16_t d;      // fp16 scale
  int8_t qs[kQk];  // signed codes
};

// Q2_K: 16 sub-blocks of 16 elements, 2-bit codes.
// y = (d * (scales[s] & 0xF)) * q - dmin * (scales[s] >> 4) for sub-block s.
// Layout of qs: two halves of 128 elements, each reading 32 bytes; within a half, element
// 32 * k + l (k = 0..3, l = 0..31) is bits 2k..2k+1 of qs[half * 32 + l]; sub-block
// s = half * 8 + 2k + (l >= 16).
struct BlockQ2_K {
  uint8_t scales[kQkK / 16];  // low nibble: 4-bit scale, high nibble: 4-bit min
  uint8_t qs[kQkK / 4];       // 2-bit codes
  uint16_t d;                 // fp16 super-block scale of the scales
  uint16_t dmin;              // fp16 super-block scale of the mins
};

// Q3_K: 16 sub-blocks of 16 elements, 3-bit signed codes, 6-bit signed scales.
// y = (d * (scale[s] - 32)) * (low2 - (hmask bit set ? 0 : 4)).
// low2 is packed as Q2_K's qs. The high bit of element 32 * k + l of half h (k = 0..3) is bit
// 4h + k of hmask[l]. The 16 6-bit scales: low 4 bits are nibbles of scales[0..7] (scales
// 0..7 in the low nibbles, 8..15 in the high ones), high 2 bits are the bit pairs of
// scales[8..11] (pair p of byte 8 + i belongs to scale 4p + i).
struct BlockQ3_K {
  uint8_t hmask[kQkK / 8];      // high bits of the codes (inverted: set means no -4)
  uint8_t qs[kQkK / 4];         // low 2 bits of the codes
  uint8_t scales[kKScaleSize];  // 16 packed 6-bit scales
  uint16_t d;                   // fp16 super-block scale
};

// Q4_K: 8 sub-blocks of 32 elements, 4-bit codes, 6-bit scales and mins.
// y = (d * sc[s]) * q - dmin * m[s].
// Each 64-element pair of sub-blocks reads 32 bytes of qs: sub-block 2p from the low nibbles,
// 2p + 1 from the high nibbles. sc/m for s < 4: scales[s] & 63, scales[s + 4] & 63; for
// s >= 4: the nibbles of scales[s + 4] plus the top two bits of scales[s - 4] / scales[s].
struct BlockQ4_K {
  uint16_t d;                   // fp16 super-block scale of the scales
  uint16_t dmin;                // fp16 super-block scale of the mins
  uint8_t scales[kKScaleSize];  // 8 scales and 8 mins, 6 bits each
  uint8_t qs[kQkK / 2];         // 4-bit codes
};

// Q5_K: as Q4_K with a fifth code bit: bit 4 of element 64p + l (l < 32) is bit 2p of
// qh[l], of element 64p + 32 + l bit 2p + 1 of qh[l].
struct BlockQ5_K {
  uint16_t d;                   // fp16 super-block scale of the scales
  uint16_t dmin;                // fp16 super-block scale of the mins
  uint8_t scales[kKScaleSize];  // 8 scales and 8 mins, 6 bits each
  uint8_t qh[kQkK / 8];         // fifth bits
  uint8_t qs[kQkK / 2];         // low 4 bits
};

// Q6_K: 16 sub-blocks of 16 elements, 6-bit codes, 8-bit signed scales.
// y = (d * scales[s]) * (q - 32).
// Each 128-element half reads 64 bytes of ql and 32 of qh: element 32k + l (k = 0..3) takes
// its low 4 bits from ql[(k & 1) * 32 + l] (low nibble for k < 2, high for k >= 2) and its high
// 2 bits from bits 2k..2k+1 of qh[l].
struct BlockQ6_K {
  uint8_t ql[kQkK / 2];      // low 4 bits of the codes
  uint8_t qh[kQkK / 4];      // high 2 bits of the codes
  int8_t scales[kQkK / 16];  // signed 8-bit sub-block scales
  uint16_t d;                // fp16 super-block scale
};

// MXFP4 (OCP microscaling FP4; gpt-oss stores its experts in it): 32 elements, y[j] and
// y[j + 16] from the low and high nibble of qs[j], each an E2M1 code, times the E8M0 scale e
// (2^(e - 127)). ggml keeps the codes doubled as integers (0, 1, 2, 3, 4, 6, 8, 12 and their
// negatives) and halves the scale instead: 2^(e - 128), a denormal for e < 2. The one format
// here with 1-byte alignment (17 bytes).
struct BlockMxfp4 {
  uint8_t e;
  uint8_t qs[kQk / 2];
};

// Sizes must match ggml's type traits (common/io/ggml_type.cc) exactly.
static_assert(sizeof(BlockF16) == 2);
static_assert(sizeof(BlockBf16) == 2);
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockMxfp4) == 17);

// Field offsets that differ from "packed in declaration order" would mean padding crept in.
static_assert(offsetof(BlockQ2_K, d) == 80);
static_assert(offsetof(BlockQ3_K, d) == 108);
static_assert(offsetof(BlockQ5_0, qs) == 6);
static_assert(offsetof(BlockQ6_K, d) == 208);

static_assert(std::is_trivially_copyable_v<BlockQ4_K> && std::is_standard_layout_v<BlockQ4_K>);

}  // namespace bitsplit::quant
