#include "common/io/gguf.h"

#include <bit>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/io/byte_reader.h"
#include "common/util/status_macros.h"

namespace bitsplit::gguf {

namespace {

using io::CheckedAdd;
using io::CheckedMul;
using io::Quote;
using io::ToAbsl;
using io::WithContext;

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
// Smallest possible encodings, used to reject counts that the remaining bytes cannot hold
// before anything is allocated for them.
constexpr uint64_t kMinMetadataEntryBytes = 8 + 4 + 1;   // empty key, type, one-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;  // empty name, n_dims=0, type, offset

absl::string_view TypeName(ValueType type) { return ToAbsl(ValueTypeName(type)); }

bool IsKnownValueType(uint32_t type_id) {
  return type_id <= static_cast<uint32_t>(ValueType::kFloat64);
}

// Encoded size of a scalar type, 0 for string/array (variable).
uint64_t FixedValueSize(ValueType type) {
  switch (type) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kBool:
      return 1;
    case ValueType::kUint16:
    case ValueType::kInt16:
      return 2;
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kFloat32:
      return 4;
    case ValueType::kUint64:
    case ValueType::kInt64:
    case ValueType::kFloat64:
      return 8;
    case ValueType::kString:
    case ValueType::kArray:
      return 0;
  }
  return 0;
}

// Fewest bytes one element of `type` can take: what an array count is checked against.
uint64_t MinEncodedSize(ValueType type) {
  if (type == ValueType::kString) return 8;  // length, empty body
  if (type == ValueType::kArray) return 12;  // element type, count 0
  return FixedValueSize(type);
}

bool IsUnsignedInteger(ValueType type) {
  return type == ValueType::kUint8 || type == ValueType::kUint16 || type == ValueType::kUint32 ||
         type == ValueType::kUint64;
}
bool IsSignedInteger(ValueType type) {
  return type == ValueType::kInt8 || type == ValueType::kInt16 || type == ValueType::kInt32 ||
         type == ValueType::kInt64;
}
bool IsFloat(ValueType type) { return type == ValueType::kFloat32 || type == ValueType::kFloat64; }

// Conversions of one value for the typed getters; the error detail names the problem only,
// the caller adds file and key.
absl::StatusOr<uint64_t> ValueAsUint(const Value& value) {
  if (IsUnsignedInteger(value.type)) return std::get<uint64_t>(value.data);
  if (IsSignedInteger(value.type)) {
    int64_t signed_value = std::get<int64_t>(value.data);
    if (signed_value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("value ", signed_value, " is negative, expected an unsigned integer"));
    }
    return static_cast<uint64_t>(signed_value);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("has type ", TypeName(value.type), ", expected an integer"));
}

absl::StatusOr<int64_t> ValueAsInt(const Value& value) {
  if (IsSignedInteger(value.type)) return std::get<int64_t>(value.data);
  if (IsUnsignedInteger(value.type)) {
    uint64_t unsigned_value = std::get<uint64_t>(value.data);
    if (unsigned_value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat("value ", unsigned_value, " does not fit in int64"));
    }
    return static_cast<int64_t>(unsigned_value);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("has type ", TypeName(value.type), ", expected an integer"));
}

absl::StatusOr<double> ValueAsFloat(const Value& value) {
  if (IsFloat(value.type)) return std::get<double>(value.data);
  if (IsUnsignedInteger(value.type)) return static_cast<double>(std::get<uint64_t>(value.data));
  if (IsSignedInteger(value.type)) return static_cast<double>(std::get<int64_t>(value.data));
  return absl::InvalidArgumentError(
      absl::StrCat("has type ", TypeName(value.type), ", expected a number"));
}

}  // namespace

std::string_view ValueTypeName(ValueType type) {
  switch (type) {
    case ValueType::kUint8:
      return "UINT8";
    case ValueType::kInt8:
      return "INT8";
    case ValueType::kUint16:
      return "UINT16";
    case ValueType::kInt16:
      return "INT16";
    case ValueType::kUint32:
      return "UINT32";
    case ValueType::kInt32:
      return "INT32";
    case ValueType::kFloat32:
      return "FLOAT32";
    case ValueType::kBool:
      return "BOOL";
    case ValueType::kString:
      return "STRING";
    case ValueType::kArray:
      return "ARRAY";
    case ValueType::kUint64:
      return "UINT64";
    case ValueType::kInt64:
      return "INT64";
    case ValueType::kFloat64:
      return "FLOAT64";
  }
  return "UNKNOWN";
}

