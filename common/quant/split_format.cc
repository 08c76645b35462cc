#include "common/quant/split_format.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/quant/base_group_fit.h"
#include "common/quant/ggml_blocks.h"
#include "common/util/fp16.h"
#include "common/util/status_macros.h"

namespace bitsplit::quant {
namespace {

constexpr uint16_t kFp16Infinity = 0x7c00;

// Indexed by SplitFormat.
constexpr SplitFormatInfo Info(SplitFormat format, const char* name) {
  return {SplitFormatTraitsOf(format), name};
}
constexpr SplitFormatInfo kFormatInfo[kNumSplitFormats] = {
    Info(SplitFormat::kB2Sym, "b2_sym"), Info(SplitFormat::kB2Asym, "b2_asym"),
    Info(SplitFormat::kB3Sym, "b3_sym"), Info(SplitFormat::kB3Asym, "b3_asym"),
    Info(SplitFormat::kB4Sym, "b4_sym"), Info(SplitFormat::kB4Asym, "b4_asym"),
    Info(SplitFormat::kR6, "r6"),        Info(SplitFormat::kR8, "r8"),
    Info(SplitFormat::kQ8_0, "q8_0"),    Info(SplitFormat::kR3, "r3"),
    Info(SplitFormat::kR4, "r4"),        Info(SplitFormat::kR5, "r5"),
    Info(SplitFormat::kBTern, "bt_sym"),
};
static_assert(sizeof(BlockQ8_0) == 2 + sizeof(SubBlock8));

// ---- Bit planes (see split_format.h) --------------------------------------------------------

void PackPlane2(const uint8_t* codes, uint8_t* plane) {  // codes: 32 values, low 2 bits used
  std::memset(plane, 0, 8);
  for (int j = 0; j < kSplitSubBlock; ++j) plane[j % 8] |= (codes[j] & 3) << (2 * (j / 8));
}
void PackPlane1(const uint8_t* codes, int bit, uint8_t* plane) {  // bit `bit` of each code
  std::memset(plane, 0, 4);
  for (int j = 0; j < kSplitSubBlock; ++j) plane[j % 4] |= ((codes[j] >> bit) & 1) << (j / 4);
}
void PackPlane4(const uint8_t* codes, uint8_t* plane) {  // low 4 bits of each code
  for (int j = 0; j < 16; ++j) plane[j] = (codes[j] & 15) | ((codes[j + 16] & 15) << 4);
}
int Plane2(const uint8_t* plane, int j) { return (plane[j % 8] >> (2 * (j / 8))) & 3; }
int Plane1(const uint8_t* plane, int j) { return (plane[j % 4] >> (j / 4)) & 1; }
int Plane4(const uint8_t* plane, int j) { return j < 16 ? plane[j] & 15 : plane[j - 16] >> 4; }
// Ternary: element j is trit j % 5 of byte j / 5 (SubBlockTern).
void PackTern(const uint8_t* codes, uint8_t* out) {
  for (int b = 0; b < static_cast<int>(sizeof(SubBlockTern)); ++b) {
    uint8_t trits[kTernTritsPerByte] = {};
    for (int i = 0; i < kTernTritsPerByte && kTernTritsPerByte * b + i < kSplitSubBlock; ++i) {
      trits[i] = codes[kTernTritsPerByte * b + i];
    }
    out[b] = TernPackByte(trits);
  }
}
int Tern(const uint8_t* p, int j) {
  return TernTrit(p[j / kTernTritsPerByte], j % kTernTritsPerByte);
}

// Packs 32 codes (unsigned q, or c + 128 reinterpreted for the signed formats) into a sub-block.
void PackSubBlock(SplitFormat format, const uint8_t* codes, uint8_t* out) {
  switch (format) {
    case SplitFormat::kB2Sym:
    case SplitFormat::kB2Asym:
      PackPlane2(codes, out);
      return;
    case SplitFormat::kB3Sym:
    case SplitFormat::kB3Asym:
    case SplitFormat::kR3: {
      PackPlane2(codes, out);
      PackPlane1(codes, 2, out + 8);
      return;
    }
    case SplitFormat::kB4Sym:
    case SplitFormat::kB4Asym:
    case SplitFormat::kR4:
      PackPlane4(codes, out);
      return;
    case SplitFormat::kR5:
      PackPlane4(codes, out);
      PackPlane1(codes, 4, out + 16);
      return;
    case SplitFormat::kR6: {
      PackPlane4(codes, out);
      uint8_t high[kSplitSubBlock];
      for (int j = 0; j < kSplitSubBlock; ++j) high[j] = codes[j] >> 4;
      PackPlane2(high, out + 16);
      return;
    }
    case SplitFormat::kR8:
    case SplitFormat::kQ8_0:
      std::memcpy(out, codes, kSplitSubBlock);  // already the int8 bit patterns
      return;
    case SplitFormat::kBTern:
      PackTern(codes, out);
      return;
  }
  BITSPLIT_CHECK(false);
}

uint16_t LoadHalf(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return h;
}
void StoreHalf(uint16_t h, uint8_t* p) { std::memcpy(p, &h, sizeof(h)); }

// One block of ggml's quantize_row_q8_0_ref: its fp16 scale and 32 codes.
void QuantizeQ8_0Block(const float* v, uint16_t* d_out, int8_t* codes) {
  float amax = 0.0f;
  for (int j = 0; j < kQk; ++j) amax = std::max(amax, std::fabs(v[j]));  // ggml's MAX(amax, |v|)
  const float d = amax / ((1 << 7) - 1);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  *d_out = Fp32ToFp16(d);
  for (int j = 0; j < kQk; ++j) codes[j] = static_cast<int8_t>(std::roundf(v[j] * id));
}

bool AllFinite(const float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(v[i])) return false;
  }
  return true;
}

}  // namespace

