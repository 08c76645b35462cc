#pragma once
// A bound on JSON nesting, checked before text reaches a parser or a value whose copies and dumps
// recurse (nlohmann's): a million '[' would otherwise be a stack overflow.
#include <cstddef>
#include <string_view>

namespace bitsplit::util {

// The byte offset of the first '[' or '{' (outside strings) that opens nesting level
// max_depth + 1, or npos when `text` never nests deeper than max_depth. Brackets inside strings
// do not count; the text need not be valid JSON.
inline size_t JsonNestingExceeds(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::string_view::npos;
}

}  // namespace bitsplit::util
