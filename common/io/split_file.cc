#include "common/io/split_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/io/byte_reader.h"
#include "common/util/json_nesting.h"
#include "common/util/status_macros.h"

namespace bitsplit {
namespace {

using io::CheckedAdd;
using io::CheckedAlignUp;
using io::CheckedMul;
using io::Quote;
using io::ToAbsl;
using io::WithContext;

// Offset of the metadata text: right after the fixed header.
constexpr uint64_t kMetadataOffset = sizeof(SplitFileHeader);
// Smallest tensor entry: 1-byte name, one dimension. Tensor counts are checked against what the
// remaining bytes could hold before anything is reserved for them.
constexpr uint64_t kMinTensorEntryBytes = 4 + 1 + 4 + 4 + 4 + 8 + 8 + 8;

std::string DimsToString(const std::vector<int64_t>& dims) {
  std::string text = "[";
  for (size_t d = 0; d < dims.size(); ++d) absl::StrAppend(&text, d ? ", " : "", dims[d]);
  return text + "]";
}

// nlohmann's messages quote what the parser last read, i.e. bytes from the file: keep them
// printable and short.
std::string PrintableExcerpt(std::string_view text) {
  constexpr size_t kMaxShown = 300;
  std::string out;
  for (size_t i = 0; i < text.size() && i < kMaxShown; ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte < 0x20 || byte >= 0x7F) {
      absl::StrAppend(&out, "\\x", absl::Hex(byte, absl::kZeroPad2));
    } else {
      out.push_back(static_cast<char>(byte));
    }
  }
  if (text.size() > kMaxShown) out += "...";
  return out;
}

// nlohmann parses iteratively, but copying, comparing and dumping a json value recurse: a file of
// a million '[' would be a stack overflow waiting for the first caller that copies the metadata.
// Strings are skipped so that brackets inside them do not count.
absl::Status CheckJsonDepth(std::string_view text) {
  const size_t at = util::JsonNestingExceeds(text, kSplitFileMaxMetadataDepth);
  if (at == std::string_view::npos) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("JSON nests deeper than ",
                                                 kSplitFileMaxMetadataDepth, " levels (at byte ",
                                                 at, " of the text)"));
}

absl::StatusOr<nlohmann::json> ParseMetadataText(std::string_view text) {
  if (text.size() > kSplitFileMaxMetadataBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("is ", text.size(),
                                                     " bytes, more than the reader's limit of ",
                                                     kSplitFileMaxMetadataBytes));
  }
  BITSPLIT_RETURN_IF_ERROR(CheckJsonDepth(text));
  nlohmann::json parsed;
  try {
    parsed = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& error) {
    // Drop the "[json.exception.parse_error.101] " prefix: the rest says what and where.
    std::string_view message = error.what();
    if (const size_t end = message.find("] ");
        !message.empty() && message[0] == '[' && end != std::string_view::npos) {
      message.remove_prefix(end + 2);
    }
    return absl::InvalidArgumentError(absl::StrCat("not valid JSON: ", PrintableExcerpt(message)));
  }
  if (!parsed.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("is a JSON ", parsed.type_name(), ", expected an object"));
  }
  return parsed;
}

// Maps the errno of a failed file operation to a status code the caller can act on.
absl::Status ErrnoStatus(int error_number, absl::string_view message) {
  const std::string full = absl::StrCat(message, ": ", std::strerror(error_number));
  switch (error_number) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(full);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(full);
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return absl::ResourceExhaustedError(full);
    default:
      return absl::ErrnoToStatus(error_number, full);
  }
}

}  // namespace

std::string_view SplitFileKindName(SplitFileKind kind) {
  switch (kind) {
    case SplitFileKind::kBase:
      return "base";
    case SplitFileKind::kResidual:
      return "residual";
  }
  return "unknown";
}

std::string SplitFingerprintToHex(const SplitFingerprint& fingerprint) {
  constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * fingerprint.size());
  for (uint8_t byte : fingerprint) {
    hex.push_back(kDigits[byte >> 4]);
    hex.push_back(kDigits[byte & 0xF]);
  }
  return hex;
}

