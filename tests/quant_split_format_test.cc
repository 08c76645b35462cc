// Split formats (common/quant/split_format.h): sizes, the documented bit layouts, the base
// quantizer's quality, and the residual round-trip guarantee |W - (B + R)| <= step / 2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/quant/split_format.h"
#include "common/util/fp16.h"
#include "tests/testing/metrics.h"
#include "tests/testing/random.h"

namespace bitsplit::quant {
namespace {

constexpr SplitFormat kBaseFormats[] = {
    SplitFormat::kB2Sym, SplitFormat::kB2Asym, SplitFormat::kB3Sym, SplitFormat::kB3Asym,
    SplitFormat::kB4Sym, SplitFormat::kB4Asym, SplitFormat::kBTern};
constexpr SplitFormat kResidualFormats[] = {SplitFormat::kR3, SplitFormat::kR4, SplitFormat::kR5,
                                            SplitFormat::kR6, SplitFormat::kR8};
constexpr int kGroups[] = {32, 64, 128};

using testing::Gaussian;

// Code values of an unsigned format: the ternary base has 3 (-d, 0, d), the others 2^bits.
int Levels(SplitFormat format) {
  return format == SplitFormat::kBTern ? 3 : 1 << GetSplitFormatInfo(format).bits;
}

std::vector<float> Dequantize(SplitFormat format, int group, const std::vector<uint8_t>& row,
                              int64_t cols) {
  std::vector<float> out(cols);
  DequantizeSplitRow(format, group, row.data(), cols, out.data());
  return out;
}

using testing::Nmse;

TEST(SplitLayout, RowLayoutAndSizes) {
  // Codes first, then the fp16 scales, then (asymmetric) the fp16 mins.
  const SplitRowLayout b2 = GetSplitRowLayout(SplitFormat::kB2Asym, 64, 576);
  EXPECT_EQ(b2.groups, 9);
  EXPECT_EQ(b2.sub_blocks, 18);
  EXPECT_EQ(b2.code_offset, 0u);
  EXPECT_EQ(b2.code_stride, sizeof(SubBlock2));
  EXPECT_EQ(b2.scale_offset, 18 * 8u);
  EXPECT_EQ(b2.scale_stride, 2u);
  EXPECT_EQ(b2.min_offset, 18 * 8u + 9 * 2u);
  EXPECT_EQ(b2.row_bytes, 18 * 8u + 9 * 4u);
  const int sub_bytes[] = {8, 8, 12, 12, 16, 16, 24, 32};
  const size_t sub_sizes[] = {sizeof(SubBlock2), sizeof(SubBlock2), sizeof(SubBlock3),
                              sizeof(SubBlock3), sizeof(SubBlock4), sizeof(SubBlock4),
                              sizeof(SubBlock6), sizeof(SubBlock8)};
  for (int i = 0; i < 8; ++i) {
    const auto format = static_cast<SplitFormat>(i);
    const SplitFormatInfo& info = GetSplitFormatInfo(format);
    EXPECT_EQ(info.sub_block_bytes, sub_bytes[i]);
    EXPECT_EQ(static_cast<size_t>(info.sub_block_bytes), sub_sizes[i]);
    EXPECT_EQ(info.bits * 4, info.sub_block_bytes);
    for (int group : kGroups) {
      const int64_t cols = 4 * group;
      EXPECT_EQ(SplitRowBytes(format, group, cols),
                cols / 32 * info.sub_block_bytes + 4 * (info.has_min ? 4 : 2))
          << info.name;
    }
  }
  // Q8_0 takes the split layout too (not ggml's interleaved blocks): r8/g32's.
  const SplitRowLayout q8 = GetSplitRowLayout(SplitFormat::kQ8_0, 32, 64);
  EXPECT_EQ(q8.code_offset, 0u);
  EXPECT_EQ(q8.code_stride, 32u);
  EXPECT_EQ(q8.scale_offset, 64u);
  EXPECT_EQ(q8.scale_stride, 2u);
  EXPECT_EQ(q8.row_bytes, 68u);
  // Bits per weight of a few configurations the design discusses.
  EXPECT_DOUBLE_EQ(8.0 * SplitRowBytes(SplitFormat::kR6, 128, 4096) / 4096, 6.125);
  EXPECT_DOUBLE_EQ(8.0 * SplitRowBytes(SplitFormat::kR8, 32, 4096) / 4096, 8.5);
  EXPECT_DOUBLE_EQ(8.0 * SplitRowBytes(SplitFormat::kB2Asym, 64, 4096) / 4096, 2.5);
  EXPECT_DOUBLE_EQ(8.0 * SplitRowBytes(SplitFormat::kB2Sym, 128, 4096) / 4096, 2.125);
  // Ternary: 7 bytes per 32 elements (5 trits a byte), one fp16 scale per group.
  const SplitRowLayout tern = GetSplitRowLayout(SplitFormat::kBTern, 64, 576);
  EXPECT_EQ(tern.groups, 9);
  EXPECT_EQ(tern.sub_blocks, 18);
  EXPECT_EQ(tern.code_stride, 7u);
  EXPECT_EQ(tern.scale_offset, 18 * 7u);
  EXPECT_EQ(tern.row_bytes, 18 * 7u + 9 * 2u);
  EXPECT_EQ(sizeof(SubBlockTern), 7u);
  EXPECT_EQ(GetSplitFormatInfo(SplitFormat::kBTern).code_offset, 1.0f);
  EXPECT_TRUE(GetSplitFormatInfo(SplitFormat::kBTern).is_base);
  EXPECT_FALSE(GetSplitFormatInfo(SplitFormat::kBTern).has_min);
  EXPECT_STREQ(GetSplitFormatInfo(SplitFormat::kBTern).name, "bt_sym");
  EXPECT_DOUBLE_EQ(8.0 * SplitRowBytes(SplitFormat::kBTern, 64, 4096) / 4096, 2.0);
  EXPECT_DOUBLE_EQ(8.0 * SplitRowBytes(SplitFormat::kBTern, 32, 4096) / 4096, 2.25);
  EXPECT_DOUBLE_EQ(8.0 * SplitRowBytes(SplitFormat::kBTern, 128, 4096) / 4096, 1.875);
}

TEST(SplitLayout, ValidatesGroupsAndNames) {
  EXPECT_TRUE(ValidateSplitLayout(SplitFormat::kB2Sym, 96, 192).ok());
  EXPECT_FALSE(ValidateSplitLayout(SplitFormat::kB2Sym, 48, 96).ok());
  EXPECT_FALSE(ValidateSplitLayout(SplitFormat::kB2Sym, 0, 96).ok());
  EXPECT_FALSE(ValidateSplitLayout(SplitFormat::kB2Sym, -32, 96).ok());
  EXPECT_FALSE(ValidateSplitLayout(SplitFormat::kR8, 64, 96).ok());
  EXPECT_FALSE(ValidateSplitLayout(SplitFormat::kR8, 32, 0).ok());
  EXPECT_FALSE(ValidateSplitLayout(SplitFormat::kQ8_0, 64, 128).ok());
  EXPECT_FALSE(ValidateSplitLayout(static_cast<SplitFormat>(99), 32, 32).ok());
  for (int i = 0; i < kNumSplitFormats; ++i) {
    const auto format = static_cast<SplitFormat>(i);
    const auto parsed = ParseSplitFormat(GetSplitFormatInfo(format).name);
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, format);
  }
  EXPECT_FALSE(ParseSplitFormat("b5_sym").ok());
}

// Writes one row of `codes.size()` elements by the layout of docs/formats.md, independently of
// the library's packer: codes[j] is the unsigned code (signed for r8/q8_0) of element j; every
// group gets scale d and min m.
std::vector<uint8_t> HandPackedRow(SplitFormat format, int group, uint16_t d, uint16_t m,
                                   const std::vector<int>& codes) {
  const SplitFormatInfo& info = GetSplitFormatInfo(format);
  const int64_t cols = static_cast<int64_t>(codes.size());
  std::vector<uint8_t> row(SplitRowBytes(format, group, cols), 0);
  const int64_t groups = cols / group, sub_blocks = cols / 32;
  for (int64_t g = 0; g < groups; ++g) {
    // Codes, then scales, then mins.
    std::memcpy(&row[sub_blocks * info.sub_block_bytes + 2 * g], &d, 2);
    if (info.has_min)
      std::memcpy(&row[sub_blocks * info.sub_block_bytes + 2 * groups + 2 * g], &m, 2);
  }
  for (int64_t s = 0; s < sub_blocks; ++s) {
    uint8_t* sub = &row[s * info.sub_block_bytes];
    if (format == SplitFormat::kBTern) {
      // Byte b holds elements 5b..5b + 4 (element 5b the most significant trit; byte 6 only
      // elements 30 and 31, its last three trits zero) as v = sum t_i 3^(4 - i), stored as
      // ceil(256 v / 243).
      for (int b = 0; b < 7; ++b) {
        int v = 0;
        for (int i = 0; i < 5; ++i) {
          const int j = 5 * b + i;
          v = 3 * v + (j < 32 ? codes[s * 32 + j] : 0);
        }
        sub[b] = static_cast<uint8_t>((256 * v + 242) / 243);
      }
      continue;
    }
    for (int j = 0; j < 32; ++j) {
      const int q = codes[s * 32 + j];
      auto plane2 = [&](uint8_t* p, int v) { p[j % 8] |= (v & 3) << (2 * (j / 8)); };
      auto plane4 = [&](uint8_t* p, int v) { p[j % 16] |= (v & 15) << (j < 16 ? 0 : 4); };
      switch (info.bits) {
        case 2:
          plane2(sub, q);
          break;
        case 3:
          plane2(sub, q);
          sub[8 + j % 4] |= ((q >> 2) & 1) << (j / 4);
          break;
        case 4:
          plane4(sub, q);
          break;
        case 5:
          plane4(sub, q);
          sub[16 + j % 4] |= ((q >> 4) & 1) << (j / 4);
          break;
        case 6:
          plane4(sub, q);
          plane2(sub + 16, q >> 4);
          break;
        case 8:
          sub[j] = static_cast<uint8_t>(static_cast<int8_t>(q));
          break;
      }
    }
  }
  return row;
}

TEST(SplitLayout, DocumentedBitLayoutDequantizes) {
  const float d = 0.25f, m = -1.5f;
  std::mt19937 rng(3);
  for (int i = 0; i < kNumSplitFormats; ++i) {
    const auto format = static_cast<SplitFormat>(i);
    const SplitFormatInfo& info = GetSplitFormatInfo(format);
    const int group = format == SplitFormat::kQ8_0 ? 32 : 64;
    const int64_t cols = 3 * group;
    std::vector<int> codes(cols);
    for (int& q : codes) {
      q = info.signed_codes ? static_cast<int>(rng() % 256) - 128
                            : static_cast<int>(rng() % static_cast<uint32_t>(Levels(format)));
    }
    codes[0] = info.signed_codes ? -128 : Levels(format) - 1;  // extremes present
    codes[1] = info.signed_codes ? 127 : 0;
    const std::vector<uint8_t> row =
        HandPackedRow(format, group, Fp32ToFp16(d), Fp32ToFp16(m), codes);
    const std::vector<float> y = Dequantize(format, group, row, cols);
    for (int j = 0; j < cols; ++j) {
      float want;
      if (info.has_min) {
        want = d * codes[j] + m;
      } else if (info.signed_codes) {
        want = d * codes[j];
      } else {
        want = d * (codes[j] - info.code_offset);
      }
      ASSERT_EQ(y[j], want) << info.name << " element " << j << " code " << codes[j];
    }
    // UnpackSubBlock agrees with the same layout.
    const SplitRowLayout layout = GetSplitRowLayout(format, group, cols);
    for (int64_t s = 0; s < layout.sub_blocks; ++s) {
      int unpacked[32];
      UnpackSubBlock(format, &row[layout.code_offset + s * layout.code_stride], unpacked);
      for (int j = 0; j < 32; ++j) ASSERT_EQ(unpacked[j], codes[32 * s + j]) << info.name;
    }
    EXPECT_EQ(SplitGroupScale(format, group, cols, row.data(), 2), d);
  }
}

// The ternary bytes of docs/formats.md, written out: trits (2, 0, 1, 2, 1) are
// v = 162 + 0 + 9 + 6 + 1 = 178, stored as ceil(178 * 256 / 243) = 188; (0, 0, 0, 0, 0) as 0;
// (2, 2, 2, 2, 2) = 242 as 255; (1, 1, 1, 1, 1) = 121 as ceil(127.47) = 128; (0, 1, 2, 0, 1) =
// 46 as ceil(48.46) = 49; (1, 0, 0, 0, 0) = 81 as ceil(85.33) = 86; byte 6 holds elements 30 and
// 31: (2, 1) = 189 as ceil(199.11) = 200.
TEST(SplitLayout, TernaryBytesAsDocumented) {
  const uint8_t codes[7] = {188, 0, 255, 128, 49, 86, 200};
  const int trits[32] = {2, 0, 1, 2, 1, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 1,
                         1, 1, 1, 1, 0, 1, 2, 0, 1, 1, 0, 0, 0, 0, 2, 1};
  const uint16_t d = Fp32ToFp16(0.5f);
  std::vector<uint8_t> row(SplitRowBytes(SplitFormat::kBTern, 32, 32));
  ASSERT_EQ(row.size(), 9u);
  std::memcpy(row.data(), codes, 7);
  std::memcpy(row.data() + 7, &d, 2);
  const std::vector<float> y = Dequantize(SplitFormat::kBTern, 32, row, 32);
  int unpacked[32];
  UnpackSubBlock(SplitFormat::kBTern, row.data(), unpacked);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(unpacked[j], trits[j]) << "element " << j;
    EXPECT_EQ(y[j], 0.5f * (trits[j] - 1)) << "element " << j;
  }
  // Every one of the 243 byte values decodes to its own five trits.
  for (int v = 0; v < 243; ++v) {
    const auto byte = static_cast<uint8_t>((256 * v + 242) / 243);
    for (int i = 0; i < 5; ++i) {
      int power = 1;
      for (int k = 0; k < 4 - i; ++k) power *= 3;
      ASSERT_EQ(TernTrit(byte, i), v / power % 3) << "v " << v << " trit " << i;
    }
  }
}

