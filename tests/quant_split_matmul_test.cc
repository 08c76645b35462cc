// Split-format matmul kernels (common/quant/split_matmul.h):
//  * the AVX2 kernel equals the scalar same-arithmetic reference bit for bit, for every format,
//    group size, batch size, thread count, with and without accumulation, also on random bytes
//    (every code and scale pattern a file could hold);
//  * batch invariance: each activation row's outputs are the same bits alone (T = 1) as inside
//    batches of 2..64 at any position, with 1, 2 or 3 threads;
//  * accuracy against an f32 reference (dequantized weights x unquantized activations);
//  * activation quantization: AVX2 equals scalar, round-trip error within half a step.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/quant/split_format.h"
#include "common/quant/split_matmul.h"
#include "common/util/fp16.h"
#include "common/util/thread_pool.h"
#include "tests/testing/metrics.h"
#include "tests/testing/random.h"

namespace bitsplit::quant {
namespace {

// Runs `body` once per kernel instruction set this CPU supports (AVX2 always; AVX-VNNI and
// AVX-512 where present), then restores the default. Each ISA must meet the same bit-exact
// expectations.
template <typename Body>
void ForEachIsa(Body body) {
  const MatMulIsa before = ActiveMatMulIsa();
  for (MatMulIsa isa : {MatMulIsa::kAvx2, MatMulIsa::kAvxVnni, MatMulIsa::kAvx512}) {
    if (!MatMulIsaSupported(isa)) continue;
    ASSERT_TRUE(SelectMatMulIsa(isa).ok());
    SCOPED_TRACE(MatMulIsaName(isa));
    body();
  }
  ASSERT_TRUE(SelectMatMulIsa(before).ok());
}

constexpr SplitFormat kAllFormats[] = {
    SplitFormat::kB2Sym, SplitFormat::kB2Asym, SplitFormat::kB3Sym, SplitFormat::kB3Asym,
    SplitFormat::kB4Sym, SplitFormat::kB4Asym, SplitFormat::kR3,    SplitFormat::kR4,
    SplitFormat::kR5,    SplitFormat::kR6,     SplitFormat::kR8,    SplitFormat::kQ8_0,
    SplitFormat::kBTern,
};

std::vector<int> GroupsFor(SplitFormat format) {
  if (format == SplitFormat::kQ8_0) return {32};
  return {32, 64, 128};
}

std::string Name(SplitFormat format, int group) {
  return absl::StrCat(GetSplitFormatInfo(format).name, "/g", group);
}

using testing::Gaussian;

// A quantized matrix with its backing bytes.
struct Matrix {
  std::vector<uint8_t> bytes;
  MatrixView view;
};

// Gaussian weights through the real quantizer of `format`; rows `row_stride` apart (0: packed,
// otherwise the padding bytes hold garbage that must never be read).
Matrix QuantizedMatrix(SplitFormat format, int group, int64_t rows, int64_t cols, uint32_t seed,
                       size_t row_stride = 0) {
  const size_t row_bytes = SplitRowBytes(format, group, cols);
  if (row_stride == 0) row_stride = row_bytes;
  Matrix m;
  m.bytes.assign(rows * row_stride, 0xA5);
  const SplitFormatInfo& info = GetSplitFormatInfo(format);
  // Residual-like magnitudes for the residual formats, weight-like otherwise.
  const std::vector<float> w = Gaussian(rows * cols, seed, info.is_residual ? 0.01f : 0.05f);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* out = m.bytes.data() + r * row_stride;
    if (info.is_base) {
      EXPECT_TRUE(QuantizeBaseRow(format, group, &w[r * cols], nullptr, cols, out).ok());
    } else if (info.is_residual) {
      EXPECT_TRUE(QuantizeResidualRow(format, group, &w[r * cols], cols, out).ok());
    } else {
      QuantizeQ8_0SplitRow(&w[r * cols], cols, out);
    }
  }
  auto view = MakeMatrixView(format, group, rows, cols, m.bytes.data(), m.bytes.size(), row_stride);
  EXPECT_TRUE(view.ok()) << view.status();
  m.view = *view;
  return m;
}

// Random bytes everywhere, then every scale/min replaced by a random finite fp16 of moderate
// size (codes stay arbitrary: R8/Q8_0 get -128, R6 gets code 0, ...).
Matrix RandomBytesMatrix(SplitFormat format, int group, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  Matrix m;
  const size_t row_bytes = SplitRowBytes(format, group, cols);
  m.bytes.resize(rows * row_bytes);
  for (uint8_t& b : m.bytes) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> scale(-0.1f, 0.1f);
  const SplitFormatInfo& info = GetSplitFormatInfo(format);
  const SplitRowLayout layout = GetSplitRowLayout(format, group, cols);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = m.bytes.data() + r * row_bytes;
    for (int64_t g = 0; g < layout.groups; ++g) {
      uint16_t half = Fp32ToFp16(scale(rng));
      std::memcpy(row + layout.scale_offset + g * layout.scale_stride, &half, 2);
      if (info.has_min) {
        half = Fp32ToFp16(scale(rng));
        std::memcpy(row + layout.min_offset + g * layout.min_stride, &half, 2);
      }
    }
  }
  m.view = *MakeMatrixView(format, group, rows, cols, m.bytes.data(), m.bytes.size());
  return m;
}