absl::StatusOr<SplitFingerprint> SplitFingerprintFromHex(std::string_view hex) {
  SplitFingerprint fingerprint{};
  if (hex.size() != 2 * fingerprint.size()) {
    return absl::InvalidArgumentError(absl::StrCat("fingerprint ", Quote(hex), " has ", hex.size(),
                                                   " characters, expected ", 2 * fingerprint.size(),
                                                   " hex digits"));
  }
  auto digit_value = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < fingerprint.size(); ++i) {
    const int high = digit_value(hex[2 * i]);
    const int low = digit_value(hex[2 * i + 1]);
    if (high < 0 || low < 0) {
      return absl::InvalidArgumentError(absl::StrCat("fingerprint ", Quote(hex),
                                                     " has a non-hex character at ",
                                                     high < 0 ? 2 * i : 2 * i + 1));
    }
    fingerprint[i] = static_cast<uint8_t>(high << 4 | low);
  }
  return fingerprint;
}

std::string TensorFormatName(uint32_t format) {
  if (IsGgmlTensorFormat(format)) return GgmlTypeName(format);
  if (IsSplitTensorFormat(format)) return absl::StrCat("split format ", SplitFormatIdOf(format));
  return absl::StrCat("format 0x", absl::Hex(format));
}

absl::StatusOr<SplitTensorSize> ComputeSplitTensorSize(uint32_t format, uint32_t group_size,
                                                       const std::vector<int64_t>& dims,
                                                       const RowSizeOracle& oracle) {
  if (dims.empty() || dims.size() > kSplitFileMaxDims) {
    return absl::InvalidArgumentError(
        absl::StrCat(dims.size(), " dimensions, expected 1 to ", kSplitFileMaxDims));
  }
  uint64_t num_elements = 1;
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims[d] <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("dimension ", d, " is ", dims[d], ", expected a positive size"));
    }
    if (!CheckedMul(num_elements, static_cast<uint64_t>(dims[d]), &num_elements) ||
        num_elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(absl::StrCat("element count (product of dimensions ",
                                                     DimsToString(dims), ") overflows int64"));
    }
  }
  const int64_t cols = dims[0];
  const uint64_t rows = num_elements / static_cast<uint64_t>(cols);

  uint64_t row_bytes = 0;
  if (IsGgmlTensorFormat(format)) {
    const std::optional<GgmlTypeTraits> traits = GetGgmlTypeTraits(format);
    if (!traits) {
      return absl::InvalidArgumentError(absl::StrCat("unknown ggml type id ", format));
    }
    if (group_size != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("group size ", group_size, " given for ggml format ", ToAbsl(traits->name),
                       ", expected 0 (ggml formats have a fixed block size)"));
    }
    const auto block_elements = static_cast<uint64_t>(traits->block_elements);
    if (static_cast<uint64_t>(cols) % block_elements != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("row size ", cols, " (dimension 0) is not a multiple of the ",
                       ToAbsl(traits->name), " block size ", block_elements));
    }
    if (!CheckedMul(static_cast<uint64_t>(cols) / block_elements,
                    static_cast<uint64_t>(traits->block_bytes), &row_bytes)) {
      return absl::InvalidArgumentError(absl::StrCat("row byte size of ", cols, " ",
                                                     ToAbsl(traits->name), " elements overflows"));
    }
  } else if (IsSplitTensorFormat(format)) {
    const uint32_t id = SplitFormatIdOf(format);
    if (!oracle) {
      return absl::FailedPreconditionError(
          absl::StrCat("split format ", id,
                       " needs a row-size oracle from the quant layer, but none was given"));
    }
    absl::StatusOr<uint64_t> oracle_row_bytes = oracle(id, group_size, cols);
    if (!oracle_row_bytes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("split format ", id, ", group size ", group_size, ", ", cols,
                       " columns: ", oracle_row_bytes.status().message()));
    }
    if (*oracle_row_bytes == 0) {
      return absl::InvalidArgumentError(absl::StrCat("split format ", id, ", group size ",
                                                     group_size, ", ", cols,
                                                     " columns: the row-size oracle says 0 bytes"));
    }
    row_bytes = *oracle_row_bytes;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown tensor format 0x", absl::Hex(format),
                     " (neither a ggml type id below 0x10000 nor a split format 0x10000 + id)"));
  }

  uint64_t num_bytes;
  if (!CheckedMul(row_bytes, rows, &num_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("byte size of ", rows, " rows of ", row_bytes, " bytes overflows"));
  }
  return SplitTensorSize{row_bytes, num_bytes, static_cast<int64_t>(num_elements)};
}

