#include "common/ops/matmul.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/ops/block_decoders.h"
#include "common/ops/dequantize_simd.h"
#include "common/ops/simd_dot.h"
#include "common/util/status_macros.h"

namespace bitsplit::ops {
namespace {

// Weight rows dequantized together. A tile of the widest SmolLM2 row (1536 f32) is 72 KiB, so it
// stays in L2 while every token's activations stream past it.
constexpr int64_t kTileRows = 12;
// Register blocking of the tiled dot kernel: kBlockTokens activation rows x kBlockRows weight
// rows share their loads (12 accumulators + 3 weight vectors + 1 activation vector = 16 ymm).
constexpr int kBlockTokens = 4;
constexpr int kBlockRows = 3;
// Rows decoded together by the single-token kernel (independent accumulator chains).
constexpr int kFusedRows = 4;

// y[t][r] for t < kTokens, r < num_rows, weight rows already in f32 (`rows`, stride cols).
template <int kTokens>
void DotTokensWithRows(const float* x, const float* rows, int64_t num_rows, int64_t cols, float* y,
                       int64_t y_stride) {
  int64_t r = 0;
  for (; r + kBlockRows <= num_rows; r += kBlockRows) {
    simd::DotBlock<kTokens, kBlockRows>(x, cols, rows + r * cols, cols, cols, y + r, y_stride);
  }
  for (; r < num_rows; ++r) {
    simd::DotBlock<kTokens, 1>(x, cols, rows + r * cols, cols, cols, y + r, y_stride);
  }
}

// One tile: dot every token with `num_rows` dequantized weight rows starting at output row
// `first_row`.
void MultiplyTile(const float* x, int64_t num_tokens, const float* rows, int64_t first_row,
                  int64_t num_rows, int64_t cols, float* y, int64_t y_stride) {
  int64_t t = 0;
  for (; t + kBlockTokens <= num_tokens; t += kBlockTokens) {
    DotTokensWithRows<kBlockTokens>(x + t * cols, rows, num_rows, cols,
                                    y + t * y_stride + first_row, y_stride);
  }
  for (; t < num_tokens; ++t) {
    DotTokensWithRows<1>(x + t * cols, rows, num_rows, cols, y + t * y_stride + first_row,
                         y_stride);
  }
}

// Decode (T = 1) reads every weight once per token, so the weights are decoded in registers and
// used at once instead of going through the scratch tile. The arithmetic per output element is
// unchanged: the decoders are the ones the SIMD row dequantizers use (same weight bits), and each
// accumulator lane takes k = l, l + 8, ... in increasing k with one FMA, as in DotBlock (rows
// are whole 8-element groups here, so DotBlock has no tail either). Bit-identical to the tiled
// path; tests/model_llama_model_test.cc compares one-token and batched runs bit for bit.
template <typename Decoder, int kRows>
void FusedDotRows(const float* x, const uint8_t* rows, int64_t row_bytes, int64_t cols, float* y) {
  constexpr int kVectors = Decoder::kElements / 8;
  __m256 acc[kRows];
  for (int r = 0; r < kRows; ++r) acc[r] = _mm256_setzero_ps();
  const int64_t num_blocks = cols / Decoder::kElements;
  for (int64_t b = 0; b < num_blocks; ++b) {
    __m256 xv[kVectors];
    for (int j = 0; j < kVectors; ++j) xv[j] = _mm256_loadu_ps(x + b * Decoder::kElements + 8 * j);
    for (int r = 0; r < kRows; ++r) {
      __m256 w[kVectors];
      Decoder::Decode(rows + r * row_bytes + b * Decoder::kBytes, w);
      for (int j = 0; j < kVectors; ++j) acc[r] = _mm256_fmadd_ps(xv[j], w[j], acc[r]);
    }
  }
  for (int r = 0; r < kRows; ++r) y[r] = simd::HorizontalSum(acc[r]);
}

// One token times `count` rows of w starting at `first`, written to y[first ...].
template <typename Decoder>
void FusedTile(const float* x, const WeightMatrix& w, int64_t first, int64_t count, float* y) {
  int64_t r = 0;
  for (; r + kFusedRows <= count; r += kFusedRows) {
    FusedDotRows<Decoder, kFusedRows>(x, w.row(first + r), w.row_bytes, w.cols, y + first + r);
  }
  for (; r < count; ++r) {
    FusedDotRows<Decoder, 1>(x, w.row(first + r), w.row_bytes, w.cols, y + first + r);
  }
}

using FusedTileFn = void (*)(const float* x, const WeightMatrix& w, int64_t first, int64_t count,
                             float* y);

// The fused single-token kernel for w, or nullptr (then the tiled path runs).
FusedTileFn GetFusedTileFn(const WeightMatrix& w) {
  switch (w.type) {
    case GgmlType::kQ4_0:
      return FusedTile<simd::DecodeQ4_0>;
    case GgmlType::kQ4_1:
      return FusedTile<simd::DecodeQ4_1>;
    case GgmlType::kQ8_0:
      return FusedTile<simd::DecodeQ8_0>;
    case GgmlType::kF16:
      return w.cols % 8 == 0 ? FusedTile<simd::DecodeF16> : nullptr;
    default:
      return nullptr;
  }
}

}  // namespace

absl::StatusOr<WeightMatrix> MakeWeightMatrix(GgmlType type, const void* data, int64_t rows,
                                              int64_t cols, const std::string& what) {
  const auto traits = GetGgmlTypeTraits(type);
  quant::DequantizeRowFn dequantize_row = GetSimdDequantizeRowFn(type);
  if (dequantize_row == nullptr) dequantize_row = quant::GetDequantizeRowFn(type);
  if (!traits || dequantize_row == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: tensor type %s cannot be dequantized by this build", what, GgmlTypeName(type)));
  }
  if (rows <= 0 || cols <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: matrix shape [%d, %d] is empty", what, rows, cols));
  }
  if (cols % traits->block_elements != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: row length %d is not a multiple of the %s block size %d", what, cols,
                        traits->name, traits->block_elements));
  }
  if (data == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: no data", what));
  }
  WeightMatrix matrix;
  matrix.type = type;
  matrix.data = static_cast<const uint8_t*>(data);
  matrix.rows = rows;
  matrix.cols = cols;
  matrix.row_bytes = cols / traits->block_elements * traits->block_bytes;
  matrix.dequantize_row = dequantize_row;
  return matrix;
}

