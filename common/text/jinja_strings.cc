#include "common/text/jinja_strings.h"

#include <algorithm>

#include "common/text/jinja_value.h"

namespace bitsplit::text::jinja {

std::string PyStrip(std::string_view s, const std::optional<std::string>& chars, StripSide side) {
  const std::vector<uint32_t> cps = DecodeUtf8(s);
  const std::vector<uint32_t> set = chars ? DecodeUtf8(*chars) : std::vector<uint32_t>{};
  auto strip = [&](uint32_t cp) {
    return chars ? std::find(set.begin(), set.end(), cp) != set.end() : IsPythonSpace(cp);
  };
  size_t begin = 0;
  size_t end = cps.size();
  if (side != StripSide::kRight) {
    while (begin < end && strip(cps[begin])) ++begin;
  }
  if (side != StripSide::kLeft) {
    while (end > begin && strip(cps[end - 1])) --end;
  }
  return EncodeUtf8(std::vector<uint32_t>(cps.begin() + begin, cps.begin() + end));
}

std::vector<std::string> PySplit(std::string_view s, const std::optional<std::string>& sep,
                                 long long maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t start = 0;
    while (maxsplit < 0 || static_cast<long long>(out.size()) < maxsplit) {
      const size_t at = s.find(*sep, start);
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(start, at - start));
      start = at + sep->size();
    }
    out.emplace_back(s.substr(start));
    return out;
  }
  const std::vector<uint32_t> cps = DecodeUtf8(s);
  size_t i = 0;
  while (true) {
    while (i < cps.size() && IsPythonSpace(cps[i])) ++i;
    if (i == cps.size()) break;
    if (maxsplit >= 0 && static_cast<long long>(out.size()) == maxsplit) {
      size_t end = cps.size();
      while (end > i && IsPythonSpace(cps[end - 1])) --end;
      out.push_back(EncodeUtf8(std::vector<uint32_t>(cps.begin() + i, cps.begin() + end)));
      break;
    }
    size_t j = i;
    while (j < cps.size() && !IsPythonSpace(cps[j])) ++j;
    out.push_back(EncodeUtf8(std::vector<uint32_t>(cps.begin() + i, cps.begin() + j)));
    i = j;
  }
  return out;
}

std::vector<std::string> PyRSplit(std::string_view s, const std::optional<std::string>& sep,
                                  long long maxsplit) {
  if (maxsplit < 0) return PySplit(s, sep, maxsplit);
  std::vector<std::string> out;
  if (sep) {
    size_t end = s.size();
    while (static_cast<long long>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      const size_t at = s.rfind(*sep, end - sep->size());
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(at + sep->size(), end - at - sep->size()));
      end = at;
    }
    out.emplace_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  std::vector<std::string> all = PySplit(s, std::nullopt, -1);
  if (static_cast<long long>(all.size()) <= maxsplit + 1) return all;
  // The leftmost pieces stay joined with their original white space.
  const std::vector<uint32_t> cps = DecodeUtf8(s);
  size_t end = cps.size();
  for (long long k = 0; k < maxsplit; ++k) {
    while (end > 0 && IsPythonSpace(cps[end - 1])) --end;
    size_t start = end;
    while (start > 0 && !IsPythonSpace(cps[start - 1])) --start;
    out.push_back(EncodeUtf8(std::vector<uint32_t>(cps.begin() + start, cps.begin() + end)));
    end = start;
  }
  size_t begin = 0;
  while (begin < end && IsPythonSpace(cps[begin])) ++begin;
  while (end > begin && IsPythonSpace(cps[end - 1])) --end;
  out.push_back(EncodeUtf8(std::vector<uint32_t>(cps.begin() + begin, cps.begin() + end)));
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> PySplitlines(std::string_view s) {
  std::vector<std::string> out;
  const std::vector<uint32_t> cps = DecodeUtf8(s);
  std::vector<uint32_t> line;
  for (size_t i = 0; i < cps.size(); ++i) {
    const uint32_t cp = cps[i];
    const bool is_break = cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c ||
                          (cp >= 0x1c && cp <= 0x1e) || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
    if (!is_break) {
      line.push_back(cp);
      continue;
    }
    if (cp == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
    out.push_back(EncodeUtf8(line));
    line.clear();
  }
  if (!line.empty()) out.push_back(EncodeUtf8(line));
  return out;
}

std::string PyReplace(std::string_view s, std::string_view old, std::string_view replacement,
                      long long count) {
  std::string out;
  if (old.empty()) {
    const std::vector<uint32_t> cps = DecodeUtf8(s);
    long long done = 0;
    for (uint32_t cp : cps) {
      if (count < 0 || done < count) {
        out += replacement;
        ++done;
      }
      AppendUtf8(cp, out);
    }
    if (count < 0 || done < count) out += replacement;
    return out;
  }
  size_t start = 0;
  long long done = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(old, start);
    if (at == std::string_view::npos) break;
    out += s.substr(start, at - start);
    out += replacement;
    start = at + old.size();
    ++done;
  }
  out += s.substr(start);
  return out;
}

std::string AsciiUpper(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return out;
}

std::string AsciiLower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

std::string PyTitle(std::string_view s) {
  std::string out(s);
  bool previous_cased = false;
  for (char& c : out) {
    const bool lower = c >= 'a' && c <= 'z';
    const bool upper = c >= 'A' && c <= 'Z';
    if (lower && !previous_cased) c = static_cast<char>(c - 'a' + 'A');
    if (upper && previous_cased) c = static_cast<char>(c - 'A' + 'a');
    previous_cased = lower || upper;
  }
  return out;
}

std::string PyCapitalize(std::string_view s) {
  std::string out = AsciiLower(s);
  if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = static_cast<char>(out[0] - 32);
  return out;
}

size_t PyLength(std::string_view s) { return DecodeUtf8(s).size(); }

size_t PyCount(std::string_view s, std::string_view needle) {
  if (needle.empty()) return PyLength(s) + 1;
  size_t n = 0;
  for (size_t at = s.find(needle); at != std::string_view::npos;
       at = s.find(needle, at + needle.size())) {
    ++n;
  }
  return n;
}

}  // namespace bitsplit::text::jinja