// ---- Reader -----------------------------------------------------------------------------------

// Reads the image front to back with a bounds check before every access. Its error details say
// what is wrong and where; SplitFile::Parse prefixes the file name.
class SplitFile::Parser {
 public:
  Parser(const uint8_t* data, size_t size, SplitFile* file,
         std::optional<SplitFileKind> expected_kind, const RowSizeOracle& oracle)
      : reader_(data, size), file_(file), expected_kind_(expected_kind), oracle_(oracle) {}

  absl::Status Run() {
    BITSPLIT_RETURN_IF_ERROR(ParseFixedHeader());
    BITSPLIT_RETURN_IF_ERROR(ParseMetadata());
    BITSPLIT_RETURN_IF_ERROR(ParseTensorEntries());
    BITSPLIT_RETURN_IF_ERROR(ParseHeaderPadding());
    return PlaceTensorData();
  }

 private:
  absl::Status ParseFixedHeader() {
    const uint8_t* magic = nullptr;
    BITSPLIT_RETURN_IF_ERROR(reader_.Skip(sizeof(kSplitFileMagic), "magic", &magic));
    if (std::memcmp(magic, kSplitFileMagic, sizeof(kSplitFileMagic)) != 0) {
      if (std::memcmp(magic, "GGUF", 4) == 0) {
        return absl::InvalidArgumentError(
            "this is a GGUF file, not a bitsplit split file (make one with `bitsplit quantize`)");
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "bad magic ",
          Quote(std::string_view(reinterpret_cast<const char*>(magic), sizeof(kSplitFileMagic))),
          ", expected 'BSPLIT\\x00\\x00': not a bitsplit split file"));
    }

    uint32_t version = 0;
    BITSPLIT_RETURN_IF_ERROR(reader_.Read(&version, "version"));
    if (version != kSplitFileVersion) {
      if (__builtin_bswap32(version) == kSplitFileVersion) {
        return absl::InvalidArgumentError(absl::StrCat(
            "version field reads ", version,
            " (1 byte-swapped): a big-endian file, only little-endian split files exist"));
      }
      return absl::InvalidArgumentError(absl::StrCat("unsupported split file version ", version,
                                                     " (this build reads version ",
                                                     kSplitFileVersion, ")"));
    }
    file_->version_ = version;

    uint32_t kind = 0;
    BITSPLIT_RETURN_IF_ERROR(reader_.Read(&kind, "kind"));
    if (kind != static_cast<uint32_t>(SplitFileKind::kBase) &&
        kind != static_cast<uint32_t>(SplitFileKind::kResidual)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown file kind ", kind, " (expected 1 = base or 2 = residual)"));
    }
    file_->kind_ = static_cast<SplitFileKind>(kind);
    if (expected_kind_ && *expected_kind_ != file_->kind_) {
      return absl::FailedPreconditionError(
          absl::StrCat("is a ", ToAbsl(SplitFileKindName(file_->kind_)), " split file, expected a ",
                       ToAbsl(SplitFileKindName(*expected_kind_)), " split file"));
    }

