#pragma once
// Scalar half/bfloat16 conversions. Exact (round-to-nearest-even on the way down), so they
// agree bit for bit with F16C's vcvtph2ps/vcvtps2ph and with numpy.
#include <cstdint>
#include <cstring>

namespace bitsplit {

inline float Fp32FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
inline uint32_t BitsFromFp32(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

inline float Fp16ToFp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    if (mantissa == 0) return Fp32FromBits(sign);
    // Subnormal half: value = mantissa * 2^-24.
    float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return Fp32FromBits(sign | 0x7f800000u | (mantissa << 13));
  return Fp32FromBits(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

inline uint16_t Fp32ToFp16(float f) {
  uint32_t x = BitsFromFp32(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) {  // Inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (x > 0x7f800000u ? 0x200u : 0u));
  }
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to Inf
  if (x < 0x38800000u) {
    // Result is subnormal or zero: round x * 2^24 to an integer, ties to even.
    if (x < 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t exponent = x >> 23;
    uint32_t mantissa = (x & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // 14..24
    uint32_t result = mantissa >> shift;
    const uint32_t remainder = mantissa & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (remainder > half || (remainder == half && (result & 1u))) ++result;
    return static_cast<uint16_t>(sign | result);
  }
  // Normal: rebias the exponent and round the mantissa to 10 bits, ties to even.
  uint32_t result = ((x - 0x38000000u) >> 13);
  const uint32_t remainder = x & 0x1fffu;
  if (remainder > 0x1000u || (remainder == 0x1000u && (result & 1u))) ++result;
  return static_cast<uint16_t>(sign | result);
}

inline float Bf16ToFp32(uint16_t b) { return Fp32FromBits(static_cast<uint32_t>(b) << 16); }

inline uint16_t Fp32ToBf16(float f) {
  uint32_t x = BitsFromFp32(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace bitsplit
