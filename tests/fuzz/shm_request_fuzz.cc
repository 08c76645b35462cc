// Bytes -> the residual channel's layout, header check and request decoding (common/io/
// shm_channel.h): what the cpu-residual service derives from a client's request in shared memory
// before its kernels read the activations and write the outputs. Every view a decoded request
// hands out is touched inside a heap copy of the segment, so ASan flags one that leaves it.
//
// Input: one mode byte, then
//   mode even: u32 max_rows, u32 max_cols, u32 max_outputs (the service's capacities), u32
//              channel max_rows, then requests of 20 bytes (seq, layer, group, rows, cols);
//   mode odd:  a raw 128-byte header, u32 segment size (cut to 1 MiB), then requests as above.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "common/io/shm_channel.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using namespace bitsplit;
using namespace bitsplit::shm;

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  template <typename T>
  bool Take(T* out) {
    if (size_ - offset_ < sizeof(T)) return false;
    std::memcpy(out, data_ + offset_, sizeof(T));
    offset_ += sizeof(T);
    return true;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t offset_ = 0;
};

// ComputeShmLayout's promise: the areas follow one another without overlap, each as large as its
// capacity, and the segment (at most 4 GiB) holds them all.
void CheckLayout(const ShmLayout& l) {
  const uint64_t rows = l.max_rows;
  const bool ok =
      l.codes_offset >= kShmHeaderBytes && l.scales_offset >= l.codes_offset + rows * l.max_cols &&
      l.sums_offset >= l.scales_offset + rows * l.max_block_stride * 4 &&
      l.outputs_offset >= l.sums_offset + rows * l.max_block_stride * 4 &&
      l.segment_bytes >= l.outputs_offset + rows * l.max_outputs * 4 &&
      l.segment_bytes <= (uint64_t{4} << 30) && l.max_block_stride == BlockStride(l.max_cols);
  if (!ok) __builtin_trap();
}

void DecodeAll(Input& input, const ShmHeader& header, uint64_t segment_bytes,
               uint32_t channel_max_rows) {
  // Exactly the segment's size, so that a view one byte past it is a heap overflow. Left
  // uninitialized: zeroing up to 16 MiB per input made this target 10x slower than the others,
  // and only the views' bounds are checked, never their contents.
  std::unique_ptr<uint8_t[]> segment(new uint8_t[segment_bytes]);
  for (int i = 0; i < 16; ++i) {
    ShmRequestCopy request;
    if (!input.Take(&request.seq) || !input.Take(&request.layer) || !input.Take(&request.group) ||
        !input.Take(&request.rows) || !input.Take(&request.cols)) {
      return;
    }
    auto view = DecodeRequest(header, segment.get(), segment_bytes, request, channel_max_rows);
    if (!view.ok()) continue;
    if (view->rows < 1 || view->rows > channel_max_rows || view->cols % 32 != 0 ||
        view->block_stride != BlockStride(view->cols)) {
      __builtin_trap();
    }
    const uint64_t rows = view->rows;
    fuzz::Touch(view->codes, rows * view->cols);
    fuzz::Touch(view->scales, rows * view->block_stride * sizeof(float));
    fuzz::Touch(view->sums, rows * view->block_stride * sizeof(float));
    fuzz::Touch(view->outputs, view->output_capacity * sizeof(float));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input input(data, size);
  uint8_t mode = 0;
  if (!input.Take(&mode)) return 0;
  if (mode % 2 == 0) {
    uint32_t max_rows = 0, max_cols = 0, max_outputs = 0, channel_max_rows = 0;
    if (!input.Take(&max_rows) || !input.Take(&max_cols) || !input.Take(&max_outputs) ||
        !input.Take(&channel_max_rows)) {
      return 0;
    }
    auto layout = ComputeShmLayout(max_rows, max_cols, max_outputs);
    if (!layout.ok()) return 0;
    CheckLayout(*layout);
    const ShmHeader header = HeaderForLayout(*layout);
    if (!CheckShmHeader(header, layout->segment_bytes).ok()) __builtin_trap();
    if (layout->segment_bytes > (uint64_t{16} << 20)) return 0;  // fuzzing speed, not a limit
    DecodeAll(input, header, layout->segment_bytes, channel_max_rows);
    return 0;
  }
  ShmHeader header;
  uint32_t segment_bytes = 0;
  if (!input.Take(&header) || !input.Take(&segment_bytes)) return 0;
  segment_bytes %= uint32_t{1} << 20;
  (void)CheckShmHeader(header, segment_bytes);
  // Decoding must stay inside the segment whatever the header claims.
  DecodeAll(input, header, segment_bytes, header.max_rows);
  return 0;
}
