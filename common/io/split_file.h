#pragma once
// The split-model container: one file for the base (draft) weights and one for the residuals,
// written by `bitsplit quantize` and memory-mapped by the services. Byte layout:
// docs/formats.md, "Split container".
//
//   header   magic "BSPLIT\0\0", u32 version, u32 kind, 32-byte fingerprint,
//            u64 metadata length + metadata (UTF-8 JSON object),
//            u64 tensor count + tensor entries, zero padding to a multiple of 64
//   data     every tensor at a multiple of 64 from the data start, packed in entry order
//
// The reader validates everything before exposing anything (magic, version, kind, lengths and
// counts against the file size, names, dimensions, byte sizes against the tensor's format,
// alignment, order, overlap, bounds, trailing bytes, metadata JSON), so no accessor ever points
// outside the image and every error names the file. The io layer knows ggml block sizes but not
// the split formats (those live in the quant layer): a caller-supplied RowSizeOracle gives the
// row byte size of a split-format tensor.
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/io/ggml_type.h"
#include "common/io/mapped_file.h"
#include "nlohmann/json.hpp"

namespace bitsplit {

inline constexpr char kSplitFileMagic[8] = {'B', 'S', 'P', 'L', 'I', 'T', '\0', '\0'};
inline constexpr uint32_t kSplitFileVersion = 1;
// Of the data start (in the file) and of every tensor's offset (from the data start). 64 is a
// cache line and the widest vector load, and keeps mmapped rows aligned for the kernels.
inline constexpr uint64_t kSplitFileAlignment = 64;
inline constexpr uint32_t kSplitFileMaxDims = 4;
// Limits that bound what a hostile file can make the reader allocate. A tokenizer of 262k tokens
// with merges is ~10 MB of JSON; names are like "blk.79.ffn_down.weight".
inline constexpr uint64_t kSplitFileMaxMetadataBytes = uint64_t{256} << 20;
inline constexpr int kSplitFileMaxMetadataDepth = 64;  // nesting of JSON arrays/objects
inline constexpr uint32_t kSplitFileMaxTensorNameBytes = 256;

enum class SplitFileKind : uint32_t {
  kBase = 1,      // base weights, norms, embeddings, config, tokenizer: the draft model
  kResidual = 2,  // the residual of every linear weight
};
std::string_view SplitFileKindName(SplitFileKind kind);  // "base" / "residual"

// Identifies one quantize run; base and residual files of the same run carry the same bytes.
// Opaque: the writer chooses them (e.g. a hash of the source model and the quantizer knobs).
using SplitFingerprint = std::array<uint8_t, 32>;
std::string SplitFingerprintToHex(const SplitFingerprint& fingerprint);  // 64 lowercase digits
absl::StatusOr<SplitFingerprint> SplitFingerprintFromHex(std::string_view hex);

// The fixed-size start of every split file. The writer copies it out as is; the reader reads it
// field by field (to name the field in errors).
struct SplitFileHeader {
  char magic[8];            // kSplitFileMagic
  uint32_t version;         // kSplitFileVersion
  uint32_t kind;            // SplitFileKind
  uint8_t fingerprint[32];  // SplitFingerprint
  uint64_t metadata_bytes;  // length of the JSON text that follows
};
static_assert(sizeof(SplitFileHeader) == 56);
static_assert(offsetof(SplitFileHeader, version) == 8 && offsetof(SplitFileHeader, kind) == 12 &&
              offsetof(SplitFileHeader, fingerprint) == 16 &&
              offsetof(SplitFileHeader, metadata_bytes) == 48);

// ---- Tensor formats ---------------------------------------------------------------------------
// A tensor entry's u32 `format` has two namespaces, so that source-precision tensors copied from
// the GGUF (norms, embeddings) and our own split formats live side by side:
//   0x00000 .. 0x0FFFF  a ggml type id (GgmlType); group_size must be 0 (ggml blocks are fixed)
//   0x10000 .. 0x1FFFF  split format id (format - 0x10000), i.e. quant::SplitFormat, with the
//                       group_size it was quantized with
// Anything else is rejected.
inline constexpr uint32_t kSplitFormatNamespace = uint32_t{1} << 16;
inline constexpr uint32_t kMaxSplitFormatId = kSplitFormatNamespace - 1;

constexpr uint32_t GgmlTensorFormat(GgmlType type) { return static_cast<uint32_t>(type); }
// `split_format_id` must be at most kMaxSplitFormatId.
constexpr uint32_t SplitTensorFormat(uint32_t split_format_id) {
  return kSplitFormatNamespace | split_format_id;
}
constexpr bool IsGgmlTensorFormat(uint32_t format) { return format < kSplitFormatNamespace; }
constexpr bool IsSplitTensorFormat(uint32_t format) {
  return (format & ~kMaxSplitFormatId) == kSplitFormatNamespace;
}
constexpr uint32_t SplitFormatIdOf(uint32_t format) { return format & kMaxSplitFormatId; }
// For messages: "Q4_1" for ggml types, "split format 6" for split formats.
std::string TensorFormatName(uint32_t format);

// Bytes of one row (`cols` elements) of split format `split_format_id` (namespace removed)
// quantized with `group_size`. Returns INVALID_ARGUMENT for an unknown id or a group/cols
// combination the format does not allow; the reader adds file and tensor to the message. The
// quant layer provides it, e.g.
//   [](uint32_t id, uint32_t group, int64_t cols) -> absl::StatusOr<uint64_t> {
//     if (id >= quant::kNumSplitFormats) return absl::InvalidArgumentError("unknown format");
//     auto format = static_cast<quant::SplitFormat>(id);
//     BITSPLIT_RETURN_IF_ERROR(quant::ValidateSplitLayout(format, group, cols));
//     return quant::SplitRowBytes(format, group, cols);
//   }
using RowSizeOracle = std::function<absl::StatusOr<uint64_t>(uint32_t split_format_id,
                                                             uint32_t group_size, int64_t cols)>;

// Row and total byte size of a tensor, validated exactly as the reader does (the writer uses it
// too, so it cannot write what the reader refuses). `oracle` may be empty when `format` is a
// ggml type. The error detail names the problem, not the file or tensor.
struct SplitTensorSize {
  uint64_t row_bytes;
  uint64_t num_bytes;
  int64_t num_elements;
};
absl::StatusOr<SplitTensorSize> ComputeSplitTensorSize(uint32_t format, uint32_t group_size,
                                                       const std::vector<int64_t>& dims,
                                                       const RowSizeOracle& oracle);

// ---- Reader -----------------------------------------------------------------------------------
struct SplitTensor {
  std::string name;
  uint32_t format;            // see "Tensor formats" above
  uint32_t group_size;        // 0 for ggml formats
  std::vector<int64_t> dims;  // dims[0] is the innermost dimension (columns); 1 to 4 of them
  int64_t num_elements;
  uint64_t row_bytes;   // bytes of one row of dims[0] elements
  uint64_t offset;      // relative to the data start; a multiple of kSplitFileAlignment
  uint64_t num_bytes;   // rows * row_bytes
  const uint8_t* data;  // into the image; 64-byte aligned when the image is (mmap: it is)