    BITSPLIT_RETURN_IF_ERROR(reader_.Read(&file_->fingerprint_, "fingerprint"));
    return absl::OkStatus();
  }

  absl::Status ParseMetadata() {
    uint64_t length = 0;
    BITSPLIT_RETURN_IF_ERROR(reader_.Read(&length, "metadata length"));
    if (length > reader_.remaining()) {
      return absl::InvalidArgumentError(
          absl::StrCat("metadata length ", length, " at offset ", reader_.offset() - 8,
                       " runs past end of file (", reader_.remaining(), " bytes remain, file size ",
                       reader_.size(), ")"));
    }
    const uint8_t* text = nullptr;
    BITSPLIT_RETURN_IF_ERROR(reader_.Skip(length, "metadata", &text));
    file_->metadata_text_ = std::string_view(reinterpret_cast<const char*>(text), length);
    absl::StatusOr<nlohmann::json> parsed = ParseMetadataText(file_->metadata_text_);
    if (!parsed.ok()) {
      return WithContext(parsed.status(), absl::StrCat("metadata (", length, " bytes at offset ",
                                                       kMetadataOffset, ")"));
    }
    file_->metadata_ = *std::move(parsed);
    return absl::OkStatus();
  }

  absl::Status ParseTensorEntries() {
    BITSPLIT_RETURN_IF_ERROR(reader_.Read(&tensor_count_, "tensor count"));
    if (tensor_count_ > reader_.remaining() / kMinTensorEntryBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor count ", tensor_count_, " is impossible: the remaining ", reader_.remaining(),
          " bytes hold at most ", reader_.remaining() / kMinTensorEntryBytes, " tensor entries"));
    }
    file_->tensors_.reserve(tensor_count_);
    for (uint64_t i = 0; i < tensor_count_; ++i) {
      const std::string entry = absl::StrCat("tensor entry ", i, " of ", tensor_count_);
      SplitTensor tensor;
      BITSPLIT_RETURN_IF_ERROR(WithContext(ReadName(&tensor.name), entry));
      const std::string where = absl::StrCat(entry, " (tensor ", Quote(tensor.name), ")");
      BITSPLIT_RETURN_IF_ERROR(WithContext(ParseTensorEntry(&tensor), where));
      auto [it, inserted] = file_->tensor_index_.emplace(tensor.name, i);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": duplicate tensor name, first used by tensor entry ", it->second));
      }
      file_->tensors_.push_back(std::move(tensor));
    }
    return absl::OkStatus();
  }

  absl::Status ReadName(std::string* name) {
    uint32_t length = 0;
    BITSPLIT_RETURN_IF_ERROR(reader_.Read(&length, "name length"));
    if (length == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("empty tensor name at offset ", reader_.offset() - 4));
    }
    if (length > kSplitFileMaxTensorNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat("name length ", length, " at offset ",
                                                     reader_.offset() - 4, " is over the limit of ",
                                                     kSplitFileMaxTensorNameBytes, " bytes"));
    }
    const uint8_t* bytes = nullptr;
    BITSPLIT_RETURN_IF_ERROR(reader_.Skip(length, "name", &bytes));
    name->assign(reinterpret_cast<const char*>(bytes), length);
    return absl::OkStatus();
  }

  // Everything of one entry after its name; also checks its place relative to the previous one.
  absl::Status ParseTensorEntry(SplitTensor* tensor) {
    BITSPLIT_RETURN_IF_ERROR(reader_.Read(&tensor->format, "format"));
    BITSPLIT_RETURN_IF_ERROR(reader_.Read(&tensor->group_size, "group size"));
    uint32_t n_dims = 0;
    BITSPLIT_RETURN_IF_ERROR(reader_.Read(&n_dims, "dimension count"));
    if (n_dims == 0 || n_dims > kSplitFileMaxDims) {
      return absl::InvalidArgumentError(absl::StrCat("dimension count ", n_dims, " at offset ",
                                                     reader_.offset() - 4, ", expected 1 to ",
                                                     kSplitFileMaxDims));
    }
    tensor->dims.resize(n_dims);
    for (uint32_t d = 0; d < n_dims; ++d) {
      BITSPLIT_RETURN_IF_ERROR(reader_.Read(&tensor->dims[d], absl::StrCat("dimension ", d)));
    }
    BITSPLIT_RETURN_IF_ERROR(reader_.Read(&tensor->offset, "data offset"));
    BITSPLIT_RETURN_IF_ERROR(reader_.Read(&tensor->num_bytes, "data size"));

    BITSPLIT_ASSIGN_OR_RETURN(
        const SplitTensorSize size,
        ComputeSplitTensorSize(tensor->format, tensor->group_size, tensor->dims, oracle_));
    tensor->num_elements = size.num_elements;
    tensor->row_bytes = size.row_bytes;
    if (tensor->num_bytes != size.num_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data size ", tensor->num_bytes, " does not match its shape: ", tensor->rows(),
          " rows of ", size.row_bytes, " bytes (", TensorFormatName(tensor->format),
          ", group size ", tensor->group_size, ", dims ", DimsToString(tensor->dims), ") are ",
          size.num_bytes, " bytes"));
    }

    // Data is packed in entry order, each tensor at the next multiple of the alignment: one
    // canonical layout, so any edit of an offset is detected.
    if (tensor->offset % kSplitFileAlignment != 0) {
      return absl::InvalidArgumentError(absl::StrCat("data offset ", tensor->offset,
                                                     " is not a multiple of the alignment ",
                                                     kSplitFileAlignment));
    }
    const SplitTensor* previous = file_->tensors_.empty() ? nullptr : &file_->tensors_.back();
    if (previous != nullptr && tensor->offset < previous->offset) {
      return absl::InvalidArgumentError(
          absl::StrCat("data offset ", tensor->offset, " is before the offset ", previous->offset,
                       " of the preceding tensor ", Quote(previous->name),
                       " (tensor data must follow the order of the entries)"));
    }
    if (previous != nullptr && tensor->offset < data_end_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data at offset ", tensor->offset, " overlaps tensor ", Quote(previous->name), " data [",
          previous->offset, ", ", data_end_, ") (offsets relative to the data start)"));
    }
    uint64_t expected_offset;
    if (!CheckedAlignUp(data_end_, kSplitFileAlignment, &expected_offset)) {
      return absl::InvalidArgumentError(absl::StrCat("data offset ", tensor->offset,
                                                     " follows data that ends at ", data_end_,
                                                     ", past any possible file size"));
    }
    if (tensor->offset != expected_offset) {
      return absl::InvalidArgumentError(
          absl::StrCat("data offset ", tensor->offset, " leaves a gap: expected ", expected_offset,
                       " (tensors are packed in entry order, each at the next multiple of ",
                       kSplitFileAlignment, ")"));
    }
    if (!CheckedAdd(tensor->offset, tensor->num_bytes, &data_end_)) {
      return absl::InvalidArgumentError(absl::StrCat("data offset ", tensor->offset, " + size ",
                                                     tensor->num_bytes, " overflows"));
    }
    return absl::OkStatus();
  }

  // The data starts at the first aligned offset after the entries; the bytes in between are 0.
  absl::Status ParseHeaderPadding() {
    uint64_t data_offset;
    if (!CheckedAlignUp(reader_.offset(), kSplitFileAlignment, &data_offset)) {
      return absl::InvalidArgumentError("data start overflows");
    }
    const uint64_t padding_start = reader_.offset();
    const uint8_t* padding = nullptr;
    BITSPLIT_RETURN_IF_ERROR(reader_.Skip(data_offset - padding_start, "header padding", &padding));
    for (uint64_t i = 0; i < data_offset - padding_start; ++i) {
      if (padding[i] != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("header padding byte at offset ", padding_start + i, " is 0x",
                         absl::Hex(padding[i], absl::kZeroPad2), ", expected 0"));
      }
    }
    file_->data_offset_ = data_offset;
    return absl::OkStatus();
  }

  absl::Status PlaceTensorData() {
    const uint64_t data_offset = file_->data_offset_;
    for (SplitTensor& tensor : file_->tensors_) {
      uint64_t start;
      uint64_t end;
      // Cannot overflow after the entry checks unless the data start is near 2^64; checked anyway.
      if (!CheckedAdd(data_offset, tensor.offset, &start) ||
          !CheckedAdd(start, tensor.num_bytes, &end)) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor ", Quote(tensor.name), ": data end overflows"));
      }
      if (end > reader_.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor ", Quote(tensor.name), ": data [", start, ", ", end,
                         ") extends past end of file (size ", reader_.size(), ")"));
      }
      tensor.data = reader_.data() + start;
    }
    // data_end_ is 0 without tensors: the file then ends at the data start.
    const uint64_t file_end = data_offset + data_end_;
    if (reader_.size() > file_end) {
      return absl::InvalidArgumentError(absl::StrCat(
          reader_.size() - file_end, " trailing bytes after the end of the tensor data at offset ",
          file_end, " (file size ", reader_.size(), ")"));
    }
    return absl::OkStatus();
  }

  io::ByteReader reader_;
  SplitFile* file_;
  std::optional<SplitFileKind> expected_kind_;
  const RowSizeOracle& oracle_;
  uint64_t tensor_count_ = 0;
  uint64_t data_end_ = 0;  // end of the last entry's data, relative to the data start
};

