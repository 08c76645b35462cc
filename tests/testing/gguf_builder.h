#pragma once
// Builds GGUF v3 (or v2) byte images in memory, for tests: metadata of every value type,
// arrays (also of strings and of arrays), tensor infos and aligned tensor data.
//
//   GgufBuilder b;
//   b.AddString("general.architecture", "llama").AddUint32("llama.block_count", 2);
//   b.AddStringArray("tokenizer.ggml.tokens", {"<s>", "</s>", "a"});
//   b.AddF32Tensor("output_norm.weight", {4}, {1, 2, 3, 4});
//   b.AddTensor("blk.0.attn_q.weight", GgmlType::kQ8_0, {32, 4});  // zero-filled data
//   std::vector<uint8_t> image = b.Build();
//
// Nothing is validated: the builder writes exactly what it is told, so tests can also write
// malformed files. Hooks for that: header overrides (magic, version, counts), raw metadata
// entries (any type id, any payload), raw tensor type ids, per-tensor offset / dimension-count
// overrides, and the Layout that Build() reports so a test can patch bytes afterwards.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/io/ggml_type.h"
#include "common/io/gguf.h"

namespace bitsplit::testing {

class GgufBuilder {
 public:
  using ValueType = gguf::ValueType;

  // One metadata entry as written: key, raw value type id, encoded value bytes.
  struct Kv {
    std::string key;
    uint32_t type;
    std::vector<uint8_t> payload;
  };

  // One tensor as written. Fields may be edited freely through the reference AddTensor returns
  // (references stay valid: tensors live in a deque).
  struct Tensor {
    std::string name;
    uint32_t type;                   // raw ggml type id
    std::vector<uint64_t> dims;      // ggml order: dims[0] is the contiguous dimension
    std::vector<uint8_t> data;       // written at the tensor's offset in the data section
    std::optional<uint64_t> offset;  // relative offset to write (default: packed, aligned)
    std::optional<uint32_t> n_dims;  // dimension count to write (default: dims.size())
    // False: write the info but no data (for offsets far beyond any sane image size).
    bool write_data = true;
  };

  // Where Build() put things, so tests can patch bytes of a built image.
  struct TensorInfoLayout {
    size_t start;      // the name's length field
    size_t n_dims_at;  // uint32 dimension count
    size_t dims_at;    // first uint64 dimension
    size_t type_at;    // uint32 type id
    size_t offset_at;  // uint64 data offset
  };
  struct KvLayout {
    size_t start;     // the key's length field
    size_t type_at;   // uint32 value type
    size_t value_at;  // first byte of the value
  };
  struct Layout {
    size_t version_at = 4;
    size_t tensor_count_at = 8;
    size_t kv_count_at = 16;
    std::vector<KvLayout> kvs;
    std::vector<TensorInfoLayout> tensor_infos;
    size_t tensor_infos_end = 0;           // first byte after the last tensor info
    size_t data_offset = 0;                // aligned start of the data section
    std::vector<uint64_t> tensor_offsets;  // relative offsets written, one per tensor
  };

  // ---- Header -------------------------------------------------------------------------------
  static constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian

  GgufBuilder& SetMagic(uint32_t magic) {
    magic_ = magic;
    return *this;
  }
  GgufBuilder& SetVersion(uint32_t version) {
    version_ = version;
    return *this;
  }
  GgufBuilder& OverrideTensorCount(uint64_t count) {
    tensor_count_ = count;
    return *this;
  }
  GgufBuilder& OverrideKvCount(uint64_t count) {
    kv_count_ = count;
    return *this;
  }
  // Lays tensor data out with `alignment` and, unless told otherwise, also writes the
  // general.alignment key (UINT32) that tells readers so.
  GgufBuilder& SetAlignment(uint32_t alignment, bool write_key = true) {
    alignment_ = alignment;
    if (write_key) AddUint32("general.alignment", alignment);
    return *this;
  }