// Exact ternary values w = d (t - 1) quantize back to the same codes (the search finds d), and
// the library's bytes equal the hand-packed ones: a pack/unpack round trip over random
// patterns of the 3^32 a sub-block can hold, plus blocks of one code (every block needs one
// code 2 so that its group's scale is d).
TEST(SplitLayout, TernaryPackUnpackRoundTrip) {
  std::mt19937 rng(41);
  const int64_t cols = 32 * 64;
  const float d = 0.125f;
  for (int round = 0; round < 16; ++round) {
    std::vector<int> codes(cols);
    for (int& t : codes) t = static_cast<int>(rng() % 3);
    if (round == 0) {
      for (int j = 0; j < 32; ++j) codes[j] = 0;
      for (int j = 32; j < 64; ++j) codes[j] = 2;
      for (int j = 64; j < 96; ++j) codes[j] = 1;
      codes[64] = 2;  // a block of zeros needs one nonzero to fix its scale
    }
    for (int64_t s = 0; s < cols / 32; ++s) codes[s * 32 + rng() % 32] = 2;  // d is fixed
    std::vector<float> w(cols);
    for (int64_t j = 0; j < cols; ++j) w[j] = d * static_cast<float>(codes[j] - 1);
    std::vector<uint8_t> row(SplitRowBytes(SplitFormat::kBTern, 32, cols));
    ASSERT_TRUE(QuantizeBaseRow(SplitFormat::kBTern, 32, w.data(), nullptr, cols, row.data()).ok());
    EXPECT_EQ(row, HandPackedRow(SplitFormat::kBTern, 32, Fp32ToFp16(d), 0, codes));
    for (int64_t s = 0; s < cols / 32; ++s) {
      int unpacked[32];
      UnpackSubBlock(SplitFormat::kBTern, &row[s * 7], unpacked);
      for (int j = 0; j < 32; ++j) ASSERT_EQ(unpacked[j], codes[s * 32 + j]) << s << " " << j;
    }
    EXPECT_EQ(Dequantize(SplitFormat::kBTern, 32, row, cols), w);
  }
}

