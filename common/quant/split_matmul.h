#pragma once
// y = x · Wᵀ for weights in a split format (split_format.h), with int8 activations.
//
// Activations are quantized per row in blocks of 32: codes c in -127..127 with an f32 scale
// s = amax / 127 per block (and the block's code sum, for formats with a min/offset). Each
// weight sub-block meets an activation block in an integer dot product (AVX2 maddubs/madd,
// exact in int32), which is then scaled and accumulated in f32.
//
// Batch invariance (docs/design.md §3): y[t][r] depends only on activation row t and
// weight row r. Its arithmetic is one fixed sequence, the same for any number of rows T, any
// position of t in the batch, any thread count and any row tiling; work is split over weight
// rows only. The sequence, which MatMulReference spells out in scalar code, is (per (t, r)):
//
//   even[0..8) = odd[0..8) = 0                     two sets of eight f32 lanes
//   for each run of 8 groups (the last run may be shorter; missing groups count as zero):
//     for each 32-block b of those groups, in order:
//       isum[k] = sum_{i<4} code_w[32b + 4k + i] * code_x[t][32b + 4k + i]   (exact int32)
//       sc      = d(group of b) * s[t][b]                                      (f32 product)
//       acc     = b even ? even : odd                       (b counts from the row's start)
//       acc[k]  = fma(float(isum[k]), sc, acc[k])
//     if the format has an offset/min:                        (lane k <-> k-th group of the run)
//       even[k] = fma(min(group), group_sum[t][group], even[k])
//   acc[k] = even[k] + odd[k]
//   y = ((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7))
//   out = accumulate ? out + y : y
//
// Two lane sets because 512-bit kernels take two consecutive blocks per vector (interleaved by
// doubleword: lane 2k of the even block's set, 2k + 1 of the odd block's): one vpdpbusd, one
// conversion and one multiply-add serve both. 256-bit kernels keep the two sets in two registers.
//
// where min(group) = m for the asymmetric formats and -offset * d for the offset formats
// (kB*Sym, kR6), and group_sum[t][g] = sum over the group's blocks b, in order from 0.0f, of
// s[t][b] * (sum of the block's activation codes). The SIMD kernel performs exactly these
// operations, so MatMul and MatMulReference agree bit for bit.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/quant/split_format.h"
#include "common/util/thread_pool.h"

namespace bitsplit::quant {

inline constexpr int kActivationBlock = 32;

// Callers that split a matmul's weight rows between threads (MatMul, SplitMatMulGroup, the
// residual service) cut at multiples of this: every kernel's row tiles then stay whole. Tiling
// never changes results; short tiles only cost speed.
inline constexpr int64_t kMatMulRowGrain = 8;

// Floats per row in QuantizedActivations' scales and sums: cols / 32 blocks rounded up to 8.
constexpr int64_t ActivationBlockStride(int64_t cols) { return (cols / 32 + 7) / 8 * 8; }

// Activation rows quantized to int8 in blocks of 32.
struct QuantizedActivations {
  int64_t rows = 0;           // T
  int64_t cols = 0;           // a multiple of 32
  int64_t block_stride = 0;   // floats per row in scales/sums: cols / 32 rounded up to 8
  std::vector<int8_t> codes;  // [rows][cols], each in -127..127
  std::vector<float> scales;  // [rows][block_stride]: x ~= scales[b] * codes; zero padded
  std::vector<float> sums;    // [rows][block_stride]: scales[b] * (sum of block b's codes)

  const int8_t* row_codes(int64_t t) const { return codes.data() + t * cols; }
  const float* row_scales(int64_t t) const { return scales.data() + t * block_stride; }
  const float* row_sums(int64_t t) const { return sums.data() + t * block_stride; }
};

// Per block of 32: s = amax / 127, inverse = s ? 1 / s : 0, c = round-half-even(x * inverse)
// clamped to +-127, sum = s * float(sum c); a block whose inverse overflows (amax < ~4e-37) is
// stored as s = 0, c = 0. `x` is row-major [rows][cols] and must be finite; cols a positive
// multiple of 32. `out` is resized (its buffers are reused across calls). AVX2; bit-identical
// to QuantizeActivationsReference. Rotate x first (hadamard.h) when the weights were rotated.
void QuantizeActivations(const float* x, int64_t rows, int64_t cols, QuantizedActivations* out);
void QuantizeActivationsReference(const float* x, int64_t rows, int64_t cols,
                                  QuantizedActivations* out);

// A read-only row-major [rows, cols] weight matrix in a split format; rows are `row_stride`
// bytes apart (>= SplitRowBytes). Points into memory it does not own (normally a mapped file).
struct MatrixView {
  SplitFormat format = SplitFormat::kR8;
  int group = 32;
  int64_t rows = 0;
  int64_t cols = 0;
  const uint8_t* data = nullptr;
  size_t row_stride = 0;

