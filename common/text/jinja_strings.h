#pragma once
// Python's str methods that chat templates call, over UTF-8 (jinja_strings.cc).
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace bitsplit::text::jinja {

enum class StripSide { kBoth, kLeft, kRight };
// str.strip/lstrip/rstrip: `chars` unset strips Python white space.
std::string PyStrip(std::string_view s, const std::optional<std::string>& chars, StripSide side);
// str.split(sep, maxsplit) (sep unset: runs of white space, no empty pieces) and str.rsplit.
std::vector<std::string> PySplit(std::string_view s, const std::optional<std::string>& sep,
                                 long long maxsplit);
std::vector<std::string> PyRSplit(std::string_view s, const std::optional<std::string>& sep,
                                  long long maxsplit);
// str.splitlines(): \n, \r\n, \r, \v, \f, \x1c-\x1e, U+0085, U+2028, U+2029 end lines.
std::vector<std::string> PySplitlines(std::string_view s);
// str.replace(old, new, count), count < 0: all.
std::string PyReplace(std::string_view s, std::string_view old, std::string_view replacement,
                      long long count);
// str.upper(), str.lower(), str.title() and str.capitalize() for Latin (ASCII, Latin-1,
// Latin Extended-A), Greek and Cyrillic letters; other letters are left as they are.
std::string PyUpper(std::string_view s);
std::string PyLower(std::string_view s);
std::string PyTitle(std::string_view s);
std::string PyCapitalize(std::string_view s);
// jinja2's title filter: each piece after a run of "-", white space, "(", "{", "[" or "<"
// gets its first character upper-cased and the rest lower-cased.
std::string JinjaTitle(std::string_view s);
// Whether the code point is upper-case (lower-case) in the scripts above.
bool IsUpperLetter(uint32_t code_point);
bool IsLowerLetter(uint32_t code_point);
// Length in code points, as len(str).
size_t PyLength(std::string_view s);
// Non-overlapping occurrences, as str.count.
size_t PyCount(std::string_view s, std::string_view needle);

}  // namespace bitsplit::text::jinja