// Reads the image front to back with a bounds check before every access. Its error details
// say what is wrong and where; File::Parse prefixes the file name.
class File::Parser {
 public:
  Parser(const uint8_t* data, size_t size, File* file, TensorData tensor_data)
      : reader_(data, size), file_(file), tensor_data_(tensor_data) {}

  absl::Status Run() {
    BITSPLIT_RETURN_IF_ERROR(ParseHeader());
    BITSPLIT_RETURN_IF_ERROR(ParseMetadata());
    file_->metadata_end_offset_ = offset();
    BITSPLIT_RETURN_IF_ERROR(ParseAlignment());
    BITSPLIT_RETURN_IF_ERROR(ParseTensorInfos());
    return PlaceTensorData();
  }

 private:
  uint64_t remaining() const { return reader_.remaining(); }
  uint64_t offset() const { return reader_.offset(); }
  size_t size() const { return reader_.size(); }

  template <typename T>
  absl::Status Read(T* out, absl::string_view what, absl::string_view what_suffix = {}) {
    return reader_.Read(out, what, what_suffix);
  }
  absl::Status ReadString(std::string* out, absl::string_view what) {
    return reader_.ReadString<uint64_t>(out, what);
  }

  absl::Status ParseHeader() {
    uint32_t magic = 0;
    BITSPLIT_RETURN_IF_ERROR(Read(&magic, "magic"));
    if (magic != kMagic) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bad magic ", Quote(std::string_view(reinterpret_cast<const char*>(reader_.data()), 4)),
          ", expected 'GGUF': not a GGUF file"));
    }
    uint32_t version = 0;
    BITSPLIT_RETURN_IF_ERROR(Read(&version, "version"));
    if (version == 1) {
      return absl::InvalidArgumentError(
          "GGUF version 1 is not supported (it uses 32-bit counts and lengths); convert the file "
          "with a current llama.cpp");
    }
    if (version < kMinSupportedVersion || version > kMaxSupportedVersion) {
      uint32_t swapped = __builtin_bswap32(version);
      if (swapped >= 1 && swapped <= kMaxSupportedVersion) {
        return absl::InvalidArgumentError(
            absl::StrCat("version field reads ", version, " (", swapped,
                         " byte-swapped): a big-endian GGUF file, only little-endian files are "
                         "supported"));
      }
      return absl::InvalidArgumentError(absl::StrCat("unsupported GGUF version ", version,
                                                     " (supported: ", kMinSupportedVersion, " to ",
                                                     kMaxSupportedVersion, ")"));
    }
    file_->version_ = version;

    // Versions 2 and 3 both use 64-bit counts; they differ only in byte-order support.
    BITSPLIT_RETURN_IF_ERROR(Read(&tensor_count_, "tensor count"));
    BITSPLIT_RETURN_IF_ERROR(Read(&metadata_count_, "metadata count"));
    // Each count is checked against what the rest of the file could hold before anything is
    // reserved for it, so a forged count cannot trigger a huge allocation.
    if (metadata_count_ > remaining() / kMinMetadataEntryBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metadata count ", metadata_count_, " is impossible: the remaining ", remaining(),
          " bytes hold at most ", remaining() / kMinMetadataEntryBytes, " entries"));
    }
    if (tensor_count_ > remaining() / kMinTensorInfoBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor count ", tensor_count_, " is impossible: the remaining ", remaining(),
          " bytes hold at most ", remaining() / kMinTensorInfoBytes, " tensor infos"));
    }
    return absl::OkStatus();
  }

  absl::Status ParseMetadata() {
    file_->metadata_.reserve(metadata_count_);
    for (uint64_t i = 0; i < metadata_count_; ++i) {
      const std::string entry = absl::StrCat("metadata entry ", i, " of ", metadata_count_);
      MetadataEntry parsed;
      BITSPLIT_RETURN_IF_ERROR(WithContext(ReadString(&parsed.key, "key"), entry));
      const std::string where = absl::StrCat(entry, " (key ", Quote(parsed.key), ")");
      auto [it, inserted] = file_->metadata_index_.emplace(parsed.key, i);
      if (!inserted) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": duplicate key, first defined by metadata entry ", it->second));
      }
      uint32_t type_id = 0;
      BITSPLIT_RETURN_IF_ERROR(WithContext(Read(&type_id, "value type"), where));
      if (!IsKnownValueType(type_id)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": unknown metadata value type ", type_id));
      }
      absl::Status status = ParseValue(static_cast<ValueType>(type_id), 0, &parsed.value);
      if (!status.ok()) return WithContext(status, where);
      file_->metadata_.push_back(std::move(parsed));
    }
    return absl::OkStatus();
  }

  // `depth` is the number of arrays enclosing this value.
  absl::Status ParseValue(ValueType type, int depth, Value* out) {
    out->type = type;
    switch (type) {
      case ValueType::kUint8:
        return ReadAs<uint8_t, uint64_t>(out);
      case ValueType::kUint16:
        return ReadAs<uint16_t, uint64_t>(out);
      case ValueType::kUint32:
        return ReadAs<uint32_t, uint64_t>(out);
      case ValueType::kUint64:
        return ReadAs<uint64_t, uint64_t>(out);
      case ValueType::kInt8:
        return ReadAs<int8_t, int64_t>(out);
      case ValueType::kInt16:
        return ReadAs<int16_t, int64_t>(out);
      case ValueType::kInt32:
        return ReadAs<int32_t, int64_t>(out);
      case ValueType::kInt64:
        return ReadAs<int64_t, int64_t>(out);
      case ValueType::kFloat32:
        return ReadAs<float, double>(out);
      case ValueType::kFloat64:
        return ReadAs<double, double>(out);
      case ValueType::kBool: {
        uint8_t byte = 0;
        BITSPLIT_RETURN_IF_ERROR(Read(&byte, "BOOL value"));
        if (byte > 1) {
          return absl::InvalidArgumentError(absl::StrCat("BOOL value at offset ", offset() - 1,
                                                         " is ", byte, ", expected 0 or 1"));
        }
        out->data = byte == 1;
        return absl::OkStatus();
      }
      case ValueType::kString: {
        std::string text;
        BITSPLIT_RETURN_IF_ERROR(ReadString(&text, "string"));
        out->data = std::move(text);
        return absl::OkStatus();
      }
      case ValueType::kArray:
        return ParseArray(depth, out);
    }
    return absl::InternalError("unreachable value type");  // types are checked by the callers
  }

  template <typename Encoded, typename Stored>
  absl::Status ReadAs(Value* out) {
    Encoded value{};
    BITSPLIT_RETURN_IF_ERROR(Read(&value, TypeName(out->type), " value"));
    out->data = static_cast<Stored>(value);
    return absl::OkStatus();
  }

  absl::Status ParseArray(int depth, Value* out) {
    if (depth + 1 > kMaxArrayNestingDepth) {
      return absl::InvalidArgumentError(absl::StrCat(
          "arrays nested deeper than ", kMaxArrayNestingDepth, " levels are not supported"));
    }
    uint32_t element_type_id = 0;
    BITSPLIT_RETURN_IF_ERROR(Read(&element_type_id, "array element type"));
    if (!IsKnownValueType(element_type_id)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown array element type ", element_type_id,
                                                     " at offset ", offset() - 4));
    }
    const auto element_type = static_cast<ValueType>(element_type_id);
    uint64_t count = 0;
    BITSPLIT_RETURN_IF_ERROR(Read(&count, "array count"));
    const uint64_t min_element_bytes = MinEncodedSize(element_type);
    if (count > remaining() / min_element_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "array of ", count, " ", TypeName(element_type), " elements at offset ", offset() - 12,
          " needs at least ", min_element_bytes, " bytes per element but only ", remaining(),
          " bytes remain (file size ", size(), ")"));
    }
    total_array_elements_ += count;  // cannot overflow: count <= file size at each step
    if (total_array_elements_ > kMaxTotalArrayElements) {
      return absl::ResourceExhaustedError(
          absl::StrCat("metadata arrays hold more than ", kMaxTotalArrayElements,
                       " elements in total (the reader's limit); this array adds ", count));
    }
    Array array;
    array.element_type = element_type;
    array.elements.resize(count);
    for (uint64_t i = 0; i < count; ++i) {
      absl::Status status = ParseValue(element_type, depth + 1, &array.elements[i]);
      if (!status.ok()) {
        return WithContext(status, absl::StrCat("array element ", i, " of ", count));
      }
    }
    out->data = std::move(array);
    return absl::OkStatus();
  }

  absl::Status ParseAlignment() {
    const Value* value = file_->Find("general.alignment");
    if (value == nullptr) return absl::OkStatus();
    if (value->type != ValueType::kUint32) {
      return absl::InvalidArgumentError(
          absl::StrCat("general.alignment has type ", TypeName(value->type), ", expected UINT32"));
    }
    uint64_t alignment = std::get<uint64_t>(value->data);
    if (alignment == 0 || !std::has_single_bit(alignment)) {
      return absl::InvalidArgumentError(
          absl::StrCat("general.alignment is ", alignment, ", expected a nonzero power of two"));
    }
    file_->alignment_ = alignment;
    return absl::OkStatus();
  }

  absl::Status ParseTensorInfos() {
    file_->tensors_.reserve(tensor_count_);
    for (uint64_t i = 0; i < tensor_count_; ++i) {
      const std::string entry = absl::StrCat("tensor info ", i, " of ", tensor_count_);
      TensorInfo tensor;
      BITSPLIT_RETURN_IF_ERROR(WithContext(ReadString(&tensor.name, "name"), entry));
      const std::string where = absl::StrCat(entry, " (tensor ", Quote(tensor.name), ")");
      absl::Status status = ParseTensorInfo(&tensor);
      if (!status.ok()) return WithContext(status, where);
      auto [it, inserted] = file_->tensor_index_.emplace(tensor.name, i);
      if (!inserted) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": duplicate tensor name, first used by tensor info ", it->second));
      }
      file_->tensors_.push_back(std::move(tensor));
    }
    return absl::OkStatus();
  }

  // Everything of one tensor info after its name.
  absl::Status ParseTensorInfo(TensorInfo* tensor) {
    uint32_t n_dims = 0;
    BITSPLIT_RETURN_IF_ERROR(Read(&n_dims, "dimension count"));
    if (n_dims > kMaxDims) {
      return absl::InvalidArgumentError(
          absl::StrCat(n_dims, " dimensions, at most ", kMaxDims, " are supported"));
    }
    uint64_t raw_dims[kMaxDims] = {};
    for (uint32_t d = 0; d < n_dims; ++d) {
      BITSPLIT_RETURN_IF_ERROR(Read(&raw_dims[d], absl::StrCat("dimension ", d)));
    }
    uint32_t type_id = 0;
    BITSPLIT_RETURN_IF_ERROR(Read(&type_id, "type"));
    BITSPLIT_RETURN_IF_ERROR(Read(&tensor->offset, "data offset"));

    // Shape: every dimension positive and the element count representable.
    uint64_t num_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      if (raw_dims[d] == 0) {
        return absl::InvalidArgumentError(absl::StrCat("dimension ", d, " is 0"));
      }
      if (raw_dims[d] > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return absl::InvalidArgumentError(
            absl::StrCat("dimension ", d, " is ", raw_dims[d], ", larger than INT64_MAX"));
      }
      if (!CheckedMul(num_elements, raw_dims[d], &num_elements) ||
          num_elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return absl::InvalidArgumentError(absl::StrCat("element count (product of dimensions ",
                                                       DimsToString(raw_dims, n_dims),
                                                       ") overflows int64"));
      }
      tensor->dims.push_back(static_cast<int64_t>(raw_dims[d]));
    }
    tensor->num_elements = static_cast<int64_t>(num_elements);

    // Type and byte size: rows must be whole blocks.
    const std::optional<GgmlTypeTraits> traits = GetGgmlTypeTraits(type_id);
    if (!traits) {
      return absl::InvalidArgumentError(absl::StrCat("unknown tensor type id ", type_id));
    }
    tensor->type = static_cast<GgmlType>(type_id);
    const uint64_t row_elements = n_dims == 0 ? 1 : raw_dims[0];
    const uint64_t block_elements = static_cast<uint64_t>(traits->block_elements);
    if (row_elements % block_elements != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("row size ", row_elements, " (dimension 0) is not a multiple of the ",
                       ToAbsl(traits->name), " block size ", block_elements));
    }
    uint64_t row_bytes;
    uint64_t num_bytes;
    if (!CheckedMul(row_elements / block_elements, static_cast<uint64_t>(traits->block_bytes),
                    &row_bytes) ||
        !CheckedMul(row_bytes, num_elements / row_elements, &num_bytes)) {
      return absl::InvalidArgumentError(absl::StrCat("byte size of ", num_elements, " ",
                                                     ToAbsl(traits->name), " elements overflows"));
    }
    tensor->num_bytes = num_bytes;

    if (tensor->offset % file_->alignment_ != 0) {
      return absl::InvalidArgumentError(absl::StrCat("data offset ", tensor->offset,
                                                     " is not a multiple of the alignment ",
                                                     file_->alignment_));
    }
    return absl::OkStatus();
  }

  static std::string DimsToString(const uint64_t* dims, uint32_t n_dims) {
    std::string text = "[";
    for (uint32_t d = 0; d < n_dims; ++d) absl::StrAppend(&text, d ? ", " : "", dims[d]);
    return text + "]";
  }

  // The data section starts at the first aligned offset after the tensor infos. Tensors must
  // be laid out in the order of their infos without overlap, and lie inside the file.
  absl::Status PlaceTensorData() {
    const uint64_t alignment = file_->alignment_;
    uint64_t padded;
    if (!CheckedAdd(offset(), alignment - 1, &padded)) {
      return absl::InvalidArgumentError("data section offset overflows");
    }
    file_->data_offset_ = padded / alignment * alignment;

    const TensorInfo* previous = nullptr;
    uint64_t previous_end = 0;  // relative to the data section
    for (TensorInfo& tensor : file_->tensors_) {
      const std::string where = absl::StrCat("tensor ", Quote(tensor.name));
      uint64_t relative_end;
      uint64_t absolute_start;
      uint64_t absolute_end;
      if (!CheckedAdd(tensor.offset, tensor.num_bytes, &relative_end) ||
          !CheckedAdd(file_->data_offset_, tensor.offset, &absolute_start) ||
          !CheckedAdd(file_->data_offset_, relative_end, &absolute_end)) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": data offset ", tensor.offset,
                                                       " + size ", tensor.num_bytes, " overflows"));
      }
      if (previous != nullptr && tensor.offset < previous->offset) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": data offset ", tensor.offset, " is before the offset ",
                         previous->offset, " of the preceding tensor ", Quote(previous->name),
                         " (tensor data must follow the order of the tensor infos)"));
      }
      if (previous != nullptr && tensor.offset < previous_end) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": data [", tensor.offset, ", ", relative_end, ") overlaps tensor ",
                         Quote(previous->name), " data [", previous->offset, ", ", previous_end,
                         ") (offsets relative to the data section)"));
      }
      if (absolute_end > size() && tensor_data_ == TensorData::kMayBeAbsent) {
        tensor.data = nullptr;
      } else if (absolute_end > size()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": data [", absolute_start, ", ", absolute_end,
                         ") extends past end of file (size ", size(), ")"));
      } else {
        tensor.data = reader_.data() + absolute_start;
      }
      previous = &tensor;
      previous_end = relative_end;
    }
    return absl::OkStatus();
  }

  io::ByteReader reader_;
  File* file_;
  TensorData tensor_data_;
  uint64_t tensor_count_ = 0;
  uint64_t metadata_count_ = 0;
  uint64_t total_array_elements_ = 0;
};