bool SameBits(float a, float b) { return BitsFromFp32(a) == BitsFromFp32(b); }

// Index of the first element whose bits differ, or -1.
int64_t FirstDifference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!SameBits(a[i], b[i])) return static_cast<int64_t>(i);
  }
  return -1;
}

using testing::Nmse;

TEST(QuantizeActivations, Avx2MatchesReferenceBitForBit) {
  const int64_t rows = 7, cols = 320;
  std::vector<float> x = Gaussian(rows * cols, 11);
  for (int64_t i = 0; i < cols; ++i) x[i] *= 1e-30f;                   // tiny values
  for (int64_t i = 32; i < 64; ++i) x[cols + i] = 0.0f;                // an all-zero block
  for (int64_t i = 0; i < cols; ++i) x[2 * cols + i] *= 1e4f;          // large values
  for (int64_t i = 0; i < 32; ++i) x[3 * cols + i] = 0.5f * (i - 16);  // exact ties x * inverse
  x[3 * cols] = -127.0f;                                               // amax on a negative element
  for (int64_t i = 0; i < 32; ++i) x[4 * cols + i] = std::ldexp(1.0f, -140);  // subnormal
  QuantizedActivations fast, reference;
  QuantizeActivations(x.data(), rows, cols, &fast);
  QuantizeActivationsReference(x.data(), rows, cols, &reference);
  EXPECT_EQ(fast.codes, reference.codes);
  EXPECT_EQ(FirstDifference(fast.scales, reference.scales), -1);
  EXPECT_EQ(FirstDifference(fast.sums, reference.sums), -1);
  EXPECT_EQ(fast.block_stride, 16);  // 10 blocks padded to 16
}

TEST(QuantizeActivations, RoundTripWithinHalfStep) {
  const int64_t rows = 5, cols = 256;
  const std::vector<float> x = Gaussian(rows * cols, 12, 3.0f);
  QuantizedActivations q;
  QuantizeActivations(x.data(), rows, cols, &q);
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t b = 0; b < cols / 32; ++b) {
      const float s = q.row_scales(t)[b];
      int sum = 0;
      for (int j = 0; j < 32; ++j) {
        const int64_t k = b * 32 + j;
        const int c = q.row_codes(t)[k];
        ASSERT_LE(std::abs(c), 127);
        EXPECT_LE(std::fabs(x[t * cols + k] - s * c), 0.5f * s * (1 + 1e-5f));
        sum += c;
      }
      EXPECT_EQ(q.row_sums(t)[b], s * static_cast<float>(sum));
    }
  }
}