  int64_t cols() const { return dims[0]; }
  int64_t rows() const { return num_elements / dims[0]; }
};

class SplitFile {
 public:
  // Maps `path` and validates it. `expected_kind`: FAILED_PRECONDITION when the file is of the
  // other kind (nullopt accepts either). `row_size_oracle` is needed only when the file holds
  // split-format tensors (FAILED_PRECONDITION otherwise). A malformed file is INVALID_ARGUMENT
  // (RESOURCE_EXHAUSTED past a reader limit); every message starts with the path.
  static absl::StatusOr<std::unique_ptr<SplitFile>> Open(const std::string& path,
                                                         std::optional<SplitFileKind> expected_kind,
                                                         RowSizeOracle row_size_oracle);
  // Validates an image the caller keeps alive (tests use synthetic bytes). `name` stands for the
  // path in messages.
  static absl::StatusOr<std::unique_ptr<SplitFile>> Parse(
      const uint8_t* data, size_t size, std::string name,
      std::optional<SplitFileKind> expected_kind, RowSizeOracle row_size_oracle);

  const std::string& name() const { return name_; }
  uint32_t version() const { return version_; }
  SplitFileKind kind() const { return kind_; }
  const SplitFingerprint& fingerprint() const { return fingerprint_; }
  std::string fingerprint_hex() const { return SplitFingerprintToHex(fingerprint_); }

  // The parsed metadata (always a JSON object) and its text as stored.
  const nlohmann::json& metadata() const { return metadata_; }
  std::string_view metadata_text() const { return metadata_text_; }

  const uint8_t* image_data() const { return image_data_; }
  size_t image_size() const { return image_size_; }
  uint64_t data_offset() const { return data_offset_; }  // absolute start of tensor data

  const std::vector<SplitTensor>& tensors() const { return tensors_; }
  const SplitTensor* FindTensor(std::string_view name) const;
  // FindTensor that reports absence as NOT_FOUND naming the file.
  absl::StatusOr<const SplitTensor*> GetTensor(std::string_view name) const;

