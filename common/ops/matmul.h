#pragma once
// y = x · Wᵀ for a weight matrix stored in any dequantizable ggml type.
//
// Batch invariance: y[t][o] depends only on x row t and weight row o. It is one fixed-order dot
// product (common/ops/simd_dot.h) of x row t with the f32 dequantization of row o, whatever the
// number of rows T, the tile a row falls in, or the thread count. Work is split over output rows
// only; a reduction is never split.
#include <cstdint>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "common/io/ggml_type.h"
#include "common/quant/dequantize.h"
#include "common/util/thread_pool.h"

namespace bitsplit::ops {

// A read-only view of a row-major [rows, cols] matrix whose rows are stored back to back, each
// `row_bytes` long and encoded in `type` (e.g. a GGUF tensor with dims {cols, rows}).
// It points into memory it does not own (normally a mapped model file).
// Thread safety: immutable; any number of threads may read through it.
struct WeightMatrix {
  GgmlType type = GgmlType::kF32;
  const uint8_t* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_bytes = 0;
  // The fastest row dequantizer for `type`: AVX2 where common/ops has one, else the reference.
  quant::DequantizeRowFn dequantize_row = nullptr;

  const uint8_t* row(int64_t index) const { return data + index * row_bytes; }
};

// Checks that `type` can be dequantized and that `cols` is a whole number of its blocks.
// `what` names the matrix in error messages (e.g. the tensor name).
absl::StatusOr<WeightMatrix> MakeWeightMatrix(GgmlType type, const void* data, int64_t rows,
                                              int64_t cols, const std::string& what);

// y[t * w.rows + o] = sum_k x[t * w.cols + k] * W[o][k] for t < num_tokens: x is
// [num_tokens, w.cols], y is [num_tokens, w.rows], both row-major. Dequantizes each tile of
// weight rows once to f32 scratch and reuses it for all tokens (AVX2/FMA); a single token
// instead decodes the weights in registers, with the same arithmetic and so the same bits.
// Parallel over output rows.
void MatMul(const float* x, int64_t num_tokens, const WeightMatrix& w, float* y, ThreadPool& pool);

// MatMul of the same x with several matrices (e.g. wq|wk|wv, or w_gate|w_up) in one parallel
// pass: ys[i] = x · ws[i]ᵀ. Each output element is computed exactly as MatMul computes it; only
// the thread hand-offs are shared.
void MatMulMany(const float* x, int64_t num_tokens, std::span<const WeightMatrix* const> ws,
                std::span<float* const> ys, ThreadPool& pool);

// Straightforward scalar version (double accumulation, reference dequantizer from common/quant)
// that MatMul is tested against.
void MatMulReference(const float* x, int64_t num_tokens, const WeightMatrix& w, float* y);

// Dequantizes row `index` of `w` into dst[0, w.cols) (e.g. an embedding lookup).
void DequantizeWeightRow(const WeightMatrix& w, int64_t index, float* dst);

}  // namespace bitsplit::ops
