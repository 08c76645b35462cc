#pragma once
// The element types a KV cache stores its rows in, and attention's view of one layer's rows.
//
//   f32   as computed;
//   f16   rounded to the nearest half (the CUDA backend's cache, and llama.cpp's default);
//   q8_0  ggml's Q8_0 blocks of 32 (quant::QuantizeQ8_0Row: one fp16 scale, 32 int8 codes;
//         llama.cpp's --cache-type-k/v q8_0), 34 bytes per 32 elements.
//
// Attention reads a row by decoding the head's slice to f32 exactly as ggml dequantizes it and
// then computing on the decoded values in simd_dot's fixed order, so its result depends on the
// storage only through the decoded values: attention over an f16 or q8_0 cache equals attention
// over an f32 cache holding the decoded rows, bit for bit, and stays batch-invariant.
#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace bitsplit::ops {

enum class KvType : uint8_t { kF32, kF16, kQ8_0 };

std::string_view KvTypeName(KvType type);  // "f32", "f16", "q8_0"
// INVALID_ARGUMENT for anything but the three names, listing them.
absl::StatusOr<KvType> ParseKvType(std::string_view name);

// Elements a q8_0 block holds: a q8_0 cache needs every head's width to be a multiple of it.
inline constexpr int64_t kKvQ8Block = 32;
// Whether rows of `type` can hold heads `head_dim` wide (q8_0: a multiple of 32).
bool KvTypeFitsHead(KvType type, int64_t head_dim);
// Bytes of one row of `kv_dim` elements (q8_0: kv_dim a multiple of 32).
int64_t KvRowBytes(KvType type, int64_t kv_dim);

// Encodes `count` f32 rows of `kv_dim` elements, back to back, into rows of `type`.
void EncodeKvRows(KvType type, const float* rows, int64_t count, int64_t kv_dim, uint8_t* out);
// Decodes elements [first, first + count) of an encoded row (q8_0: both multiples of 32).
void DecodeKvElements(KvType type, const uint8_t* row, int64_t first, int64_t count, float* out);

// One layer of a cache: row s starts at data + s * row_bytes.
struct KvRows {
  const uint8_t* data = nullptr;
  KvType type = KvType::kF32;
  int64_t row_bytes = 0;
};

}  // namespace bitsplit::ops
