// QuantizeQ8_0Row must reproduce ggml's quantize_row_q8_0_ref byte for byte. The oracle is
// gguf-py's numpy port (tests/oracle/gen_q8_0_fixtures.py wrote the fixture). Also: the split
// row (QuantizeQ8_0SplitRow) holds the same codes and scales, and its dequantization equals the
// ggml-format dequantizer's of the blocks (common/quant/dequantize.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "common/io/ggml_type.h"
#include "common/quant/dequantize.h"
#include "common/quant/ggml_blocks.h"
#include "common/quant/split_format.h"
#include "common/util/fp16.h"
#include "tests/testing/paths.h"

namespace bitsplit::quant {
namespace {

struct Q8Case {
  std::string name;
  std::vector<float> input;
  std::vector<uint8_t> expected;
};

class Reader {
 public:
  explicit Reader(std::vector<uint8_t> bytes) : bytes_(std::move(bytes)) {}
  bool Read(void* out, size_t size) {
    if (size > bytes_.size() - position_) return false;
    std::memcpy(out, bytes_.data() + position_, size);
    position_ += size;
    return true;
  }
  bool AtEnd() const { return position_ == bytes_.size(); }

 private:
  std::vector<uint8_t> bytes_;
  size_t position_ = 0;
};

// One row of ggml's Q8_0 blocks as a kQ8_0 split row, bytes moved unchanged (docs/formats.md):
// block b's codes to bytes 32 b.., its fp16 scale to cols + 2 b.
std::vector<uint8_t> BlocksToSplitRow(const std::vector<uint8_t>& blocks) {
  const size_t count = blocks.size() / sizeof(BlockQ8_0);
  std::vector<uint8_t> row(blocks.size());
  for (size_t b = 0; b < count; ++b) {
    const uint8_t* block = blocks.data() + b * sizeof(BlockQ8_0);
    std::memcpy(row.data() + kQk * b, block + offsetof(BlockQ8_0, qs), kQk);
    std::memcpy(row.data() + kQk * count + 2 * b, block + offsetof(BlockQ8_0, d), 2);
  }
  return row;
}

void LoadCases(std::vector<Q8Case>* cases) {
  const std::string path = testing::SourcePath("tests/fixtures/quant/q8_0_quantize.bin");
  std::ifstream stream(path, std::ios::binary);
  ASSERT_TRUE(stream) << "cannot open " << path
                      << " (regenerate with tests/oracle/gen_q8_0_fixtures.py)";
  Reader reader(std::vector<uint8_t>{std::istreambuf_iterator<char>(stream),
                                     std::istreambuf_iterator<char>()});
  char magic[8];
  ASSERT_TRUE(reader.Read(magic, 8));
  ASSERT_EQ(std::string(magic, 8), "BSQ8QFX1");
  uint32_t count = 0;
  ASSERT_TRUE(reader.Read(&count, 4));
  for (uint32_t i = 0; i < count; ++i) {
    Q8Case c;
    uint32_t name_length = 0, blocks = 0;
    ASSERT_TRUE(reader.Read(&name_length, 4));
    c.name.resize(name_length);
    ASSERT_TRUE(reader.Read(c.name.data(), name_length));
    ASSERT_TRUE(reader.Read(&blocks, 4));
    c.input.resize(blocks * kQk);
    c.expected.resize(blocks * sizeof(BlockQ8_0));
    ASSERT_TRUE(reader.Read(c.input.data(), c.input.size() * sizeof(float)));
    ASSERT_TRUE(reader.Read(c.expected.data(), c.expected.size()));
    cases->push_back(std::move(c));
  }
  ASSERT_TRUE(reader.AtEnd());
}

TEST(QuantizeQ8_0, MatchesGgufPyByteForByte) {
  std::vector<Q8Case> cases;
  ASSERT_NO_FATAL_FAILURE(LoadCases(&cases));
  ASSERT_GE(cases.size(), 8u);
  for (const Q8Case& c : cases) {
    std::vector<uint8_t> got(c.expected.size());
    QuantizeQ8_0Row(c.input.data(), static_cast<int64_t>(c.input.size()), got.data());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i], c.expected[i])
          << c.name << ": block " << i / sizeof(BlockQ8_0) << " byte " << i % sizeof(BlockQ8_0);
    }
  }
}

// The split row's codes and scales are the fixture's blocks' bytes, moved: codes of block b at
// 32 b, its fp16 scale at cols + 2 b.
TEST(QuantizeQ8_0, SplitRowHoldsGgufPyCodesAndScales) {
  std::vector<Q8Case> cases;
  ASSERT_NO_FATAL_FAILURE(LoadCases(&cases));
  for (const Q8Case& c : cases) {
    const int64_t cols = static_cast<int64_t>(c.input.size());
    ASSERT_EQ(SplitRowBytes(SplitFormat::kQ8_0, 32, cols), c.expected.size());
    std::vector<uint8_t> row(c.expected.size());
    QuantizeQ8_0SplitRow(c.input.data(), cols, row.data());
    for (int64_t b = 0; b < cols / kQk; ++b) {
      const uint8_t* block = c.expected.data() + b * sizeof(BlockQ8_0);
      ASSERT_EQ(std::memcmp(row.data() + 32 * b, block + 2, 32), 0) << c.name << " block " << b;
      ASSERT_EQ(std::memcmp(row.data() + cols + 2 * b, block, 2), 0) << c.name << " block " << b;
    }
  }
}

TEST(QuantizeQ8_0, SplitDequantizeEqualsGgmlDequantize) {
  std::vector<Q8Case> cases;
  ASSERT_NO_FATAL_FAILURE(LoadCases(&cases));
  // Random bytes too: codes of -128 and any fp16 scale, as a GGUF file may hold.
  Q8Case random;
  std::mt19937 rng(5);
  random.expected.resize(64 * sizeof(BlockQ8_0));
  for (uint8_t& b : random.expected) b = static_cast<uint8_t>(rng());
  random.input.resize(64 * kQk);
  cases.push_back(random);
  for (const Q8Case& c : cases) {
    const int64_t n = static_cast<int64_t>(c.input.size());
    std::vector<float> split(n), ggml(n);
    ASSERT_EQ(SplitRowBytes(SplitFormat::kQ8_0, 32, n), c.expected.size());
    const std::vector<uint8_t> row = BlocksToSplitRow(c.expected);
    DequantizeSplitRow(SplitFormat::kQ8_0, 32, row.data(), n, split.data());
    ASSERT_TRUE(DequantizeRow(GgmlType::kQ8_0, c.expected.data(), ggml.data(), n).ok());
    for (int64_t i = 0; i < n; ++i) {
      const bool both_nan = std::isnan(split[i]) && std::isnan(ggml[i]);
      ASSERT_TRUE(both_nan || BitsFromFp32(split[i]) == BitsFromFp32(ggml[i]))
          << c.name << " " << i;
    }
  }
  EXPECT_EQ(SplitRowBytes(SplitFormat::kQ8_0, 32, 4096), 128 * sizeof(BlockQ8_0));
}

}  // namespace
}  // namespace bitsplit::quant