// Each stored code is the nearest level for the stored (fp16) parameters.
TEST(QuantizeBase, CodesAreNearestLevels) {
  const int64_t cols = 512;
  const std::vector<float> w = Gaussian(cols, 10, 0.02f);
  for (SplitFormat format : kBaseFormats) {
    for (int group : kGroups) {
      const SplitFormatInfo& info = GetSplitFormatInfo(format);
      std::vector<uint8_t> row(SplitRowBytes(format, group, cols));
      ASSERT_TRUE(QuantizeBaseRow(format, group, w.data(), nullptr, cols, row.data()).ok());
      const std::vector<float> y = Dequantize(format, group, row, cols);
      for (int64_t g = 0; g < cols / group; ++g) {
        const SplitRowLayout layout = GetSplitRowLayout(format, group, cols);
        uint16_t mh = 0;
        if (info.has_min) std::memcpy(&mh, &row[layout.min_offset + 2 * g], 2);
        const float d = SplitGroupScale(format, group, cols, row.data(), g), m = Fp16ToFp32(mh);
        for (int i = 0; i < group; ++i) {
          const int64_t k = g * group + i;
          const float error = std::fabs(w[k] - y[k]);
          for (int q = 0; q < Levels(format); ++q) {
            const float level = info.has_min ? d * q + m : d * (q - info.code_offset);
            ASSERT_LE(error, std::fabs(w[k] - level) * (1 + 1e-6f) + 1e-12f)
                << info.name << "/g" << group << " element " << k;
          }
        }
      }
    }
  }
}

