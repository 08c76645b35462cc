// KV cache rows in f32, f16 and q8_0: the encodings against independent decoders (the scalar
// half conversion, quant's ggml Q8_0 dequantizer), their error bound, and attention over encoded
// rows against attention over f32 rows holding the decoded values.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/io/ggml_type.h"
#include "common/ops/attention.h"
#include "common/ops/kv_rows.h"
#include "common/quant/dequantize.h"
#include "common/util/fp16.h"
#include "gtest/gtest.h"

namespace bitsplit::ops {
namespace {

// 4 query heads over 2 kv heads of 32 (q8_0 blocks a head exactly).
constexpr AttentionShape kShape{.num_heads = 4, .num_kv_heads = 2, .head_dim = 32, .scale = 0.2f};
constexpr int64_t kQDim = 4 * 32;
constexpr int64_t kKvDim = 2 * 32;
constexpr int64_t kPrefix = 6;
constexpr int64_t kTokens = 4;
constexpr int64_t kSlots = kPrefix + kTokens;

std::vector<float> Random(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = normal(rng);
  return x;
}

std::vector<uint8_t> Encode(KvType type, const std::vector<float>& rows) {
  const int64_t count = static_cast<int64_t>(rows.size()) / kKvDim;
  std::vector<uint8_t> bytes(static_cast<size_t>(count * KvRowBytes(type, kKvDim)));
  EncodeKvRows(type, rows.data(), count, kKvDim, bytes.data());
  return bytes;
}

std::vector<float> Decode(KvType type, const std::vector<uint8_t>& bytes) {
  const int64_t row_bytes = KvRowBytes(type, kKvDim);
  const int64_t count = static_cast<int64_t>(bytes.size()) / row_bytes;
  std::vector<float> rows(static_cast<size_t>(count * kKvDim));
  for (int64_t r = 0; r < count; ++r) {
    DecodeKvElements(type, bytes.data() + r * row_bytes, 0, kKvDim, rows.data() + r * kKvDim);
  }
  return rows;
}

TEST(KvRowsTest, NamesRoundTripAndUnknownNamesAreRefused) {
  for (const KvType type : {KvType::kF32, KvType::kF16, KvType::kQ8_0}) {
    absl::StatusOr<KvType> parsed = ParseKvType(KvTypeName(type));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, type);
  }
  const absl::StatusOr<KvType> bad = ParseKvType("q4_0");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("f16"), absl::string_view::npos);
}

TEST(KvRowsTest, RowBytesAndHeadWidths) {
  EXPECT_EQ(KvRowBytes(KvType::kF32, 64), 256);
  EXPECT_EQ(KvRowBytes(KvType::kF16, 64), 128);
  EXPECT_EQ(KvRowBytes(KvType::kQ8_0, 64), 2 * 34);  // two blocks: fp16 scale + 32 codes
  EXPECT_TRUE(KvTypeFitsHead(KvType::kF16, 20));
  EXPECT_FALSE(KvTypeFitsHead(KvType::kQ8_0, 20));
  EXPECT_TRUE(KvTypeFitsHead(KvType::kQ8_0, 128));
}

TEST(KvRowsTest, F16RowsHoldTheNearestHalf) {
  std::vector<float> rows = Random(3 * kKvDim, 5, 40.0f);
  rows[1] = 1e-7f;  // subnormal in half precision
  rows[2] = 1e6f;   // beyond the half range: infinity
  rows[3] = -0.0f;
  const std::vector<float> decoded = Decode(KvType::kF16, Encode(KvType::kF16, rows));
  for (size_t i = 0; i < rows.size(); ++i) {
    const float want = Fp16ToFp32(Fp32ToFp16(rows[i]));
    EXPECT_EQ(std::memcmp(&decoded[i], &want, sizeof(float)), 0) << i;
  }
  // A slice that starts mid-row and has a tail shorter than 8 decodes the same elements.
  const std::vector<uint8_t> bytes = Encode(KvType::kF16, rows);
  std::vector<float> slice(13);
  DecodeKvElements(KvType::kF16, bytes.data(), 3, 13, slice.data());
  for (int i = 0; i < 13; ++i) EXPECT_EQ(slice[i], decoded[3 + i]);
}

