// Checks the scalar reference dequantizers against fixtures written by
// tests/oracle/gen_dequant_fixtures.py with gguf-py (an independent numpy port of ggml).
//
// Every format is required to match bit for bit (NaN matches any NaN): our code follows
// ggml's operation order, numpy evaluates the same float32 operations element-wise with the
// same grouping, and neither side fuses multiply-adds (-ffp-contract=off here), so there is no
// source of rounding difference to tolerate. (For the K-quants the sub-block scale products
// d * sc are even exact in float, an 11-bit fp16 mantissa times an integer of at most 8 bits,
// so only the final multiply and the subtraction of the min round.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/io/ggml_type.h"
#include "common/quant/dequantize.h"
#include "common/quant/ggml_blocks.h"
#include "common/util/fp16.h"
#include "tests/testing/paths.h"

namespace bitsplit::quant {
namespace {

// One named run of blocks with the oracle's output (see the generator for the file layout).
struct FixtureCase {
  std::string name;
  int64_t block_count = 0;
  std::vector<uint8_t> raw;
  std::vector<float> expected;
};

struct Fixture {
  uint32_t type_id = 0;
  uint32_t block_elements = 0;
  uint32_t block_bytes = 0;
  std::vector<FixtureCase> cases;
};

class ByteReader {
 public:
  explicit ByteReader(std::vector<uint8_t> bytes) : bytes_(std::move(bytes)) {}

  bool Read(void* out, size_t size) {
    if (size > bytes_.size() - position_) return false;
    std::memcpy(out, bytes_.data() + position_, size);
    position_ += size;
    return true;
  }
  bool ReadU32(uint32_t* out) { return Read(out, sizeof(*out)); }
  bool AtEnd() const { return position_ == bytes_.size(); }

 private:
  std::vector<uint8_t> bytes_;
  size_t position_ = 0;
};

// Loads tests/fixtures/quant/<file>; fails the calling test on a malformed file.
void LoadFixture(const std::string& file, Fixture* fixture) {
  const std::string path = testing::SourcePath("tests/fixtures/quant/" + file);
  std::ifstream stream(path, std::ios::binary);
  ASSERT_TRUE(stream) << "cannot open " << path
                      << " (regenerate with tests/oracle/gen_dequant_fixtures.py)";
  std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(stream),
                             std::istreambuf_iterator<char>()};
  ByteReader reader(std::move(bytes));

