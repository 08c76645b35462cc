#include "common/quant/split_format.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/quant/ggml_blocks.h"
#include "common/util/fp16.h"
#include "common/util/status_macros.h"

namespace bitsplit::quant {
namespace {

constexpr uint16_t kFp16Infinity = 0x7c00;
constexpr float kFp16Max = 65504.0f;

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

// fp16 bits nearest to v, saturated to the finite range (so a candidate never becomes inf).
uint16_t ToHalfSaturated(float v) { return Fp32ToFp16(std::clamp(v, -kFp16Max, kFp16Max)); }

// ---- Base group fitting ---------------------------------------------------------------------

// One group's inputs: n values and their (positive-sum) weights.
struct GroupData {
  const float* w;
  const float* a;
  int n;
};

struct SymFit {
  uint16_t d = 0;
  double error = INFINITY;
};

// Codes of the symmetric grid y = d * (q - offset) for scale d (nearest level, clamped).
void SymCodes(const GroupData& g, float d, int levels, float offset, uint8_t* q) {
  for (int i = 0; i < g.n; ++i) {
    const float u = d != 0.0f ? std::nearbyint(g.w[i] / d + offset) : std::nearbyint(offset);
    q[i] = static_cast<uint8_t>(std::clamp(u, 0.0f, static_cast<float>(levels - 1)));
  }
}

// Weighted squared error of the stored (fp16-rounded) parameters, exactly as dequantized.
double SymError(const GroupData& g, float d, float offset, const uint8_t* q) {
  double error = 0.0;
  for (int i = 0; i < g.n; ++i) {
    const float y = d * (static_cast<float>(q[i]) - offset);
    const double diff = static_cast<double>(g.w[i]) - y;
    error += g.a[i] * diff * diff;
  }
  return error;
}

// Least-squares scale for fixed codes: argmin_d sum a (w - d c)^2 = sum a w c / sum a c^2.
bool SymRefit(const GroupData& g, float offset, const uint8_t* q, float* d) {
  double wc = 0.0, cc = 0.0;
  for (int i = 0; i < g.n; ++i) {
    const double c = static_cast<double>(q[i]) - offset;
    wc += g.a[i] * g.w[i] * c;
    cc += g.a[i] * c * c;
  }
  if (cc <= 0.0) return false;
  *d = static_cast<float>(wc / cc);
  return std::isfinite(*d);
}

// Tries scale d (unrounded): rounds it to fp16, derives codes, keeps it if it beats `best`.
void TrySymScale(const GroupData& g, float d, int levels, float offset, uint8_t* scratch,
                 SymFit* best) {
  const uint16_t h = ToHalfSaturated(d);
  const float rounded = Fp16ToFp32(h);
  if (rounded == 0.0f) return;
  SymCodes(g, rounded, levels, offset, scratch);
  const double error = SymError(g, rounded, offset, scratch);
  if (error < best->error) *best = {h, error};
}

// Grid search around the range-derived scale (the extreme value on an extreme level), each
// candidate also refitted by least squares; then a few refit rounds from the winner.
uint16_t FitSymGroup(const GroupData& g, int levels, float offset, uint8_t* codes) {
  float amax = 0.0f, extreme = 0.0f;
  for (int i = 0; i < g.n; ++i) {
    if (std::fabs(g.w[i]) > amax) {
      amax = std::fabs(g.w[i]);
      extreme = g.w[i];
    }
  }
  if (amax == 0.0f) {
    SymCodes(g, 0.0f, levels, offset, codes);
    return 0;
  }
  // Mid-rise grids are symmetric: one orientation. Mid-tread grids have one more negative level,
  // so try the extreme on either end (the scale's sign picks which side gets the extra level).
  float bases[2];
  int base_count = 0;
  const float top = static_cast<float>(levels - 1) - offset;  // largest positive code
  if (top == offset) {
    bases[base_count++] = amax / offset;
  } else {
    bases[base_count++] = extreme / -offset;
    bases[base_count++] = extreme / top;
  }
  std::vector<uint8_t> scratch(g.n);
  SymFit best;
  for (int b = 0; b < base_count; ++b) {
    for (int k = 0; k <= 40; ++k) {
      const float d = bases[b] * (0.4f + 0.02f * static_cast<float>(k));
      TrySymScale(g, d, levels, offset, scratch.data(), &best);
      SymCodes(g, d, levels, offset, scratch.data());
      float refit;
      if (SymRefit(g, offset, scratch.data(), &refit)) {
        TrySymScale(g, refit, levels, offset, scratch.data(), &best);
      }
    }
  }
  for (int round = 0; round < 3 && std::isfinite(best.error); ++round) {
    SymCodes(g, Fp16ToFp32(best.d), levels, offset, scratch.data());
    float refit;
    if (!SymRefit(g, offset, scratch.data(), &refit)) break;
    const SymFit before = best;
    TrySymScale(g, refit, levels, offset, scratch.data(), &best);
    if (best.d == before.d) break;
  }
  if (!std::isfinite(best.error)) best.d = 0;  // every candidate underflowed fp16
  SymCodes(g, Fp16ToFp32(best.d), levels, offset, codes);
  return best.d;
}

struct AsymFit {
  uint16_t d = 0;
  uint16_t m = 0;
  double error = INFINITY;
};

void AsymCodes(const GroupData& g, float d, float m, int levels, uint8_t* q) {
  for (int i = 0; i < g.n; ++i) {
    const float u = d != 0.0f ? std::nearbyint((g.w[i] - m) / d) : 0.0f;
    q[i] = static_cast<uint8_t>(std::clamp(u, 0.0f, static_cast<float>(levels - 1)));
  }
}

double AsymError(const GroupData& g, float d, float m, const uint8_t* q) {
  double error = 0.0;
  for (int i = 0; i < g.n; ++i) {
    const float y = d * static_cast<float>(q[i]) + m;
    const double diff = static_cast<double>(g.w[i]) - y;
    error += g.a[i] * diff * diff;
  }
  return error;
}

// Weighted least squares of (d, m) for fixed codes: minimize sum a (d q + m - w)^2.
bool AsymRefit(const GroupData& g, const uint8_t* q, float* d, float* m) {
  double sa = 0, sq = 0, sqq = 0, sw = 0, sqw = 0;
  for (int i = 0; i < g.n; ++i) {
    const double a = g.a[i], qi = q[i], w = g.w[i];
    sa += a;
    sq += a * qi;
    sqq += a * qi * qi;
    sw += a * w;
    sqw += a * qi * w;
  }
  const double det = sa * sqq - sq * sq;
  if (!(det > 0.0)) return false;
  *d = static_cast<float>((sa * sqw - sq * sw) / det);
  *m = static_cast<float>((sqq * sw - sq * sqw) / det);
  return *d > 0.0f && std::isfinite(*d) && std::isfinite(*m);
}

// With the min already rounded, the best scale: argmin_d sum a (w - m - d q)^2.
bool AsymRefitScale(const GroupData& g, const uint8_t* q, float m, float* d) {
  double num = 0, den = 0;
  for (int i = 0; i < g.n; ++i) {
    num += g.a[i] * (static_cast<double>(g.w[i]) - m) * q[i];
    den += g.a[i] * static_cast<double>(q[i]) * q[i];
  }
  if (!(den > 0.0)) return false;
  *d = static_cast<float>(num / den);
  return *d > 0.0f && std::isfinite(*d);
}

void TryAsym(const GroupData& g, float d, float m, int levels, uint8_t* scratch, AsymFit* best) {
  const uint16_t dh = ToHalfSaturated(d);
  const uint16_t mh = ToHalfSaturated(m);
  const float dr = Fp16ToFp32(dh), mr = Fp16ToFp32(mh);
  if (dr <= 0.0f) return;
  AsymCodes(g, dr, mr, levels, scratch);
  double error = AsymError(g, dr, mr, scratch);
  if (error < best->error) *best = {dh, mh, error};
  // Rounding m moved every value; re-fit d for the rounded m and the new codes.
  float refit;
  if (AsymRefitScale(g, scratch, mr, &refit)) {
    const uint16_t rh = ToHalfSaturated(refit);
    const float rr = Fp16ToFp32(rh);
    if (rr > 0.0f && rh != dh) {
      AsymCodes(g, rr, mr, levels, scratch);
      error = AsymError(g, rr, mr, scratch);
      if (error < best->error) *best = {rh, mh, error};
    }
  }
}

// Like llama.cpp's make_qkx2_quants in spirit: candidate inverse scales (levels - 1 + delta) /
// range, each with a least-squares (d, m) refit, plus refit rounds from the winner.
void FitAsymGroup(const GroupData& g, int levels, uint8_t* codes, uint16_t* d_out,
                  uint16_t* m_out) {
  float lo = g.w[0], hi = g.w[0];
  for (int i = 1; i < g.n; ++i) {
    lo = std::min(lo, g.w[i]);
    hi = std::max(hi, g.w[i]);
  }
  AsymFit best;
  std::vector<uint8_t> scratch(g.n);
  const float range = hi - lo;
  if (range > 0.0f && std::isfinite(range)) {
    TryAsym(g, range / static_cast<float>(levels - 1), lo, levels, scratch.data(), &best);
    for (int k = -10; k <= 10; ++k) {
      const float inverse = (static_cast<float>(levels - 1) + 0.1f * k) / range;
      for (int i = 0; i < g.n; ++i) {
        const float u = std::nearbyint((g.w[i] - lo) * inverse);
        scratch[i] = static_cast<uint8_t>(std::clamp(u, 0.0f, static_cast<float>(levels - 1)));
      }
      float d, m;
      if (AsymRefit(g, scratch.data(), &d, &m)) TryAsym(g, d, m, levels, scratch.data(), &best);
    }
    for (int round = 0; round < 3 && std::isfinite(best.error); ++round) {
      AsymCodes(g, Fp16ToFp32(best.d), Fp16ToFp32(best.m), levels, scratch.data());
      float d, m;
      if (!AsymRefit(g, scratch.data(), &d, &m)) break;
      const AsymFit before = best;
      TryAsym(g, d, m, levels, scratch.data(), &best);
      if (best.d == before.d && best.m == before.m) break;
    }
  }
  if (!std::isfinite(best.error)) {  // a constant group (or a range below fp16 resolution)
    const float mean = 0.5f * lo + 0.5f * hi;
    best = {0, ToHalfSaturated(mean), 0.0};
  }
  *d_out = best.d;
  *m_out = best.m;
  AsymCodes(g, Fp16ToFp32(best.d), Fp16ToFp32(best.m), levels, codes);
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
  // Ternary is the symmetric grid of 3 levels, offset 1 (-d, 0, d): FitSymGroup's mid-rise case.
  const int levels = SplitCodeLevels(format);
  const SplitRowLayout layout = GetSplitRowLayout(format, group, cols);
  std::vector<float> ones(group, 1.0f);
  std::vector<uint8_t> codes(group);
  for (int64_t g = 0; g < layout.groups; ++g) {
    GroupData data{w + g * group, ones.data(), group};
    if (importance != nullptr) {
      double total = 0.0;
      for (int i = 0; i < group; ++i) total += importance[g * group + i];
      if (total > 0.0) data.a = importance + g * group;  // all-zero importance: unweighted
    }
    if (info.has_min) {
      uint16_t d, m;
      FitAsymGroup(data, levels, codes.data(), &d, &m);
      StoreHalf(d, out + layout.scale_offset + g * layout.scale_stride);
      StoreHalf(m, out + layout.min_offset + g * layout.min_stride);
    } else {
      StoreHalf(FitSymGroup(data, levels, info.code_offset, codes.data()),
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
