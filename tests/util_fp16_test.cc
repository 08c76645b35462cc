// Checks common/util/fp16.h against expectations that do not share its code: closed-form
// values, hand-picked rounding ties, and the F16C hardware conversions (the build targets
// x86-64-v3, which includes F16C).
#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "absl/strings/str_format.h"
#include "common/util/fp16.h"

namespace bitsplit {
namespace {

bool IsHalfNan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0; }
bool IsBf16Nan(uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x007fu) != 0; }

// The value of a half from its definition, computed in double arithmetic.
double HalfValueFromDefinition(uint16_t h) {
  const int sign = (h & 0x8000u) ? -1 : 1;
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  if (exponent == 31) return sign * std::numeric_limits<double>::infinity();
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

uint16_t HardwareFp32ToFp16(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}

TEST(Fp16, EveryHalfConvertsToItsDefinedValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t half = static_cast<uint16_t>(h);
    const float f = Fp16ToFp32(half);
    if (IsHalfNan(half)) {
      ASSERT_TRUE(std::isnan(f)) << h;
      ASSERT_EQ(std::signbit(f), (h & 0x8000u) != 0) << h;
      continue;
    }
    // Every half is exactly representable as a float, so the comparison is exact; compare bits
    // too so that -0 is distinguished from +0.
    const float defined = static_cast<float>(HalfValueFromDefinition(half));
    ASSERT_EQ(BitsFromFp32(f), BitsFromFp32(defined)) << absl::StrFormat("half 0x%04x", h);
  }
}

TEST(Fp16, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t half = static_cast<uint16_t>(h);
    const uint16_t back = Fp32ToFp16(Fp16ToFp32(half));
    if (IsHalfNan(half)) {
      // The payload is not preserved, but NaN-ness and sign are.
      ASSERT_TRUE(IsHalfNan(back)) << h;
      ASSERT_EQ(back & 0x8000u, half & 0x8000u) << h;
    } else {
      ASSERT_EQ(back, half) << absl::StrFormat("half 0x%04x came back as 0x%04x", h, back);
    }
  }
}

TEST(Fp16, EveryHalfMatchesF16C) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t half = static_cast<uint16_t>(h);
    const float ours = Fp16ToFp32(half);
    const float hardware = _cvtsh_ss(half);
    if (IsHalfNan(half)) {
      // F16C quiets signalling NaNs; we keep the payload. Only NaN-ness is the contract.
      ASSERT_TRUE(std::isnan(ours) && std::isnan(hardware)) << h;
    } else {
      ASSERT_EQ(BitsFromFp32(ours), BitsFromFp32(hardware)) << absl::StrFormat("0x%04x", h);
    }
  }
}

TEST(Fp16, RoundsToNearestTiesToEven) {
  struct Case {
    float input;
    uint16_t expected;
  };
  const Case cases[] = {
      {1.0f, 0x3c00},
      {1.0f + 0x1p-11f, 0x3c00},             // tie between 1 and 1 + 2^-10: even is 1
      {1.0f + 3 * 0x1p-11f, 0x3c02},         // tie between 0x3c01 and 0x3c02: even is 0x3c02
      {1.0f + 0x1p-11f + 0x1p-20f, 0x3c01},  // just above the tie rounds up
      {1.0f + 0x1p-11f - 0x1p-20f, 0x3c00},  // just below rounds down
      {-(1.0f + 0x1p-11f), 0xbc00},
      {65504.0f, 0x7bff},  // fp16 max
      {65519.0f, 0x7bff},  // below the tie with 65536: stays finite
      {65520.0f, 0x7c00},  // tie between 65504 and 2^16 (odd vs even): inf
      {-65520.0f, 0xfc00},
      {1e10f, 0x7c00},
      {0x1p-24f, 0x0001},             // smallest subnormal
      {0x1p-25f, 0x0000},             // tie between 0 and 2^-24: even is 0
      {0x1p-25f + 0x1p-40f, 0x0001},  // just above that tie
      {3 * 0x1p-25f, 0x0002},         // tie between 1 and 2 (x 2^-24): even is 2
      {5 * 0x1p-25f, 0x0002},         // tie between 2 and 3: even is 2
      {-3 * 0x1p-25f, 0x8002},
      {1023.5f * 0x1p-24f, 0x0400},  // tie between largest subnormal and 2^-14: even
      {1022.5f * 0x1p-24f, 0x03fe},  // tie between 0x3fe and 0x3ff: even is 0x3fe
      {0x1p-14f, 0x0400},            // smallest normal
      {1e-10f, 0x0000},
      {-1e-10f, 0x8000},
      {0.0f, 0x0000},
      {-0.0f, 0x8000},
      {std::numeric_limits<float>::infinity(), 0x7c00},
      {-std::numeric_limits<float>::infinity(), 0xfc00},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(Fp32ToFp16(c.input), c.expected)
        << absl::StrFormat("%a (0x%08x)", c.input, BitsFromFp32(c.input));
    EXPECT_EQ(HardwareFp32ToFp16(c.input), c.expected) << "F16C disagrees on " << c.input;
  }
  EXPECT_TRUE(IsHalfNan(Fp32ToFp16(std::numeric_limits<float>::quiet_NaN())));
  // A signalling NaN whose payload lives only in the low bits must not become infinity.
  EXPECT_TRUE(IsHalfNan(Fp32ToFp16(Fp32FromBits(0x7f800001u))));
  EXPECT_TRUE(IsHalfNan(Fp32ToFp16(Fp32FromBits(0xff800001u))));
}