// The core property: AVX2 kernel == scalar reference, bit for bit.
void ExpectKernelMatchesReference(const MatrixView& w, int64_t tokens, uint32_t seed,
                                  const std::string& what) {
  const std::vector<float> xf = Gaussian(tokens * w.cols, seed);
  QuantizedActivations x;
  QuantizeActivations(xf.data(), tokens, w.cols, &x);
  std::vector<float> want(tokens * w.rows), start = Gaussian(tokens * w.rows, seed + 1);
  MatMulReference(w, x, want.data(), /*accumulate=*/false);
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    std::vector<float> got(tokens * w.rows, NAN);
    MatMul(w, x, got.data(), /*accumulate=*/false, pool);
    ASSERT_EQ(FirstDifference(got, want), -1) << what << " T=" << tokens << " threads=" << threads;
    // Accumulation: exactly start + product (one f32 add), in both implementations.
    std::vector<float> acc_got = start, acc_want = start;
    MatMul(w, x, acc_got.data(), /*accumulate=*/true, pool);
    MatMulReference(w, x, acc_want.data(), /*accumulate=*/true);
    ASSERT_EQ(FirstDifference(acc_got, acc_want), -1) << what << " accumulate T=" << tokens;
    for (size_t i = 0; i < start.size(); ++i) ASSERT_TRUE(SameBits(acc_got[i], start[i] + want[i]));
  }
}

TEST(SplitMatMul, KernelMatchesReferenceBitForBit) {
  ForEachIsa([&] {
    for (SplitFormat format : kAllFormats) {
      for (int group : GroupsFor(format)) {
        // 9 groups: a full run of 8 plus a partial one; 37 rows: every row-tile remainder.
        // T >= 8 (16 for the 8-bit formats): AVX-512 row tiles expand their codes once into a
        // cache that their later token tiles load.
        const Matrix m = QuantizedMatrix(format, group, 37, 9 * group, 100 + group);
        for (int64_t tokens : {1, 2, 3, 4, 5, 7, 8, 13, 16, 21}) {
          ExpectKernelMatchesReference(m.view, tokens, 7 * tokens, Name(format, group));
        }
      }
    }
  });
}

TEST(SplitMatMul, KernelMatchesReferenceOnRandomBytes) {
  ForEachIsa([&] {
    for (SplitFormat format : kAllFormats) {
      for (int group : GroupsFor(format)) {
        const Matrix m = RandomBytesMatrix(format, group, 13, 17 * group, 200 + group);
        for (int64_t tokens : {1, 4, 6}) {
          ExpectKernelMatchesReference(m.view, tokens, 3 * tokens, Name(format, group) + " random");
        }
      }
    }
  });
}

// The kernels fetch a row's scales 32 blocks ahead, with a loop specialised per scale layout
// (group 32, Q8_0's strided d, 64, 128, a multiple of 256, anything else) for full spans and a
// general one for the row's last, partial span: rows of 75-80 blocks take both, every layout.
// At T = 5 (more than one token tile) Q8_0's strided scales and group 96's are gathered once per
// row tile into a per-thread cache that the token tiles read.
TEST(SplitMatMul, EveryScaleLayoutOverFullAndPartialSpans) {
  ForEachIsa([&] {
    for (SplitFormat format : kAllFormats) {
      std::vector<int> groups = {32, 64, 96, 128, 256};
      if (format == SplitFormat::kQ8_0) groups = {32};
      for (int group : groups) {
        const int64_t cols = (2400 + group - 1) / group * group;
        const Matrix m = QuantizedMatrix(format, group, 9, cols, 400 + group);
        for (int64_t tokens : {1, 2, 5}) {
          ExpectKernelMatchesReference(m.view, tokens, 11 * tokens, Name(format, group) + " spans");
        }
      }
    }
  });
}

