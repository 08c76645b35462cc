// The residual channel's pure parts: the layout of a segment, the header check the client makes
// of a mapped segment, and the service's decoding of a request's sizes into views.
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/io/shm_channel.h"
#include "gtest/gtest.h"

namespace bitsplit::shm {
namespace {

TEST(ShmLayoutTest, SmolLm2ServiceLayout) {
  // 64 rows, widest input 1536 (ffn_down), widest output 3072 (gate + up).
  auto layout = ComputeShmLayout(64, 1536, 3072);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->codes_offset, 4096u);
  EXPECT_EQ(layout->max_block_stride, 48u);  // 1536 / 32 = 48, a multiple of 8
  EXPECT_EQ(layout->scales_offset, 4096u + 64 * 1536);
  EXPECT_EQ(layout->sums_offset, layout->scales_offset + 64 * 48 * 4);
  EXPECT_EQ(layout->outputs_offset, layout->sums_offset + 64 * 48 * 4);
  // One expert segment per row at most, 16 bytes each.
  EXPECT_EQ(layout->segments_offset, layout->outputs_offset + 64 * 3072 * 4);
  EXPECT_EQ(layout->segment_bytes, (layout->segments_offset + 64 * 16 + 4095) / 4096 * 4096);
  EXPECT_TRUE(CheckShmHeader(HeaderForLayout(*layout), layout->segment_bytes).ok());
  EXPECT_FALSE(CheckShmHeader(HeaderForLayout(*layout), layout->segment_bytes + 4096).ok());
}

// These capacities make the 64-bit sums of the area sizes wrap to a 4096-byte "segment": a
// header claiming them with a one-page segment passed the client's check, which then placed the
// codes area 2^63 bytes past the mapping.
TEST(ShmLayoutTest, CapacitiesWhoseSizesOverflowAreRefused) {
  const struct {
    uint32_t rows, cols, outputs;
  } cases[] = {{4294967295u, 2147483648u, 3623878657u},
               {4294967295u, 1073741824u, 3959422977u},
               {4294967295u, 4294967264u, 4294967295u}};
  for (const auto& c : cases) {
    auto layout = ComputeShmLayout(c.rows, c.cols, c.outputs);
    EXPECT_FALSE(layout.ok()) << c.rows << " " << c.cols << " " << c.outputs << ": segment of "
                              << layout->segment_bytes << " bytes";
    ShmLayout forged;
    forged.max_rows = c.rows;
    forged.max_cols = c.cols;
    forged.max_outputs = c.outputs;
    forged.segment_bytes = 4096;
    EXPECT_FALSE(CheckShmHeader(HeaderForLayout(forged), 4096).ok());
  }
}

class DecodeRequestTest : public ::testing::Test {
 protected:
  DecodeRequestTest()
      : layout_(*ComputeShmLayout(8, 256, 512)),
        header_(HeaderForLayout(layout_)),
        segment_(layout_.segment_bytes) {}

  absl::StatusOr<ShmRequestView> Decode(uint32_t rows, uint32_t cols, uint32_t max_rows = 8) {
    ShmRequestCopy request{.seq = 3, .layer = 5, .group = 2, .rows = rows, .cols = cols};
    return DecodeRequest(header_, segment_.data(), segment_.size(), request, max_rows);
  }

  ShmLayout layout_;
  ShmHeader header_;
  std::vector<uint8_t> segment_;
};

TEST_F(DecodeRequestTest, ValidRequestGivesViewsAtTheLayoutsOffsets) {
  auto view = Decode(8, 96);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->seq, 3u);
  EXPECT_EQ(view->layer, 5);
  EXPECT_EQ(view->group, 2u);
  EXPECT_EQ(view->block_stride, 8u);  // 96 / 32 = 3, rounded up to 8
  EXPECT_EQ(reinterpret_cast<const uint8_t*>(view->codes), segment_.data() + 4096);
  EXPECT_EQ(reinterpret_cast<const uint8_t*>(view->scales),
            segment_.data() + layout_.scales_offset);
  EXPECT_EQ(reinterpret_cast<const uint8_t*>(view->sums), segment_.data() + layout_.sums_offset);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(view->outputs), segment_.data() + layout_.outputs_offset);
  EXPECT_EQ(view->output_capacity, 8u * 512);
  EXPECT_EQ(view->num_segments, 0u);
}

// An expert group's request carries at most one segment per row, in the segment table.
TEST_F(DecodeRequestTest, ExpertSegmentsAreCountedAgainstTheRows) {
  ShmRequestCopy request{
      .seq = 1, .layer = 0, .group = 5, .rows = 8, .cols = 256, .num_segments = 8};
  auto view = DecodeRequest(header_, segment_.data(), segment_.size(), request, 8);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->num_segments, 8u);
  EXPECT_EQ(reinterpret_cast<const uint8_t*>(view->segments),
            segment_.data() + layout_.segments_offset);
  request.rows = 3;
  request.num_segments = 4;
  EXPECT_EQ(DecodeRequest(header_, segment_.data(), segment_.size(), request, 8).status().message(),
            "num_segments 4 exceeds the request's 3 rows");
  // A segment shorter than its header claims refuses the segment table that does not fit.
  request.num_segments = 3;
  auto short_segment =
      DecodeRequest(header_, segment_.data(), layout_.segments_offset + 16, request, 8);
  EXPECT_NE(short_segment.status().message().find("segments area"), std::string::npos)
      << short_segment.status();
}

TEST_F(DecodeRequestTest, RowsAndColsOutsideTheCapacitiesAreRefusedNamingTheBound) {
  EXPECT_EQ(Decode(0, 256).status().message(), "rows (T) 0 is out of range [1, 8]");
  EXPECT_EQ(Decode(9, 256).status().message(), "rows (T) 9 is out of range [1, 8]");
  EXPECT_EQ(Decode(5, 256, 4).status().message(), "rows (T) 5 is out of range [1, 4]");
  EXPECT_EQ(Decode(1, 288).status().message(),
            "cols 288 is not a positive multiple of 32 at most 256");
  EXPECT_EQ(Decode(1, 100).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Decode(1, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

// The header is the service's own copy, but the views must stay inside the segment whatever it
// says: a segment shorter than its header claims refuses the areas that do not fit.
TEST_F(DecodeRequestTest, AreasOutsideTheSegmentAreRefused) {
  ShmRequestCopy request{.seq = 1, .layer = 0, .group = 0, .rows = 8, .cols = 256};
  auto view = DecodeRequest(header_, segment_.data(), layout_.outputs_offset + 100, request, 8);
  EXPECT_EQ(view.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(view.status().message().find("outputs area"), std::string::npos) << view.status();
  ShmHeader overlapping = header_;
  overlapping.scales_offset = header_.codes_offset + 64;
  view = DecodeRequest(overlapping, segment_.data(), segment_.size(), request, 8);
  EXPECT_NE(view.status().message().find("codes area"), std::string::npos) << view.status();
}

}  // namespace
}  // namespace bitsplit::shm