absl::StatusOr<std::unique_ptr<File>> File::Open(const std::string& path, TensorData tensor_data) {
  BITSPLIT_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mapping, MappedFile::Open(path));
  BITSPLIT_ASSIGN_OR_RETURN(std::unique_ptr<File> file,
                            Parse(mapping->data(), mapping->size(), path, tensor_data));
  file->mapping_ = std::move(mapping);
  return file;
}

absl::StatusOr<std::unique_ptr<File>> File::Parse(const uint8_t* data, size_t size,
                                                  std::string name, TensorData tensor_data) {
  std::unique_ptr<File> file(new File());
  file->name_ = std::move(name);
  file->image_data_ = data;
  file->image_size_ = size;
  if (data == nullptr && size != 0) {
    return file->Error(absl::StatusCode::kInvalidArgument, "null image with nonzero size");
  }
  absl::Status status = Parser(data, size, file.get(), tensor_data).Run();
  if (!status.ok()) return file->Error(status.code(), status.message());
  return file;
}

absl::Status File::Error(absl::StatusCode code, absl::string_view detail) const {
  return absl::Status(code, absl::StrCat(name_, ": ", detail));
}

const Value* File::Find(std::string_view key) const {
  auto it = metadata_index_.find(std::string(key));
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].value;
}