 private:
  class Parser;
  SplitFile() = default;

  std::unique_ptr<MappedFile> mapping_;  // null when parsed from caller-owned memory
  const uint8_t* image_data_ = nullptr;
  size_t image_size_ = 0;
  std::string name_;
  uint32_t version_ = 0;
  SplitFileKind kind_ = SplitFileKind::kBase;
  SplitFingerprint fingerprint_{};
  nlohmann::json metadata_;
  std::string_view metadata_text_;
  uint64_t data_offset_ = 0;
  std::vector<SplitTensor> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;  // names are unique
};

// OK when `base` is a base file, `residual` a residual file and both carry the same
// fingerprint; FAILED_PRECONDITION naming both files (and both fingerprints in hex) otherwise.
absl::Status CheckSplitPair(const SplitFile& base, const SplitFile& residual);

// ---- Writer -----------------------------------------------------------------------------------
// Streams a split file to `path`.tmp and renames it to `path` on Finish, so `path` is either
// absent, the previous file, or complete. Usage:
//
//   auto writer = SplitFileWriter::Create(path, SplitFileKind::kResidual, fingerprint,
//                                         metadata, oracle);
//   for (each tensor) (*writer)->DeclareTensor(name, format, group, dims);   // sizes known now
//   for (each tensor, any order) (*writer)->WriteTensorData(name, bytes, n);  // in chunks
//   (*writer)->Finish();
//
// Declarations fix the header (metadata included) and every tensor's offset; the first
// WriteTensorData writes the header and reserves the whole file (so a full disk is reported
// before hours of quantization, where the filesystem allows), after which declarations are
// refused. Each tensor's bytes arrive in order, in as many chunks as convenient, but tensors may
// be written in any order, so a 70B model never has to be in memory. Not thread-safe. Destroying
// an unfinished writer removes `path`.tmp.
class SplitFileWriter {
 public:
  // Creates `path`.tmp. `metadata` must be a JSON object whose strings are valid UTF-8 (encode
  // raw byte strings, e.g. some tokenizer tokens, before putting them in); it is stored as
  // compact text. `row_size_oracle` may be empty if no split-format tensor is declared.
  static absl::StatusOr<std::unique_ptr<SplitFileWriter>> Create(
      std::string path, SplitFileKind kind, const SplitFingerprint& fingerprint,
      const nlohmann::json& metadata, RowSizeOracle row_size_oracle);
  ~SplitFileWriter();
  SplitFileWriter(const SplitFileWriter&) = delete;
  SplitFileWriter& operator=(const SplitFileWriter&) = delete;

  // Declares the next tensor (entries keep declaration order) and returns the number of bytes
  // its data must have. INVALID_ARGUMENT for a name or shape the reader would refuse,
  // FAILED_PRECONDITION once data writing has begun.
  absl::StatusOr<uint64_t> DeclareTensor(std::string name, uint32_t format, uint32_t group_size,
                                         std::vector<int64_t> dims);
  // Appends `size` bytes to tensor `name`'s data. NOT_FOUND for an undeclared name,
  // INVALID_ARGUMENT when the bytes would run past the declared size.
  absl::Status WriteTensorData(std::string_view name, const void* data, size_t size);
  // Checks that every tensor is complete, flushes to disk and renames `path`.tmp to `path`.
  absl::Status Finish();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }

 private:
  struct PendingTensor {
    std::string name;
    uint32_t format;
    uint32_t group_size;
    std::vector<int64_t> dims;
    uint64_t num_bytes;
    uint64_t offset = 0;   // relative to the data start; set when the layout is fixed
    uint64_t written = 0;  // bytes received so far
  };

  SplitFileWriter() = default;
  // Lays out the header and the data, writes the header and reserves the file. Idempotent.
  absl::Status FixLayout();
  absl::Status PositionedWrite(uint64_t at, const void* data, size_t size);
  absl::Status Error(absl::StatusCode code, std::string_view detail) const;

  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  SplitFileKind kind_ = SplitFileKind::kBase;
  SplitFingerprint fingerprint_{};
  std::string metadata_text_;
  RowSizeOracle row_size_oracle_;
  std::vector<PendingTensor> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
  bool layout_fixed_ = false;
  bool finished_ = false;
  uint64_t data_offset_ = 0;
  uint64_t file_size_ = 0;
  absl::Status write_failure_;  // sticky: after a failed write the file is not trustworthy
};

}  // namespace bitsplit
