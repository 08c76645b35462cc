// Bytes -> SplitFile::Parse with the quant layer's row sizes -> every tensor view -> the metadata
// JSON -> the embedded GGUF metadata with its config: what SplitModelFiles::Open reads of a split
// file before the first forward pass. (The model layer's own oracle and record parser live in
// split_model.cc, which links the int8 kernels this clang build leaves out; the oracle below is
// the same code.)
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "common/io/gguf.h"
#include "common/io/split_file.h"
#include "common/model/config.h"
#include "common/quant/split_format.h"
#include "common/util/status_macros.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using namespace bitsplit;

constexpr char kGgufMetadataTensor[] = "gguf.metadata";  // model/split_model.h

absl::StatusOr<uint64_t> RowBytes(uint32_t id, uint32_t group, int64_t cols) {
  if (id >= static_cast<uint32_t>(quant::kNumSplitFormats)) {
    return absl::InvalidArgumentError("unknown split format id");
  }
  if (group > (uint32_t{1} << 20)) return absl::InvalidArgumentError("group out of range");
  const auto format = static_cast<quant::SplitFormat>(id);
  BITSPLIT_RETURN_IF_ERROR(quant::ValidateSplitLayout(format, static_cast<int>(group), cols));
  return quant::SplitRowBytes(format, static_cast<int>(group), cols);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const RowSizeOracle oracle = RowBytes;
  auto file = SplitFile::Parse(data, size, "fuzz.bsplit", std::nullopt, oracle);
  if (!file.ok()) return 0;
  const SplitFile& f = **file;
  for (const SplitTensor& tensor : f.tensors()) {
    fuzz::Touch(tensor.data, tensor.num_bytes);
    if (tensor.rows() * static_cast<int64_t>(tensor.row_bytes) !=
        static_cast<int64_t>(tensor.num_bytes)) {
      __builtin_trap();  // the reader promised num_bytes = rows * row_bytes
    }
  }
  (void)f.metadata().dump();
  const SplitTensor* image = f.FindTensor(kGgufMetadataTensor);
  if (image != nullptr) {
    auto metadata = gguf::File::Parse(image->data, image->num_bytes, "fuzz.bsplit:metadata");
    const SplitTensor* embedding = f.FindTensor("token_embd.weight");
    if (metadata.ok() && embedding != nullptr && embedding->dims.size() == 2) {
      (void)model::ModelConfigFromGgufMetadata(**metadata, embedding->dims[1]);
    }
  }
  return 0;
}
