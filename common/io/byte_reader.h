#pragma once
// Bounds-checked reading of untrusted little-endian file images, and the message helpers that
// the hardened readers (GGUF, split container) share. Everything a file says about sizes and
// offsets is attacker-controlled, so every read is checked before it happens and every piece of
// arithmetic on file values is overflow-checked.
#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/util/status_macros.h"

namespace bitsplit::io {

// Both formats are little-endian and every read below is a plain memcpy.
static_assert(std::endian::native == std::endian::little,
              "the file readers assume a little-endian host");

// Debian's abseil is built with its own absl::string_view (not an alias of std::string_view),
// and StrCat takes only the former; the public APIs use std::string_view.
inline absl::string_view ToAbsl(std::string_view text) { return {text.data(), text.size()}; }

inline bool CheckedAdd(uint64_t a, uint64_t b, uint64_t* sum) {
  return !__builtin_add_overflow(a, b, sum);
}
inline bool CheckedMul(uint64_t a, uint64_t b, uint64_t* product) {
  return !__builtin_mul_overflow(a, b, product);
}
// Rounds `value` up to a multiple of `alignment` (nonzero); false when that overflows.
inline bool CheckedAlignUp(uint64_t value, uint64_t alignment, uint64_t* aligned) {
  uint64_t padded;
  if (!CheckedAdd(value, alignment - 1, &padded)) return false;
  *aligned = padded / alignment * alignment;
  return true;
}

// Names in messages come from the file: escape them so that control bytes cannot garble a
// terminal or a log, and cut them short so that a 1 MB key does not become a 1 MB message.
inline std::string Quote(std::string_view text) {
  constexpr size_t kMaxShown = 80;
  std::string escaped = absl::CHexEscape(ToAbsl(text.substr(0, kMaxShown)));
  return absl::StrCat("'", escaped, text.size() > kMaxShown ? "...'" : "'");
}

// Same code, message prefixed with where the error happened.
inline absl::Status WithContext(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

// A cursor over an image. Errors say what was being read, where, and how much was left; the
// caller prefixes the file name.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  uint64_t offset() const { return offset_; }
  uint64_t remaining() const { return size_ - offset_; }
  const uint8_t* cursor() const { return data_ + offset_; }

  // Fails unless `bytes` more bytes exist at the cursor. `what` + `what_suffix` name the field;
  // two parts so that the hot path (one call per array element) never builds a string.
  absl::Status Need(uint64_t bytes, absl::string_view what,
                    absl::string_view what_suffix = {}) const {
    if (bytes <= remaining()) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("truncated: ", what, what_suffix, " needs ", bytes, " bytes at offset ",
                     offset_, " but only ", remaining(), " remain (file size ", size_, ")"));
  }

  template <typename T>
  absl::Status Read(T* out, absl::string_view what, absl::string_view what_suffix = {}) {
    BITSPLIT_RETURN_IF_ERROR(Need(sizeof(T), what, what_suffix));
    std::memcpy(out, data_ + offset_, sizeof(T));
    offset_ += sizeof(T);
    return absl::OkStatus();
  }

  // Advances past `bytes` bytes, returning where they start.
  absl::Status Skip(uint64_t bytes, absl::string_view what, const uint8_t** start = nullptr) {
    BITSPLIT_RETURN_IF_ERROR(Need(bytes, what));
    if (start != nullptr) *start = data_ + offset_;
    offset_ += bytes;
    return absl::OkStatus();
  }

  // A string prefixed by its length, stored as a `LengthType` (uint64 in GGUF, uint32 in split
  // files). The length is checked against the remaining bytes before anything is allocated.
  template <typename LengthType>
  absl::Status ReadString(std::string* out, absl::string_view what) {
    LengthType length = 0;
    BITSPLIT_RETURN_IF_ERROR(Read(&length, what, " length"));
    if (length > remaining()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " length ", length, " at offset ", offset_ - sizeof(LengthType),
          " runs past end of file (", remaining(), " bytes remain, file size ", size_, ")"));
    }
    out->assign(reinterpret_cast<const char*>(data_ + offset_), length);
    offset_ += length;
    return absl::OkStatus();
  }

 private:
  const uint8_t* data_;
  size_t size_;
  uint64_t offset_ = 0;
};

}  // namespace bitsplit::io