TEST(KvRowsTest, Q8RowsAreGgmlQ8_0Blocks) {
  std::vector<float> rows = Random(3 * kKvDim, 6, 3.0f);
  std::fill(rows.begin() + kKvDim, rows.begin() + kKvDim + 32, 0.0f);  // an all-zero block
  const std::vector<uint8_t> bytes = Encode(KvType::kQ8_0, rows);
  const std::vector<float> decoded = Decode(KvType::kQ8_0, bytes);
  // quant's ggml Q8_0 dequantizer reads the same bytes as a GGUF Q8_0 tensor.
  std::vector<float> ggml(rows.size());
  ASSERT_TRUE(quant::DequantizeRow(GgmlType::kQ8_0, bytes.data(), ggml.data(),
                                   static_cast<int64_t>(rows.size()))
                  .ok());
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(decoded[i], ggml[i]) << i;
  }
  // Each element is within half a step of its block's scale, amax / 127 (stored as fp16).
  for (size_t block = 0; block < rows.size() / 32; ++block) {
    float amax = 0.0f;
    for (size_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(rows[32 * block + j]));
    const float step = Fp16ToFp32(Fp32ToFp16(amax / 127.0f));
    for (size_t j = 0; j < 32; ++j) {
      const size_t i = 32 * block + j;
      EXPECT_LE(std::fabs(decoded[i] - rows[i]), 0.5f * step + 0.01f * step) << i;
    }
  }
  // The second head's slice of row 2 decodes alone to the same values.
  std::vector<float> slice(32);
  DecodeKvElements(KvType::kQ8_0, bytes.data() + 2 * KvRowBytes(KvType::kQ8_0, kKvDim), 32, 32,
                   slice.data());
  for (int j = 0; j < 32; ++j) EXPECT_EQ(slice[j], decoded[2 * kKvDim + 32 + j]);
}

// Token 0 is a child of the prefix, 1 and 2 are children of 0, 3 is a child of 2.
const std::vector<uint8_t> kTreeMask = {1, 0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 0, 1, 0, 1, 1};

std::vector<float> RunAttention(const std::vector<float>& q, const KvRows& keys,
                                const KvRows& values, int64_t prefix, int64_t tokens,
                                const uint8_t* mask, int threads) {
  ThreadPool pool(threads);
  std::vector<float> out(static_cast<size_t>(tokens * kQDim));
  Attention(q.data(), tokens, keys, values, prefix, mask, kShape, out.data(), pool);
  return out;
}

// Attention over encoded rows equals attention over f32 rows holding their decoded values, and
// a tree node equals its path run alone over the same encoded rows: the storage changes the
// values attention sees, never how it computes on them.
TEST(KvRowsTest, AttentionOverEncodedRowsIsAttentionOverTheDecodedValues) {
  const std::vector<float> q = Random(kTokens * kQDim, 7);
  const std::vector<float> keys = Random(kSlots * kKvDim, 8);
  const std::vector<float> values = Random(kSlots * kKvDim, 9);
  for (const KvType type : {KvType::kF16, KvType::kQ8_0}) {
    SCOPED_TRACE(KvTypeName(type));
    const std::vector<uint8_t> key_bytes = Encode(type, keys);
    const std::vector<uint8_t> value_bytes = Encode(type, values);
    const std::vector<float> key_f32 = Decode(type, key_bytes);
    const std::vector<float> value_f32 = Decode(type, value_bytes);
    const int64_t row_bytes = KvRowBytes(type, kKvDim);
    const KvRows encoded_keys{key_bytes.data(), type, row_bytes};
    const KvRows encoded_values{value_bytes.data(), type, row_bytes};
    const KvRows f32_keys{reinterpret_cast<const uint8_t*>(key_f32.data()), KvType::kF32,
                          kKvDim * 4};
    const KvRows f32_values{reinterpret_cast<const uint8_t*>(value_f32.data()), KvType::kF32,
                            kKvDim * 4};
    const std::vector<float> encoded =
        RunAttention(q, encoded_keys, encoded_values, kPrefix, kTokens, kTreeMask.data(), 2);
    const std::vector<float> f32 =
        RunAttention(q, f32_keys, f32_values, kPrefix, kTokens, kTreeMask.data(), 1);
    EXPECT_EQ(std::memcmp(encoded.data(), f32.data(), f32.size() * sizeof(float)), 0);

    // Token 3's path is prefix, 0, 2, 3: those rows copied into a cache of their own.
    std::vector<uint8_t> path_keys(key_bytes.begin(), key_bytes.begin() + kPrefix * row_bytes);
    std::vector<uint8_t> path_values(value_bytes.begin(),
                                     value_bytes.begin() + kPrefix * row_bytes);
    for (const int64_t j : {0, 2, 3}) {
      const int64_t slot = kPrefix + j;
      path_keys.insert(path_keys.end(), key_bytes.begin() + slot * row_bytes,
                       key_bytes.begin() + (slot + 1) * row_bytes);
      path_values.insert(path_values.end(), value_bytes.begin() + slot * row_bytes,
                         value_bytes.begin() + (slot + 1) * row_bytes);
    }
    const uint8_t self = 1;
    const std::vector<float> q3(q.begin() + 3 * kQDim, q.begin() + 4 * kQDim);
    const std::vector<float> alone =
        RunAttention(q3, {path_keys.data(), type, row_bytes}, {path_values.data(), type, row_bytes},
                     kPrefix + 2, 1, &self, 3);
    EXPECT_EQ(std::memcmp(alone.data(), encoded.data() + 3 * kQDim, kQDim * sizeof(float)), 0);
  }
}

}  // namespace
}  // namespace bitsplit::ops