absl::StatusOr<std::unique_ptr<SplitFile>> SplitFile::Open(
    const std::string& path, std::optional<SplitFileKind> expected_kind,
    RowSizeOracle row_size_oracle) {
  BITSPLIT_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mapping, MappedFile::Open(path));
  BITSPLIT_ASSIGN_OR_RETURN(
      std::unique_ptr<SplitFile> file,
      Parse(mapping->data(), mapping->size(), path, expected_kind, std::move(row_size_oracle)));
  file->mapping_ = std::move(mapping);
  return file;
}

absl::StatusOr<std::unique_ptr<SplitFile>> SplitFile::Parse(
    const uint8_t* data, size_t size, std::string name, std::optional<SplitFileKind> expected_kind,
    RowSizeOracle row_size_oracle) {
  std::unique_ptr<SplitFile> file(new SplitFile());
  file->name_ = std::move(name);
  file->image_data_ = data;
  file->image_size_ = size;
  absl::Status status = data == nullptr && size != 0
                            ? absl::InvalidArgumentError("null image with nonzero size")
                            : Parser(data, size, file.get(), expected_kind, row_size_oracle).Run();
  if (!status.ok()) return WithContext(status, file->name_);
  return file;
}

const SplitTensor* SplitFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<const SplitTensor*> SplitFile::GetTensor(std::string_view name) const {
  const SplitTensor* tensor = FindTensor(name);
  if (tensor == nullptr) {
    return absl::NotFoundError(absl::StrCat(name_, ": ", ToAbsl(SplitFileKindName(kind_)),
                                            " split file has no tensor ", Quote(name)));
  }
  return tensor;
}