TEST(SplitMatMul, OddGroupSizesAndLongRows) {
  ForEachIsa([&] {
    // Groups that are not a power of two (96) and rows with many runs (4096 columns).
    for (SplitFormat format : {SplitFormat::kB3Asym, SplitFormat::kR5, SplitFormat::kR6,
                               SplitFormat::kR8, SplitFormat::kBTern}) {
      const Matrix odd = QuantizedMatrix(format, 96, 9, 96 * 11, 300);
      ExpectKernelMatchesReference(odd.view, 5, 41, Name(format, 96));
      const Matrix wide = QuantizedMatrix(format, 64, 6, 4096, 301);
      ExpectKernelMatchesReference(wide.view, 3, 42, Name(format, 64) + " wide");
    }
  });
}

// One- and two-token calls tile rows by the L1 data cache (L1Tiling): with kSmallL1, rows
// this long take tiles of 8, 4, 2 or 1 rows (T = 1: b2 and b3 at 4096 columns 8, b2 at 8192 and
// b4 and r6 at 4096 4, r8 at 4096 2, r8 and q8_0 at 16384 1) instead of 8 or 4, with the 13
// rows' remainders in smaller tiles, and every prefetch goes to L2. Both tilings, every ISA, give
// the reference's bits.
TEST(SplitMatMul, BothL1TilingsMatchReference) {
  const L1Tiling before = ActiveL1Tiling();
  for (L1Tiling tiling : {L1Tiling::kLargeL1, L1Tiling::kSmallL1}) {
    SelectL1Tiling(tiling);
    SCOPED_TRACE(L1TilingName(tiling));
    ForEachIsa([&] {
      for (SplitFormat format : kAllFormats) {
        const int group = format == SplitFormat::kQ8_0 ? 32 : 64;
        for (int64_t cols : {4096, 8192, 16384}) {
          const Matrix m = QuantizedMatrix(format, group, 13, cols, 700 + cols / 1024);
          for (int64_t tokens : {1, 2, 5}) {
            ExpectKernelMatchesReference(m.view, tokens, 17 * tokens,
                                         Name(format, group) + " cols " + std::to_string(cols));
          }
        }
      }
    });
  }
  SelectL1Tiling(before);
}

// The tiling follows this CPU's L1 data cache unless a caller selects one.
TEST(SplitMatMul, L1TilingFollowsL1DataCache) {
  const long l1_bytes = sysconf(_SC_LEVEL1_DCACHE_SIZE);
  EXPECT_EQ(ActiveL1Tiling(),
            l1_bytes > 0 && l1_bytes <= (32 << 10) ? L1Tiling::kSmallL1 : L1Tiling::kLargeL1)
      << "L1d " << l1_bytes;
  EXPECT_STREQ(L1TilingName(L1Tiling::kSmallL1), "small-l1");
  EXPECT_STREQ(L1TilingName(L1Tiling::kLargeL1), "large-l1");
}

// For T >= 3 the AVX-512 kernel of the signed formats and r6 reads activations it prepared once
// per call, unless they would take more than 512 KiB (2 bytes per code for the signed formats, 1
// for r6): at 8192 columns 31 tokens of r8 and q8_0 are prepared and 33 are not, 63 tokens of r6
// are and 65 are not. Either way the reference's bits.
TEST(SplitMatMul, EitherSideOfThePreparedActivationLimit) {
  ForEachIsa([&] {
    for (SplitFormat format : {SplitFormat::kR8, SplitFormat::kQ8_0, SplitFormat::kR6}) {
      const Matrix m = QuantizedMatrix(format, 32, 6, 8192, 302);
      const std::vector<int64_t> token_counts =
          format == SplitFormat::kR6 ? std::vector<int64_t>{63, 65} : std::vector<int64_t>{31, 33};
      for (int64_t tokens : token_counts) {
        ExpectKernelMatchesReference(m.view, tokens, 43 + tokens, Name(format, 32) + " prepared");
      }
    }
  });
}