// The search must beat the plain range-derived parameters, and reach Gaussian-typical errors.
TEST(QuantizeBase, BeatsRangeQuantizationOnGaussianWeights) {
  const int64_t rows = 16, cols = 1024;
  const std::vector<float> w = Gaussian(rows * cols, 11, 0.02f);
  // NMSE ceilings per bits for group 64 (measured: b2 0.106-0.112, b3 0.028-0.031,
  // b4 0.0067-0.0081; range-derived parameters: 0.20-0.26, 0.037-0.041, 0.0081-0.0099). Ternary
  // apart (measured 0.186, range-derived 0.51): the best fixed 3-level quantizer of a Gaussian
  // (Lloyd-Max) has NMSE 0.190, which a scale fitted to each group's own 64 samples can only
  // approach, or beat slightly by fitting the sample.
  const double ceiling[] = {0, 0, 0.13, 0.037, 0.0095};
  const double ternary_ceiling = 0.21;
  for (SplitFormat format : kBaseFormats) {
    const SplitFormatInfo& info = GetSplitFormatInfo(format);
    const int group = 64, levels = Levels(format);
    std::vector<float> searched, naive;
    for (int64_t r = 0; r < rows; ++r) {
      const float* v = &w[r * cols];
      std::vector<uint8_t> row(SplitRowBytes(format, group, cols));
      ASSERT_TRUE(QuantizeBaseRow(format, group, v, nullptr, cols, row.data()).ok());
      const std::vector<float> y = Dequantize(format, group, row, cols);
      searched.insert(searched.end(), y.begin(), y.end());
      // Naive: asym d = range / (L - 1), m = min; sym d = amax / offset-side; nearest codes.
      for (int64_t g = 0; g < cols / group; ++g) {
        const float* x = v + g * group;
        const auto [lo, hi] = std::minmax_element(x, x + group);
        float amax = 0;
        for (int i = 0; i < group; ++i) amax = std::max(amax, std::fabs(x[i]));
        for (int i = 0; i < group; ++i) {
          float value;
          if (info.has_min) {
            const float d = Fp16ToFp32(Fp32ToFp16((*hi - *lo) / (levels - 1)));
            const float m = Fp16ToFp32(Fp32ToFp16(*lo));
            value = d * std::clamp(std::nearbyint((x[i] - m) / d), 0.0f, levels - 1.0f) + m;
          } else {
            const float d = Fp16ToFp32(Fp32ToFp16(amax / info.code_offset));
            const float q =
                std::clamp(std::nearbyint(x[i] / d + info.code_offset), 0.0f, levels - 1.0f);
            value = d * (q - info.code_offset);
          }
          naive.push_back(value);
        }
      }
    }
    const double e_searched = Nmse(searched, w), e_naive = Nmse(naive, w);
    std::printf("%-8s g64 NMSE searched %.4f  range-derived %.4f\n", info.name, e_searched,
                e_naive);
    EXPECT_LT(e_searched, e_naive * 0.95) << info.name;
    EXPECT_LT(e_searched, format == SplitFormat::kBTern ? ternary_ceiling : ceiling[info.bits])
        << info.name;
  }
}

