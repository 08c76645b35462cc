#pragma once
// The ggml tensor type ids that GGUF files use, with their block geometry. Sizes follow
// ggml's type traits table (tests/io_gguf_reader_test.cc checks every id against gguf-py's);
// the reader needs them to validate tensor extents even for types this project cannot
// dequantize.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace bitsplit {

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
  kNVFP4 = 40,
  kQ1_0 = 41,
};

struct GgmlTypeTraits {
  std::string_view name;
  int64_t block_elements;  // elements per block (1 for plain types)
  int64_t block_bytes;     // bytes per block
};

// Traits of a known type id, or nullopt for ids that ggml does not (or no longer) define.
std::optional<GgmlTypeTraits> GetGgmlTypeTraits(uint32_t type_id);
inline std::optional<GgmlTypeTraits> GetGgmlTypeTraits(GgmlType type) {
  return GetGgmlTypeTraits(static_cast<uint32_t>(type));
}

// Name for messages; "type#<id>" for unknown ids.
std::string GgmlTypeName(uint32_t type_id);
inline std::string GgmlTypeName(GgmlType type) { return GgmlTypeName(static_cast<uint32_t>(type)); }

}  // namespace bitsplit
