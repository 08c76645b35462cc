#pragma once
// AVX2 row dequantizers for the formats that dominate real models (F16, Q4_0, Q4_1, Q8_0).
// Each performs exactly the float operations of the scalar reference in common/quant (integer
// code -> float, times the block scale, plus the block offset; no FMA), so its output is
// bit-identical to it; tests/ops_dequantize_simd_test.cc checks that on random blocks.
#include "common/io/ggml_type.h"
#include "common/quant/dequantize.h"

namespace bitsplit::ops {

// The AVX2 row dequantizer for `type`, or nullptr when there is none (use the reference).
quant::DequantizeRowFn GetSimdDequantizeRowFn(GgmlType type);

}  // namespace bitsplit::ops