TEST(QuantizeBase, ImportanceLowersWeightedError) {
  const int64_t cols = 2048;
  const std::vector<float> w = Gaussian(cols, 12, 0.02f);
  std::vector<float> importance(cols);
  std::mt19937 rng(13);
  std::exponential_distribution<float> heavy(1.0f);
  for (float& a : importance) a = std::pow(heavy(rng), 3.0f);  // a few columns dominate
  for (SplitFormat format : kBaseFormats) {
    std::vector<uint8_t> plain(SplitRowBytes(format, 64, cols)), weighted(plain.size());
    ASSERT_TRUE(QuantizeBaseRow(format, 64, w.data(), nullptr, cols, plain.data()).ok());
    ASSERT_TRUE(
        QuantizeBaseRow(format, 64, w.data(), importance.data(), cols, weighted.data()).ok());
    const std::vector<float> yp = Dequantize(format, 64, plain, cols);
    const std::vector<float> yw = Dequantize(format, 64, weighted, cols);
    double ep = 0, ew = 0;
    for (int64_t i = 0; i < cols; ++i) {
      ep += importance[i] * (w[i] - yp[i]) * (w[i] - yp[i]);
      ew += importance[i] * (w[i] - yw[i]) * (w[i] - yw[i]);
    }
    EXPECT_LT(ew, ep * 0.9) << GetSplitFormatInfo(format).name;
  }
}