  char magic[8];
  ASSERT_TRUE(reader.Read(magic, sizeof(magic)));
  ASSERT_EQ(std::string(magic, sizeof(magic)), "BSDQFIX1") << path;
  uint32_t case_count = 0;
  ASSERT_TRUE(reader.ReadU32(&fixture->type_id));
  ASSERT_TRUE(reader.ReadU32(&fixture->block_elements));
  ASSERT_TRUE(reader.ReadU32(&fixture->block_bytes));
  ASSERT_TRUE(reader.ReadU32(&case_count));
  for (uint32_t c = 0; c < case_count; ++c) {
    FixtureCase fixture_case;
    uint32_t name_length = 0, block_count = 0;
    ASSERT_TRUE(reader.ReadU32(&name_length));
    fixture_case.name.resize(name_length);
    ASSERT_TRUE(reader.Read(fixture_case.name.data(), name_length));
    ASSERT_TRUE(reader.ReadU32(&block_count));
    fixture_case.block_count = block_count;
    fixture_case.raw.resize(size_t{block_count} * fixture->block_bytes);
    ASSERT_TRUE(reader.Read(fixture_case.raw.data(), fixture_case.raw.size()));
    fixture_case.expected.resize(size_t{block_count} * fixture->block_elements);
    ASSERT_TRUE(
        reader.Read(fixture_case.expected.data(), fixture_case.expected.size() * sizeof(float)));
    fixture->cases.push_back(std::move(fixture_case));
  }
  ASSERT_TRUE(reader.AtEnd()) << path << " has trailing bytes";
}

// Bit-exact comparison; every NaN equals every other NaN (payloads are not part of the
// contract: numpy may quiet signalling NaNs when it converts halves with F16C).
::testing::AssertionResult SameFloats(const std::vector<float>& expected,
                                      const std::vector<float>& actual, int64_t block_elements) {
  if (expected.size() != actual.size()) {
    return ::testing::AssertionFailure() << "size " << actual.size() << " vs " << expected.size();
  }
  int mismatches = 0;
  std::string first;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (std::isnan(expected[i]) && std::isnan(actual[i])) continue;
    if (BitsFromFp32(expected[i]) == BitsFromFp32(actual[i])) continue;
    if (mismatches++ == 0) {
      first = absl::StrFormat("element %d (block %d): expected %.9g (0x%08x), got %.9g (0x%08x)", i,
                              static_cast<int64_t>(i) / block_elements, expected[i],
                              BitsFromFp32(expected[i]), actual[i], BitsFromFp32(actual[i]));
    }
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << mismatches << " mismatching values; first at " << first;
}

struct FormatParam {
  GgmlType type;
  const char* file;
  bool in_real_models;  // the fixture must then hold blocks taken from the model files
};

class DequantizeFixtureTest : public ::testing::TestWithParam<FormatParam> {};

TEST_P(DequantizeFixtureTest, MatchesGgufPyBitForBit) {
  const FormatParam& param = GetParam();
  Fixture fixture;
  ASSERT_NO_FATAL_FAILURE(LoadFixture(param.file, &fixture));

  const auto traits = GetGgmlTypeTraits(param.type);
  ASSERT_TRUE(traits.has_value());
  ASSERT_EQ(fixture.type_id, static_cast<uint32_t>(param.type));
  ASSERT_EQ(fixture.block_elements, traits->block_elements);
  ASSERT_EQ(fixture.block_bytes, traits->block_bytes);
  ASSERT_FALSE(fixture.cases.empty());

  const DequantizeRowFn row_fn = GetDequantizeRowFn(param.type);
  ASSERT_NE(row_fn, nullptr);
  int real_cases = 0;
  for (const FixtureCase& fixture_case : fixture.cases) {
    SCOPED_TRACE(fixture_case.name);
    if (fixture_case.name.rfind("real:", 0) == 0) ++real_cases;
    const int64_t n = fixture_case.block_count * traits->block_elements;

    // Through the checked wrapper, from an odd address: blocks inside a mapped file need not
    // be aligned for the block struct.
    std::vector<uint8_t> misaligned(fixture_case.raw.size() + 1);
    std::memcpy(misaligned.data() + 1, fixture_case.raw.data(), fixture_case.raw.size());
    std::vector<float> actual(static_cast<size_t>(n), -12345.0f);
    ASSERT_TRUE(DequantizeRow(param.type, misaligned.data() + 1, actual.data(), n).ok());
    EXPECT_TRUE(SameFloats(fixture_case.expected, actual, traits->block_elements));

    // Block by block through the raw function pointer: a row's blocks are independent.
    std::vector<float> per_block(static_cast<size_t>(n), -12345.0f);
    for (int64_t b = 0; b < fixture_case.block_count; ++b) {
      row_fn(fixture_case.raw.data() + b * traits->block_bytes,
             per_block.data() + b * traits->block_elements, traits->block_elements);
    }
    EXPECT_TRUE(SameFloats(fixture_case.expected, per_block, traits->block_elements));
  }
  if (param.in_real_models) {
    EXPECT_GT(real_cases, 0) << "fixture lacks blocks from the real models";
  }
}

INSTANTIATE_TEST_SUITE_P(AllFormats, DequantizeFixtureTest,
                         ::testing::Values(FormatParam{GgmlType::kF32, "f32.bin", true},
                                           FormatParam{GgmlType::kF16, "f16.bin", false},
                                           FormatParam{GgmlType::kBF16, "bf16.bin", false},
                                           FormatParam{GgmlType::kQ8_0, "q8_0.bin", true},
                                           FormatParam{GgmlType::kQ4_0, "q4_0.bin", false},
                                           FormatParam{GgmlType::kQ4_1, "q4_1.bin", true},
                                           FormatParam{GgmlType::kQ5_0, "q5_0.bin", true},
                                           FormatParam{GgmlType::kQ5_1, "q5_1.bin", false},
                                           FormatParam{GgmlType::kQ2_K, "q2_k.bin", false},
                                           FormatParam{GgmlType::kQ3_K, "q3_k.bin", false},
                                           FormatParam{GgmlType::kQ4_K, "q4_k.bin", true},
                                           FormatParam{GgmlType::kQ5_K, "q5_k.bin", false},
                                           FormatParam{GgmlType::kQ6_K, "q6_k.bin", true},
                                           FormatParam{GgmlType::kMXFP4, "mxfp4.bin", false}),
                         [](const ::testing::TestParamInfo<FormatParam>& info) {
                           return std::string(GgmlTypeName(info.param.type));
                         });

// The block structs are declared field by field as ggml-common.h declares them; the type
// table's block sizes (what the GGUF reader sizes tensors by) must be what those fields add up
// to, or a dequantizer would read its blocks at the wrong stride.
TEST(GgmlBlocks, StructSizesAreTheTypeTableSizes) {
  struct Case {
    GgmlType type;
    size_t bytes;
    int elements;
  };
  for (const Case& c :
       {Case{GgmlType::kF16, sizeof(BlockF16), 1}, Case{GgmlType::kBF16, sizeof(BlockBf16), 1},
        Case{GgmlType::kQ4_0, sizeof(BlockQ4_0), kQk},
        Case{GgmlType::kQ4_1, sizeof(BlockQ4_1), kQk},
        Case{GgmlType::kQ5_0, sizeof(BlockQ5_0), kQk},
        Case{GgmlType::kQ5_1, sizeof(BlockQ5_1), kQk},
        Case{GgmlType::kQ8_0, sizeof(BlockQ8_0), kQk},
        Case{GgmlType::kQ2_K, sizeof(BlockQ2_K), kQkK},
        Case{GgmlType::kQ3_K, sizeof(BlockQ3_K), kQkK},
        Case{GgmlType::kQ4_K, sizeof(BlockQ4_K), kQkK},
        Case{GgmlType::kQ5_K, sizeof(BlockQ5_K), kQkK},
        Case{GgmlType::kQ6_K, sizeof(BlockQ6_K), kQkK},
        Case{GgmlType::kMXFP4, sizeof(BlockMxfp4), kQk}}) {
    SCOPED_TRACE(GgmlTypeName(c.type));
    const auto traits = GetGgmlTypeTraits(c.type);
    ASSERT_TRUE(traits.has_value());
    EXPECT_EQ(static_cast<size_t>(traits->block_bytes), c.bytes);
    EXPECT_EQ(traits->block_elements, c.elements);
  }
}

// A readable spot check of the layout that the fixtures pin down wholesale: Q4_0 keeps element
// j in the low nibble and element j + 16 in the high nibble of byte j.
TEST(Dequantize, Q4_0NibbleOrder) {
  BlockQ4_0 block{};
  block.d = Fp32ToFp16(0.5f);
  for (int j = 0; j < kQk / 2; ++j) block.qs[j] = static_cast<uint8_t>((15 - j) << 4 | j);
  std::vector<float> out(kQk);
  ASSERT_TRUE(DequantizeRow(GgmlType::kQ4_0, &block, out.data(), kQk).ok());
  for (int j = 0; j < kQk / 2; ++j) {
    EXPECT_EQ(out[j], 0.5f * static_cast<float>(j - 8)) << j;
    EXPECT_EQ(out[j + kQk / 2], 0.5f * static_cast<float>(7 - j)) << j;
  }
}

// MXFP4 by hand: E2M1 codes 0..15 are 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives, times
// 2^(e - 127); element j in the low nibble, j + 16 in the high one.
TEST(Dequantize, Mxfp4CodesAndScale) {
  constexpr float kE2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  BlockMxfp4 block{};
  for (int j = 0; j < kQk / 2; ++j) block.qs[j] = static_cast<uint8_t>((15 - j) << 4 | j);
  for (const int e : {127, 130, 120, 1}) {
    block.e = static_cast<uint8_t>(e);
    std::vector<float> out(kQk);
    ASSERT_TRUE(DequantizeRow(GgmlType::kMXFP4, &block, out.data(), kQk).ok());
    const float scale = std::ldexp(1.0f, e - 127);
    for (int j = 0; j < kQk / 2; ++j) {
      EXPECT_EQ(out[j], kE2m1[j] * scale) << "e " << e << " j " << j;
      EXPECT_EQ(out[j + kQk / 2], kE2m1[15 - j] * scale) << "e " << e << " j " << j;
    }
  }
}

TEST(Dequantize, UnsupportedTypesAreRejected) {
  for (GgmlType type : {GgmlType::kIQ2_XXS, GgmlType::kIQ4_NL, GgmlType::kQ8_1, GgmlType::kQ8_K,
                        GgmlType::kI8, GgmlType::kF64, GgmlType::kTQ1_0, GgmlType::kNVFP4,
                        static_cast<GgmlType>(4) /* removed Q4_2 */}) {
    SCOPED_TRACE(GgmlTypeName(type));
    EXPECT_EQ(GetDequantizeRowFn(type), nullptr);
    uint8_t src[512] = {};
    float dst[256] = {};
    const absl::Status status = DequantizeRow(type, src, dst, 256);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("not supported"), std::string_view::npos) << status;
  }
}

