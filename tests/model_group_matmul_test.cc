// A linear group's matmul (common/model/split_backend.h): SplitMatMulGroup, and MatMulGroupRows
// over any cut of the group's rows into ranges (the residual service's way of splitting them),
// equal each matrix's scalar MatMulReference bit for bit, including ranges that end inside a row
// tile and ranges that span two matrices.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/split_backend.h"
#include "common/quant/split_format.h"
#include "common/quant/split_matmul.h"
#include "common/util/thread_pool.h"
#include "tests/testing/random.h"

namespace bitsplit::model {
namespace {

constexpr quant::SplitFormat kFormat = quant::SplitFormat::kR8;
constexpr int kGroup = 32;
constexpr int64_t kCols = 192;

using testing::Gaussian;

struct OwnedMatrix {
  std::vector<uint8_t> bytes;
  quant::MatrixView view;
};

OwnedMatrix ResidualMatrix(int64_t rows, uint32_t seed) {
  const size_t row_bytes = quant::SplitRowBytes(kFormat, kGroup, kCols);
  OwnedMatrix m;
  m.bytes.resize(static_cast<size_t>(rows) * row_bytes);
  const std::vector<float> w = Gaussian(rows * kCols, seed, 0.01f);
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_TRUE(quant::QuantizeResidualRow(kFormat, kGroup, &w[r * kCols], kCols,
                                           m.bytes.data() + r * row_bytes)
                    .ok());
  }
  auto view = quant::MakeMatrixView(kFormat, kGroup, rows, kCols, m.bytes.data(), m.bytes.size());
  EXPECT_TRUE(view.ok()) << view.status();
  m.view = *view;
  return m;
}

// The group's matrices, shaped like q|k|v (or gate|up): row counts that are not multiples of the
// kernels' row grain, so thread and range boundaries fall inside row tiles and across matrices.
struct Group {
  std::vector<OwnedMatrix> owned;
  std::vector<quant::MatrixView> views;
};

Group MakeGroup(const std::vector<int64_t>& rows, uint32_t seed) {
  Group g;
  for (size_t i = 0; i < rows.size(); ++i) g.owned.push_back(ResidualMatrix(rows[i], seed + i));
  for (const OwnedMatrix& m : g.owned) g.views.push_back(m.view);
  return g;
}

// outputs[i] = start[i] + x · W_iᵀ by the scalar reference, one matrix at a time.
std::vector<std::vector<float>> Expected(const Group& g, const quant::QuantizedActivations& x,
                                         const std::vector<std::vector<float>>& start) {
  std::vector<std::vector<float>> y = start;
  for (size_t i = 0; i < g.views.size(); ++i) {
    quant::MatMulReference(g.views[i], x, y[i].data(), /*accumulate=*/true);
  }
  return y;
}

std::vector<float*> Pointers(std::vector<std::vector<float>>& y) {
  std::vector<float*> p;
  for (auto& v : y) p.push_back(v.data());
  return p;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(GroupRowRanges, LaysTheMatricesEndToEnd) {
  const Group g = MakeGroup({37, 13, 21}, 1);
  const GroupRowRanges ranges(g.views);
  EXPECT_EQ(ranges.count, 3u);
  EXPECT_EQ(ranges.start[0], 0);
  EXPECT_EQ(ranges.start[1], 37);
  EXPECT_EQ(ranges.start[2], 50);
  EXPECT_EQ(ranges.start[3], 71);
  EXPECT_EQ(ranges.total(), 71);
}

TEST(SplitMatMulGroup, EqualsEachMatrixAloneForAnySplit) {
  for (const std::vector<int64_t>& rows :
       std::vector<std::vector<int64_t>>{{40}, {24, 9}, {37, 13, 21}}) {
    const Group g = MakeGroup(rows, 10);
    const GroupRowRanges ranges(g.views);
    for (int64_t tokens : {1, 3, 4, 9}) {
      SCOPED_TRACE(absl::StrCat(rows.size(), " matrices, T = ", tokens));
      const std::vector<float> xf = Gaussian(tokens * kCols, 20 + tokens, 1.0f);
      quant::QuantizedActivations x;
      quant::QuantizeActivations(xf.data(), tokens, kCols, &x);
      // Accumulating onto values already there, as the verify path adds the residual half.
      std::vector<std::vector<float>> start;
      for (size_t i = 0; i < rows.size(); ++i) {
        start.push_back(Gaussian(tokens * rows[i], 30 + i, 1.0f));
      }
      const std::vector<std::vector<float>> expected = Expected(g, x, start);

      for (int threads : {1, 3}) {
        ThreadPool pool(threads);
        std::vector<std::vector<float>> y = start;
        const std::vector<float*> outputs = Pointers(y);
        SplitMatMulGroup(g.views, x, outputs, /*accumulate=*/true, pool);
        for (size_t i = 0; i < rows.size(); ++i) {
          EXPECT_TRUE(SameBits(y[i], expected[i])) << threads << " threads, matrix " << i;
        }
      }

      // Ranges of 1, 4, 3, 9, 13, ... rows: some end inside a row tile, some span a matrix end.
      std::vector<std::vector<float>> y = start;
      const std::vector<float*> outputs = Pointers(y);
      int64_t begin = 0;
      for (int64_t length = 1; begin < ranges.total(); length = length * 3 % 14 + 1) {
        const int64_t end = std::min(ranges.total(), begin + length);
        MatMulGroupRows(g.views, ranges, x, begin, end, outputs, /*accumulate=*/true);
        begin = end;
      }
      // An empty range computes nothing.
      MatMulGroupRows(g.views, ranges, x, ranges.total(), ranges.total(), outputs, true);
      for (size_t i = 0; i < rows.size(); ++i) {
        EXPECT_TRUE(SameBits(y[i], expected[i])) << "ranges, matrix " << i;
      }
    }
  }
}

}  // namespace
}  // namespace bitsplit::model