TEST(QuantizeBase, EdgeGroupsAndBadInput) {
  const int64_t cols = 128;
  std::vector<float> w(cols, 0.0f);
  for (int i = 32; i < 64; ++i) w[i] = 0.37f;               // a constant group (group 32)
  w[64] = 5.0f;                                             // a single spike
  for (int i = 96; i < 128; ++i) w[i] = 1e-9f * (i - 112);  // below fp16 resolution
  for (SplitFormat format : kBaseFormats) {
    const SplitFormatInfo& info = GetSplitFormatInfo(format);
    std::vector<uint8_t> row(SplitRowBytes(format, 32, cols)), again(row.size());
    ASSERT_TRUE(QuantizeBaseRow(format, 32, w.data(), nullptr, cols, row.data()).ok());
    ASSERT_TRUE(QuantizeBaseRow(format, 32, w.data(), nullptr, cols, again.data()).ok());
    EXPECT_EQ(row, again) << "deterministic";
    const std::vector<float> y = Dequantize(format, 32, row, cols);
    for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], 0.0f) << info.name;  // zeros stay exact
    for (int i = 0; i < cols; ++i) ASSERT_TRUE(std::isfinite(y[i]));
    if (info.has_min) {
      for (int i = 32; i < 64; ++i) EXPECT_NEAR(y[i], 0.37f, 2e-4f) << info.name;  // fp16 m
    }
    // A spike among zeros gets its own level, except on the mid-rise 2-bit grid: it has no
    // zero level, so the squared-error optimum keeps the 31 zeros near zero and clips the spike.
    if (format != SplitFormat::kB2Sym) {
      EXPECT_NEAR(y[64], 5.0f, 5.0f * 0.01f) << info.name;
    }
  }
  std::vector<uint8_t> row(SplitRowBytes(SplitFormat::kB2Sym, 32, cols));
  w[3] = NAN;
  EXPECT_FALSE(QuantizeBaseRow(SplitFormat::kB2Sym, 32, w.data(), nullptr, cols, row.data()).ok());
  w[3] = 0.0f;
  std::vector<float> bad_importance(cols, 1.0f);
  bad_importance[7] = -1.0f;
  EXPECT_FALSE(
      QuantizeBaseRow(SplitFormat::kB2Sym, 32, w.data(), bad_importance.data(), cols, row.data())
          .ok());
  EXPECT_FALSE(QuantizeBaseRow(SplitFormat::kR8, 32, w.data(), nullptr, cols, row.data()).ok());
  EXPECT_FALSE(QuantizeBaseRow(SplitFormat::kB2Sym, 48, w.data(), nullptr, cols, row.data()).ok());
}