void MatMul(const float* x, int64_t num_tokens, const WeightMatrix& w, float* y, ThreadPool& pool) {
  const WeightMatrix* ws[] = {&w};
  float* ys[] = {y};
  MatMulMany(x, num_tokens, ws, ys, pool);
}

void MatMulMany(const float* x, int64_t num_tokens, std::span<const WeightMatrix* const> ws,
                std::span<float* const> ys, ThreadPool& pool) {
  BITSPLIT_CHECK(ws.size() == ys.size());
  if (num_tokens <= 0) return;
  // Tiles never straddle two matrices: tile_start[i] is the first tile of matrix i.
  std::vector<int64_t> tile_start(ws.size() + 1, 0);
  for (size_t i = 0; i < ws.size(); ++i) {
    BITSPLIT_CHECK(ws[i]->dequantize_row != nullptr && ws[i]->cols == ws[0]->cols);
    tile_start[i + 1] = tile_start[i] + (ws[i]->rows + kTileRows - 1) / kTileRows;
  }
  pool.ParallelFor(tile_start.back(), [&](int64_t begin, int64_t end, int /*worker*/) {
    // Per-thread scratch survives across calls: pool workers are long-lived threads.
    thread_local std::vector<float> scratch;
    size_t matrix = 0;
    for (int64_t tile = begin; tile < end; ++tile) {
      while (tile >= tile_start[matrix + 1]) ++matrix;
      const WeightMatrix& w = *ws[matrix];
      const int64_t first = (tile - tile_start[matrix]) * kTileRows;
      const int64_t count = std::min(kTileRows, w.rows - first);
      if (num_tokens == 1) {
        if (const FusedTileFn fused = GetFusedTileFn(w); fused != nullptr) {
          fused(x, w, first, count, ys[matrix]);
          continue;
        }
      }
      const float* rows;
      if (w.type == GgmlType::kF32) {
        rows = reinterpret_cast<const float*>(w.row(first));  // already f32: no copy
      } else {
        scratch.resize(static_cast<size_t>(kTileRows * w.cols));
        for (int64_t r = 0; r < count; ++r) {
          w.dequantize_row(w.row(first + r), scratch.data() + r * w.cols, w.cols);
        }
        rows = scratch.data();
      }
      MultiplyTile(x, num_tokens, rows, first, count, w.cols, ys[matrix], w.rows);
    }
  });
}

void MatMulReference(const float* x, int64_t num_tokens, const WeightMatrix& w, float* y) {
  const quant::DequantizeRowFn dequantize_row = quant::GetDequantizeRowFn(w.type);
  BITSPLIT_CHECK(dequantize_row != nullptr);
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t o = 0; o < w.rows; ++o) {
    dequantize_row(w.row(o), row.data(), w.cols);
    for (int64_t t = 0; t < num_tokens; ++t) {
      const float* xt = x + t * w.cols;
      double sum = 0.0;
      for (int64_t k = 0; k < w.cols; ++k) sum += static_cast<double>(xt[k]) * row[k];
      y[t * w.rows + o] = static_cast<float>(sum);
    }
  }
}

void DequantizeWeightRow(const WeightMatrix& w, int64_t index, float* dst) {
  BITSPLIT_CHECK(w.dequantize_row != nullptr && index >= 0 && index < w.rows);
  w.dequantize_row(w.row(index), dst, w.cols);
}

}  // namespace bitsplit::ops
