#include "common/ops/kv_rows.h"

#include <immintrin.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/ops/block_decoders.h"
#include "common/quant/ggml_blocks.h"
#include "common/quant/split_format.h"
#include "common/util/fp16.h"
#include "common/util/status_macros.h"

namespace bitsplit::ops {

std::string_view KvTypeName(KvType type) {
  switch (type) {
    case KvType::kF32:
      return "f32";
    case KvType::kF16:
      return "f16";
    case KvType::kQ8_0:
      return "q8_0";
  }
  BITSPLIT_CHECK(false);
}

absl::StatusOr<KvType> ParseKvType(std::string_view name) {
  for (const KvType type : {KvType::kF32, KvType::kF16, KvType::kQ8_0}) {
    if (name == KvTypeName(type)) return type;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown KV cache type \"", std::string(name), "\"; expected f32, f16 or q8_0"));
}

bool KvTypeFitsHead(KvType type, int64_t head_dim) {
  return head_dim > 0 && (type != KvType::kQ8_0 || head_dim % kKvQ8Block == 0);
}

int64_t KvRowBytes(KvType type, int64_t kv_dim) {
  switch (type) {
    case KvType::kF32:
      return kv_dim * static_cast<int64_t>(sizeof(float));
    case KvType::kF16:
      return kv_dim * static_cast<int64_t>(sizeof(uint16_t));
    case KvType::kQ8_0:
      BITSPLIT_CHECK(kv_dim % kKvQ8Block == 0);
      return kv_dim / kKvQ8Block * static_cast<int64_t>(sizeof(quant::BlockQ8_0));
  }
  BITSPLIT_CHECK(false);
}

void EncodeKvRows(KvType type, const float* rows, int64_t count, int64_t kv_dim, uint8_t* out) {
  const int64_t elements = count * kv_dim;
  switch (type) {
    case KvType::kF32:
      std::memcpy(out, rows, static_cast<size_t>(elements) * sizeof(float));
      return;
    case KvType::kF16:
      for (int64_t i = 0; i < elements; ++i) {
        const uint16_t half = Fp32ToFp16(rows[i]);
        std::memcpy(out + 2 * i, &half, sizeof(half));
      }
      return;
    case KvType::kQ8_0: {
      const int64_t row_bytes = KvRowBytes(type, kv_dim);
      for (int64_t r = 0; r < count; ++r) {
        quant::QuantizeQ8_0Row(rows + r * kv_dim, kv_dim, out + r * row_bytes);
      }
      return;
    }
  }
  BITSPLIT_CHECK(false);
}

void DecodeKvElements(KvType type, const uint8_t* row, int64_t first, int64_t count, float* out) {
  switch (type) {
    case KvType::kF32:
      std::memcpy(out, row + first * 4, static_cast<size_t>(count) * sizeof(float));
      return;
    case KvType::kF16: {
      const uint8_t* halves = row + 2 * first;
      int64_t i = 0;
      // vcvtph2ps converts exactly, as Fp16ToFp32 does.
      for (; i + 8 <= count; i += 8) {
        _mm256_storeu_ps(
            out + i,
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(halves + 2 * i))));
      }
      for (; i < count; ++i) {
        uint16_t half;
        std::memcpy(&half, halves + 2 * i, sizeof(half));
        out[i] = Fp16ToFp32(half);
      }
      return;
    }
    case KvType::kQ8_0: {
      BITSPLIT_CHECK(first % kKvQ8Block == 0 && count % kKvQ8Block == 0);
      const uint8_t* blocks = row + first / kKvQ8Block * sizeof(quant::BlockQ8_0);
      for (int64_t b = 0; b < count / kKvQ8Block; ++b) {
        // ggml's dequantize_row_q8_0, y = d * q, eight values at a time.
        __m256 decoded[4];
        simd::DecodeQ8_0::Decode(blocks + b * sizeof(quant::BlockQ8_0), decoded);
        for (int j = 0; j < 4; ++j) _mm256_storeu_ps(out + b * kKvQ8Block + 8 * j, decoded[j]);
      }
      return;
    }
  }
  BITSPLIT_CHECK(false);
}

}  // namespace bitsplit::ops