  // ---- Metadata scalars ---------------------------------------------------------------------
  GgufBuilder& AddUint8(std::string key, uint8_t v) {
    return AddScalar(std::move(key), ValueType::kUint8, v);
  }
  GgufBuilder& AddInt8(std::string key, int8_t v) {
    return AddScalar(std::move(key), ValueType::kInt8, v);
  }
  GgufBuilder& AddUint16(std::string key, uint16_t v) {
    return AddScalar(std::move(key), ValueType::kUint16, v);
  }
  GgufBuilder& AddInt16(std::string key, int16_t v) {
    return AddScalar(std::move(key), ValueType::kInt16, v);
  }
  GgufBuilder& AddUint32(std::string key, uint32_t v) {
    return AddScalar(std::move(key), ValueType::kUint32, v);
  }
  GgufBuilder& AddInt32(std::string key, int32_t v) {
    return AddScalar(std::move(key), ValueType::kInt32, v);
  }
  GgufBuilder& AddUint64(std::string key, uint64_t v) {
    return AddScalar(std::move(key), ValueType::kUint64, v);
  }
  GgufBuilder& AddInt64(std::string key, int64_t v) {
    return AddScalar(std::move(key), ValueType::kInt64, v);
  }
  GgufBuilder& AddFloat32(std::string key, float v) {
    return AddScalar(std::move(key), ValueType::kFloat32, v);
  }
  GgufBuilder& AddFloat64(std::string key, double v) {
    return AddScalar(std::move(key), ValueType::kFloat64, v);
  }
  GgufBuilder& AddBool(std::string key, bool v) {
    return AddScalar(std::move(key), ValueType::kBool, static_cast<uint8_t>(v ? 1 : 0));
  }
  GgufBuilder& AddString(std::string key, std::string_view v) {
    return AddRaw(std::move(key), ValueType::kString, EncodeString(v));
  }

  // ---- Metadata arrays ----------------------------------------------------------------------
  GgufBuilder& AddStringArray(std::string key, const std::vector<std::string>& values) {
    std::vector<uint8_t> payload = ArrayHeader(ValueType::kString, values.size());
    for (const std::string& v : values) AppendString(&payload, v);
    return AddRaw(std::move(key), ValueType::kArray, std::move(payload));
  }
  // Numeric arrays: every value is converted to the C++ type of `element_type` and written
  // little-endian (e.g. AddArray("k", ValueType::kInt32, std::vector<int>{1, 2})).
  template <typename T>
  GgufBuilder& AddArray(std::string key, ValueType element_type, const std::vector<T>& values) {
    std::vector<uint8_t> payload = ArrayHeader(element_type, values.size());
    for (const T& v : values) AppendNumber(&payload, element_type, v);
    return AddRaw(std::move(key), ValueType::kArray, std::move(payload));
  }
  GgufBuilder& AddInt32Array(std::string key, const std::vector<int32_t>& values) {
    return AddArray(std::move(key), ValueType::kInt32, values);
  }
  GgufBuilder& AddUint32Array(std::string key, const std::vector<uint32_t>& values) {
    return AddArray(std::move(key), ValueType::kUint32, values);
  }
  GgufBuilder& AddFloat32Array(std::string key, const std::vector<float>& values) {
    return AddArray(std::move(key), ValueType::kFloat32, values);
  }
  // Any entry, byte for byte: `type` may be an unknown id, `payload` anything (see the
  // Encode/Append helpers below for composing nested arrays or wrong lengths).
  GgufBuilder& AddRaw(std::string key, uint32_t type, std::vector<uint8_t> payload) {
    kvs_.push_back(Kv{std::move(key), type, std::move(payload)});
    return *this;
  }
  GgufBuilder& AddRaw(std::string key, ValueType type, std::vector<uint8_t> payload) {
    return AddRaw(std::move(key), static_cast<uint32_t>(type), std::move(payload));
  }
  std::vector<Kv>& kvs() { return kvs_; }