// The kernels read each row's codes and scales and nothing beyond the matrix: a matrix that
// ends where an inaccessible page begins works for every format, also with rows whose
// scales are too few for the AVX-512 kernel's wide code loads (which then load exactly).
TEST(SplitMatMul, ReadsNothingPastTheMatrix) {
  const long page = sysconf(_SC_PAGESIZE);
  ForEachIsa([&] {
    for (SplitFormat format : kAllFormats) {
      for (int64_t cols : {64, 128, 256, 1024}) {
        const int group = format == SplitFormat::kQ8_0 ? 32 : 64;
        const Matrix source = QuantizedMatrix(format, group, 11, cols, 500 + cols);
        const size_t size = source.bytes.size();
        const size_t mapped = (size + page - 1) / page * page + page;
        void* region =
            mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        ASSERT_NE(region, MAP_FAILED);
        uint8_t* guard = static_cast<uint8_t*>(region) + mapped - page;
        ASSERT_EQ(mprotect(guard, page, PROT_NONE), 0);
        uint8_t* at_end = guard - size;  // the matrix's last byte is the guard page's neighbour
        std::memcpy(at_end, source.bytes.data(), size);
        auto view = MakeMatrixView(format, group, 11, cols, at_end, size);
        ASSERT_TRUE(view.ok()) << view.status();
        for (int64_t tokens : {1, 2, 5}) {
          ExpectKernelMatchesReference(*view, tokens, 13 * tokens,
                                       Name(format, group) + " cols " + std::to_string(cols));
        }
        ASSERT_EQ(munmap(region, mapped), 0);
      }
    }
  });
}

TEST(SplitMatMul, PaddedRowStrideIsIgnored) {
  const int64_t cols = 256;
  const size_t stride = SplitRowBytes(SplitFormat::kB2Asym, 64, cols) + 40;
  const Matrix padded = QuantizedMatrix(SplitFormat::kB2Asym, 64, 10, cols, 400, stride);
  const Matrix packed = QuantizedMatrix(SplitFormat::kB2Asym, 64, 10, cols, 400);
  const std::vector<float> xf = Gaussian(3 * cols, 401);
  QuantizedActivations x;
  QuantizeActivations(xf.data(), 3, cols, &x);
  ThreadPool pool(2);
  std::vector<float> a(30), b(30);
  MatMul(padded.view, x, a.data(), false, pool);
  MatMul(packed.view, x, b.data(), false, pool);
  EXPECT_EQ(FirstDifference(a, b), -1);
}

// Batch invariance: row t alone vs inside batches of every size 2..64, threads 1/2/3.
TEST(SplitMatMul, BatchInvariant) {
  ForEachIsa([&] {
    constexpr int64_t kTokens = 64;
    for (SplitFormat format : kAllFormats) {
      for (int group : GroupsFor(format)) {
        const int64_t rows = 21, cols = 9 * group;
        const Matrix m = QuantizedMatrix(format, group, rows, cols, 500);
        const std::vector<float> xf = Gaussian(kTokens * cols, 501);
        // Reference outputs: every token computed alone, single-threaded.
        std::vector<float> alone(kTokens * rows);
        {
          ThreadPool pool(1);
          QuantizedActivations one;
          for (int64_t t = 0; t < kTokens; ++t) {
            QuantizeActivations(xf.data() + t * cols, 1, cols, &one);
            MatMul(m.view, one, alone.data() + t * rows, false, pool);
          }
        }
        for (int threads : {1, 2, 3}) {
          ThreadPool pool(threads);
          QuantizedActivations batch;
          std::vector<float> y;
          for (int64_t size = 2; size <= kTokens; ++size) {
            // Batch = tokens [first, first + size) (cyclic), so each token also moves position.
            const int64_t first = (size * 7) % kTokens;
            std::vector<float> xb(size * cols);
            for (int64_t i = 0; i < size; ++i) {
              const int64_t t = (first + i) % kTokens;
              std::memcpy(&xb[i * cols], &xf[t * cols], cols * sizeof(float));
            }
            QuantizeActivations(xb.data(), size, cols, &batch);
            y.assign(size * rows, NAN);
            MatMul(m.view, batch, y.data(), false, pool);
            for (int64_t i = 0; i < size; ++i) {
              const int64_t t = (first + i) % kTokens;
              for (int64_t r = 0; r < rows; ++r) {
                ASSERT_TRUE(SameBits(y[i * rows + r], alone[t * rows + r]))
                    << Name(format, group) << " token " << t << " at " << i << " of " << size
                    << " threads " << threads << " row " << r;
              }
            }
          }
        }
      }
    }
  });
}