  const uint8_t* row(int64_t index) const { return data + index * row_stride; }
};

// Checks the layout and that `size_bytes` covers all rows; row_stride 0 means packed rows.
absl::StatusOr<MatrixView> MakeMatrixView(SplitFormat format, int group, int64_t rows, int64_t cols,
                                          const uint8_t* data, size_t size_bytes,
                                          size_t row_stride = 0);

// The kernels exist for three instruction sets, with the same bits out (the integer sums are
// exact in each): AVX2 (the baseline the build assumes); AVX-VNNI (one vpdpbusd per 32-byte
// integer dot product instead of vpmaddubsw + vpmaddwd; Zen 4+, Intel since Alder Lake); AVX-512
// F/VL/BW/VNNI/VBMI + GFNI (two blocks per 512-bit vector, codes expanded with vpermb and
// vgf2p8affineqb; Zen 4+, Ice Lake and later servers). The best one the CPU supports is selected
// at start-up.
enum class MatMulIsa { kAvx2, kAvxVnni, kAvx512 };
bool MatMulIsaSupported(MatMulIsa isa);
MatMulIsa ActiveMatMulIsa();
const char* MatMulIsaName(MatMulIsa isa);
// Switches every later MatMul/MatMulRows call of the process (tests and benchmarks compare the
// two); FAILED_PRECONDITION when the CPU lacks `isa`. Not for use while a MatMul runs.
absl::Status SelectMatMulIsa(MatMulIsa isa);

// How the kernels size their row tiles and prefetches to the L1 data cache, chosen at start-up:
// a tile's rows plus the rows prefetched ahead of it must stay in L1 until read. kLargeL1 (48 KiB
// and up, e.g. Zen 5; what the kernels were tuned on): at T = 1 and 2, 8-row tiles (4 for the
// 8-bit formats) at least 16 KiB ahead, every prefetch into L1. kSmallL1 (32 KiB or less, e.g.
// Zen 3 and 4), where that evicted the prefetched lines before use: every prefetch into L2, so
// only the tile being read must stay in L1; at T = 1 tiles of at most 16 KiB (8, 4, 2 or 1 rows)
// at least 16 KiB ahead, at T = 2 at most 20 KiB and 32 KiB ahead (r6, r8 and q8_0 20-45%
// faster at T = 1, 2 or 4 than kLargeL1, measured in docs/performance.md). Same bits.
enum class L1Tiling { kLargeL1, kSmallL1 };
L1Tiling ActiveL1Tiling();
const char* L1TilingName(L1Tiling tiling);
// Switches every later MatMul/MatMulRows call of the process (tests and benchmarks). Not for use
// while a MatMul runs.
void SelectL1Tiling(L1Tiling tiling);

// y[t * w.rows + r] (=|+=) x row t · W row r for t < x.rows; y is [x.rows][w.rows] row-major.
// x.cols must equal w.cols, and x.rows must be >= 1. Parallel over weight rows (static chunks
// of `pool`); AVX2/FMA/F16C (+ AVX-VNNI where present). Invariants are BITSPLIT_CHECKed (a caller
// validates input first).
void MatMul(const MatrixView& w, const QuantizedActivations& x, float* y, bool accumulate,
            ThreadPool& pool);

// The same for weight rows [row_begin, row_end) only, on the calling thread (for callers that
// schedule their own threads). Writes only those columns of y; results equal MatMul's bits.
void MatMulRows(const MatrixView& w, const QuantizedActivations& x, int64_t row_begin,
                int64_t row_end, float* y, bool accumulate);

// Scalar code of exactly the arithmetic above: MatMul must match it bit for bit.
void MatMulReference(const MatrixView& w, const QuantizedActivations& x, float* y, bool accumulate);

// Independent f32 reference: dequantized weights (DequantizeSplitRow) times the unquantized
// activations x ([tokens][w.cols]), accumulated in double. Differs from MatMul by the int8
// activation rounding only.
void MatMulF32Reference(const MatrixView& w, const float* x, int64_t tokens, float* y);

}  // namespace bitsplit::quant