// Residual codes never clip: the fp16 step d is max|r| / N rounded up, so every |r - R| <= d/2.
TEST(QuantizeResidual, NeverClipsAndStaysWithinHalfStep) {
  const int64_t cols = 1024;
  std::vector<float> r = Gaussian(cols, 20, 1e-3f);
  std::mt19937 rng(21);
  for (int64_t g = 0; g < cols / 32; ++g) {  // per-32 magnitudes from 1e-9 to 1e3
    const float scale = std::pow(10.0f, static_cast<float>(g % 13) - 6.0f);
    for (int i = 0; i < 32; ++i) r[g * 32 + i] *= scale;
  }
  for (int i = 0; i < 32; ++i) r[i] = 0.0f;                                // an all-zero group
  r[100] = 123.0f;                                                         // a spike
  for (int i = 160; i < 192; ++i) r[i] = std::ldexp(1.0f, -30) * (i % 3);  // fp16 subnormal d
  for (SplitFormat format : kResidualFormats) {
    const SplitFormatInfo& info = GetSplitFormatInfo(format);
    const int max_code = (1 << (info.bits - 1)) - 1;
    for (int group : kGroups) {
      std::vector<uint8_t> row(SplitRowBytes(format, group, cols));
      ASSERT_TRUE(QuantizeResidualRow(format, group, r.data(), cols, row.data()).ok());
      const std::vector<float> y = Dequantize(format, group, row, cols);
      for (int64_t g = 0; g < cols / group; ++g) {
        const float d = SplitGroupScale(format, group, cols, row.data(), g);
        float amax = 0;
        for (int i = 0; i < group; ++i) amax = std::max(amax, std::fabs(r[g * group + i]));
        // d is the smallest fp16 >= amax / N.
        ASSERT_GE(d * max_code, amax * (1 - 1e-6f)) << info.name << " group " << g;
        if (d > 0) {
          const uint16_t below = Fp32ToFp16(d) - 1;
          ASSERT_LT(Fp16ToFp32(below), amax / max_code) << info.name << " group " << g;
        }
        for (int s = 0; s < group / 32; ++s) {
          int codes[32];
          UnpackSubBlock(format, &row[(g * group / 32 + s) * info.sub_block_bytes], codes);
          for (int j = 0; j < 32; ++j) {
            const int c =
                info.signed_codes ? codes[j] : codes[j] - static_cast<int>(info.code_offset);
            ASSERT_LE(std::abs(c), max_code);
            if (!info.signed_codes) {
              ASSERT_GE(codes[j], 1);  // q = 0 is never written
            }
          }
        }
        for (int i = 0; i < group; ++i) {
          const int64_t k = g * group + i;
          ASSERT_LE(std::fabs(double(r[k]) - y[k]), 0.5 * d + 1e-6 * std::fabs(r[k]))
              << info.name << "/g" << group << " element " << k;
        }
      }
    }
  }
  std::vector<uint8_t> row(SplitRowBytes(SplitFormat::kR8, 32, 32));
  std::vector<float> huge(32, 1e7f);  // needs d = 1e7 / 127 > fp16 max
  EXPECT_FALSE(QuantizeResidualRow(SplitFormat::kR8, 32, huge.data(), 32, row.data()).ok());
  huge[0] = INFINITY;
  EXPECT_FALSE(QuantizeResidualRow(SplitFormat::kR6, 32, huge.data(), 32, row.data()).ok());
  EXPECT_FALSE(QuantizeResidualRow(SplitFormat::kB4Sym, 32, r.data(), 32, row.data()).ok());
}