TEST(Dequantize, LengthMustBeAWholeNumberOfBlocks) {
  std::vector<uint8_t> src(4 * sizeof(BlockQ4_K));
  std::vector<float> dst(4 * kQkK, 7.0f);
  struct Case {
    GgmlType type;
    int64_t n;
  };
  for (const Case& c :
       {Case{GgmlType::kQ4_0, 31}, Case{GgmlType::kQ4_0, 33}, Case{GgmlType::kQ8_0, 16},
        Case{GgmlType::kQ4_K, 255}, Case{GgmlType::kQ6_K, 32}, Case{GgmlType::kQ4_K, -256},
        Case{GgmlType::kF32, -1}}) {
    SCOPED_TRACE(absl::StrFormat("%s n=%d", GgmlTypeName(c.type), c.n));
    const absl::Status status = DequantizeRow(c.type, src.data(), dst.data(), c.n);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  }
  // A rejected call writes nothing.
  for (float value : dst) ASSERT_EQ(value, 7.0f);
  // Zero elements is a valid, empty row.
  EXPECT_TRUE(DequantizeRow(GgmlType::kQ4_K, src.data(), dst.data(), 0).ok());
  EXPECT_TRUE(DequantizeRow(GgmlType::kQ4_K, src.data(), dst.data(), 2 * kQkK).ok());
}

TEST(Dequantize, NullBuffersAreRejected) {
  float dst[kQk];
  uint8_t src[sizeof(BlockQ8_0)] = {};
  EXPECT_EQ(DequantizeRow(GgmlType::kQ8_0, nullptr, dst, kQk).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeRow(GgmlType::kQ8_0, src, nullptr, kQk).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace bitsplit::quant
