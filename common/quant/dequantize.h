#pragma once
// Scalar reference dequantization of the ggml formats found in GGUF files.
// Each format's block struct lives in ggml_blocks.h; these functions are the reference that
// faster (SIMD/CUDA) kernels are tested against.
#include <cstdint>

#include "absl/status/status.h"
#include "common/io/ggml_type.h"

namespace bitsplit::quant {

// Converts n elements (a multiple of the type's block size) from `src` to f32 `dst`.
using DequantizeRowFn = void (*)(const void* src, float* dst, int64_t n);

// The row dequantizer for `type`, or nullptr if this project cannot dequantize it.
DequantizeRowFn GetDequantizeRowFn(GgmlType type);

// Checked wrapper: INVALID_ARGUMENT for unsupported types or n not a multiple of the block.
absl::Status DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n);

}  // namespace bitsplit::quant