const TensorInfo* File::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<const Value*> File::FindOrError(std::string_view key) const {
  const Value* value = Find(key);
  if (value == nullptr) {
    return Error(absl::StatusCode::kNotFound,
                 absl::StrCat("metadata key ", Quote(key), " not found"));
  }
  return value;
}

namespace {

// Runs a per-value conversion and turns its error into "<file>: metadata key 'k' <detail>".
template <typename Convert>
auto ConvertValue(const Value& value, const std::string& file_name, std::string_view key,
                  Convert convert) -> decltype(convert(value)) {
  auto result = convert(value);
  if (!result.ok()) {
    return absl::Status(
        result.status().code(),
        absl::StrCat(file_name, ": metadata key ", Quote(key), " ", result.status().message()));
  }
  return result;
}

// Converts every element of an array value; the error names the offending element.
template <typename T, typename Convert>
absl::StatusOr<std::vector<T>> ConvertArray(const Value& value, const std::string& file_name,
                                            std::string_view key, Convert convert) {
  if (value.type != ValueType::kArray) {
    return absl::InvalidArgumentError(absl::StrCat(file_name, ": metadata key ", Quote(key),
                                                   " has type ", TypeName(value.type),
                                                   ", expected an array"));
  }
  const Array& array = std::get<Array>(value.data);
  std::vector<T> result;
  result.reserve(array.elements.size());
  for (size_t i = 0; i < array.elements.size(); ++i) {
    auto converted = convert(array.elements[i]);
    if (!converted.ok()) {
      return absl::Status(converted.status().code(),
                          absl::StrCat(file_name, ": metadata key ", Quote(key), " (ARRAY of ",
                                       TypeName(array.element_type), "): element ", i, " ",
                                       converted.status().message()));
    }
    result.push_back(*std::move(converted));
  }
  return result;
}

absl::StatusOr<std::string> ValueAsString(const Value& value) {
  if (value.type == ValueType::kString) return std::get<std::string>(value.data);
  return absl::InvalidArgumentError(
      absl::StrCat("has type ", TypeName(value.type), ", expected STRING"));
}

absl::StatusOr<bool> ValueAsBool(const Value& value) {
  if (value.type == ValueType::kBool) return std::get<bool>(value.data);
  return absl::InvalidArgumentError(
      absl::StrCat("has type ", TypeName(value.type), ", expected BOOL"));
}

}  // namespace

