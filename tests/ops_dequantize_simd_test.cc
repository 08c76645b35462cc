#include <cstring>
#include <random>
#include <vector>

#include "common/ops/dequantize_simd.h"
#include "common/quant/dequantize.h"
#include "gtest/gtest.h"

namespace bitsplit::ops {
namespace {

// Random block bytes, with every fp16 scale/offset field (2-byte fields at `half_offsets` of
// each block) forced finite: random bits elsewhere cover all codes, subnormal and huge scales.
std::vector<uint8_t> RandomBlocks(int64_t num_blocks, int64_t block_bytes,
                                  const std::vector<int>& half_offsets, std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> data(num_blocks * block_bytes);
  for (uint8_t& b : data) b = static_cast<uint8_t>(byte(rng));
  for (int64_t b = 0; b < num_blocks; ++b) {
    for (int offset : half_offsets) {
      uint8_t& high = data[b * block_bytes + offset + 1];
      if ((high & 0x7c) == 0x7c) high &= 0xbf;  // exponent 31 (inf/NaN) -> 15
    }
  }
  return data;
}

struct Format {
  GgmlType type;
  int64_t block_elements;
  int64_t block_bytes;
  std::vector<int> half_offsets;
};

class SimdDequantizeTest : public ::testing::TestWithParam<Format> {};

INSTANTIATE_TEST_SUITE_P(Formats, SimdDequantizeTest,
                         ::testing::Values(Format{GgmlType::kF16, 1, 2, {0}},
                                           Format{GgmlType::kQ4_0, 32, 18, {0}},
                                           Format{GgmlType::kQ4_1, 32, 20, {0, 2}},
                                           Format{GgmlType::kQ8_0, 32, 34, {0}}),
                         [](const auto& info) { return GgmlTypeName(info.param.type); });

TEST_P(SimdDequantizeTest, BitIdenticalToReference) {
  const Format format = GetParam();
  const quant::DequantizeRowFn simd = GetSimdDequantizeRowFn(format.type);
  const quant::DequantizeRowFn reference = quant::GetDequantizeRowFn(format.type);
  ASSERT_NE(simd, nullptr);
  ASSERT_NE(reference, nullptr);
  std::mt19937 rng(42);
  // 37 elements leaves an F16 tail after the 8-wide loop; quantized rows use 37 blocks.
  const int64_t num_blocks = 37;
  const int64_t n = num_blocks * format.block_elements;
  for (int trial = 0; trial < 50; ++trial) {
    const std::vector<uint8_t> data =
        RandomBlocks(num_blocks, format.block_bytes, format.half_offsets, rng);
    std::vector<float> fast(n), expected(n);
    simd(data.data(), fast.data(), n);
    reference(data.data(), expected.data(), n);
    ASSERT_EQ(std::memcmp(fast.data(), expected.data(), n * sizeof(float)), 0) << "trial " << trial;
  }
}

TEST(SimdDequantizeTest, OtherTypesFallBackToTheReference) {
  EXPECT_EQ(GetSimdDequantizeRowFn(GgmlType::kQ6_K), nullptr);
  EXPECT_EQ(GetSimdDequantizeRowFn(GgmlType::kF32), nullptr);
}

}  // namespace
}  // namespace bitsplit::ops