absl::Status CheckSplitPair(const SplitFile& base, const SplitFile& residual) {
  if (base.kind() != SplitFileKind::kBase) {
    return absl::FailedPreconditionError(
        absl::StrCat(base.name(), ": is a ", ToAbsl(SplitFileKindName(base.kind())),
                     " split file, but it was given as the base file"));
  }
  if (residual.kind() != SplitFileKind::kResidual) {
    return absl::FailedPreconditionError(
        absl::StrCat(residual.name(), ": is a ", ToAbsl(SplitFileKindName(residual.kind())),
                     " split file, but it was given as the residual file"));
  }
  if (base.fingerprint() != residual.fingerprint()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "split files do not belong together: base file ", base.name(), " has fingerprint ",
        base.fingerprint_hex(), " but residual file ", residual.name(), " has fingerprint ",
        residual.fingerprint_hex(),
        "; use the base and residual files written by the same `bitsplit quantize` run"));
  }
  return absl::OkStatus();
}

// ---- Writer -----------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<SplitFileWriter>> SplitFileWriter::Create(
    std::string path, SplitFileKind kind, const SplitFingerprint& fingerprint,
    const nlohmann::json& metadata, RowSizeOracle row_size_oracle) {
  if (kind != SplitFileKind::kBase && kind != SplitFileKind::kResidual) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": unknown split file kind ", static_cast<uint32_t>(kind)));
  }
  if (!metadata.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": metadata is a JSON ", metadata.type_name(), ", expected an object"));
  }
  std::unique_ptr<SplitFileWriter> writer(new SplitFileWriter());
  try {
    // strict: invalid UTF-8 is an error, not silently replaced (the reader refuses it).
    writer->metadata_text_ = metadata.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
  } catch (const nlohmann::json::exception& error) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": metadata cannot be stored as JSON text (", PrintableExcerpt(error.what()),
        "); encode byte strings that are not UTF-8 before storing them"));
  }
  // Refuse here what the reader would refuse later, before hours of quantization.
  if (writer->metadata_text_.size() > kSplitFileMaxMetadataBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        path, ": metadata is ", writer->metadata_text_.size(),
        " bytes of JSON, more than the reader's limit of ", kSplitFileMaxMetadataBytes));
  }
  BITSPLIT_RETURN_IF_ERROR(
      WithContext(CheckJsonDepth(writer->metadata_text_), absl::StrCat(path, ": metadata")));

  writer->path_ = std::move(path);
  writer->temp_path_ = writer->path_ + ".tmp";
  writer->kind_ = kind;
  writer->fingerprint_ = fingerprint;
  writer->row_size_oracle_ = std::move(row_size_oracle);
  writer->fd_ = ::open(writer->temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (writer->fd_ < 0) {
    return ErrnoStatus(errno, absl::StrCat(writer->temp_path_, ": cannot create"));
  }
  return writer;
}

