#include "common/text/streaming_detokenizer.h"

#include <algorithm>
#include <utility>

namespace bitsplit::text {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Appends the well-formed text of `bytes` to `out`, replacing ill-formed subparts with U+FFFD.
// With `at_end` false, a trailing sequence that is a valid but incomplete prefix of a character
// is left unconsumed (more bytes may complete it). Returns the number of bytes consumed.
size_t AppendValidated(std::string_view bytes, bool at_end, std::string& out) {
  const auto at = [&](size_t i) { return static_cast<uint8_t>(bytes[i]); };
  size_t pos = 0;
  while (pos < bytes.size()) {
    const uint8_t lead = at(pos);
    if (lead < 0x80) {
      out.push_back(static_cast<char>(lead));
      ++pos;
      continue;
    }
    // Sequence length and the allowed range of the second byte (Unicode table 3-7); the other
    // continuation bytes are always 80..BF.
    size_t length = 0;
    uint8_t second_min = 0x80, second_max = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      if (lead == 0xE0) second_min = 0xA0;
      if (lead == 0xED) second_max = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      if (lead == 0xF0) second_min = 0x90;
      if (lead == 0xF4) second_max = 0x8F;
    }
    if (length == 0) {  // continuation byte or a lead that can never start a character
      out.append(kReplacement);
      ++pos;
      continue;
    }
    size_t valid = 1;  // bytes of the sequence that are well-formed so far
    while (valid < length && pos + valid < bytes.size()) {
      const uint8_t byte = at(pos + valid);
      const uint8_t min = valid == 1 ? second_min : 0x80;
      const uint8_t max = valid == 1 ? second_max : 0xBF;
      if (byte < min || byte > max) break;
      ++valid;
    }
    if (valid == length) {
      out.append(bytes.substr(pos, length));
      pos += length;
    } else if (pos + valid == bytes.size() && !at_end) {
      return pos;  // an incomplete character at the end: wait for more bytes
    } else {
      out.append(kReplacement);
      pos += valid;
    }
  }
  return pos;
}

}  // namespace

bool IsValidUtf8(std::string_view bytes) {
  std::string scratch;
  scratch.reserve(bytes.size());
  AppendValidated(bytes, /*at_end=*/true, scratch);
  return scratch == bytes;
}

std::string ReplaceInvalidUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  AppendValidated(bytes, /*at_end=*/true, out);
  return out;
}

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tokenizer, bool render_special,
                                           std::vector<int32_t> rendered_ids)
    : tokenizer_(tokenizer),
      render_special_(render_special),
      rendered_ids_(std::move(rendered_ids)) {
  std::sort(rendered_ids_.begin(), rendered_ids_.end());
}

absl::StatusOr<std::string> StreamingDetokenizer::Push(int32_t id) {
  const bool render =
      render_special_ || std::binary_search(rendered_ids_.begin(), rendered_ids_.end(), id);
  const absl::StatusOr<std::string_view> piece = tokenizer_.TokenToPiece(id, render);
  if (!piece.ok()) return piece.status();
  pending_.append(*piece);
  std::string complete;
  const size_t consumed = AppendValidated(pending_, /*at_end=*/false, complete);
  pending_.erase(0, consumed);
  return complete;
}

std::string StreamingDetokenizer::Finish() {
  std::string rest;
  AppendValidated(pending_, /*at_end=*/true, rest);
  pending_.clear();
  return rest;
}

}  // namespace bitsplit::text