TEST(SplitMatMul, RowRangesEqualFullMatMul) {
  // Accumulating into a y that already holds other values, range by range.
  const Matrix m = QuantizedMatrix(SplitFormat::kR6, 32, 23, 320, 600);
  const std::vector<float> xf = Gaussian(5 * 320, 601);
  QuantizedActivations x;
  QuantizeActivations(xf.data(), 5, 320, &x);
  ThreadPool pool(2);
  const std::vector<float> start = Gaussian(5 * 23, 602);
  std::vector<float> full = start, pieces = start;
  MatMul(m.view, x, full.data(), true, pool);
  const int64_t bounds[] = {0, 1, 6, 7, 15, 23};  // ranges of 1, 5, 1, 8 and 8 rows
  for (int i = 0; i + 1 < 6; ++i) {
    MatMulRows(m.view, x, bounds[i], bounds[i + 1], pieces.data(), true);
  }
  EXPECT_EQ(FirstDifference(full, pieces), -1);
}

// int8 activations in blocks of 32 are the only approximation against the f32 reference. With
// s = amax / 127 the rounding error is uniform in +-s/2, variance s^2 / 12; for Gaussian blocks
// amax ~ 2.0-2.5 sigma, so the relative error variance is ~(2.2 / 127)^2 / 12 = 2.5e-5, and a
// dot product with independent weights inherits that ratio: NMSE ~ 2.5e-5 expected (measured
// 2.3e-5 .. 2.6e-5 here). 1e-4 leaves margin for fluctuation, and a real bug (a wrong scale,
// lane or offset) produces NMSE >= 1e-3.
TEST(SplitMatMul, CloseToF32Reference) {
  for (SplitFormat format : kAllFormats) {
    for (int group : GroupsFor(format)) {
      const int64_t rows = 48, cols = 1024, tokens = 6;
      const Matrix m = QuantizedMatrix(format, group, rows, cols, 700 + group);
      const std::vector<float> xf = Gaussian(tokens * cols, 701);
      QuantizedActivations x;
      QuantizeActivations(xf.data(), tokens, cols, &x);
      ThreadPool pool(2);
      std::vector<float> got(tokens * rows), want(tokens * rows);
      MatMul(m.view, x, got.data(), false, pool);
      MatMulF32Reference(m.view, xf.data(), tokens, want.data());
      const double nmse = Nmse(got, want);
      EXPECT_LE(nmse, 1e-4) << Name(format, group);
      RecordProperty(Name(format, group), absl::StrCat(nmse));
      std::printf("%-12s NMSE vs f32 reference %.3g\n", Name(format, group).c_str(), nmse);
    }
  }
}

