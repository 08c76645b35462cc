#pragma once
// GGUF v2/v3 reader. Parses metadata and tensor infos from an in-memory image (normally a
// MappedFile) and validates everything before exposing it: no accessor ever points outside the
// image. Tensor data is not copied; TensorInfo::data points into the image.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/io/ggml_type.h"
#include "common/io/mapped_file.h"

namespace bitsplit::gguf {

// Limits of the reader. They bound what a hostile file can make it allocate; real models stay
// far below them (the largest vocabularies have ~262k tokens, i.e. ~800k array elements for
// tokens + scores + token types, plus merges).
inline constexpr uint32_t kMinSupportedVersion = 2;
inline constexpr uint32_t kMaxSupportedVersion = 3;
inline constexpr uint64_t kDefaultAlignment = 32;
inline constexpr uint32_t kMaxDims = 4;
// An array nested in an array is depth 2. llama.cpp rejects nested arrays outright; we accept
// a few levels so that no valid-by-spec file is refused, but no more (recursion is bounded).
inline constexpr int kMaxArrayNestingDepth = 4;
// Total elements over all metadata arrays of one file. Each element becomes a Value (~48
// bytes), so this caps metadata memory at a few hundred MB whatever the file claims.
inline constexpr uint64_t kMaxTotalArrayElements = uint64_t{1} << 23;

enum class ValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
std::string_view ValueTypeName(ValueType type);

struct Value;
struct Array {
  ValueType element_type;
  std::vector<Value> elements;
};

// One metadata value. Integers keep their signedness; floats are widened to double.
struct Value {
  ValueType type;
  std::variant<uint64_t, int64_t, double, bool, std::string, Array> data;
};

struct MetadataEntry {
  std::string key;
  Value value;
};

struct TensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // ggml order: dims[0] is the contiguous (innermost) dimension
  GgmlType type;
  uint64_t offset;  // relative to the start of the tensor data section
  int64_t num_elements;
  uint64_t num_bytes;
  const uint8_t* data;  // points into the file image; null when absent (TensorData)
};

// Whether tensor data must be in the file. kMayBeAbsent reads the metadata and tensor table of a
// file whose data section is cut off (a shapes-only GGUF, for planning): every other check
// stands, and a tensor whose data lies past the end of the file gets data == nullptr.
enum class TensorData { kRequired, kMayBeAbsent };

class File {
 public:
  // Maps `path` and parses it. Every error message names the path and what is wrong.
  static absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path,
                                                    TensorData tensor_data = TensorData::kRequired);
  // Parses an image the caller keeps alive (used by tests with synthetic bytes).
  static absl::StatusOr<std::unique_ptr<File>> Parse(
      const uint8_t* data, size_t size, std::string name = "<memory>",
      TensorData tensor_data = TensorData::kRequired);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // absolute start of tensor data
  // Absolute offset just past the last metadata entry, where the tensor infos begin. Bytes
  // [0, metadata_end_offset()) with the tensor count patched to 0 are a valid tensor-less GGUF
  // image holding the same metadata (split models embed one to carry config and tokenizer).
  uint64_t metadata_end_offset() const { return metadata_end_offset_; }
  const std::string& name() const { return name_; }
  // The whole image (the mapped file, or the caller's bytes).
  const uint8_t* image_data() const { return image_data_; }
  size_t image_size() const { return image_size_; }

  const std::vector<MetadataEntry>& metadata() const { return metadata_; }
  const Value* Find(std::string_view key) const;

  // Typed getters: NOT_FOUND when absent, INVALID_ARGUMENT on a type mismatch. Integer getters
  // accept any integer type whose value fits.
  absl::StatusOr<std::string> GetString(std::string_view key) const;
  absl::StatusOr<uint64_t> GetUint(std::string_view key) const;
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;
  absl::StatusOr<double> GetFloat(std::string_view key) const;  // any float or integer type
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<std::vector<std::string>> GetStringArray(std::string_view key) const;
  absl::StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;
  absl::StatusOr<std::vector<double>> GetFloatArray(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* FindTensor(std::string_view name) const;

 private:
  class Parser;
  File() = default;
  // Status with `detail` prefixed by the file name, as every message of this class is.
  absl::Status Error(absl::StatusCode code, absl::string_view detail) const;
  // Find() that reports absence as NOT_FOUND.
  absl::StatusOr<const Value*> FindOrError(std::string_view key) const;

  std::unique_ptr<MappedFile> mapping_;  // null when parsed from caller-owned memory
  const uint8_t* image_data_ = nullptr;
  size_t image_size_ = 0;
  std::string name_;
  uint32_t version_ = 0;
  uint64_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  uint64_t metadata_end_offset_ = 0;
  std::vector<MetadataEntry> metadata_;
  std::vector<TensorInfo> tensors_;
  // Name -> index lookups (the names are unique; the parser rejects duplicates).
  std::unordered_map<std::string, size_t> metadata_index_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

}  // namespace bitsplit::gguf
