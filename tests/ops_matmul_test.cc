#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/ops/matmul.h"
#include "common/quant/ggml_blocks.h"
#include "common/util/fp16.h"
#include "gtest/gtest.h"
#include "tests/testing/metrics.h"

namespace bitsplit::ops {
namespace {

// Random weights in `type`, encoded by hand from the block layouts (not by any quantizer under
// test), for a [rows, cols] matrix.
std::vector<uint8_t> RandomWeights(GgmlType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255);
  const int64_t n = rows * cols;
  std::vector<uint8_t> data;
  switch (type) {
    case GgmlType::kF32: {
      data.resize(n * sizeof(float));
      for (int64_t i = 0; i < n; ++i) {
        const float v = normal(rng);
        std::memcpy(data.data() + i * sizeof(float), &v, sizeof(float));
      }
      break;
    }
    case GgmlType::kF16: {
      data.resize(n * sizeof(uint16_t));
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = Fp32ToFp16(normal(rng));
        std::memcpy(data.data() + i * sizeof(uint16_t), &h, sizeof(uint16_t));
      }
      break;
    }
    case GgmlType::kQ8_0: {
      std::vector<quant::BlockQ8_0> blocks(n / quant::kQk);
      for (auto& block : blocks) {
        block.d = Fp32ToFp16(0.01f + 0.02f * std::abs(normal(rng)));
        for (auto& q : block.qs) q = static_cast<int8_t>(byte(rng) - 128);
      }
      data.resize(blocks.size() * sizeof(quant::BlockQ8_0));
      std::memcpy(data.data(), blocks.data(), data.size());
      break;
    }
    case GgmlType::kQ4_0: {
      std::vector<quant::BlockQ4_0> blocks(n / quant::kQk);
      for (auto& block : blocks) {
        block.d = Fp32ToFp16(0.05f + 0.1f * std::abs(normal(rng)));
        for (auto& q : block.qs) q = static_cast<uint8_t>(byte(rng));
      }
      data.resize(blocks.size() * sizeof(quant::BlockQ4_0));
      std::memcpy(data.data(), blocks.data(), data.size());
      break;
    }
    case GgmlType::kQ4_1: {
      std::vector<quant::BlockQ4_1> blocks(n / quant::kQk);
      for (auto& block : blocks) {
        block.d = Fp32ToFp16(0.05f + 0.1f * std::abs(normal(rng)));
        block.m = Fp32ToFp16(-0.5f + 0.2f * normal(rng));
        for (auto& q : block.qs) q = static_cast<uint8_t>(byte(rng));
      }
      data.resize(blocks.size() * sizeof(quant::BlockQ4_1));
      std::memcpy(data.data(), blocks.data(), data.size());
      break;
    }
    default:
      ADD_FAILURE() << "no generator for " << GgmlTypeName(type);
  }
  return data;
}

std::vector<float> RandomActivations(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

using testing::Nmse;

struct Shape {
  GgmlType type;
  int64_t rows;
  int64_t cols;
};

class MatMulTest : public ::testing::TestWithParam<Shape> {};

// Rows not a multiple of the tile (8) or the register block (4); F32/F16 rows with a tail that
// is not a multiple of the 8-lane vector.
INSTANTIATE_TEST_SUITE_P(
    Types, MatMulTest,
    ::testing::Values(Shape{GgmlType::kF32, 37, 43}, Shape{GgmlType::kF16, 37, 45},
                      Shape{GgmlType::kF16, 21, 48}, Shape{GgmlType::kQ4_0, 37, 64},
                      Shape{GgmlType::kQ8_0, 37, 96}, Shape{GgmlType::kQ4_1, 37, 96},
                      Shape{GgmlType::kQ4_1, 64, 576}),
    [](const auto& info) {
      return std::string(GgmlTypeName(info.param.type)) + "_" + std::to_string(info.param.rows) +
             "x" + std::to_string(info.param.cols);
    });

TEST_P(MatMulTest, SimdMatchesScalarReferenceForAllBatchSizes) {
  const Shape shape = GetParam();
  std::mt19937 rng(1234);
  const std::vector<uint8_t> data = RandomWeights(shape.type, shape.rows, shape.cols, rng);
  auto w = MakeWeightMatrix(shape.type, data.data(), shape.rows, shape.cols, "w");
  ASSERT_TRUE(w.ok()) << w.status();
  ThreadPool pool(2);
  for (int64_t tokens = 1; tokens <= 64; ++tokens) {
    const std::vector<float> x = RandomActivations(tokens * shape.cols, rng);
    std::vector<float> y(tokens * shape.rows), expected(tokens * shape.rows);
    MatMul(x.data(), tokens, *w, y.data(), pool);
    MatMulReference(x.data(), tokens, *w, expected.data());
    EXPECT_LT(Nmse(y, expected), 1e-12) << "T=" << tokens;
  }
}

// T = 1 takes the fused dequantize-and-dot kernel for the formats that have one and T > 1 the
// dequantized tile, so this also checks that the two paths agree bit for bit.
TEST_P(MatMulTest, RowResultIsIndependentOfBatchSizeAndThreads) {
  const Shape shape = GetParam();
  std::mt19937 rng(99);
  const std::vector<uint8_t> data = RandomWeights(shape.type, shape.rows, shape.cols, rng);
  auto w = MakeWeightMatrix(shape.type, data.data(), shape.rows, shape.cols, "w");
  ASSERT_TRUE(w.ok()) << w.status();
  constexpr int64_t kTokens = 19;
  const std::vector<float> x = RandomActivations(kTokens * shape.cols, rng);

  ThreadPool single(1);
  std::vector<float> alone(kTokens * shape.rows);
  for (int64_t t = 0; t < kTokens; ++t) {
    MatMul(x.data() + t * shape.cols, 1, *w, alone.data() + t * shape.rows, single);
  }
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t tokens : {int64_t{2}, int64_t{3}, int64_t{7}, kTokens}) {
      std::vector<float> batched(tokens * shape.rows);
      MatMul(x.data(), tokens, *w, batched.data(), pool);
      for (int64_t i = 0; i < tokens * shape.rows; ++i) {
        ASSERT_EQ(std::memcmp(&batched[i], &alone[i], sizeof(float)), 0)
            << "threads=" << threads << " T=" << tokens << " element " << i;
      }
    }
  }
}