SplitFileWriter::~SplitFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!finished_ && !temp_path_.empty()) ::unlink(temp_path_.c_str());
}

absl::Status SplitFileWriter::Error(absl::StatusCode code, std::string_view detail) const {
  return absl::Status(code, absl::StrCat(path_, ": ", ToAbsl(detail)));
}

absl::StatusOr<uint64_t> SplitFileWriter::DeclareTensor(std::string name, uint32_t format,
                                                        uint32_t group_size,
                                                        std::vector<int64_t> dims) {
  if (finished_ || layout_fixed_) {
    return Error(absl::StatusCode::kFailedPrecondition,
                 absl::StrCat("cannot declare tensor ", Quote(name),
                              " after tensor data writing has begun"));
  }
  if (name.empty() || name.size() > kSplitFileMaxTensorNameBytes) {
    return Error(absl::StatusCode::kInvalidArgument,
                 absl::StrCat("tensor name ", Quote(name), " has ", name.size(),
                              " bytes, expected 1 to ", kSplitFileMaxTensorNameBytes));
  }
  if (tensor_index_.contains(name)) {
    return Error(absl::StatusCode::kInvalidArgument,
                 absl::StrCat("tensor ", Quote(name), " is already declared"));
  }
  absl::StatusOr<SplitTensorSize> size =
      ComputeSplitTensorSize(format, group_size, dims, row_size_oracle_);
  if (!size.ok()) {
    return Error(size.status().code(),
                 absl::StrCat("tensor ", Quote(name), ": ", size.status().message()));
  }
  tensor_index_.emplace(name, tensors_.size());
  tensors_.push_back(
      PendingTensor{std::move(name), format, group_size, std::move(dims), size->num_bytes});
  return size->num_bytes;
}

absl::Status SplitFileWriter::FixLayout() {
  if (layout_fixed_) return absl::OkStatus();

  std::string header(sizeof(SplitFileHeader), '\0');
  SplitFileHeader fixed{};
  std::memcpy(fixed.magic, kSplitFileMagic, sizeof(fixed.magic));
  fixed.version = kSplitFileVersion;
  fixed.kind = static_cast<uint32_t>(kind_);
  std::memcpy(fixed.fingerprint, fingerprint_.data(), sizeof(fixed.fingerprint));
  fixed.metadata_bytes = metadata_text_.size();
  std::memcpy(header.data(), &fixed, sizeof(fixed));
  header += metadata_text_;

  auto append = [&header](const auto& value) {
    header.append(reinterpret_cast<const char*>(&value), sizeof(value));
  };
  append(static_cast<uint64_t>(tensors_.size()));
  uint64_t data_end = 0;
  for (PendingTensor& tensor : tensors_) {
    // Cannot overflow: every size was checked, and the sum of real tensor sizes fits a file.
    tensor.offset =
        (data_end + kSplitFileAlignment - 1) / kSplitFileAlignment * kSplitFileAlignment;
    data_end = tensor.offset + tensor.num_bytes;
    append(static_cast<uint32_t>(tensor.name.size()));
    header += tensor.name;
    append(tensor.format);
    append(tensor.group_size);
    append(static_cast<uint32_t>(tensor.dims.size()));
    for (int64_t dim : tensor.dims) append(dim);
    append(tensor.offset);
    append(tensor.num_bytes);
  }
  data_offset_ =
      (header.size() + kSplitFileAlignment - 1) / kSplitFileAlignment * kSplitFileAlignment;
  header.resize(data_offset_, '\0');
  file_size_ = data_offset_ + data_end;

  // Reserve the whole file now: a full disk fails here rather than after hours of work, and the
  // padding between tensors reads as zeros without being written.
  if (file_size_ > 0) {
    if (::fallocate(fd_, 0, 0, static_cast<off_t>(file_size_)) != 0) {
      const int error_number = errno;
      if (error_number != EOPNOTSUPP && error_number != ENOSYS) {
        return ErrnoStatus(error_number,
                           absl::StrCat(temp_path_, ": cannot reserve ", file_size_, " bytes"));
      }
      if (::ftruncate(fd_, static_cast<off_t>(file_size_)) != 0) {
        return ErrnoStatus(errno,
                           absl::StrCat(temp_path_, ": cannot extend to ", file_size_, " bytes"));
      }
    }
  }
  layout_fixed_ = true;
  return PositionedWrite(0, header.data(), header.size());
}