  // ---- Tensors ------------------------------------------------------------------------------
  // `data` empty: the tensor gets its exact byte size (when the type and row size allow
  // computing it) of zeros. Otherwise `data` is written as is, whatever its size.
  Tensor& AddTensor(std::string name, GgmlType type, std::vector<uint64_t> dims,
                    std::vector<uint8_t> data = {}) {
    return AddRawTensor(std::move(name), static_cast<uint32_t>(type), std::move(dims),
                        std::move(data));
  }
  Tensor& AddRawTensor(std::string name, uint32_t type_id, std::vector<uint64_t> dims,
                       std::vector<uint8_t> data = {}) {
    if (data.empty()) data.resize(TensorBytes(type_id, dims).value_or(0));
    Tensor& tensor = tensors_.emplace_back();
    tensor.name = std::move(name);
    tensor.type = type_id;
    tensor.dims = std::move(dims);
    tensor.data = std::move(data);
    return tensor;
  }
  // A tensor info without data, none allocated (a shapes-only file of a big model): its offset
  // packs it after the previous shapes-only tensor as its type and dims size it, so a reader
  // that allows absent data (gguf::TensorData::kMayBeAbsent) sees a consistent table. For files
  // whose tensors are all shapes-only.
  Tensor& AddShapeOnlyTensor(std::string name, GgmlType type, std::vector<uint64_t> dims) {
    const uint64_t bytes = TensorBytes(static_cast<uint32_t>(type), dims, UINT64_MAX).value_or(0);
    Tensor& tensor = tensors_.emplace_back();
    tensor.name = std::move(name);
    tensor.type = static_cast<uint32_t>(type);
    tensor.dims = std::move(dims);
    tensor.write_data = false;
    tensor.offset = AlignUp(shape_only_end_, alignment_);
    shape_only_end_ = *tensor.offset + bytes;
    return tensor;
  }
  Tensor& AddF32Tensor(std::string name, std::vector<uint64_t> dims,
                       const std::vector<float>& values) {
    std::vector<uint8_t> data(values.size() * sizeof(float));
    if (!values.empty()) std::memcpy(data.data(), values.data(), data.size());
    return AddTensor(std::move(name), GgmlType::kF32, std::move(dims), std::move(data));
  }
  std::deque<Tensor>& tensors() { return tensors_; }

  // Exact data size of a tensor, or nullopt when the type is unknown, a row is not whole
  // blocks, or the size is absurd (over 1 GiB: nothing a test should allocate).
  // Bytes of a tensor's data; nullopt for an unknown type, partial blocks, overflow or more than
  // `limit` bytes (data that AddTensor would allocate).
  static std::optional<uint64_t> TensorBytes(uint32_t type_id, const std::vector<uint64_t>& dims,
                                             uint64_t limit = uint64_t{1} << 30) {
    std::optional<GgmlTypeTraits> traits = GetGgmlTypeTraits(type_id);
    if (!traits) return std::nullopt;
    const uint64_t block_elements = static_cast<uint64_t>(traits->block_elements);
    uint64_t rows = 1;
    for (size_t d = 1; d < dims.size(); ++d) {
      if (__builtin_mul_overflow(rows, dims[d], &rows)) return std::nullopt;
    }
    const uint64_t row_elements = dims.empty() ? 1 : dims[0];
    if (row_elements % block_elements != 0) return std::nullopt;
    uint64_t bytes;
    if (__builtin_mul_overflow(row_elements / block_elements,
                               static_cast<uint64_t>(traits->block_bytes), &bytes) ||
        __builtin_mul_overflow(bytes, rows, &bytes) || bytes > limit) {
      return std::nullopt;
    }
    return bytes;
  }