// Adding a base and a residual product (the verify path) equals the product with B + R up to
// the activation rounding, i.e. the two-matmul split is what the service will compute.
TEST(SplitMatMul, BasePlusResidualMatchesFullWeights) {
  const int64_t rows = 32, cols = 512, tokens = 4;
  const std::vector<float> w = Gaussian(rows * cols, 800, 0.05f);
  const SplitFormat base = SplitFormat::kB2Asym, residual = SplitFormat::kR8;
  std::vector<uint8_t> b(rows * SplitRowBytes(base, 64, cols));
  std::vector<uint8_t> r(rows * SplitRowBytes(residual, 32, cols));
  for (int64_t i = 0; i < rows; ++i) {
    ASSERT_TRUE(QuantizeSplitRow(base, 64, residual, 32, &w[i * cols], nullptr, cols,
                                 &b[i * SplitRowBytes(base, 64, cols)],
                                 &r[i * SplitRowBytes(residual, 32, cols)])
                    .ok());
  }
  const MatrixView bv = *MakeMatrixView(base, 64, rows, cols, b.data(), b.size());
  const MatrixView rv = *MakeMatrixView(residual, 32, rows, cols, r.data(), r.size());
  const std::vector<float> xf = Gaussian(tokens * cols, 801);
  QuantizedActivations x;
  QuantizeActivations(xf.data(), tokens, cols, &x);
  ThreadPool pool(2);
  std::vector<float> y(tokens * rows), exact(tokens * rows, 0.0f);
  MatMul(bv, x, y.data(), false, pool);
  MatMul(rv, x, y.data(), true, pool);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < rows; ++i) {
      double sum = 0.0;
      for (int64_t k = 0; k < cols; ++k) sum += double(w[i * cols + k]) * xf[t * cols + k];
      exact[t * rows + i] = static_cast<float>(sum);
    }
  }
  EXPECT_LE(Nmse(y, exact), 1e-4);
}

TEST(SplitMatMul, IsaSelection) {
  EXPECT_TRUE(MatMulIsaSupported(MatMulIsa::kAvx2));
  EXPECT_EQ(MatMulIsaSupported(MatMulIsa::kAvxVnni), __builtin_cpu_supports("avxvnni") != 0);
  EXPECT_EQ(MatMulIsaSupported(MatMulIsa::kAvx512),
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
                __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("gfni"));
  // The default is the best the CPU has.
  const MatMulIsa best = MatMulIsaSupported(MatMulIsa::kAvx512)    ? MatMulIsa::kAvx512
                         : MatMulIsaSupported(MatMulIsa::kAvxVnni) ? MatMulIsa::kAvxVnni
                                                                   : MatMulIsa::kAvx2;
  EXPECT_EQ(ActiveMatMulIsa(), best);
  for (MatMulIsa isa : {MatMulIsa::kAvxVnni, MatMulIsa::kAvx512}) {
    if (MatMulIsaSupported(isa)) continue;
    const absl::Status status = SelectMatMulIsa(isa);
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(status.message().find(MatMulIsaName(isa)), std::string::npos) << status;
    EXPECT_EQ(ActiveMatMulIsa(), best);
  }
}

TEST(MakeMatrixView, RejectsBadShapes) {
  std::vector<uint8_t> bytes(1000);
  EXPECT_FALSE(MakeMatrixView(SplitFormat::kR8, 48, 2, 96, bytes.data(), bytes.size()).ok());
  EXPECT_FALSE(MakeMatrixView(SplitFormat::kR8, 32, 0, 96, bytes.data(), bytes.size()).ok());
  EXPECT_FALSE(MakeMatrixView(SplitFormat::kR8, 32, 2, 96, nullptr, bytes.size()).ok());
  EXPECT_FALSE(MakeMatrixView(SplitFormat::kR8, 32, 100, 96, bytes.data(), bytes.size()).ok());
  EXPECT_FALSE(MakeMatrixView(SplitFormat::kR8, 32, 2, 96, bytes.data(), bytes.size(), 50).ok());
  EXPECT_FALSE(MakeMatrixView(SplitFormat::kQ8_0, 64, 2, 128, bytes.data(), bytes.size()).ok());
  const auto ok = MakeMatrixView(SplitFormat::kR8, 32, 2, 96, bytes.data(), 2 * 102);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->row_stride, 102u);
}

}  // namespace
}  // namespace bitsplit::quant