// The split round trip for every base x residual format and group: |W - (B + R)| <= d_R / 2.
TEST(QuantizeSplit, RoundTripWithinHalfResidualStep) {
  const int64_t cols = 768;
  std::vector<float> w = Gaussian(cols, 30, 0.02f);
  w[5] = 0.5f;  // outliers, as real weights have
  w[300] = -0.3f;
  for (SplitFormat base : kBaseFormats) {
    for (SplitFormat residual : kResidualFormats) {
      for (int base_group : kGroups) {
        for (int residual_group : {32, 128}) {
          const std::string what =
              absl::StrCat(GetSplitFormatInfo(base).name, "/g", base_group, "+",
                           GetSplitFormatInfo(residual).name, "/g", residual_group);
          std::vector<uint8_t> b(SplitRowBytes(base, base_group, cols));
          std::vector<uint8_t> r(SplitRowBytes(residual, residual_group, cols));
          ASSERT_TRUE(QuantizeSplitRow(base, base_group, residual, residual_group, w.data(),
                                       nullptr, cols, b.data(), r.data())
                          .ok())
              << what;
          const std::vector<float> yb = Dequantize(base, base_group, b, cols);
          const std::vector<float> yr = Dequantize(residual, residual_group, r, cols);
          // The residual format applied to W directly (R8 at group 32 is Q8_0-like).
          std::vector<uint8_t> direct(r.size());
          ASSERT_TRUE(
              QuantizeResidualRow(residual, residual_group, w.data(), cols, direct.data()).ok());
          const double direct_nmse = Nmse(Dequantize(residual, residual_group, direct, cols), w);
          double err2 = 0, ref2 = 0;
          for (int64_t k = 0; k < cols; ++k) {
            const float step =
                SplitGroupScale(residual, residual_group, cols, r.data(), k / residual_group);
            const double error = std::fabs(double(w[k]) - (double(yb[k]) + double(yr[k])));
            // Slack: rounding of w - B, of r / d and of d * c (a few ulps of the magnitudes).
            ASSERT_LE(error, 0.5 * step + 1e-6 * (std::fabs(w[k]) + std::fabs(yb[k])))
                << what << " element " << k;
            err2 += error * error;
            ref2 += double(w[k]) * w[k];
          }
          // B + R is more accurate than the residual format alone on W: the residual's range is
          // the base's error, far below W's range, except in groups where the base clipped an
          // outlier (where it is about equal). One measured exception: r3 over b2_sym at group
          // 32 (NMSE 0.088 vs 0.055 here): the mid-rise 2-bit grid leaves an error spread evenly
          // over its whole step in every group, which r3's 7 levels resolve worse than they do
          // W's bell shape. (The bound above holds for it too.)
          const bool r3_over_b2_sym = base == SplitFormat::kB2Sym && base_group == 32 &&
                                      residual == SplitFormat::kR3 && residual_group == 32;
          if (!r3_over_b2_sym) {
            EXPECT_LT(err2 / ref2, direct_nmse) << what;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace bitsplit::quant