const SplitFormatInfo& GetSplitFormatInfo(SplitFormat format) {
  const auto index = static_cast<uint32_t>(format);
  BITSPLIT_CHECK(index < kNumSplitFormats);
  return kFormatInfo[index];
}

absl::StatusOr<SplitFormat> ResidualFormatOfBits(int bits) {
  for (const SplitFormatInfo& info : kFormatInfo) {
    if (info.is_residual && info.bits == bits) return static_cast<SplitFormat>(&info - kFormatInfo);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("no residual format of ", bits, " bits (3, 4, 5, 6 or 8)"));
}

absl::StatusOr<SplitFormat> ParseSplitFormat(std::string_view name) {
  for (int i = 0; i < kNumSplitFormats; ++i) {
    if (name == kFormatInfo[i].name) return static_cast<SplitFormat>(i);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown split format '", std::string(name), "'"));
}

absl::Status ValidateSplitLayout(SplitFormat format, int group, int64_t cols) {
  if (static_cast<uint32_t>(format) >= kNumSplitFormats) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown split format id ", static_cast<uint32_t>(format)));
  }
  const char* name = GetSplitFormatInfo(format).name;
  if (group <= 0 || group % kSplitSubBlock != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": group size ", group, " is not a positive multiple of 32"));
  }
  if (format == SplitFormat::kQ8_0 && group != kSplitSubBlock) {
    return absl::InvalidArgumentError(absl::StrCat("q8_0: group size must be 32, got ", group));
  }
  if (cols <= 0 || cols % group != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": row length ", cols, " is not a positive multiple of group ", group));
  }
  return absl::OkStatus();
}

SplitRowLayout GetSplitRowLayout(SplitFormat format, int group, int64_t cols) {
  BITSPLIT_CHECK(ValidateSplitLayout(format, group, cols).ok());
  return SplitRowLayoutOf(format, group, cols);
}

size_t SplitRowBytes(SplitFormat format, int group, int64_t cols) {
  return GetSplitRowLayout(format, group, cols).row_bytes;
}

