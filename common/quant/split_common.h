#pragma once
// What host code (g++, C++20) and device code (nvcc, C++17) must read identically, declared once
// for both: the split formats, each format's static facts, the sub-block packings, the row
// layout, and the Philox uniform that every sampler draws from. Losslessness depends on the two
// sides agreeing bit for bit, so neither keeps a copy. Plain C++17 with no absl, so that
// common/cuda/*.cu includes it as it is (ggml-common.h is the model). Formats and packings are
// described in split_format.h and docs/formats.md.
#include <Random123/philox.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#if defined(__CUDACC__)
#define BITSPLIT_HOST_DEVICE __host__ __device__
#else
#define BITSPLIT_HOST_DEVICE
#endif

namespace bitsplit {
namespace quant {

enum class SplitFormat : uint32_t {
  kB2Sym = 0,
  kB2Asym = 1,
  kB3Sym = 2,
  kB3Asym = 3,
  kB4Sym = 4,
  kB4Asym = 5,
  kR6 = 6,
  kR8 = 7,
  kQ8_0 = 8,
  kR3 = 9,
  kR4 = 10,
  kR5 = 11,
  kBTern = 12,
};
inline constexpr int kNumSplitFormats = 13;

// Elements per sub-block: the unit of code packing and of the integer dot products.
inline constexpr int kSplitSubBlock = 32;

// Static facts about a format (the host adds its name: SplitFormatInfo).
struct SplitFormatTraits {
  int bits;             // bits per code (kBTern: 2, the width of its code range 0..2; it packs
                        // 1.75 bits per element, sub_block_bytes)
  bool is_base;         // kB*: produced by QuantizeBaseRow
  bool is_residual;     // kR3 .. kR8: produced by QuantizeResidualRow
  bool has_min;         // the row stores an fp16 min m per group after the scales
  bool signed_codes;    // codes are int8 (kR8, kQ8_0); otherwise unsigned with an offset
  float code_offset;    // y = d * (q - code_offset) for the unsigned symmetric formats
  int sub_block_bytes;  // bytes of packed codes per 32 elements
};

// The traits of `format`; an id beyond the enum gets bits = 0.
BITSPLIT_HOST_DEVICE constexpr SplitFormatTraits SplitFormatTraitsOf(SplitFormat format) {
  switch (format) {  //   bits base   resid  min    signed offset bytes
    case SplitFormat::kB2Sym:
      return {2, true, false, false, false, 1.5f, 8};
    case SplitFormat::kB2Asym:
      return {2, true, false, true, false, 0.0f, 8};
    case SplitFormat::kB3Sym:
      return {3, true, false, false, false, 4.0f, 12};
    case SplitFormat::kB3Asym:
      return {3, true, false, true, false, 0.0f, 12};
    case SplitFormat::kB4Sym:
      return {4, true, false, false, false, 8.0f, 16};
    case SplitFormat::kB4Asym:
      return {4, true, false, true, false, 0.0f, 16};
    case SplitFormat::kR6:
      return {6, false, true, false, false, 32.0f, 24};
    case SplitFormat::kR8:
      return {8, false, true, false, true, 0.0f, 32};
    case SplitFormat::kQ8_0:
      return {8, false, false, false, true, 0.0f, 32};
    case SplitFormat::kR3:
      return {3, false, true, false, false, 4.0f, 12};
    case SplitFormat::kR4:
      return {4, false, true, false, false, 8.0f, 16};
    case SplitFormat::kR5:
      return {5, false, true, false, false, 16.0f, 20};
    case SplitFormat::kBTern:
      return {2, true, false, false, false, 1.0f, 7};
  }
  return {0, false, false, false, false, 0.0f, 0};
}

// How many code values q an unsigned format's grid has (q in 0 .. levels - 1): 3 for the ternary
// base, 2^bits otherwise.
BITSPLIT_HOST_DEVICE constexpr int SplitCodeLevels(SplitFormat format) {
  return format == SplitFormat::kBTern ? 3 : 1 << SplitFormatTraitsOf(format).bits;
}

// ---- Sub-block packings (32 elements each; element j, code bits as named) -------------------
// Plane2: j -> bits 2*(j/8)..2*(j/8)+1 of byte j%8.          (8 bytes)
// Plane1: j -> bit j/4 of byte j%4.                          (4 bytes)
// Plane4: j < 16 -> low nibble of byte j; else high nibble of byte j-16 (like ggml's Q4_0).
struct SubBlock2 {
  uint8_t qs[8];  // Plane2 of the 2-bit codes
};
struct SubBlock3 {
  uint8_t ql[8];  // Plane2 of code bits 0-1
  uint8_t qh[4];  // Plane1 of code bit 2
};
struct SubBlock4 {
  uint8_t qs[16];  // Plane4 of the 4-bit codes
};
struct SubBlock5 {
  uint8_t ql[16];  // Plane4 of code bits 0-3
  uint8_t qh[4];   // Plane1 of code bit 4
};
struct SubBlock6 {
  uint8_t ql[16];  // Plane4 of code bits 0-3
  uint8_t qh[8];   // Plane2 of code bits 4-5
};
struct SubBlock8 {
  int8_t qs[32];  // signed codes in element order
};
// Ternary codes t in 0..2, five per byte in base 3: element j is trit j % 5 of byte j / 5
// (bytes 0-5 hold elements 0-29, byte 6 elements 30 and 31 in its trits 0 and 1, trits 2-4
// zero). A byte holding trits t0..t4 (t0 the most significant: v = 81 t0 + 27 t1 + 9 t2 + 3 t3 +
// t4 < 243) stores ceil(v * 256 / 243), a base-3 fraction scaled to a byte, so that trit i is
// ((uint8_t)(byte * 3^i) * 3) >> 8: multiplying by 3^i drops the trits above i (mod 256), and
// the top of the product by 3 is the next trit. SIMD decodes it with 16-bit multiplies
// (ggml's TQ1_0 stores its trits the same way).
struct SubBlockTern {
  uint8_t qs[7];
};
inline constexpr int kTernTritsPerByte = 5;
BITSPLIT_HOST_DEVICE constexpr int TernPow3(int i) {
  int power = 1;
  for (; i > 0; --i) power *= 3;
  return power;
}
// The stored byte of five trits, t[0] the most significant.
BITSPLIT_HOST_DEVICE constexpr uint8_t TernPackByte(const uint8_t (&t)[kTernTritsPerByte]) {
  int v = 0;
  for (int i = 0; i < kTernTritsPerByte; ++i) v = 3 * v + t[i];
  return static_cast<uint8_t>((v * 256 + 242) / 243);
}
// Trit i (0..4) of a stored byte.
BITSPLIT_HOST_DEVICE constexpr int TernTrit(uint8_t byte, int i) {
  return (static_cast<uint8_t>(byte * TernPow3(i)) * 3) >> 8;
}

static_assert(sizeof(SubBlock2) == 8 && sizeof(SubBlock3) == 12 && sizeof(SubBlock4) == 16);
static_assert(sizeof(SubBlock5) == 20 && sizeof(SubBlock6) == 24 && sizeof(SubBlock8) == 32);
static_assert(std::is_trivially_copyable_v<SubBlock6> && std::is_standard_layout_v<SubBlock6>);
static_assert(SplitFormatTraitsOf(SplitFormat::kB2Sym).sub_block_bytes == sizeof(SubBlock2));
static_assert(SplitFormatTraitsOf(SplitFormat::kB3Sym).sub_block_bytes == sizeof(SubBlock3));
static_assert(SplitFormatTraitsOf(SplitFormat::kB4Sym).sub_block_bytes == sizeof(SubBlock4));
static_assert(SplitFormatTraitsOf(SplitFormat::kR3).sub_block_bytes == sizeof(SubBlock3));
static_assert(SplitFormatTraitsOf(SplitFormat::kR4).sub_block_bytes == sizeof(SubBlock4));
static_assert(SplitFormatTraitsOf(SplitFormat::kR5).sub_block_bytes == sizeof(SubBlock5));
static_assert(SplitFormatTraitsOf(SplitFormat::kR6).sub_block_bytes == sizeof(SubBlock6));
static_assert(SplitFormatTraitsOf(SplitFormat::kR8).sub_block_bytes == sizeof(SubBlock8));
static_assert(SplitFormatTraitsOf(SplitFormat::kBTern).sub_block_bytes == sizeof(SubBlockTern));
static_assert((kSplitSubBlock + kTernTritsPerByte - 1) / kTernTritsPerByte == sizeof(SubBlockTern));
static_assert(TernPow3(kTernTritsPerByte) <= 256, "five trits fit a byte");

// Where things are inside one row: group g's scale at scale_offset + g * scale_stride (fp16),
// its min at min_offset + g * min_stride (asymmetric formats), sub-block b's codes at
// code_offset + b * code_stride.
struct SplitRowLayout {
  int64_t groups = 0;
  int64_t sub_blocks = 0;
  size_t code_offset = 0;
  size_t code_stride = 0;
  size_t scale_offset = 0;
  size_t scale_stride = 0;
  size_t min_offset = 0;  // meaningful only when the format has_min
  size_t min_stride = 0;
  size_t row_bytes = 0;
};

// The layout of a row of `cols` elements in groups of `group`. Unchecked: the host's
// GetSplitRowLayout validates the arguments first (ValidateSplitLayout).
BITSPLIT_HOST_DEVICE constexpr SplitRowLayout SplitRowLayoutOf(SplitFormat format, int group,
                                                               int64_t cols) {
  const SplitFormatTraits traits = SplitFormatTraitsOf(format);
  SplitRowLayout layout;
  layout.groups = cols / group;
  layout.sub_blocks = cols / kSplitSubBlock;
  layout.code_offset = 0;
  layout.code_stride = static_cast<size_t>(traits.sub_block_bytes);
  layout.scale_offset = static_cast<size_t>(layout.sub_blocks * traits.sub_block_bytes);
  layout.scale_stride = sizeof(uint16_t);
  layout.min_offset = layout.scale_offset + static_cast<size_t>(layout.groups) * sizeof(uint16_t);
  layout.min_stride = sizeof(uint16_t);
  layout.row_bytes =
      layout.min_offset +
      (traits.has_min ? static_cast<size_t>(layout.groups) * sizeof(uint16_t) : size_t{0});
  return layout;
}

}  // namespace quant

// The uniform double in [0, 1) that sampling draws for the token at `position` of a sequence
// seeded with `seed`: Philox4x32-10 of counter (position, 0) under key seed, its first two
// words' top 53 bits. Every value is exactly representable, so the CPU sampler and the device's
// choice kernels draw the same number.
BITSPLIT_HOST_DEVICE inline double PhiloxUniform(uint64_t seed, int64_t position) {
  r123::Philox4x32 philox;
  const uint64_t counter = static_cast<uint64_t>(position);
  r123::Philox4x32::ctr_type ctr = {
      {static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0u, 0u}};
  r123::Philox4x32::key_type key = {
      {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}};
  const r123::Philox4x32::ctr_type out = philox(ctr, key);
  const uint64_t bits = ((static_cast<uint64_t>(out[0]) << 32) | out[1]) >> 11;
  return static_cast<double>(bits) * 0x1.0p-53;
}

}  // namespace bitsplit
