#pragma once
// GGUF v2/v3 reader. Parses metadata and tensor infos from an in-memory image (normally a
// MappedFile) and validates everything before exposing it: no accessor ever points outside the
// image. Tensor data is not copied; TensorInfo::data points into the image.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "common/io/ggml_type.h"
#include "common/io/mapped_file.h"

namespace bitsplit::gguf {

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
  uint64_t offset;            // relative to the start of the tensor data section
  int64_t num_elements;
  uint64_t num_bytes;
  const uint8_t* data;        // points into the file image
};

class File {
 public:
  // Maps `path` and parses it. Every error message names the path and what is wrong.
  static absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path);
  // Parses an image the caller keeps alive (used by tests with synthetic bytes).
  static absl::StatusOr<std::unique_ptr<File>> Parse(const uint8_t* data, size_t size,
                                                     std::string name = "<memory>");

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  const std::string& name() const { return name_; }

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
  File() = default;
  std::unique_ptr<MappedFile> mapping_;  // null when parsed from caller-owned memory
  std::string name_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<MetadataEntry> metadata_;
  std::vector<TensorInfo> tensors_;
};

}  // namespace bitsplit::gguf