absl::Status QuantizeBaseRow(SplitFormat format, int group, const float* w, const float* importance,
                             int64_t cols, uint8_t* out) {
  BITSPLIT_RETURN_IF_ERROR(ValidateSplitLayout(format, group, cols));
  const SplitFormatInfo& info = GetSplitFormatInfo(format);
  if (!info.is_base) {
    return absl::InvalidArgumentError(absl::StrCat(info.name, " is not a base format"));
  }
  if (!AllFinite(w, cols)) return absl::InvalidArgumentError("base weights are not finite");
  if (importance != nullptr) {
    for (int64_t i = 0; i < cols; ++i) {
      if (!std::isfinite(importance[i]) || importance[i] < 0.0f) {
        return absl::InvalidArgumentError(
            absl::StrCat("importance[", i, "] = ", importance[i], " is not a finite weight >= 0"));
      }
    }
  }
  // Ternary is the symmetric grid of 3 levels, offset 1 (-d, 0, d): the symmetric fit's
  // one-orientation case (top level = offset).
  const int levels = SplitCodeLevels(format);
  const SplitRowLayout layout = GetSplitRowLayout(format, group, cols);
  std::vector<float> ones(group, 1.0f);
  std::vector<uint8_t> codes(group);
  BaseGroupFitter fitter;
  for (int64_t g = 0; g < layout.groups; ++g) {
    GroupData data{w + g * group, ones.data(), group};
    if (importance != nullptr) {
      double total = 0.0;
      for (int i = 0; i < group; ++i) total += importance[g * group + i];
      if (total > 0.0) data.a = importance + g * group;  // all-zero importance: unweighted
    }
    if (info.has_min) {
      uint16_t d, m;
      fitter.FitAsymmetric(data, levels, codes.data(), &d, &m);
      StoreHalf(d, out + layout.scale_offset + g * layout.scale_stride);
      StoreHalf(m, out + layout.min_offset + g * layout.min_stride);
    } else {
      StoreHalf(fitter.FitSymmetric(data, levels, info.code_offset, codes.data()),
                out + layout.scale_offset + g * layout.scale_stride);
    }
    const int64_t first_sub_block = g * (group / kSplitSubBlock);
    for (int s = 0; s < group / kSplitSubBlock; ++s) {
      PackSubBlock(format, codes.data() + s * kSplitSubBlock,
                   out + layout.code_offset + (first_sub_block + s) * layout.code_stride);
    }
  }
  return absl::OkStatus();
}

absl::Status QuantizeResidualRow(SplitFormat format, int group, const float* r, int64_t cols,
                                 uint8_t* out) {
  BITSPLIT_RETURN_IF_ERROR(ValidateSplitLayout(format, group, cols));
  const SplitFormatInfo& info = GetSplitFormatInfo(format);
  if (!info.is_residual) {
    return absl::InvalidArgumentError(absl::StrCat(info.name, " is not a residual format"));
  }
  if (!AllFinite(r, cols)) return absl::InvalidArgumentError("residual values are not finite");
  // N = 2^(b-1) - 1 (3, 7, 15, 31, 127): symmetric, no -2^(b-1). The unsigned formats store
  // q = c + offset (offset = N + 1), so q is in 1..2N + 1 and never 0.
  const int max_code = (1 << (info.bits - 1)) - 1;
  const SplitRowLayout layout = GetSplitRowLayout(format, group, cols);
  uint8_t codes[kSplitSubBlock];
  for (int64_t g = 0; g < layout.groups; ++g) {
    const float* values = r + g * group;
    float amax = 0.0f;
    for (int i = 0; i < group; ++i) amax = std::max(amax, std::fabs(values[i]));
    // The smallest fp16 d with d >= amax / N: rounding d up is what keeps every code unclipped.
    const float wanted = amax / static_cast<float>(max_code);
    uint16_t h = Fp32ToFp16(wanted);
    if (Fp16ToFp32(h) < wanted) ++h;  // positive finite halves are ordered like their bits
    if (h >= kFp16Infinity) {
      return absl::InvalidArgumentError(absl::StrCat(
          "residual magnitude ", amax, " needs a scale beyond the fp16 range (group ", g, ")"));
    }
    const float d = Fp16ToFp32(h);
    StoreHalf(h, out + layout.scale_offset + g * layout.scale_stride);
    const int64_t first_sub_block = g * (group / kSplitSubBlock);
    for (int s = 0; s < group / kSplitSubBlock; ++s) {
      for (int j = 0; j < kSplitSubBlock; ++j) {
        const float x = values[s * kSplitSubBlock + j];
        const float c = d != 0.0f ? std::nearbyint(x / d) : 0.0f;
        const int code = static_cast<int>(
            std::clamp(c, -static_cast<float>(max_code), static_cast<float>(max_code)));
        codes[j] = info.signed_codes
                       ? static_cast<uint8_t>(static_cast<int8_t>(code))
                       : static_cast<uint8_t>(code + static_cast<int>(info.code_offset));
      }
      PackSubBlock(format, codes,
                   out + layout.code_offset + (first_sub_block + s) * layout.code_stride);
    }
  }
  return absl::OkStatus();
}

absl::Status QuantizeSplitRow(SplitFormat base_format, int base_group, SplitFormat residual_format,
                              int residual_group, const float* w, const float* importance,
                              int64_t cols, uint8_t* base_out, uint8_t* residual_out) {
  BITSPLIT_RETURN_IF_ERROR(QuantizeBaseRow(base_format, base_group, w, importance, cols, base_out));
  BITSPLIT_RETURN_IF_ERROR(ValidateSplitLayout(residual_format, residual_group, cols));
  std::vector<float> residual(cols);
  DequantizeSplitRow(base_format, base_group, base_out, cols, residual.data());
  for (int64_t i = 0; i < cols; ++i) residual[i] = w[i] - residual[i];
  return QuantizeResidualRow(residual_format, residual_group, residual.data(), cols, residual_out);
}