absl::Status SplitFileWriter::PositionedWrite(uint64_t at, const void* data, size_t size) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const ssize_t written = ::pwrite(fd_, bytes, size, static_cast<off_t>(at));
    if (written < 0) {
      if (errno == EINTR) continue;
      write_failure_ = ErrnoStatus(
          errno, absl::StrCat(temp_path_, ": write of ", size, " bytes at offset ", at, " failed"));
      return write_failure_;
    }
    bytes += written;
    at += static_cast<uint64_t>(written);
    size -= static_cast<size_t>(written);
  }
  return absl::OkStatus();
}

absl::Status SplitFileWriter::WriteTensorData(std::string_view name, const void* data,
                                              size_t size) {
  if (finished_) {
    return Error(absl::StatusCode::kFailedPrecondition, "the file is already finished");
  }
  if (!write_failure_.ok()) return write_failure_;
  auto it = tensor_index_.find(std::string(name));
  if (it == tensor_index_.end()) {
    return Error(absl::StatusCode::kNotFound,
                 absl::StrCat("no tensor ", Quote(name), " was declared"));
  }
  PendingTensor& tensor = tensors_[it->second];
  if (size > tensor.num_bytes - tensor.written) {
    return Error(
        absl::StatusCode::kInvalidArgument,
        absl::StrCat("tensor ", Quote(name), ": writing ", size, " more bytes after ",
                     tensor.written, " would pass its size of ", tensor.num_bytes, " bytes"));
  }
  BITSPLIT_RETURN_IF_ERROR(FixLayout());
  BITSPLIT_RETURN_IF_ERROR(
      PositionedWrite(data_offset_ + tensor.offset + tensor.written, data, size));
  tensor.written += size;
  return absl::OkStatus();
}

absl::Status SplitFileWriter::Finish() {
  if (finished_) {
    return Error(absl::StatusCode::kFailedPrecondition, "the file is already finished");
  }
  if (!write_failure_.ok()) return write_failure_;
  BITSPLIT_RETURN_IF_ERROR(FixLayout());
  for (const PendingTensor& tensor : tensors_) {
    if (tensor.written != tensor.num_bytes) {
      return Error(absl::StatusCode::kFailedPrecondition,
                   absl::StrCat("tensor ", Quote(tensor.name), " is incomplete: ", tensor.written,
                                " of ", tensor.num_bytes, " bytes written"));
    }
  }
  // Data on disk before the rename makes it visible, and the rename on disk before we report
  // success: a crash leaves either no file or a complete one at `path`.
  if (::fsync(fd_) != 0) return ErrnoStatus(errno, absl::StrCat(temp_path_, ": fsync failed"));
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return ErrnoStatus(errno, absl::StrCat(temp_path_, ": close failed"));
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    return ErrnoStatus(errno, absl::StrCat("cannot rename ", temp_path_, " to ", path_));
  }
  finished_ = true;
  std::string directory = std::filesystem::path(path_).parent_path().string();
  if (directory.empty()) directory = ".";
  const int directory_fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (directory_fd < 0) {
    return ErrnoStatus(errno, absl::StrCat(directory, ": cannot open to sync the rename"));
  }
  const int sync_result = ::fsync(directory_fd);
  const int sync_errno = errno;
  ::close(directory_fd);
  if (sync_result != 0) {
    return ErrnoStatus(sync_errno, absl::StrCat(directory, ": fsync failed"));
  }
  return absl::OkStatus();
}

}  // namespace bitsplit