TEST(MatMulManyTest, EqualsSeparateMatMuls) {
  std::mt19937 rng(5);
  const std::vector<uint8_t> a = RandomWeights(GgmlType::kQ4_1, 24, 64, rng);
  const std::vector<uint8_t> b = RandomWeights(GgmlType::kQ8_0, 13, 64, rng);
  const std::vector<uint8_t> c = RandomWeights(GgmlType::kF32, 5, 64, rng);
  auto wa = MakeWeightMatrix(GgmlType::kQ4_1, a.data(), 24, 64, "a");
  auto wb = MakeWeightMatrix(GgmlType::kQ8_0, b.data(), 13, 64, "b");
  auto wc = MakeWeightMatrix(GgmlType::kF32, c.data(), 5, 64, "c");
  ASSERT_TRUE(wa.ok() && wb.ok() && wc.ok());
  ThreadPool pool(3);
  for (int64_t tokens : {int64_t{1}, int64_t{6}}) {
    const std::vector<float> x = RandomActivations(tokens * 64, rng);
    std::vector<float> ya(tokens * 24), yb(tokens * 13), yc(tokens * 5);
    const WeightMatrix* ws[] = {&*wa, &*wb, &*wc};
    float* const ys[] = {ya.data(), yb.data(), yc.data()};
    MatMulMany(x.data(), tokens, ws, ys, pool);
    for (int i = 0; i < 3; ++i) {
      std::vector<float> separate(tokens * ws[i]->rows);
      MatMul(x.data(), tokens, *ws[i], separate.data(), pool);
      EXPECT_EQ(std::memcmp(separate.data(), ys[i], separate.size() * sizeof(float)), 0)
          << "matrix " << i << " T=" << tokens;
    }
  }
}

TEST(MatMulReferenceTest, F32MatchesDirectDoubleDotProducts) {
  std::mt19937 rng(7);
  constexpr int64_t kRows = 5, kCols = 13, kTokens = 3;
  const std::vector<uint8_t> data = RandomWeights(GgmlType::kF32, kRows, kCols, rng);
  const float* weights = reinterpret_cast<const float*>(data.data());
  auto w = MakeWeightMatrix(GgmlType::kF32, data.data(), kRows, kCols, "w");
  ASSERT_TRUE(w.ok());
  const std::vector<float> x = RandomActivations(kTokens * kCols, rng);
  std::vector<float> y(kTokens * kRows);
  MatMulReference(x.data(), kTokens, *w, y.data());
  for (int64_t t = 0; t < kTokens; ++t) {
    for (int64_t o = 0; o < kRows; ++o) {
      double sum = 0;
      for (int64_t k = 0; k < kCols; ++k) sum += double{x[t * kCols + k]} * weights[o * kCols + k];
      EXPECT_FLOAT_EQ(y[t * kRows + o], static_cast<float>(sum));
    }
  }
}

TEST(MatMulReferenceTest, Q8_0DecodesAsScaleTimesCode) {
  quant::BlockQ8_0 block;
  block.d = Fp32ToFp16(0.5f);
  for (int i = 0; i < quant::kQk; ++i) block.qs[i] = static_cast<int8_t>(i - 16);
  auto w = MakeWeightMatrix(GgmlType::kQ8_0, &block, 1, quant::kQk, "w");
  ASSERT_TRUE(w.ok());
  std::vector<float> x(quant::kQk, 1.0f);
  float y = 0;
  MatMulReference(x.data(), 1, *w, &y);
  // sum over i of 0.5 * (i - 16) = 0.5 * (496 - 512) = -8.
  EXPECT_EQ(y, -8.0f);
  std::vector<float> row(quant::kQk);
  DequantizeWeightRow(*w, 0, row.data());
  EXPECT_EQ(row[0], -8.0f);
  EXPECT_EQ(row[31], 7.5f);
}

TEST(MakeWeightMatrixTest, RejectsPartialBlocksAndUnsupportedTypes) {
  std::vector<uint8_t> data(1024);
  auto partial = MakeWeightMatrix(GgmlType::kQ4_1, data.data(), 2, 48, "blk.0.attn_q.weight");
  ASSERT_FALSE(partial.ok());
  EXPECT_NE(partial.status().message().find("blk.0.attn_q.weight"), std::string::npos);
  EXPECT_NE(partial.status().message().find("multiple"), std::string::npos);

  auto unsupported = MakeWeightMatrix(GgmlType::kI32, data.data(), 2, 8, "t");
  ASSERT_FALSE(unsupported.ok());
  EXPECT_NE(unsupported.status().message().find("cannot be dequantized"), std::string::npos);

  auto empty = MakeWeightMatrix(GgmlType::kF32, data.data(), 0, 8, "t");
  EXPECT_FALSE(empty.ok());

  auto ok = MakeWeightMatrix(GgmlType::kQ4_1, data.data(), 2, 64, "t");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->row_bytes, 2 * 20);
}

}  // namespace
}  // namespace bitsplit::ops