  // ---- Build --------------------------------------------------------------------------------
  std::vector<uint8_t> Build(Layout* layout_out = nullptr) const {
    Layout layout;
    std::vector<uint8_t> out;
    AppendScalar(&out, magic_);
    AppendScalar(&out, version_);
    AppendScalar(&out, tensor_count_.value_or(tensors_.size()));
    AppendScalar(&out, kv_count_.value_or(kvs_.size()));
    for (const Kv& kv : kvs_) {
      KvLayout at;
      at.start = out.size();
      AppendString(&out, kv.key);
      at.type_at = out.size();
      AppendScalar(&out, kv.type);
      at.value_at = out.size();
      out.insert(out.end(), kv.payload.begin(), kv.payload.end());
      layout.kvs.push_back(at);
    }
    // Default offsets pack the tensors in order, each aligned.
    uint64_t next_offset = 0;
    for (const Tensor& t : tensors_) {
      uint64_t offset = t.offset.value_or(AlignUp(next_offset, alignment_));
      layout.tensor_offsets.push_back(offset);
      next_offset = std::max(next_offset, offset + t.data.size());
    }
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const Tensor& t = tensors_[i];
      TensorInfoLayout at;
      at.start = out.size();
      AppendString(&out, t.name);
      at.n_dims_at = out.size();
      AppendScalar(&out, t.n_dims.value_or(static_cast<uint32_t>(t.dims.size())));
      at.dims_at = out.size();
      for (uint64_t d : t.dims) AppendScalar(&out, d);
      at.type_at = out.size();
      AppendScalar(&out, t.type);
      at.offset_at = out.size();
      AppendScalar(&out, layout.tensor_offsets[i]);
      layout.tensor_infos.push_back(at);
    }
    layout.tensor_infos_end = out.size();
    layout.data_offset = tensors_.empty() ? out.size() : AlignUp(out.size(), alignment_);
    out.resize(layout.data_offset);
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const Tensor& t = tensors_[i];
      if (!t.write_data || t.data.empty()) continue;
      const size_t at = layout.data_offset + layout.tensor_offsets[i];
      if (out.size() < at + t.data.size()) out.resize(at + t.data.size());
      std::memcpy(out.data() + at, t.data.data(), t.data.size());
    }
    if (layout_out) *layout_out = std::move(layout);
    return out;
  }

  // ---- Encoding helpers (little-endian, as GGUF) --------------------------------------------
  template <typename T>
  static void AppendScalar(std::vector<uint8_t>* out, T value) {
    const size_t at = out->size();
    out->resize(at + sizeof(T));
    std::memcpy(out->data() + at, &value, sizeof(T));
  }
  static void AppendString(std::vector<uint8_t>* out, std::string_view text) {
    AppendScalar<uint64_t>(out, text.size());
    out->insert(out->end(), text.begin(), text.end());
  }
  static std::vector<uint8_t> EncodeString(std::string_view text) {
    std::vector<uint8_t> out;
    AppendString(&out, text);
    return out;
  }
  // Element type id + count: the start of an ARRAY value (the elements follow).
  static std::vector<uint8_t> ArrayHeader(uint32_t element_type, uint64_t count) {
    std::vector<uint8_t> out;
    AppendScalar(&out, element_type);
    AppendScalar(&out, count);
    return out;
  }
  static std::vector<uint8_t> ArrayHeader(ValueType element_type, uint64_t count) {
    return ArrayHeader(static_cast<uint32_t>(element_type), count);
  }
  template <typename T>
  static void AppendNumber(std::vector<uint8_t>* out, ValueType type, T value) {
    switch (type) {
      case ValueType::kUint8:
        return AppendScalar(out, static_cast<uint8_t>(value));
      case ValueType::kInt8:
        return AppendScalar(out, static_cast<int8_t>(value));
      case ValueType::kUint16:
        return AppendScalar(out, static_cast<uint16_t>(value));
      case ValueType::kInt16:
        return AppendScalar(out, static_cast<int16_t>(value));
      case ValueType::kUint32:
        return AppendScalar(out, static_cast<uint32_t>(value));
      case ValueType::kInt32:
        return AppendScalar(out, static_cast<int32_t>(value));
      case ValueType::kUint64:
        return AppendScalar(out, static_cast<uint64_t>(value));
      case ValueType::kInt64:
        return AppendScalar(out, static_cast<int64_t>(value));
      case ValueType::kFloat32:
        return AppendScalar(out, static_cast<float>(value));
      case ValueType::kFloat64:
        return AppendScalar(out, static_cast<double>(value));
      case ValueType::kBool:
        return AppendScalar(out, static_cast<uint8_t>(value ? 1 : 0));
      case ValueType::kString:
      case ValueType::kArray:
        break;  // not numbers: use AppendString / ArrayHeader
    }
  }
  // Overwrites bytes of a built image, e.g. PatchAt<uint32_t>(&image, layout.version_at, 1).
  template <typename T>
  static void PatchAt(std::vector<uint8_t>* image, size_t at, T value) {
    std::memcpy(image->data() + at, &value, sizeof(T));
  }

  static uint64_t AlignUp(uint64_t value, uint64_t alignment) {
    return alignment == 0 ? value : (value + alignment - 1) / alignment * alignment;
  }

 private:
  template <typename T>
  GgufBuilder& AddScalar(std::string key, ValueType type, T value) {
    std::vector<uint8_t> payload;
    AppendScalar(&payload, value);
    return AddRaw(std::move(key), type, std::move(payload));
  }

  uint32_t magic_ = kMagic;
  uint32_t version_ = 3;
  std::optional<uint64_t> tensor_count_;
  std::optional<uint64_t> kv_count_;
  uint64_t alignment_ = gguf::kDefaultAlignment;
  std::vector<Kv> kvs_;
  std::deque<Tensor> tensors_;
  uint64_t shape_only_end_ = 0;  // AddShapeOnlyTensor's next free offset
};

// Writes `bytes` to `path` (for tests of File::Open / MappedFile). False on any error.
inline bool WriteFileBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  return static_cast<bool>(file);
}

}  // namespace bitsplit::testing