absl::StatusOr<std::string> File::GetString(std::string_view key) const {
  BITSPLIT_ASSIGN_OR_RETURN(const Value* value, FindOrError(key));
  return ConvertValue(*value, name_, key, ValueAsString);
}

absl::StatusOr<uint64_t> File::GetUint(std::string_view key) const {
  BITSPLIT_ASSIGN_OR_RETURN(const Value* value, FindOrError(key));
  return ConvertValue(*value, name_, key, ValueAsUint);
}

absl::StatusOr<int64_t> File::GetInt(std::string_view key) const {
  BITSPLIT_ASSIGN_OR_RETURN(const Value* value, FindOrError(key));
  return ConvertValue(*value, name_, key, ValueAsInt);
}

absl::StatusOr<double> File::GetFloat(std::string_view key) const {
  BITSPLIT_ASSIGN_OR_RETURN(const Value* value, FindOrError(key));
  return ConvertValue(*value, name_, key, ValueAsFloat);
}

absl::StatusOr<bool> File::GetBool(std::string_view key) const {
  BITSPLIT_ASSIGN_OR_RETURN(const Value* value, FindOrError(key));
  return ConvertValue(*value, name_, key, ValueAsBool);
}

absl::StatusOr<std::vector<std::string>> File::GetStringArray(std::string_view key) const {
  BITSPLIT_ASSIGN_OR_RETURN(const Value* value, FindOrError(key));
  return ConvertArray<std::string>(*value, name_, key, ValueAsString);
}

absl::StatusOr<std::vector<int64_t>> File::GetIntArray(std::string_view key) const {
  BITSPLIT_ASSIGN_OR_RETURN(const Value* value, FindOrError(key));
  return ConvertArray<int64_t>(*value, name_, key, ValueAsInt);
}

absl::StatusOr<std::vector<double>> File::GetFloatArray(std::string_view key) const {
  BITSPLIT_ASSIGN_OR_RETURN(const Value* value, FindOrError(key));
  return ConvertArray<double>(*value, name_, key, ValueAsFloat);
}

}  // namespace bitsplit::gguf