void ExpectMatchesF16C(uint32_t bits) {
  const float f = Fp32FromBits(bits);
  const uint16_t ours = Fp32ToFp16(f);
  const uint16_t hardware = HardwareFp32ToFp16(f);
  if (std::isnan(f)) {
    ASSERT_TRUE(IsHalfNan(ours) && IsHalfNan(hardware)) << std::hex << bits;
    ASSERT_EQ(ours & 0x8000u, hardware & 0x8000u) << std::hex << bits;
  } else {
    ASSERT_EQ(ours, hardware) << absl::StrFormat("float 0x%08x (%a)", bits, f);
  }
}

TEST(Fp16, RandomFloatsMatchF16C) {
  std::mt19937 rng(12345);
  // Uniform bit patterns cover NaNs, infinities and every exponent.
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 2'000'000; ++i) ASSERT_NO_FATAL_FAILURE(ExpectMatchesF16C(any_bits(rng)));
  // Most of those overflow or flush to zero, so also sample exponents around the half range
  // (2^-27 .. 2^17), where the rounding logic does its work.
  std::uniform_int_distribution<uint32_t> exponent(100, 144);
  std::uniform_int_distribution<uint32_t> mantissa(0, 0x7fffff);
  std::uniform_int_distribution<uint32_t> sign(0, 1);
  for (int i = 0; i < 4'000'000; ++i) {
    const uint32_t bits = (sign(rng) << 31) | (exponent(rng) << 23) | mantissa(rng);
    ASSERT_NO_FATAL_FAILURE(ExpectMatchesF16C(bits));
  }
  // And exact ties and their neighbours wherever the half result is normal (2^-14 .. 2^15),
  // since ties are where mistakes hide.
  for (uint32_t e = 113; e <= 142; ++e) {
    for (int i = 0; i < 2000; ++i) {
      // The low 13 bits are dropped for normal halves; 0x1000 there is a tie.
      const uint32_t base = (e << 23) | (mantissa(rng) & ~0x1fffu) | 0x1000u;
      for (uint32_t bits : {base - 1, base, base + 1}) {
        ASSERT_NO_FATAL_FAILURE(ExpectMatchesF16C(bits));
        ASSERT_NO_FATAL_FAILURE(ExpectMatchesF16C(bits | 0x80000000u));
      }
    }
  }
}

TEST(Bf16, EveryBf16IsTheHighHalfOfAFloat) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t bf16 = static_cast<uint16_t>(b);
    ASSERT_EQ(BitsFromFp32(Bf16ToFp32(bf16)), b << 16) << b;
    const uint16_t back = Fp32ToBf16(Bf16ToFp32(bf16));
    if (IsBf16Nan(bf16)) {
      ASSERT_TRUE(IsBf16Nan(back)) << b;
      ASSERT_EQ(back & 0x8000u, bf16 & 0x8000u) << b;
    } else {
      ASSERT_EQ(back, bf16) << b;
    }
  }
}

TEST(Bf16, RoundsToNearestTiesToEven) {
  EXPECT_EQ(Fp32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Fp32ToBf16(1.0f + 0x1p-8f), 0x3f80);      // tie: even is 0x3f80
  EXPECT_EQ(Fp32ToBf16(1.0f + 3 * 0x1p-8f), 0x3f82);  // tie: even is 0x3f82
  EXPECT_EQ(Fp32ToBf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
  EXPECT_EQ(Fp32ToBf16(-(1.0f + 0x1p-8f + 0x1p-20f)), 0xbf81);
  EXPECT_EQ(Fp32ToBf16(-0.0f), 0x8000);
  EXPECT_EQ(Fp32ToBf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to inf
  EXPECT_EQ(Fp32ToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(Fp32ToBf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_TRUE(IsBf16Nan(Fp32ToBf16(std::numeric_limits<float>::quiet_NaN())));
  // Payload only in the discarded low bits: must stay NaN, not round into infinity.
  EXPECT_TRUE(IsBf16Nan(Fp32ToBf16(Fp32FromBits(0x7f800001u))));
  EXPECT_TRUE(IsBf16Nan(Fp32ToBf16(Fp32FromBits(0x7fffffffu))));
  EXPECT_TRUE(IsBf16Nan(Fp32ToBf16(Fp32FromBits(0xff800001u))));
}

TEST(Bf16, RandomFloatsRoundToNearestEven) {
  std::mt19937 rng(6789);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 2'000'000; ++i) {
    const uint32_t bits = any_bits(rng);
    const float f = Fp32FromBits(bits);
    const uint16_t ours = Fp32ToBf16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(IsBf16Nan(ours)) << std::hex << bits;
      continue;
    }
    // The nearest bf16 by value: the two candidates around f, compared in double arithmetic.
    const uint16_t down = static_cast<uint16_t>(bits >> 16);
    if ((bits & 0xffffu) == 0) {  // exactly representable (infinities included)
      ASSERT_EQ(ours, down) << std::hex << bits;
      continue;
    }
    const uint16_t up = static_cast<uint16_t>(down + 1);
    const double distance_down = std::fabs(static_cast<double>(f) - Bf16ToFp32(down));
    const double distance_up =
        (up & 0x7fffu) == 0x7f80u && (down & 0x7fffu) == 0x7f7fu
            ? std::ldexp(1.0, 128) - std::fabs(static_cast<double>(f))  // inf acts as 2^128
            : std::fabs(static_cast<double>(f) - Bf16ToFp32(up));
    uint16_t expected;
    if (distance_down < distance_up) {
      expected = down;
    } else if (distance_up < distance_down) {
      expected = up;
    } else {
      expected = (down & 1u) ? up : down;
    }
    ASSERT_EQ(ours, expected) << absl::StrFormat("float 0x%08x", bits);
  }
}

}  // namespace
}  // namespace bitsplit
