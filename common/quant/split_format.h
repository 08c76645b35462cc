#pragma once
// The split-quantization formats: every linear weight W is stored as a low-bit base B (the
// draft model, ternary or 2/3/4-bit group-wise codes) plus a residual R (3- to 8-bit symmetric
// codes of W - B), with W ~= B + R. Also Q8_0 (ggml's format, bit-exact quantizer) as a reference
// point.
//
// A row of `cols` elements stores, in this order (SplitRowLayout):
//   codes   cols / 32 SUB-BLOCKS of packed codes, each for 32 consecutive elements
//   scales  cols / group fp16 scales d, one per group
//   mins    cols / group fp16 mins m (asymmetric formats only)
// Scales are kept apart from the codes so that the kernel reads eight consecutive scales with
// one load (split_matmul.cc), and the packing inside a sub-block is chosen so that AVX2 expands
// it to 32 bytes in element order with a broadcast load and one variable shift. kQ8_0 holds
// ggml's Q8_0 values (codes and scales bit for bit) in this layout too, not in ggml's interleaved
// 34-byte blocks, so it runs through r8/g32's kernels. Byte layouts: docs/formats.md, "Split
// formats".
//
// Dequantized value of element j of a group (q: the unsigned code, c: the signed code):
//   kB2Sym  y = d * (q - 1.5)   q in 0..3   (levels +-0.5d, +-1.5d: no zero level)
//   kBTern  y = d * (q - 1)     q in 0..2   (levels -d, 0, d; "bt_sym": 5 codes per byte in base
//                                            3, 7 bytes per 32 elements, SubBlockTern)
//   kB3Sym  y = d * (q - 4)     q in 0..7   (d may be negative: the extra level goes either way)
//   kB4Sym  y = d * (q - 8)     q in 0..15  (likewise)
//   kBnAsym y = d * q + m       q in 0..2^n-1
//   kR3     y = d * (q - 4)     q in 1..7   (c = q - 4 in -3..3; the quantizer never writes 0)
//   kR4     y = d * (q - 8)     q in 1..15  (c in -7..7; packed as kB4Sym)
//   kR5     y = d * (q - 16)    q in 1..31  (c in -15..15; SubBlock5: a nibble and a bit plane)
//   kR6     y = d * (q - 32)    q in 1..63  (c = q - 32 in -31..31; the quantizer never writes 0)
//   kR8     y = d * c           c in -127..127
//   kQ8_0   y = d * c           ggml's Q8_0 values (group must be 32); c in -128..127 when read
//                               from a file, -127..127 from our quantizer
// The 2-bit grid is mid-rise and the 3/4-bit grids mid-tread because that is what measured
// lower error on Gaussian groups (see docs/formats.md).
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/quant/split_common.h"

namespace bitsplit::quant {

// A format's name and its traits (split_common.h, shared with the device code).
struct SplitFormatInfo : SplitFormatTraits {
  const char* name;  // "b2_sym", "r6", "q8_0", ...
};
const SplitFormatInfo& GetSplitFormatInfo(SplitFormat format);
absl::StatusOr<SplitFormat> ParseSplitFormat(std::string_view name);
// The residual format of `bits` per code: 3, 4, 5, 6 or 8 (kR3 .. kR8); INVALID_ARGUMENT
// naming those otherwise.
absl::StatusOr<SplitFormat> ResidualFormatOfBits(int bits);

// OK when `group` is a positive multiple of 32 (exactly 32 for kQ8_0) and `cols` a positive
// multiple of `group`; INVALID_ARGUMENT otherwise. Every other function here requires it and
// BITSPLIT_CHECKs it.
absl::Status ValidateSplitLayout(SplitFormat format, int group, int64_t cols);

// Bytes of one row.
size_t SplitRowBytes(SplitFormat format, int group, int64_t cols);

// The layout of one row (SplitRowLayoutOf, after BITSPLIT_CHECKing ValidateSplitLayout).
SplitRowLayout GetSplitRowLayout(SplitFormat format, int group, int64_t cols);

// The sub-block packings (SubBlock2 .. SubBlock8) are declared in split_common.h.

// ---- Quantizers (scalar reference; deterministic) -------------------------------------------
// Base codes of one row. For each group the scale (and min) is chosen by a grid search around
// the range-derived value, each candidate refitted by weighted least squares, rounded to fp16,
// the codes re-derived from the rounded values and the (importance-weighted) squared error
// measured; the best candidate is kept. `importance` (nullable: all ones) has `cols`
// non-negative per-column weights. INVALID_ARGUMENT for a bad layout, a non-base format, or a
// non-finite w / importance.
absl::Status QuantizeBaseRow(SplitFormat format, int group, const float* w, const float* importance,
                             int64_t cols, uint8_t* out);

// Residual codes of one row (kR3 .. kR8). Per group d = max|r| / N (N = 2^(bits-1) - 1: 3, 7,
// 15, 31 or 127) rounded UP
// to fp16, codes c = round(r / d): no code clips, so |r - d * c| <= d / 2 (plus float rounding
// of the division). INVALID_ARGUMENT for a bad layout/format, non-finite r, or max|r| / N
// beyond the fp16 range.
absl::Status QuantizeResidualRow(SplitFormat format, int group, const float* r, int64_t cols,
                                 uint8_t* out);

// Splits one weight row: base codes into base_out, then the residual w - dequant(base) (f32)
// quantized into residual_out. Groups may differ between the two.
absl::Status QuantizeSplitRow(SplitFormat base_format, int base_group, SplitFormat residual_format,
                              int residual_group, const float* w, const float* importance,
                              int64_t cols, uint8_t* base_out, uint8_t* residual_out);

// ggml's quantize_row_q8_0_ref, bit for bit: per block of 32, d = amax / 127,
// id = d ? 1 / d : 0, c = roundf(x * id) (ties away from zero), d stored as fp16 (nearest).
// cols must be a multiple of 32; out receives cols / 32 BlockQ8_0 (ggml's interleaved blocks, as
// a GGUF Q8_0 tensor holds them).
void QuantizeQ8_0Row(const float* x, int64_t cols, uint8_t* out);

// The same codes and scales as QuantizeQ8_0Row, written as a kQ8_0 split row
// (SplitRowBytes(kQ8_0, 32, cols) bytes: the codes, then the scales).
void QuantizeQ8_0SplitRow(const float* x, int64_t cols, uint8_t* out);

// Dequantizes one row of any split format (the scalar reference of the layouts above).
void DequantizeSplitRow(SplitFormat format, int group, const uint8_t* row, int64_t cols,
                        float* out);

// The f32 value of group `group_index`'s scale d (e.g. the residual step).
float SplitGroupScale(SplitFormat format, int group, int64_t cols, const uint8_t* row,
                      int64_t group_index);

// Unpacks the 32 codes of one sub-block into `codes` in element order: the unsigned q for the
// base formats and kR3 .. kR6, the signed c for kR8 / kQ8_0 (as int).
void UnpackSubBlock(SplitFormat format, const uint8_t* sub_block, int codes[kSplitSubBlock]);

}  // namespace bitsplit::quant