void QuantizeQ8_0Row(const float* x, int64_t cols, uint8_t* out) {
  BITSPLIT_CHECK(cols % kQk == 0);
  for (int64_t b = 0; b < cols / kQk; ++b) {
    BlockQ8_0 block;
    QuantizeQ8_0Block(x + b * kQk, &block.d, block.qs);
    std::memcpy(out + b * sizeof(BlockQ8_0), &block, sizeof(block));
  }
}

void QuantizeQ8_0SplitRow(const float* x, int64_t cols, uint8_t* out) {
  BITSPLIT_CHECK(cols % kQk == 0);
  const SplitRowLayout layout = GetSplitRowLayout(SplitFormat::kQ8_0, kQk, cols);
  for (int64_t b = 0; b < layout.sub_blocks; ++b) {
    uint16_t d;
    QuantizeQ8_0Block(x + b * kQk, &d,
                      reinterpret_cast<int8_t*>(out + layout.code_offset + b * layout.code_stride));
    StoreHalf(d, out + layout.scale_offset + b * layout.scale_stride);
  }
}

void UnpackSubBlock(SplitFormat format, const uint8_t* p, int codes[kSplitSubBlock]) {
  for (int j = 0; j < kSplitSubBlock; ++j) {
    switch (format) {
      case SplitFormat::kB2Sym:
      case SplitFormat::kB2Asym:
        codes[j] = Plane2(p, j);
        break;
      case SplitFormat::kB3Sym:
      case SplitFormat::kB3Asym:
      case SplitFormat::kR3:
        codes[j] = Plane2(p, j) | (Plane1(p + 8, j) << 2);
        break;
      case SplitFormat::kB4Sym:
      case SplitFormat::kB4Asym:
      case SplitFormat::kR4:
        codes[j] = Plane4(p, j);
        break;
      case SplitFormat::kR5:
        codes[j] = Plane4(p, j) | (Plane1(p + 16, j) << 4);
        break;
      case SplitFormat::kR6:
        codes[j] = Plane4(p, j) | (Plane2(p + 16, j) << 4);
        break;
      case SplitFormat::kR8:
      case SplitFormat::kQ8_0:
        codes[j] = static_cast<int8_t>(p[j]);
        break;
      case SplitFormat::kBTern:
        codes[j] = Tern(p, j);
        break;
    }
  }
}

void DequantizeSplitRow(SplitFormat format, int group, const uint8_t* row, int64_t cols,
                        float* out) {
  const SplitFormatInfo& info = GetSplitFormatInfo(format);
  const SplitRowLayout layout = GetSplitRowLayout(format, group, cols);
  const int sub_blocks_per_group = group / kSplitSubBlock;
  int codes[kSplitSubBlock];
  for (int64_t g = 0; g < layout.groups; ++g) {
    const float d = Fp16ToFp32(LoadHalf(row + layout.scale_offset + g * layout.scale_stride));
    const float m =
        info.has_min ? Fp16ToFp32(LoadHalf(row + layout.min_offset + g * layout.min_stride)) : 0;
    for (int s = 0; s < sub_blocks_per_group; ++s) {
      const int64_t b = g * sub_blocks_per_group + s;
      UnpackSubBlock(format, row + layout.code_offset + b * layout.code_stride, codes);
      float* y = out + b * kSplitSubBlock;
      for (int j = 0; j < kSplitSubBlock; ++j) {
        const float q = static_cast<float>(codes[j]);
        if (info.has_min) {
          y[j] = d * q + m;
        } else if (info.signed_codes) {
          y[j] = q * d;  // ggml's order for Q8_0 (x * d); the product commutes anyway
        } else {
          y[j] = d * (q - info.code_offset);
        }
      }
    }
  }
}

float SplitGroupScale(SplitFormat format, int group, int64_t cols, const uint8_t* row,
                      int64_t group_index) {
  const SplitRowLayout layout = GetSplitRowLayout(format, group, cols);
  BITSPLIT_CHECK(0 <= group_index && group_index < layout.groups);
  return Fp16ToFp32(LoadHalf(row + layout.scale_offset + group_index * layout.scale_stride));
}

}  // namespace bitsplit::quant
